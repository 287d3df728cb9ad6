#include "runtime/inference/block_manager.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln::inference {

absl::StatusOr<BlockManager> BlockManager::Create(const BlockManagerOptions& options) {
  if (options.num_blocks < 1 || options.num_blocks > std::numeric_limits<BlockId>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("KV pool: num_blocks is ", options.num_blocks, "; it must be in [1, ",
                                                   std::numeric_limits<BlockId>::max(), "]"));
  }
  if (options.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool: block_size is ", options.block_size, "; it must be at least 1 token"));
  }
  return BlockManager(options);
}

BlockManager::BlockManager(const BlockManagerOptions& options)
    : block_size_(options.block_size),
      prefix_caching_(options.enable_prefix_caching),
      ref_counts_(options.num_blocks, 0),
      free_(options.num_blocks),
      cache_(options.num_blocks, options.block_size, options.block_hash) {}

absl::StatusOr<BlockManager::Sequence*> BlockManager::Find(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("KV pool: no sequence ", id));
  return &it->second;
}

absl::StatusOr<const BlockManager::Sequence*> BlockManager::Find(SequenceId id) const {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("KV pool: no sequence ", id));
  return &it->second;
}

std::vector<PrefixCache::Hit> BlockManager::MatchPrefix(absl::Span<const TokenId> tokens) const {
  std::vector<PrefixCache::Hit> hits;
  if (!prefix_caching_ || tokens.empty()) return hits;
  // Only blocks wholly before the last token: the last token is prefilled anyway (its logits
  // pick the next token), and prefilling it must not write into a block others share.
  const int64_t reusable = static_cast<int64_t>(tokens.size() - 1) / block_size_;
  ChainLink chain = PrefixCache::Root();
  for (int64_t i = 0; i < reusable; ++i) {
    std::optional<PrefixCache::Hit> hit = cache_.Find(chain, tokens.subspan(i * block_size_, block_size_));
    if (!hit.has_value()) break;
    hits.push_back(*hit);
    chain = hit->link;
  }
  return hits;
}

BlockManager::AllocationPlan BlockManager::PlanAllocation(absl::Span<const TokenId> tokens) const {
  const std::vector<PrefixCache::Hit> hits = MatchPrefix(tokens);
  AllocationPlan plan;
  plan.num_cached_tokens = static_cast<int64_t>(hits.size()) * block_size_;
  plan.new_blocks = BlocksForTokens(static_cast<int64_t>(tokens.size())) - static_cast<int64_t>(hits.size());
  for (const PrefixCache::Hit& hit : hits) plan.revived_blocks += ref_counts_[hit.block] == 0 ? 1 : 0;
  return plan;
}

bool BlockManager::CanAllocate(absl::Span<const TokenId> tokens) const {
  const AllocationPlan plan = PlanAllocation(tokens);
  return plan.new_blocks + plan.revived_blocks <= num_free_blocks();
}

int64_t BlockManager::BlocksToAppend(SequenceId id) const {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return 0;
  const Sequence& s = it->second;
  if (static_cast<int64_t>(s.tokens.size()) % block_size_ == 0) return 1;  // the last block is full
  return ref_counts_[s.blocks.back()] > 1 ? 1 : 0;                          // copy-on-write
}

bool BlockManager::CanAppend(SequenceId id) const {
  return sequences_.contains(id) && BlocksToAppend(id) <= num_free_blocks();
}

BlockId BlockManager::TakeFreeBlock() {
  const BlockId block = free_.PopFront();
  cache_.Evict(block);  // whatever it held is about to be overwritten
  ref_counts_[block] = 1;
  return block;
}

void BlockManager::AddReference(BlockId block) {
  if (ref_counts_[block] == 0) free_.Remove(block);  // a free cached block, revived by a hit
  ++ref_counts_[block];
}

void BlockManager::DropReference(BlockId block) {
  KILN_CHECK(ref_counts_[block] > 0);
  if (--ref_counts_[block] > 0) return;
  if (cache_.contains(block)) {
    free_.PushBack(block);  // most recently used: evicted last
  } else {
    free_.PushFront(block);  // holds nothing findable: reuse it first
  }
}

absl::StatusOr<int64_t> BlockManager::AllocateSequence(SequenceId id, absl::Span<const TokenId> tokens) {
  if (sequences_.contains(id)) return absl::AlreadyExistsError(absl::StrCat("KV pool: sequence ", id, " exists already"));
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("KV pool: sequence ", id, " has no tokens"));
  const std::vector<PrefixCache::Hit> hits = MatchPrefix(tokens);
  const AllocationPlan plan = PlanAllocation(tokens);
  if (plan.new_blocks + plan.revived_blocks > num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV pool: out of blocks: sequence ", id, " of ", tokens.size(), " tokens needs ", plan.new_blocks,
        " new blocks", plan.revived_blocks > 0 ? absl::StrCat(" and ", plan.revived_blocks, " free cached ones") : "",
        " (", hits.size(), " cached), ", num_free_blocks(), " free of ", num_blocks()));
  }
  Sequence s;
  s.tokens.assign(tokens.begin(), tokens.end());
  s.blocks.reserve(BlocksForTokens(static_cast<int64_t>(tokens.size())));
  // The hits first: taking fresh blocks must not evict them.
  for (const PrefixCache::Hit& hit : hits) {
    AddReference(hit.block);
    s.blocks.push_back(hit.block);
    s.chain = hit.link;
  }
  s.blocks_considered = static_cast<int64_t>(hits.size());
  for (int64_t i = 0; i < plan.new_blocks; ++i) s.blocks.push_back(TakeFreeBlock());
  sequences_.emplace(id, std::move(s));
  return plan.num_cached_tokens;
}

absl::StatusOr<std::optional<BlockCopy>> BlockManager::AppendToken(SequenceId id, TokenId token) {
  ASSIGN_OR_RETURN(Sequence * s, Find(id));
  const int64_t filled = static_cast<int64_t>(s->tokens.size()) % block_size_;
  const bool last_full = filled == 0;
  const bool shared = !last_full && ref_counts_[s->blocks.back()] > 1;
  if ((last_full || shared) && free_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool: out of blocks: sequence ", id, " at ", s->tokens.size(),
                                                     " tokens needs 1 new block",
                                                     shared ? " (copy-on-write of a shared block)" : "", ", 0 free of ",
                                                     num_blocks()));
  }
  std::optional<BlockCopy> copy;
  if (last_full) {
    s->blocks.push_back(TakeFreeBlock());
  } else if (shared) {
    const BlockId src = s->blocks.back();
    const BlockId dst = TakeFreeBlock();
    DropReference(src);  // others still hold it: it stays out of the free list
    s->blocks.back() = dst;
    copy = BlockCopy{src, dst, filled};
  }
  s->tokens.push_back(token);
  return copy;
}

absl::Status BlockManager::Fork(SequenceId parent, SequenceId child) {
  ASSIGN_OR_RETURN(const Sequence* p, Find(parent));
  if (sequences_.contains(child)) {
    return absl::AlreadyExistsError(absl::StrCat("KV pool: cannot fork ", parent, " into ", child, ": it exists already"));
  }
  Sequence copy = *p;
  for (BlockId b : copy.blocks) AddReference(b);
  sequences_.emplace(child, std::move(copy));
  return absl::OkStatus();
}

absl::Status BlockManager::FreeSequence(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("KV pool: no sequence ", id, " to free"));
  // The tail first: of a sequence's cached blocks, its last ones are evicted before its
  // prefix, which other requests are likelier to share.
  const std::vector<BlockId>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) DropReference(*b);
  sequences_.erase(it);
  return absl::OkStatus();
}

absl::Status BlockManager::MarkComputed(SequenceId id, int64_t num_computed_tokens) {
  ASSIGN_OR_RETURN(Sequence * s, Find(id));
  if (num_computed_tokens < 0 || num_computed_tokens > static_cast<int64_t>(s->tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat("KV pool: sequence ", id, " has ", s->tokens.size(),
                                                   " tokens; ", num_computed_tokens, " cannot be computed"));
  }
  if (!prefix_caching_) return absl::OkStatus();
  const int64_t full_blocks = num_computed_tokens / block_size_;
  for (int64_t i = s->blocks_considered; i < full_blocks && !s->chain_broken; ++i) {
    const absl::Span<const TokenId> tokens = absl::MakeConstSpan(s->tokens).subspan(i * block_size_, block_size_);
    const PrefixCache::InsertResult r = cache_.Insert(s->blocks[i], s->chain, tokens);
    if (r.outcome == PrefixCache::InsertOutcome::kCollision) {
      s->chain_broken = true;  // nothing after an unfindable block is findable
    } else {
      s->chain = r.link;
    }
  }
  s->blocks_considered = std::max(s->blocks_considered, full_blocks);
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const BlockId>> BlockManager::BlockTable(SequenceId id) const {
  ASSIGN_OR_RETURN(const Sequence* s, Find(id));
  return absl::MakeConstSpan(s->blocks);
}

absl::StatusOr<absl::Span<const TokenId>> BlockManager::Tokens(SequenceId id) const {
  ASSIGN_OR_RETURN(const Sequence* s, Find(id));
  return absl::MakeConstSpan(s->tokens);
}

int64_t BlockManager::RefCount(BlockId block) const {
  if (block < 0 || block >= num_blocks()) return -1;
  return ref_counts_[block];
}

bool BlockManager::IsCached(BlockId block) const { return block >= 0 && block < num_blocks() && cache_.contains(block); }

absl::Status BlockManager::CheckInvariants() const {
  std::vector<int64_t> holders(num_blocks(), 0);
  for (const auto& [id, s] : sequences_) {
    if (static_cast<int64_t>(s.blocks.size()) != BlocksForTokens(static_cast<int64_t>(s.tokens.size()))) {
      return absl::InternalError(absl::StrCat("KV pool: sequence ", id, " has ", s.tokens.size(), " tokens in ",
                                              s.blocks.size(), " blocks"));
    }
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      const BlockId b = s.blocks[i];
      if (b < 0 || b >= num_blocks()) return absl::InternalError(absl::StrCat("KV pool: sequence ", id, " names block ", b));
      ++holders[b];
      // A cached block holds one block's tokens for good; whoever holds it must hold those.
      if (cache_.contains(b)) {
        const absl::Span<const TokenId> mine = absl::MakeConstSpan(s.tokens).subspan(i * block_size_, block_size_);
        const absl::Span<const TokenId> cached = cache_.TokensOf(b);
        if (!std::equal(mine.begin(), mine.end(), cached.begin(), cached.end())) {
          return absl::InternalError(absl::StrCat("KV pool: sequence ", id, " holds cached block ", b,
                                                  " at index ", i, " but its tokens there differ"));
        }
      }
    }
  }
  int64_t zero = 0;
  for (BlockId b = 0; b < num_blocks(); ++b) {
    if (ref_counts_[b] != holders[b]) {
      return absl::InternalError(absl::StrCat("KV pool: block ", b, " has reference count ", ref_counts_[b], " but ",
                                              holders[b], " sequences hold it"));
    }
    if ((ref_counts_[b] == 0) != free_.contains(b)) {
      return absl::InternalError(absl::StrCat("KV pool: block ", b, " with reference count ", ref_counts_[b],
                                              free_.contains(b) ? " is" : " is not", " in the free list"));
    }
    zero += ref_counts_[b] == 0 ? 1 : 0;
  }
  if (zero != free_.size() || static_cast<int64_t>(free_.InOrder().size()) != free_.size()) {
    return absl::InternalError(absl::StrCat("KV pool: ", zero, " blocks are unreferenced but the free list holds ",
                                            free_.size()));
  }
  return cache_.CheckConsistent();
}

}  // namespace kiln::inference
