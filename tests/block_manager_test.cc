// The paged-KV block manager (runtime/inference/block_manager.h): block tables, appends,
// fork and copy-on-write, freeing, the errors for bad ids and an exhausted pool, and a
// million random operations checked against an independent shadow model of who holds
// which block and what each block contains.
#include "runtime/inference/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <random>

#include "absl/strings/match.h"

namespace kiln::inference {
namespace {

BlockManager MakePool(int64_t num_blocks, int64_t block_size = 16, bool prefix_caching = true) {
  absl::StatusOr<BlockManager> pool = BlockManager::Create(
      {.num_blocks = num_blocks, .block_size = block_size, .enable_prefix_caching = prefix_caching});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *std::move(pool);
}

std::vector<TokenId> Iota(int64_t n, TokenId first = 0) {
  std::vector<TokenId> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = first + static_cast<TokenId>(i);
  return tokens;
}

std::vector<BlockId> Table(const BlockManager& pool, SequenceId id) {
  absl::StatusOr<absl::Span<const BlockId>> table = pool.BlockTable(id);
  EXPECT_TRUE(table.ok()) << table.status();
  if (!table.ok()) return {};
  return std::vector<BlockId>(table->begin(), table->end());
}

TEST(BlockManager, RejectsPoolsThatCannotWork) {
  EXPECT_EQ(BlockManager::Create({.num_blocks = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockManager::Create({.num_blocks = 4, .block_size = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockManager::Create({.num_blocks = int64_t{1} << 40}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BlockManager, AllocatesBlocksForThePromptAndOnAppend) {
  BlockManager pool = MakePool(8);
  ASSERT_EQ(pool.AllocateSequence(1, Iota(20)).value(), 0);
  EXPECT_EQ(Table(pool, 1).size(), 2u);
  EXPECT_EQ(pool.num_free_blocks(), 6);
  for (int i = 0; i < 12; ++i) {  // fills the second block
    ASSERT_EQ(pool.BlocksToAppend(1), 0);
    ASSERT_EQ(pool.AppendToken(1, 7).value(), std::nullopt);
  }
  EXPECT_EQ(Table(pool, 1).size(), 2u);
  EXPECT_EQ(pool.BlocksToAppend(1), 1);  // both blocks full: the 33rd token needs a third
  ASSERT_EQ(pool.AppendToken(1, 7).value(), std::nullopt);
  EXPECT_EQ(Table(pool, 1).size(), 3u);
  EXPECT_EQ(pool.num_free_blocks(), 5);
  EXPECT_EQ(pool.Tokens(1).value().size(), 33u);
  ASSERT_TRUE(pool.FreeSequence(1).ok());
  EXPECT_EQ(pool.num_free_blocks(), 8);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockManager, OutOfBlocksSaysWhatWasNeededAndChangesNothing) {
  BlockManager pool = MakePool(4);
  ASSERT_TRUE(pool.AllocateSequence(1, Iota(48)).ok());  // 3 blocks
  EXPECT_FALSE(pool.CanAllocate(Iota(40, 100)));
  absl::StatusOr<int64_t> r = pool.AllocateSequence(2, Iota(40, 100));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "needs 3 new blocks")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "1 free of 4")) << r.status();
  EXPECT_FALSE(pool.HasSequence(2));
  EXPECT_EQ(pool.num_free_blocks(), 1);

  ASSERT_TRUE(pool.AllocateSequence(2, Iota(16, 100)).ok());  // the last block
  EXPECT_FALSE(pool.CanAppend(1));
  absl::StatusOr<std::optional<BlockCopy>> a = pool.AppendToken(1, 5);
  ASSERT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(a.status().message(), "0 free of 4")) << a.status();
  EXPECT_EQ(pool.Tokens(1).value().size(), 48u);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockManager, UnknownAndReusedIdsAreErrors) {
  BlockManager pool = MakePool(4);
  ASSERT_TRUE(pool.AllocateSequence(1, Iota(3)).ok());
  EXPECT_EQ(pool.AllocateSequence(1, Iota(3)).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(pool.AllocateSequence(2, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.AppendToken(9, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.FreeSequence(9).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.Fork(9, 10).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.Fork(1, 1).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(pool.BlockTable(9).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.MarkComputed(9, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.MarkComputed(1, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(pool.CanAppend(9));
  EXPECT_EQ(pool.RefCount(-1), -1);
  EXPECT_EQ(pool.RefCount(4), -1);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockManager, ForkSharesBlocksAndCopiesOnWriteIntoASharedPartialBlock) {
  BlockManager pool = MakePool(8);
  ASSERT_TRUE(pool.AllocateSequence(1, Iota(20)).ok());  // block 0 full, block 1 holds 4
  ASSERT_TRUE(pool.Fork(1, 2).ok());
  const std::vector<BlockId> parent = Table(pool, 1);
  EXPECT_EQ(Table(pool, 2), parent);
  EXPECT_EQ(pool.RefCount(parent[0]), 2);
  EXPECT_EQ(pool.RefCount(parent[1]), 2);
  EXPECT_EQ(pool.num_free_blocks(), 6);

  EXPECT_EQ(pool.BlocksToAppend(2), 1);
  absl::StatusOr<std::optional<BlockCopy>> copy = pool.AppendToken(2, 99);
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(copy->has_value());
  const std::vector<BlockId> child = Table(pool, 2);
  EXPECT_EQ(**copy, (BlockCopy{parent[1], child[1], 4}));
  EXPECT_EQ(child[0], parent[0]);  // the full block stays shared
  EXPECT_NE(child[1], parent[1]);
  EXPECT_EQ(pool.RefCount(parent[0]), 2);
  EXPECT_EQ(pool.RefCount(parent[1]), 1);
  EXPECT_EQ(pool.RefCount(child[1]), 1);

  // The parent holds its last block alone now: it appends in place.
  EXPECT_EQ(pool.AppendToken(1, 5).value(), std::nullopt);
  EXPECT_EQ(Table(pool, 1), parent);
  EXPECT_EQ(pool.Tokens(1).value().back(), 5);
  EXPECT_EQ(pool.Tokens(2).value().back(), 99);

  ASSERT_TRUE(pool.FreeSequence(1).ok());
  EXPECT_EQ(pool.RefCount(parent[0]), 1);
  EXPECT_EQ(pool.RefCount(parent[1]), 0);
  ASSERT_TRUE(pool.FreeSequence(2).ok());
  EXPECT_EQ(pool.num_free_blocks(), 8);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockManager, AppendAfterAForkOfAFullBlockTakesANewBlockAndCopiesNothing) {
  BlockManager pool = MakePool(4);
  ASSERT_TRUE(pool.AllocateSequence(1, Iota(32)).ok());
  ASSERT_TRUE(pool.Fork(1, 2).ok());
  EXPECT_EQ(pool.AppendToken(2, 1).value(), std::nullopt);
  EXPECT_EQ(Table(pool, 2).size(), 3u);
  EXPECT_EQ(pool.RefCount(Table(pool, 2)[2]), 1);
}

TEST(BlockManager, CopyOnWriteWithNoFreeBlockIsResourceExhausted) {
  BlockManager pool = MakePool(2);
  ASSERT_TRUE(pool.AllocateSequence(1, Iota(20)).ok());
  ASSERT_TRUE(pool.Fork(1, 2).ok());
  EXPECT_FALSE(pool.CanAppend(2));
  absl::StatusOr<std::optional<BlockCopy>> r = pool.AppendToken(2, 1);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "copy-on-write")) << r.status();
  EXPECT_EQ(pool.Tokens(2).value().size(), 20u);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

// ---------------------------------------------------------------------------------------
// A million random operations against a shadow model.
//
// The shadow does not know the manager's policies (which free block comes next, what the
// prefix cache holds); it knows what must hold whatever they are: each block's reference
// count is the number of sequences holding it, a block handed out fresh was unreferenced,
// appends need a block exactly when the last one is full or shared, and a block reused from
// the cache holds, slot for slot, the tokens of the positions it is reused for. It tracks
// what every block holds from the writes the operations imply (a prompt's tokens into its
// fresh blocks, an appended token into its slot, a copy-on-write's slots into the copy).

struct ShadowSequence {
  std::vector<TokenId> tokens;
  std::vector<BlockId> table;
};

class ShadowCheck {
 public:
  ShadowCheck(int64_t num_blocks, int64_t block_size, uint64_t seed)
      : pool_(MakePool(num_blocks, block_size)), block_size_(block_size), refs_(num_blocks, 0),
        contents_(num_blocks, std::vector<TokenId>(block_size, -1)), rng_(seed) {
    std::uniform_int_distribution<TokenId> token(0, 3);  // a small vocabulary: prefixes repeat
    for (auto& base : bases_) {
      base.resize(400);
      for (TokenId& t : base) t = token(rng_);
    }
  }

  void Run(int64_t operations) {
    for (int64_t op = 0; op < operations && !::testing::Test::HasFailure(); ++op) {
      const int choice = std::uniform_int_distribution<int>(0, 99)(rng_);
      if (choice < 22) {
        Allocate();
      } else if (choice < 62) {
        Append();
      } else if (choice < 70) {
        Fork();
      } else if (choice < 86) {
        Free();
      } else if (choice < 98) {
        MarkComputed();
      } else {
        BadIds();
      }
      CheckCounts(op);
      if (op % 20000 == 0) CheckEverything(op);
    }
    CheckEverything(operations);
    EXPECT_GT(allocations_, operations / 20) << "too few allocations succeeded to exercise the pool";
    EXPECT_GT(exhausted_, 100) << "the pool never ran out: the test misses those paths";
    EXPECT_GT(cached_hits_, 1000) << "the prefix cache was never hit";
    if (block_size_ > 1) {  // with one-token blocks no block is ever partially filled
      EXPECT_GT(copies_, 1000) << "no copy-on-write happened";
    }
  }

 private:
  int64_t FreeCount() const { return std::count(refs_.begin(), refs_.end(), 0); }

  SequenceId PickLive() {
    auto it = live_.begin();
    std::advance(it, std::uniform_int_distribution<size_t>(0, live_.size() - 1)(rng_));
    return it->first;
  }

  void Write(BlockId block, int64_t slot, TokenId token) { contents_[block][slot] = token; }

  void Allocate() {
    if (live_.size() >= 16) return;
    const auto& base = bases_[std::uniform_int_distribution<int>(0, 3)(rng_)];
    std::vector<TokenId> prompt(base.begin(), base.begin() + std::uniform_int_distribution<int>(1, 60)(rng_));
    if (rng_() % 2) {
      for (int i = std::uniform_int_distribution<int>(0, 6)(rng_); i > 0; --i) prompt.push_back(rng_() % 4);
    }
    const SequenceId id = next_id_++;
    const bool can = pool_.CanAllocate(prompt);
    const int64_t free_before = pool_.num_free_blocks();
    absl::StatusOr<int64_t> cached = pool_.AllocateSequence(id, prompt);
    ASSERT_EQ(cached.ok(), can) << cached.status();
    if (!cached.ok()) {
      ASSERT_EQ(cached.status().code(), absl::StatusCode::kResourceExhausted) << cached.status();
      ASSERT_EQ(pool_.num_free_blocks(), free_before);
      ++exhausted_;
      return;
    }
    ++allocations_;
    const int64_t n = static_cast<int64_t>(prompt.size());
    ASSERT_EQ(*cached % block_size_, 0);
    ASSERT_LT(*cached, n);
    const std::vector<BlockId> table = Table(pool_, id);
    ASSERT_EQ(static_cast<int64_t>(table.size()), (n + block_size_ - 1) / block_size_);
    const int64_t reused = *cached / block_size_;
    cached_hits_ += reused;
    int64_t taken_from_free = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(table.size()); ++i) {
      const BlockId b = table[i];
      ASSERT_TRUE(b >= 0 && b < static_cast<BlockId>(refs_.size()));
      taken_from_free += refs_[b] == 0 ? 1 : 0;
      if (i < reused) {
        for (int64_t s = 0; s < block_size_; ++s) {
          ASSERT_EQ(contents_[b][s], prompt[i * block_size_ + s]) << "block " << b << " reused for other tokens";
        }
      } else {
        ASSERT_EQ(refs_[b], 0) << "block " << b << " handed out fresh while held";
        std::fill(contents_[b].begin(), contents_[b].end(), -1);
        for (int64_t s = 0; s < block_size_ && i * block_size_ + s < n; ++s) Write(b, s, prompt[i * block_size_ + s]);
      }
      ++refs_[b];
    }
    ASSERT_EQ(pool_.num_free_blocks(), free_before - taken_from_free);
    live_[id] = ShadowSequence{prompt, table};
  }

  void Append() {
    if (live_.empty()) return;
    const SequenceId id = PickLive();
    ShadowSequence& s = live_[id];
    if (s.tokens.size() >= 300) return;
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    const int64_t filled = n % block_size_;
    const bool needs_block = filled == 0 || refs_[s.table.back()] > 1;
    const bool can = !needs_block || FreeCount() > 0;
    ASSERT_EQ(pool_.CanAppend(id), can);
    const TokenId token = rng_() % 4;
    absl::StatusOr<std::optional<BlockCopy>> copy = pool_.AppendToken(id, token);
    if (!can) {
      ASSERT_EQ(copy.status().code(), absl::StatusCode::kResourceExhausted) << copy.status();
      ++exhausted_;
      return;
    }
    ASSERT_TRUE(copy.ok()) << copy.status();
    const std::vector<BlockId> table = Table(pool_, id);
    if (filled == 0) {
      ASSERT_EQ(*copy, std::nullopt);
      ASSERT_EQ(table.size(), s.table.size() + 1);
      ASSERT_TRUE(std::equal(s.table.begin(), s.table.end(), table.begin()));
      const BlockId b = table.back();
      ASSERT_EQ(refs_[b], 0) << "block " << b << " handed out fresh while held";
      ++refs_[b];
      std::fill(contents_[b].begin(), contents_[b].end(), -1);
      Write(b, 0, token);
    } else if (needs_block) {
      ASSERT_TRUE(copy->has_value());
      const BlockId src = s.table.back(), dst = table.back();
      ASSERT_EQ(**copy, (BlockCopy{src, dst, filled}));
      ASSERT_EQ(table.size(), s.table.size());
      ASSERT_TRUE(std::equal(s.table.begin(), s.table.end() - 1, table.begin()));
      ASSERT_EQ(refs_[dst], 0) << "copy-on-write into held block " << dst;
      --refs_[src];
      ++refs_[dst];
      contents_[dst] = contents_[src];
      std::fill(contents_[dst].begin() + filled, contents_[dst].end(), -1);
      Write(dst, filled, token);
      ++copies_;
    } else {
      ASSERT_EQ(*copy, std::nullopt);
      ASSERT_EQ(table, s.table);
      ASSERT_EQ(contents_[table.back()][filled], -1) << "append over a written slot";
      Write(table.back(), filled, token);
    }
    s.table = table;
    s.tokens.push_back(token);
  }

  void Fork() {
    if (live_.empty() || live_.size() >= 16) return;
    const SequenceId parent = PickLive();
    const SequenceId child = next_id_++;
    ASSERT_TRUE(pool_.Fork(parent, child).ok());
    ShadowSequence copy = live_[parent];
    ASSERT_EQ(Table(pool_, child), copy.table);
    for (BlockId b : copy.table) ++refs_[b];
    live_[child] = std::move(copy);
  }

  void Free() {
    if (live_.empty()) return;
    const SequenceId id = PickLive();
    ASSERT_TRUE(pool_.FreeSequence(id).ok());
    for (BlockId b : live_[id].table) --refs_[b];
    live_.erase(id);
  }

  void MarkComputed() {
    if (live_.empty()) return;
    const SequenceId id = PickLive();
    const int64_t n = static_cast<int64_t>(live_[id].tokens.size());
    const int64_t computed = rng_() % 4 == 0 ? std::uniform_int_distribution<int64_t>(0, n)(rng_) : n;
    ASSERT_TRUE(pool_.MarkComputed(id, computed).ok());
  }

  void BadIds() {
    const SequenceId unknown = next_id_ + 1000;
    ASSERT_EQ(pool_.AppendToken(unknown, 0).status().code(), absl::StatusCode::kNotFound);
    ASSERT_EQ(pool_.FreeSequence(unknown).code(), absl::StatusCode::kNotFound);
    if (!live_.empty()) {
      const SequenceId id = PickLive();
      ASSERT_EQ(pool_.AllocateSequence(id, {1, 2}).status().code(), absl::StatusCode::kAlreadyExists);
      ASSERT_EQ(pool_.Fork(id, id).code(), absl::StatusCode::kAlreadyExists);
    }
  }

  // After every operation: each block's count, and the pool's total.
  void CheckCounts(int64_t op) {
    int64_t held = 0;
    for (BlockId b = 0; b < static_cast<BlockId>(refs_.size()); ++b) {
      ASSERT_EQ(pool_.RefCount(b), refs_[b]) << "block " << b << " after operation " << op;
      held += refs_[b] > 0 ? 1 : 0;
    }
    ASSERT_EQ(pool_.num_free_blocks() + held, static_cast<int64_t>(refs_.size())) << "after operation " << op;
    ASSERT_EQ(pool_.num_sequences(), static_cast<int64_t>(live_.size()));
  }

  void CheckEverything(int64_t op) {
    ASSERT_TRUE(pool_.CheckInvariants().ok()) << pool_.CheckInvariants() << " after operation " << op;
    for (const auto& [id, s] : live_) {
      ASSERT_EQ(Table(pool_, id), s.table) << "sequence " << id << " after operation " << op;
      absl::Span<const TokenId> tokens = pool_.Tokens(id).value();
      ASSERT_TRUE(std::equal(tokens.begin(), tokens.end(), s.tokens.begin(), s.tokens.end()));
      // What each of its blocks holds is what the sequence wrote (or reused) there.
      for (size_t p = 0; p < s.tokens.size(); ++p) {
        ASSERT_EQ(contents_[s.table[p / block_size_]][p % block_size_], s.tokens[p])
            << "sequence " << id << " position " << p << " after operation " << op;
      }
    }
    const std::vector<BlockId> free_order = pool_.FreeBlocksInReuseOrder();
    ASSERT_EQ(static_cast<int64_t>(free_order.size()), FreeCount());
    for (BlockId b : free_order) ASSERT_EQ(refs_[b], 0);
    // The next few blocks to be taken (the generator's decode lookahead reads them) are the
    // front of that order.
    const int64_t next = std::min<int64_t>(op % 5, static_cast<int64_t>(free_order.size()));
    ASSERT_EQ(pool_.NextFreeBlocks(op % 5), std::vector<BlockId>(free_order.begin(), free_order.begin() + next));
  }

  BlockManager pool_;
  int64_t block_size_;
  std::vector<int64_t> refs_;
  std::vector<std::vector<TokenId>> contents_;
  std::map<SequenceId, ShadowSequence> live_;
  std::array<std::vector<TokenId>, 4> bases_;
  std::mt19937_64 rng_;
  SequenceId next_id_ = 1;
  int64_t allocations_ = 0, exhausted_ = 0, cached_hits_ = 0, copies_ = 0;
};

TEST(BlockManagerRandom, AMillionOperationsAgreeWithTheShadowModel) {
  ShadowCheck check(/*num_blocks=*/64, /*block_size=*/4, /*seed=*/20261201);
  check.Run(1000000);
}

TEST(BlockManagerRandom, BlockSizesOneAndSixteen) {
  for (int64_t block_size : {1, 16}) {
    SCOPED_TRACE(block_size);
    ShadowCheck check(/*num_blocks=*/block_size == 1 ? 256 : 24, block_size, /*seed=*/7 + block_size);
    check.Run(150000);
  }
}

}  // namespace
}  // namespace kiln::inference
