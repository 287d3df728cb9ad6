#include "runtime/inference/free_block_list.h"

#include <algorithm>

#include "ir/status_macros.h"

namespace kiln::inference {

FreeBlockList::FreeBlockList(int64_t num_blocks)
    : prev_(num_blocks, kNone), next_(num_blocks, kNone), in_list_(num_blocks, false) {
  for (int64_t b = 0; b < num_blocks; ++b) PushBack(static_cast<BlockId>(b));
}

void FreeBlockList::PushFront(BlockId block) {
  KILN_CHECK(!in_list_[block]);
  prev_[block] = kNone;
  next_[block] = head_;
  if (head_ != kNone) prev_[head_] = block;
  head_ = block;
  if (tail_ == kNone) tail_ = block;
  in_list_[block] = true;
  ++size_;
}

void FreeBlockList::PushBack(BlockId block) {
  KILN_CHECK(!in_list_[block]);
  next_[block] = kNone;
  prev_[block] = tail_;
  if (tail_ != kNone) next_[tail_] = block;
  tail_ = block;
  if (head_ == kNone) head_ = block;
  in_list_[block] = true;
  ++size_;
}

void FreeBlockList::Remove(BlockId block) {
  KILN_CHECK(in_list_[block]);
  const BlockId p = prev_[block], n = next_[block];
  if (p != kNone) next_[p] = n; else head_ = n;
  if (n != kNone) prev_[n] = p; else tail_ = p;
  prev_[block] = next_[block] = kNone;
  in_list_[block] = false;
  --size_;
}

BlockId FreeBlockList::PopFront() {
  KILN_CHECK(head_ != kNone);
  const BlockId block = head_;
  Remove(block);
  return block;
}

std::vector<BlockId> FreeBlockList::First(int64_t count) const {
  std::vector<BlockId> order;
  order.reserve(static_cast<size_t>(std::max<int64_t>(0, std::min(count, size_))));
  for (BlockId b = head_; b != kNone && static_cast<int64_t>(order.size()) < count; b = next_[b]) order.push_back(b);
  return order;
}

}  // namespace kiln::inference
