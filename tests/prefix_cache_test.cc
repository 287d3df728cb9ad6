// Prefix caching in the paged-KV pool (runtime/inference/prefix_cache.h and the block
// manager that uses it): shared prefixes share block ids and are not prefilled again, hits
// are exact even when hashes collide, only computed full blocks are findable, and cached
// blocks are evicted least recently freed first.
#include "runtime/inference/prefix_cache.h"

#include <gtest/gtest.h>

#include "runtime/inference/block_manager.h"

namespace kiln::inference {
namespace {

BlockManager MakePool(int64_t num_blocks, int64_t block_size = 16, BlockHashFn hash = nullptr,
                      bool prefix_caching = true) {
  absl::StatusOr<BlockManager> pool =
      BlockManager::Create({.num_blocks = num_blocks, .block_size = block_size,
                            .enable_prefix_caching = prefix_caching, .block_hash = std::move(hash)});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *std::move(pool);
}

std::vector<TokenId> Iota(int64_t n, TokenId first = 0) {
  std::vector<TokenId> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = first + static_cast<TokenId>(i);
  return tokens;
}

std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<BlockId> Table(const BlockManager& pool, SequenceId id) {
  absl::Span<const BlockId> table = pool.BlockTable(id).value();
  return std::vector<BlockId>(table.begin(), table.end());
}

// Allocates `tokens` as sequence `id`, marks all of it computed, and returns the cached count.
int64_t AllocateComputed(BlockManager& pool, SequenceId id, const std::vector<TokenId>& tokens) {
  absl::StatusOr<int64_t> cached = pool.AllocateSequence(id, tokens);
  EXPECT_TRUE(cached.ok()) << cached.status();
  EXPECT_TRUE(pool.MarkComputed(id, static_cast<int64_t>(tokens.size())).ok());
  return cached.value_or(-1);
}

TEST(PrefixCache, TwoRequestsSharingA128TokenPrefixShareItsBlocks) {
  BlockManager pool = MakePool(32);
  const std::vector<TokenId> prefix = Iota(128, 1000);
  const std::vector<TokenId> a = Concat(prefix, Iota(10, 5));
  const std::vector<TokenId> b = Concat(prefix, Iota(20, 7));
  EXPECT_EQ(AllocateComputed(pool, 1, a), 0);
  const int64_t free_before = pool.num_free_blocks();
  ASSERT_EQ(pool.PlanAllocation(b).num_cached_tokens, 128);
  const int64_t cached = AllocateComputed(pool, 2, b);
  ASSERT_EQ(cached, 128);
  EXPECT_EQ(static_cast<int64_t>(b.size()) - cached, 20);  // the second prefills only its own tokens
  const std::vector<BlockId> ta = Table(pool, 1), tb = Table(pool, 2);
  ASSERT_EQ(ta.size(), 9u);
  ASSERT_EQ(tb.size(), 10u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(ta[i], tb[i]) << "block " << i;
    EXPECT_EQ(pool.RefCount(ta[i]), 2);
  }
  EXPECT_NE(tb[8], ta[8]);
  EXPECT_EQ(pool.num_free_blocks(), free_before - 2);  // only b's own two blocks are new
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(PrefixCache, OnlyComputedFullBlocksBelowTheLastTokenAreReused) {
  BlockManager pool = MakePool(32);
  const std::vector<TokenId> prefix = Iota(128, 1000);
  ASSERT_TRUE(pool.AllocateSequence(1, Concat(prefix, {1})).ok());
  // Not computed yet: a second request must prefill it all (the first is still writing it).
  EXPECT_EQ(pool.PlanAllocation(Concat(prefix, {2})).num_cached_tokens, 0);
  ASSERT_TRUE(pool.MarkComputed(1, 100).ok());  // 6 full blocks computed
  EXPECT_EQ(pool.PlanAllocation(Concat(prefix, {2})).num_cached_tokens, 96);
  ASSERT_TRUE(pool.MarkComputed(1, 129).ok());
  EXPECT_EQ(pool.PlanAllocation(Concat(prefix, {2})).num_cached_tokens, 128);
  // A prompt that is exactly the cached prefix still prefills its last block: its last token's
  // logits are needed, and writing its K/V into a shared block is not allowed.
  EXPECT_EQ(pool.PlanAllocation(prefix).num_cached_tokens, 112);
  // A prompt diverging inside block 3 reuses blocks 0-2.
  std::vector<TokenId> diverging = prefix;
  diverging[50] = 7;
  EXPECT_EQ(pool.PlanAllocation(diverging).num_cached_tokens, 48);
}

TEST(PrefixCache, AHashCollisionSharesNoBlockBetweenDifferentTokens) {
  // Every block hashes alike: each lookup finds the one entry indexed under key 42.
  BlockManager pool = MakePool(16, 16, [](uint64_t, absl::Span<const TokenId>) -> uint64_t { return 42; });
  const std::vector<TokenId> a = Iota(40, 0);
  EXPECT_EQ(AllocateComputed(pool, 1, a), 0);
  const std::vector<BlockId> ta = Table(pool, 1);
  EXPECT_TRUE(pool.IsCached(ta[0]));
  EXPECT_FALSE(pool.IsCached(ta[1]));  // its key was taken by block 0: not findable, not wrong

  const std::vector<TokenId> b = Iota(40, 500);
  EXPECT_EQ(AllocateComputed(pool, 2, b), 0);
  for (BlockId blk : Table(pool, 2)) {
    EXPECT_EQ(pool.RefCount(blk), 1);
    EXPECT_EQ(std::count(ta.begin(), ta.end(), blk), 0) << "block " << blk << " shared between different tokens";
  }
  // The same tokens as `a` still hit what is cached of it.
  EXPECT_EQ(AllocateComputed(pool, 3, a), 16);
  EXPECT_EQ(Table(pool, 3)[0], ta[0]);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(PrefixCache, AHitNeedsTheSameParentNotOnlyTheSameTokens) {
  // A hash of the tokens alone: block Y after X and Y after Z have the same key.
  auto tokens_only = [](uint64_t, absl::Span<const TokenId> tokens) -> uint64_t {
    return DefaultBlockHash(0, tokens);
  };
  PrefixCache cache(/*num_blocks=*/4, /*block_size=*/2, tokens_only);
  const std::vector<TokenId> x = {1, 2}, y = {3, 4}, z = {5, 6};
  const PrefixCache::InsertResult rx = cache.Insert(0, PrefixCache::Root(), x);
  ASSERT_EQ(rx.outcome, PrefixCache::InsertOutcome::kInserted);
  ASSERT_EQ(cache.Insert(1, rx.link, y).outcome, PrefixCache::InsertOutcome::kInserted);
  const PrefixCache::InsertResult rz = cache.Insert(2, PrefixCache::Root(), z);
  ASSERT_EQ(rz.outcome, PrefixCache::InsertOutcome::kInserted);
  EXPECT_TRUE(cache.Find(rx.link, y).has_value());
  EXPECT_FALSE(cache.Find(rz.link, y).has_value());  // same key, other parent: a miss
  EXPECT_EQ(cache.Insert(3, rz.link, y).outcome, PrefixCache::InsertOutcome::kCollision);

  // Evicting X and caching other tokens in its block must not revive Y as their child.
  cache.Evict(0);
  const PrefixCache::InsertResult rw = cache.Insert(0, PrefixCache::Root(), {7, 8});
  ASSERT_EQ(rw.outcome, PrefixCache::InsertOutcome::kInserted);
  EXPECT_FALSE(cache.Find(rw.link, y).has_value());
  EXPECT_TRUE(cache.CheckConsistent().ok());
}

TEST(PrefixCache, BlocksComputedTwiceAreIndexedOnceAndTheChainGoesOn) {
  BlockManager pool = MakePool(16, 16);
  const std::vector<TokenId> x = Iota(16, 100), y = Iota(16, 200), z = Iota(16, 300);
  const std::vector<TokenId> a = Concat(Concat(x, y), {1});
  const std::vector<TokenId> b = Concat(Concat(Concat(x, y), z), {2});
  // Both admitted before either is computed: neither can reuse the other's blocks.
  ASSERT_EQ(pool.AllocateSequence(1, a).value(), 0);
  ASSERT_EQ(pool.AllocateSequence(2, b).value(), 0);
  ASSERT_TRUE(pool.MarkComputed(1, 33).ok());
  ASSERT_TRUE(pool.MarkComputed(2, 49).ok());
  EXPECT_EQ(pool.num_cached_blocks(), 3);  // x and y once (a's blocks), z
  const std::vector<BlockId> ta = Table(pool, 1), tb = Table(pool, 2);
  EXPECT_TRUE(pool.IsCached(ta[0]) && pool.IsCached(ta[1]));
  EXPECT_FALSE(pool.IsCached(tb[0]) || pool.IsCached(tb[1]));
  EXPECT_TRUE(pool.IsCached(tb[2]));
  // x, y, z is findable: through a's x and y, then b's z.
  ASSERT_EQ(AllocateComputed(pool, 3, Concat(Concat(Concat(x, y), z), {3})), 48);
  EXPECT_EQ(Table(pool, 3), (std::vector<BlockId>{ta[0], ta[1], tb[2], Table(pool, 3)[3]}));
}

TEST(PrefixCache, FreedCachedBlocksStayFindableUntilReused) {
  BlockManager pool = MakePool(8, 4);
  const std::vector<TokenId> a = Iota(9, 10);
  AllocateComputed(pool, 1, a);
  const std::vector<BlockId> ta = Table(pool, 1);
  ASSERT_TRUE(pool.FreeSequence(1).ok());
  EXPECT_EQ(pool.num_free_blocks(), 8);
  EXPECT_EQ(pool.num_cached_blocks(), 2);
  EXPECT_EQ(pool.RefCount(ta[0]), 0);
  ASSERT_EQ(AllocateComputed(pool, 2, a), 8);  // revived from the free list
  EXPECT_EQ(Table(pool, 2)[0], ta[0]);
  EXPECT_EQ(Table(pool, 2)[1], ta[1]);
  EXPECT_EQ(pool.RefCount(ta[0]), 1);
  EXPECT_EQ(pool.num_free_blocks(), 5);
}

TEST(PrefixCache, EvictionIsLeastRecentlyFreedFirstAndEmptyBlocksGoBeforeCachedOnes) {
  BlockManager pool = MakePool(6, 4);
  // Three sequences of one full block and one partial block each: 6 blocks.
  const std::vector<TokenId> a = Iota(5, 100), b = Iota(5, 200), c = Iota(5, 300);
  AllocateComputed(pool, 1, a);
  AllocateComputed(pool, 2, b);
  AllocateComputed(pool, 3, c);
  const BlockId a0 = Table(pool, 1)[0], a1 = Table(pool, 1)[1];
  const BlockId b0 = Table(pool, 2)[0], b1 = Table(pool, 2)[1];
  const BlockId c0 = Table(pool, 3)[0], c1 = Table(pool, 3)[1];
  ASSERT_EQ(pool.num_free_blocks(), 0);
  ASSERT_TRUE(pool.FreeSequence(1).ok());
  ASSERT_TRUE(pool.FreeSequence(2).ok());
  ASSERT_TRUE(pool.FreeSequence(3).ok());
  // The partial blocks hold nothing findable: first. Then the cached ones, a's first.
  EXPECT_EQ(pool.FreeBlocksInReuseOrder(), (std::vector<BlockId>{c1, b1, a1, a0, b0, c0}));

  // Reusing a's block makes it the most recently used.
  AllocateComputed(pool, 4, a);
  ASSERT_TRUE(pool.FreeSequence(4).ok());
  const BlockId a1_again = pool.FreeBlocksInReuseOrder()[0];
  EXPECT_EQ(pool.FreeBlocksInReuseOrder(), (std::vector<BlockId>{a1_again, b1, a1, b0, c0, a0}));

  // Four blocks of new tokens (not computed, so not cached themselves): the three empty
  // ones, then b0, the least recently freed.
  ASSERT_TRUE(pool.AllocateSequence(5, Iota(16, 900)).ok());
  EXPECT_FALSE(pool.IsCached(b0));
  EXPECT_TRUE(pool.IsCached(c0));
  EXPECT_TRUE(pool.IsCached(a0));
  EXPECT_EQ(pool.PlanAllocation(b).num_cached_tokens, 0);
  EXPECT_EQ(pool.PlanAllocation(c).num_cached_tokens, 4);
  EXPECT_EQ(pool.PlanAllocation(a).num_cached_tokens, 4);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(PrefixCache, ASequenceTailIsEvictedBeforeItsPrefix) {
  BlockManager pool = MakePool(4, 4);
  AllocateComputed(pool, 1, Iota(13));  // three full blocks and one token
  const std::vector<BlockId> t = Table(pool, 1);
  ASSERT_TRUE(pool.FreeSequence(1).ok());
  EXPECT_EQ(pool.FreeBlocksInReuseOrder(), (std::vector<BlockId>{t[3], t[2], t[1], t[0]}));
}

TEST(PrefixCache, CanAllocateCountsFreeCachedBlocksItWouldRevive) {
  BlockManager pool = MakePool(3, 4);
  const std::vector<TokenId> a = Iota(9);
  AllocateComputed(pool, 1, a);  // 3 blocks, two of them cached
  ASSERT_TRUE(pool.FreeSequence(1).ok());
  const BlockManager::AllocationPlan plan = pool.PlanAllocation(a);
  EXPECT_EQ(plan.num_cached_tokens, 8);
  EXPECT_EQ(plan.new_blocks, 1);
  EXPECT_EQ(plan.revived_blocks, 2);
  EXPECT_TRUE(pool.CanAllocate(a));
  ASSERT_TRUE(pool.AllocateSequence(2, Iota(4, 50)).ok());  // takes the empty block
  EXPECT_FALSE(pool.CanAllocate(a));  // one new block needed, and the two free ones are its hits
  EXPECT_EQ(pool.AllocateSequence(3, a).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(PrefixCache, DisabledCachingNeverReuses) {
  BlockManager pool = MakePool(16, 16, nullptr, /*prefix_caching=*/false);
  const std::vector<TokenId> a = Iota(40);
  EXPECT_EQ(AllocateComputed(pool, 1, a), 0);
  EXPECT_EQ(AllocateComputed(pool, 2, a), 0);
  EXPECT_EQ(pool.num_cached_blocks(), 0);
}

TEST(PrefixCache, TheDefaultHashDependsOnParentAndEveryToken) {
  const std::vector<TokenId> t = Iota(16);
  const uint64_t h = DefaultBlockHash(1, t);
  EXPECT_NE(h, DefaultBlockHash(2, t));
  for (size_t i = 0; i < t.size(); ++i) {
    std::vector<TokenId> u = t;
    ++u[i];
    EXPECT_NE(h, DefaultBlockHash(1, u)) << i;
  }
  EXPECT_EQ(h, DefaultBlockHash(1, t));
}

}  // namespace
}  // namespace kiln::inference
