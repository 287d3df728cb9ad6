// The prefix cache of the paged KV pool (after vLLM's prefix_caching.md): a FULL block of
// computed K/V is findable by what it holds and by everything before it, so a request whose
// prompt starts like an earlier one reuses those blocks instead of prefilling them again.
//
// A block's key is a hash chain: key = hash(parent block's key, the block's tokens), the
// parent of a sequence's first block being a fixed root. Equal keys are only a hint: a hit
// also compares the tokens and the parent, so a hash collision costs a cache miss, never a
// block shared between different tokens. The parent is compared by `serial`, a number given
// to each cache entry once and never reused, so a child entry whose parent block was
// evicted and refilled with other tokens cannot be mistaken for a child of the new contents.
//
// The cache only indexes blocks; who holds them (reference counts) and when a free cached
// block is reused for something else (eviction, in LRU order) is the block manager's
// business (runtime/inference/block_manager.h), which calls Evict first.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "runtime/inference/inference_types.h"

namespace kiln::inference {

// hash(parent block's key, the block's tokens). Replaceable so that tests can force
// collisions; any function is correct (hits are verified), a poor one only misses more.
using BlockHashFn = std::function<uint64_t(uint64_t parent_key, absl::Span<const TokenId> tokens)>;

// A 64-bit mix of the parent key and each token (splitmix64's finalizer per step): stable
// across runs and platforms, so cache behaviour is reproducible.
uint64_t DefaultBlockHash(uint64_t parent_key, absl::Span<const TokenId> tokens);

// A position in a hash chain: after the root, or after a cached block.
struct ChainLink {
  uint64_t key = 0;     // the hash key the next block's key is computed from
  uint64_t serial = 0;  // the cache entry that ends the chain so far; 0 = the root
};

class PrefixCache {
 public:
  // `hash` may be null: DefaultBlockHash.
  PrefixCache(int64_t num_blocks, int64_t block_size, BlockHashFn hash);

  static ChainLink Root();

  // The key a block holding `tokens` would have after `parent`.
  uint64_t KeyOf(const ChainLink& parent, absl::Span<const TokenId> tokens) const;

  struct Hit {
    BlockId block = -1;
    ChainLink link;  // the chain after this block
  };
  // The cached block holding exactly `tokens` (block_size of them) right after `parent`.
  std::optional<Hit> Find(const ChainLink& parent, absl::Span<const TokenId> tokens) const;

  enum class InsertOutcome {
    kInserted,       // `block` is now cached
    kAlreadyCached,  // `block` was cached already (a forked sequence shares it)
    kDuplicate,      // another block holds the same tokens after the same parent; `block` stays
                     // uncached, and the chain continues through the other block
    kCollision,      // the key is taken by a block holding something else; `block` stays
                     // uncached and the chain cannot continue (nothing after it is findable)
  };
  struct InsertResult {
    InsertOutcome outcome;
    ChainLink link;  // the chain after this block (meaningless for kCollision)
  };
  // Makes `block`, which holds `tokens` (block_size of them) after `parent`, findable.
  InsertResult Insert(BlockId block, const ChainLink& parent, absl::Span<const TokenId> tokens);

  // Forgets `block` (it is about to hold other tokens). No effect if it is not cached.
  void Evict(BlockId block);

  bool contains(BlockId block) const { return entries_[block].has_value(); }
  int64_t size() const { return static_cast<int64_t>(by_key_.size()); }
  // The tokens a cached block holds (empty if it is not cached).
  absl::Span<const TokenId> TokensOf(BlockId block) const;

  // Every entry is indexed under its own key and the index names only cached blocks.
  absl::Status CheckConsistent() const;

 private:
  struct Entry {
    uint64_t key = 0;
    uint64_t serial = 0;
    uint64_t parent_serial = 0;
    std::vector<TokenId> tokens;
  };

  int64_t block_size_;
  BlockHashFn hash_;
  std::vector<std::optional<Entry>> entries_;      // per block
  absl::flat_hash_map<uint64_t, BlockId> by_key_;  // one block per key
  uint64_t next_serial_ = 1;                       // 0 is the root's
};

}  // namespace kiln::inference
