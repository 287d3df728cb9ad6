// The host side of the paged KV cache (DESIGN.md, "The inference lowering"): which KV blocks
// of the device's pool each sequence's tokens live in. The pool is `num_blocks` blocks of
// `block_size` token slots; a sequence of n tokens holds ceil(n / block_size) blocks, listed
// in its block table (what the decode kernel reads K/V through).
//
// Blocks are shared, never copied, when they can be:
//   fork           a child sequence gets its parent's block table; every block's reference
//                  count goes up by one
//   prefix cache   a new sequence reuses the cached full blocks of its longest cached prefix
//                  (runtime/inference/prefix_cache.h), so only the rest is prefilled
//   copy-on-write  appending into a partially filled block that another sequence also holds
//                  first moves this sequence to a fresh block, and returns the (src, dst)
//                  copy the device must do before the step that writes it
// Freeing a sequence drops one reference to each of its blocks; a block at zero goes back to
// the free list. A cached block stays findable while it is free, until it is reused for
// something else: blocks that hold nothing worth keeping are reused first, then cached
// ones least recently freed first (LRU), and a sequence's tail before its prefix (a prefix
// is worth more: later blocks are only findable through it).
//
// Blocks enter the prefix cache when their K/V is computed, or is sure to be before anyone
// else reads it (MarkComputed), not when their tokens are known: a sequence must not skip
// prefilling K/V that nobody will have written by the time it reads it. The scheduler marks
// a prefill's prompt at admission, because a step's prefills run one after another in order
// (ScheduledStep::prefills), so a later admission of the same step reads it after it is
// written; a decode's new token is marked when its step completes.
//
// Every operation checks its arguments and the pool first and changes nothing when it
// fails: out of blocks is ResourceExhausted (with what was needed and what is free), an
// unknown sequence NotFound, a reused id AlreadyExists.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/inference/free_block_list.h"
#include "runtime/inference/inference_types.h"
#include "runtime/inference/prefix_cache.h"

namespace kiln::inference {

struct BlockManagerOptions {
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  bool enable_prefix_caching = true;
  BlockHashFn block_hash;  // null: DefaultBlockHash; tests inject colliding ones
};

class BlockManager {
 public:
  // InvalidArgument for a pool of no blocks, a block size below 1, or more blocks than a
  // BlockId can name.
  static absl::StatusOr<BlockManager> Create(const BlockManagerOptions& options);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  int64_t block_size() const { return block_size_; }
  // Blocks no sequence holds (cached ones included: they are reusable).
  int64_t num_free_blocks() const { return free_.size(); }
  int64_t num_cached_blocks() const { return cache_.size(); }
  int64_t num_sequences() const { return static_cast<int64_t>(sequences_.size()); }
  bool HasSequence(SequenceId id) const { return sequences_.contains(id); }

  // Blocks a sequence of `num_tokens` tokens occupies.
  int64_t BlocksForTokens(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  // What AllocateSequence(tokens) would reuse from the cache and take from the free list.
  struct AllocationPlan {
    int64_t num_cached_tokens = 0;  // a multiple of block_size, always below tokens.size()
    int64_t new_blocks = 0;         // taken from the free list
    int64_t revived_blocks = 0;     // cached blocks that are free now and would be taken back
  };
  AllocationPlan PlanAllocation(absl::Span<const TokenId> tokens) const;
  // Whether AllocateSequence(tokens) would find enough blocks now.
  bool CanAllocate(absl::Span<const TokenId> tokens) const;
  // Blocks the next AppendToken(id) takes from the free list: 0 or 1 (0 for unknown ids).
  int64_t BlocksToAppend(SequenceId id) const;
  // Whether AppendToken(id, ...) would succeed now (false for unknown ids).
  bool CanAppend(SequenceId id) const;

  // Registers sequence `id` holding `tokens` (a prompt, or a preempted request's prompt and
  // output, to be recomputed). Returns how many leading tokens' K/V the prefix cache
  // already holds: the caller prefills tokens[result, end). The last token is always left
  // to prefill (its logits are wanted), so the result is below tokens.size().
  absl::StatusOr<int64_t> AllocateSequence(SequenceId id, absl::Span<const TokenId> tokens);

  // Appends one token to sequence `id`: the slot its K/V will be written to. Takes a new
  // block when the last one is full; returns the copy to do when the last block was shared
  // and partially filled (copy-on-write), nullopt otherwise.
  absl::StatusOr<std::optional<BlockCopy>> AppendToken(SequenceId id, TokenId token);

  // Sequence `child` starts as a copy of `parent`, sharing all its blocks.
  absl::Status Fork(SequenceId parent, SequenceId child);

  // Drops sequence `id` and its references to its blocks.
  absl::Status FreeSequence(SequenceId id);

  // The first `num_computed_tokens` tokens of sequence `id` have their K/V in the pool:
  // their full blocks become findable in the prefix cache.
  absl::Status MarkComputed(SequenceId id, int64_t num_computed_tokens);

  absl::StatusOr<absl::Span<const BlockId>> BlockTable(SequenceId id) const;
  absl::StatusOr<absl::Span<const TokenId>> Tokens(SequenceId id) const;

  // For tests and the scheduler's checks: how many sequences hold `block` (-1 when the id
  // is out of range), and whether it is in the prefix cache.
  int64_t RefCount(BlockId block) const;
  bool IsCached(BlockId block) const;
  // The free blocks in the order they will be reused (the first `count` of them: O(count)).
  std::vector<BlockId> FreeBlocksInReuseOrder() const { return free_.InOrder(); }
  std::vector<BlockId> NextFreeBlocks(int64_t count) const { return free_.First(count); }

  // Reference counts equal the number of block tables naming each block, the free list holds
  // exactly the blocks at zero, tables are as long as their tokens need, and the prefix
  // cache is consistent. O(pool + tokens): for tests.
  absl::Status CheckInvariants() const;

 private:
  struct Sequence {
    std::vector<TokenId> tokens;
    std::vector<BlockId> blocks;
    // The prefix cache's view: blocks [0, blocks_considered) were offered to the cache, and
    // `chain` is where the chain stands after them; a collision ends the chain for good.
    int64_t blocks_considered = 0;
    ChainLink chain = PrefixCache::Root();
    bool chain_broken = false;
  };

  BlockManager(const BlockManagerOptions& options);

  absl::StatusOr<Sequence*> Find(SequenceId id);
  absl::StatusOr<const Sequence*> Find(SequenceId id) const;
  // The cached blocks holding tokens' longest cached prefix (full blocks, below the last token).
  std::vector<PrefixCache::Hit> MatchPrefix(absl::Span<const TokenId> tokens) const;
  // A block off the front of the free list, evicted from the cache, with one reference.
  BlockId TakeFreeBlock();
  void AddReference(BlockId block);
  // One reference less; at zero the block joins the free list (cached: at the back).
  void DropReference(BlockId block);

  int64_t block_size_;
  bool prefix_caching_;
  std::vector<int32_t> ref_counts_;
  FreeBlockList free_;
  PrefixCache cache_;
  absl::flat_hash_map<SequenceId, Sequence> sequences_;
};

}  // namespace kiln::inference
