// The ids the host side of paged-KV inference passes around (DESIGN.md, "The inference
// lowering"): tokens, KV blocks, sequences and requests. One header so that the block
// manager, the prefix cache, the sampler and the scheduler agree on widths: block ids and
// tokens are int32 because that is what the device's block tables and token buffers hold.
#pragma once

#include <cstdint>

namespace kiln::inference {

using TokenId = int32_t;     // an index into the model's vocabulary
using BlockId = int32_t;     // an index into the KV pool's blocks, [0, num_blocks)
using SequenceId = int64_t;  // the block manager's name for one sequence of tokens
using RequestId = int64_t;   // the scheduler's name for one generation request

// A copy the device must perform before the step that reads `dst`: the first `num_tokens`
// token slots of block `src` (K and V, every layer) into block `dst`. Produced by
// copy-on-write, when a sequence appends into a partially filled block it shares.
struct BlockCopy {
  BlockId src = -1;
  BlockId dst = -1;
  int64_t num_tokens = 0;

  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

}  // namespace kiln::inference
