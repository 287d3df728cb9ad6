// The free KV blocks in the order they are to be reused: a doubly linked list threaded
// through two arrays indexed by block id, so that taking the next block, returning one at
// either end, and pulling a block out of the middle (a prefix-cache hit on a free block
// revives it) are all O(1) with no allocation after construction.
//
// The block manager returns blocks that hold nothing worth keeping to the front (reused
// first) and blocks still in the prefix cache to the back, so the front of the list is
// always the best block to evict: empty ones first, then cached ones least recently freed.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/inference/inference_types.h"

namespace kiln::inference {

class FreeBlockList {
 public:
  // All `num_blocks` blocks free, in id order.
  explicit FreeBlockList(int64_t num_blocks);

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool contains(BlockId block) const { return in_list_[block]; }
  BlockId front() const { return head_; }

  void PushFront(BlockId block);
  void PushBack(BlockId block);
  // Removes `block`, which must be in the list.
  void Remove(BlockId block);
  // Removes and returns the front block; the list must not be empty.
  BlockId PopFront();

  // The blocks front to back (for tests and invariant checks; O(size)).
  std::vector<BlockId> InOrder() const { return First(size_); }
  // The first min(count, size) blocks, front to back: O(count).
  std::vector<BlockId> First(int64_t count) const;

 private:
  static constexpr BlockId kNone = -1;
  std::vector<BlockId> prev_, next_;
  std::vector<bool> in_list_;
  BlockId head_ = kNone, tail_ = kNone;
  int64_t size_ = 0;
};

}  // namespace kiln::inference
