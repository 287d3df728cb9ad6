// chunk-lm-head: the LM head and its cross-entropy, forward and backward, in chunks of rows, so
// that only one chunk's logits and logit gradients are ever stored (the way llm.c's fused
// classifier and Liger's fused linear cross-entropy avoid the full [tokens, vocab] tensors).
// Off unless CompileOptions::lm_head_chunk_rows is set (`--lm-head-chunk-rows`): it trades a
// little GEMM efficiency and the weight gradient's f32 read-back per chunk for memory.
//
// Before (N rows of d features, V classes; the loss's cotangent dloss a constant, as it is for
// a mean loss):
//   %logits    = gemm(%x, %w) {a_layout=mk, b_layout=nk, m=N, n=V, k=d, ...} : bf16[B,T,V]
//   %l2        = reshape(%logits) : bf16[N,V]
//   %loss, %lse = cross_entropy(%l2, %labels)
//   ...
//   %dl        = cross_entropy_grad(%l2, %labels, %dloss, %lse) : bf16[N,V]
//   %dl3       = reshape(%dl) : bf16[B,T,V]
//   %dx        = gemm(%dl3, %w) {a_layout=mk, b_layout=kn, m=N, n=d, k=V} : f32[B,T,d]
//   %dw        = gemm(%dl3, %x) {a_layout=km, b_layout=kn, m=V, n=d, k=N} : f32[V,d]
// After, for chunks c of R = N / K rows (here K = 2), in place of the forward's LM head:
//   %x2 = reshape(%x) : bf16[N,d]
//   %x.0 = slice(%x2) {start=[0,0], limit=[R,d]}              (and %labels.0, %dloss.0)
//   %logits.0 = gemm(%x.0, %w) {m=R, ...} : bf16[R,V]
//   %loss.0, %lse.0 = cross_entropy(%logits.0, %labels.0)
//   %dl.0 = cross_entropy_grad(%logits.0, %labels.0, %dloss.0, %lse.0) : bf16[R,V]
//   %dx.0 = gemm(%dl.0, %w) {m=R, k=V} : f32[R,d]
//   %dw.0 = gemm(%dl.0, %x.0) {k=R, beta=0.0} : f32[V,d]
//   ... chunk 1 likewise, its weight gradient accumulating: gemm(%dl.1, %x.1, %dw.0) {beta=1.0}
//   %loss = concatenate(%loss.0, %loss.1) {dim=0} : f32[N]
//   %dx   = reshape(concatenate(%dx.0, %dx.1) {dim=0}) : f32[B,T,d]
//   %dw   = %dw.1
// The buffer plan follows definition order, so chunk c's logits and their gradient are dead
// before chunk c + 1's are written.
//
// Exact per row: cross_entropy, cross_entropy_grad and the two row-wise GEMMs compute each row
// from that row alone, so loss, LSE and dx are the same values. The weight gradient sums over
// the rows in K partial sums (f32, through C) instead of one: the same terms, reassociated, so
// the pass is registered as reassociating f32 sums (kiln check allows for that).
//
// Taken when: the logits gemm has batch 1, a_layout mk, b_layout nk, beta 0, epilogue none and
// no FP8 slots, and its value is read only by cross_entropy (through at most one reshape to
// [N, V]) and cross_entropy_grad, whose other operands are the same labels and the loss's LSE;
// dloss is a constant (computable before the forward's loss); the gradient is read (through at
// most one reshape) by exactly the two gemms above, the weight gradient with no C or, for tied
// embeddings (GPT-2), with the embedding's gradient as C (beta 1), which is then added to the
// chunks' sum where the weight gradient was (an f32 add of [V, d]);
// and the chunk count K (the smallest divisor of N with N / K rows within the chunk's rows, a
// multiple of 8) is at least 2. Runs after merge-sibling-gemms (which would merge
// the chunks' logits GEMMs, siblings on the weight, back into one) and before fuse-loops (which
// then fuses the slices and concatenates into the kernels around them).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class ChunkLmHeadPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "chunk-lm-head";
  // `chunk_rows`: the most rows (tokens) of logits one chunk may hold; 0 leaves every graph alone.
  explicit ChunkLmHeadPass(int64_t chunk_rows) : chunk_rows_(chunk_rows) {}
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;

 private:
  int64_t chunk_rows_;
};

// The chunk count for `rows` rows in chunks of at most `chunk_rows`: the smallest K >= 2 dividing
// rows with rows / K a multiple of 8 (whole GEMM tiles) and at most chunk_rows, or 1 when one
// chunk holds them all, chunk_rows is 0, or no such K exists.
int64_t LmHeadChunks(int64_t rows, int64_t chunk_rows);

}  // namespace kiln
