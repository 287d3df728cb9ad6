// rematerialize: a cheap elementwise value that the forward computes and the backward reads
// again much later (SwiGLU's silu(gate) * up and GPT-2's gelu(fc), read by the down
// projection's weight-gradient GEMM) is recomputed, in the backward, by the loop kernel that
// already reads every input it needs (the activation's VJP kernel), as one more result of
// that kernel, instead of being held in memory from the forward to the backward.
//
// Why: such a value is live across the step's peak (the end of the forward), and it costs a
// whole activation per layer there: 64 MiB per llama-S layer (bf16 [16, 1024, 2048]), 1 GiB
// over 16 layers; torch.compile's min-cut partitioner makes the same choice. Recomputing it
// inside the VJP kernel adds only its store (that kernel reads its inputs already), where a
// kernel of its own would read them again.
//
// A value V qualifies when
//   - V is one loop fusion's single result or one elementwise op (the computation to repeat),
//     of at least kMinBytes, not a function output;
//   - its last user U comes at least kMinGap nodes after every other user (or V has no other
//     user): the use that keeps it alive;
//   - a loop fusion G of V's shape whose operands include every operand of V can be placed
//     before U: G comes before U already, or every operand of G does (G then moves up to U,
//     which changes no value: it depends only on its operands).
// Without such a G, V's computation is copied as a kernel of its own just before U, when every
// operand of V is held until U anyway (a parameter, or read at or after U): it reads them
// once more, and still frees V's memory in between (llama's SwiGLU after merge-sibling-gemms,
// whose backward kernel writes the gate/up gradient, twice h's width: no h of its shape).
// G is replaced by a fusion computing G's results and then V's (its body gains V's ops, read
// from the same parameters), placed where G or U stands, whichever is first; U reads V from
// it. V's other users keep the forward's V, whose buffer now dies at its last forward use.
// Values are unchanged bit for bit: the same ops on the same inputs (the reference backend
// computes the same, so `kiln check` proves the pass exact).
//
// Before (the MLP of a Llama layer after fuse-loops):
//   %h = fusion(%gate, %up) {kind=loop} : bf16[T,F] { sigmoid, mul, mul }   (forward)
//   %y = gemm(%h, %w_down, %x) {...}                                          (forward)
//   ...
//   %dw = gemm(%dy, %h) {a_layout=km, b_layout=kn, ...}                       (backward)
//   %dup = fusion(%gate, %dh, %up) {kind=loop} : bf16[T,F] { ... }            (backward)
// After:
//   %h = fusion(%gate, %up) {kind=loop} : bf16[T,F] { sigmoid, mul, mul }
//   %y = gemm(%h, %w_down, %x) {...}
//   ...
//   %dup, %h.remat = fusion(%gate, %dh, %up) {kind=loop} : (bf16[T,F], bf16[T,F]) {
//     ... (the VJP's ops), sigmoid, mul, mul
//     return %dup, %h.remat
//   }
//   %dw = gemm(%dy, %h.remat) {a_layout=km, b_layout=kn, ...}
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class RematerializePass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "rematerialize";
  // Smaller values are not worth a kernel's extra result: 1 MiB is 0.25 us of the H200's
  // bandwidth, far below any activation of the presets.
  static constexpr int64_t kMinBytes = int64_t{1} << 20;
  // A copy of its own costs a launch and a second read of its inputs: worth it for
  // activations (llama-S's are 25-64 MiB a layer), not for the weights' bf16 copies (1-6 MiB
  // a layer, 0.3 GB in all, for 64 more launches).
  static constexpr int64_t kMinAloneBytes = int64_t{16} << 20;
  // Nodes between V's last other use and U below which V's life is not what keeps it in
  // memory across the forward-backward peak (a transformer layer's backward alone is ~60; the
  // last layer's forward and backward are ~20 apart, the LM head and the loss between).
  static constexpr int64_t kMinGap = 16;
  // Tests lower the thresholds to see the rewrite on small graphs.
  explicit RematerializePass(int64_t min_bytes = kMinBytes, int64_t min_gap = kMinGap,
                             int64_t min_alone_bytes = kMinAloneBytes)
      : min_bytes_(min_bytes), min_alone_bytes_(min_alone_bytes), min_gap_(min_gap) {}
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;

 private:
  int64_t min_bytes_, min_alone_bytes_, min_gap_;
};

}  // namespace kiln
