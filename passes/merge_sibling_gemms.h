// merge-sibling-gemms: GEMMs that read one operand in common, or that sum into one another
// through C, become one larger GEMM. A small GEMM runs cuBLASLt badly on a big GPU: llama-S's
// k/v projections (M16384 N256 K768) fill one wave of output tiles and run at ~400 TFLOP/s on
// the H200, their weight gradients (M256 N768 K16384) at ~300, and the input gradient
// dX = dq Wq + dk Wk + dv Wv as three GEMMs chained through an f32 C (beta=1) at 115-267,
// each link reading and writing the f32 sum again; merged, they are one N=1280, one M=1280
// and one K=1280 GEMM (gate/up: N, M and K of 4096), shapes that run at 650+.
//
// Three rewrites, on `gemm` nodes after lower-gemm (batch 1, epilogue none, no FP8 slots):
//   shared a:  gemm(a, b_i) for one a node, b_i differing (same layouts, k, alpha, beta=0,
//              result dtype)   -> gemm(a, concatenate(b_i along N)), result sliced along N
//   shared b:  gemm(a_i, b) likewise (the weight gradients dW_i = g_iᵀ x: a_layout=km, b=x)
//                              -> gemm(concatenate(a_i along M), b), result sliced along M
//   chain:     gemm(g_1, b_1, gemm(g_2, b_2, ...)) {beta=1}, the links of one M and N, each
//              read only by the next (elide-grad-zeroing's output for dq Wq + dk Wk + dv Wv)
//                              -> gemm(concatenate(g_i along K), concatenate(b_i along K)),
//              keeping the innermost link's C and beta (if it had one)
// Concatenating along the first dim of an operand as it lies is joining its bytes; along the
// last dim it needs that dim to be the free (or K) size. Pieces are ordered by where their
// weight (the operand they do not share; for a chain, b) is defined, and a concatenate of the
// same operands in the same order is made once, so the forward's concatenated weights
// [Wq; Wk; Wv] are the very node the backward's dX GEMM reads, and dX's and dW's
// concatenated gradients [dq, dk, dv] are one node too. fuse-loops, which runs next, puts
// each concatenate into the kernel of its operands' producers (the weights' bf16 converts,
// the gradients' loop kernels) and recomputes each slice in the loop kernels that read it (a
// slice of a stored value counts as that value: passes/fusion.cc's CheapToRecompute); a slice
// read by a hand-written kernel stays a copy kernel of its own: in llama-S's step, q's and
// k's (read by RoPE) and the five weight gradients' (read by AdamW), 7 per layer, against 9
// GEMMs and 5 weight converts fewer.
//
// Before:
//   %x = parameter() {index=0} : bf16[64,32]
//   %wq = parameter() {index=1} : bf16[48,32]
//   %wk = parameter() {index=2} : bf16[16,32]
//   %q = gemm(%x, %wq) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=64, n=48} : bf16[64,48]
//   %k = gemm(%x, %wk) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=64, n=16} : bf16[64,16]
//   %dq = parameter() {index=3} : bf16[64,48]
//   %dk = parameter() {index=4} : bf16[64,16]
//   %dx.k = gemm(%dk, %wk) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=16, m=64, n=32} : f32[64,32]
//   %dx = gemm(%dq, %wq, %dx.k) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=48, m=64, n=32} : f32[64,32]
// After (the parameters where they were; each new node just after the operands it reads):
//   %wq.concat = concatenate(%wq, %wk) {dim=0} : bf16[64,32]
//   %q.merged = gemm(%x, %wq.concat) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=64, n=64} : bf16[64,64]
//   %q = slice(%q.merged) {limit=[64,48], start=[0,0], stride=[1,1]} : bf16[64,48]
//   %k = slice(%q.merged) {limit=[64,64], start=[0,48], stride=[1,1]} : bf16[64,16]
//   %dq.concat = concatenate(%dq, %dk) {dim=1} : bf16[64,64]
//   %dx = gemm(%dq.concat, %wq.concat) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=64, m=64, n=32} : f32[64,32]
// An operand defined after an earlier piece's first use (the frontend converts each weight
// just before its GEMM, and q's reshape comes before k's weight is converted) moves up to
// just before the first piece, with the few nodes it is computed from; otherwise the group
// stays apart.
//
// Meaning: a shared-operand merge computes every element as the same sum over K in the same
// order, so it is exact. A chain merge sums all of K in one f32 accumulator instead of
// rounding each link's partial sum to f32 and adding it in the epilogue: the sums are the
// same, their f32 rounding is not (the reference backend rounds an exact sum once; cuBLASLt
// sums in its own order anyway, tests/gpu_gemm_test.cc's (K + 2) 2^-24 sum|a||b| bound). So
// the chain merge is checked against the reference within that bound, not bit for bit.
//
// Left alone: GEMMs of batch > 1 (attention's, where they remain), epilogues (GPT-2's bias
// projections), beta != 0 siblings, FP8 slots, and chains with a_layout=km: those are the
// weight gradients of successive micro-batches (--accum), whose merge would concatenate the
// micro-batches' activations and keep them all alive at once. And any piece above the size
// threshold below.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

// The largest piece (2 M N K FLOPs) worth merging: 2^37, ~0.2 ms of GEMM at 650 TFLOP/s.
// Below it, a GEMM's fixed costs (a launch, the last partial wave of output tiles, for a
// chain link the f32 C read and D written again) are a sizeable share of its time, and a
// merge removes them; above it a GEMM already fills the GPU for many waves, a merge gains a
// few percent at most, and a concatenate that fuse-loops cannot hide (an activation read
// by a hand-written kernel) costs more bytes than that saves. llama-S's pieces are 6-51
// GFLOP (all merged); llama-M's gate/up (M8192 N5632 K2048, 189 GFLOP) stay apart, its
// q/k/v (34-69 GFLOP) merge.
inline constexpr int64_t kMaxMergedPieceFlops = int64_t{1} << 37;

class MergeSiblingGemmsPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "merge-sibling-gemms";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
