// Internal to the CPU reference backend: one function per op family, each computing a
// node's result in double from its operands. ir/reference_backend.cc dispatches to
// them and rounds results to the node's dtype, so kernels never round (except integer
// division, which must be exact).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "ir/reference_backend.h"
#include "ir/thread_pool.h"

namespace kiln::reference {

struct EvalContext {
  const ReferenceOptions& options;
  ThreadPool& pool;
  absl::Span<const HostTensor* const> args;  // the function's arguments, checked against its parameters
};

using Operands = absl::Span<const HostTensor* const>;
// Shapes and attributes have been checked against shape inference before a kernel runs;
// a kernel reports only data-dependent errors (an index out of range), without the node
// name, which the evaluator adds.
using OpKernel = absl::StatusOr<HostTensor> (*)(const Node& node, Operands xs, const EvalContext& ctx);
// The same for an op of several results: one tensor per result, in order.
using MultiResultKernel = absl::StatusOr<std::vector<HostTensor>> (*)(const Node& node, Operands xs,
                                                                      const EvalContext& ctx);

// leaf_ops.cc
absl::StatusOr<HostTensor> EvalParameter(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalConstant(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalIota(const Node& node, Operands xs, const EvalContext& ctx);
// elementwise_ops.cc
absl::StatusOr<HostTensor> EvalUnary(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalBinary(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalCompare(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalSelect(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalConvert(const Node& node, Operands xs, const EvalContext& ctx);
// data_movement_ops.cc
absl::StatusOr<HostTensor> EvalBroadcast(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalReshape(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalTranspose(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalSlice(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalConcatenate(const Node& node, Operands xs, const EvalContext& ctx);
// reduction_ops.cc
absl::StatusOr<HostTensor> EvalReduceSum(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalReduceMax(const Node& node, Operands xs, const EvalContext& ctx);
// dot_general.cc
absl::StatusOr<HostTensor> EvalDotGeneral(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<std::vector<HostTensor>> EvalGemm(const Node& node, Operands xs, const EvalContext& ctx);
// indexing_ops.cc
absl::StatusOr<HostTensor> EvalGather(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalScatterAdd(const Node& node, Operands xs, const EvalContext& ctx);
// norm_ops.cc
absl::StatusOr<HostTensor> EvalRmsNorm(const Node& node, Operands xs, const EvalContext& ctx);
// rms_norm_grad_input: dx, and with {weight_grad=1} dw (rms_norm_grad_weight's value).
absl::StatusOr<std::vector<HostTensor>> EvalRmsNormGradInput(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalRmsNormGradWeight(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalLayerNorm(const Node& node, Operands xs, const EvalContext& ctx);
// add_rms_norm and add_layer_norm: (sum, y).
absl::StatusOr<std::vector<HostTensor>> EvalAddNorm(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<std::vector<HostTensor>> EvalAddRmsNormGradInput(const Node& node, Operands xs,
                                                                const EvalContext& ctx);
// layer_norm_grad_input and add_layer_norm_grad_input: dx, [copy,] and with {weight_grad=1}
// dw and db.
absl::StatusOr<std::vector<HostTensor>> EvalLayerNormGradInput(const Node& node, Operands xs,
                                                               const EvalContext& ctx);
// softmax_ops.cc
absl::StatusOr<HostTensor> EvalSoftmax(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalSoftmaxGrad(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<std::vector<HostTensor>> EvalCrossEntropy(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalCrossEntropyGrad(const Node& node, Operands xs, const EvalContext& ctx);
// rope.cc
absl::StatusOr<HostTensor> EvalRope(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalRopeTable(const Node& node, Operands xs, const EvalContext& ctx);
// optimizer_ops.cc
absl::StatusOr<std::vector<HostTensor>> EvalAdamWUpdate(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalSumOfSquares(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<std::vector<HostTensor>> EvalFp8Quantize(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalFp8Dequantize(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalFp8ScaleUpdate(const Node& node, Operands xs, const EvalContext& ctx);
// attention_ops.cc
absl::StatusOr<std::vector<HostTensor>> EvalAttention(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalAttentionDelta(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<std::vector<HostTensor>> EvalAttentionGrad(const Node& node, Operands xs, const EvalContext& ctx);
// paged_kv_ops.cc
absl::StatusOr<HostTensor> EvalKvCacheWrite(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalPagedAttention(const Node& node, Operands xs, const EvalContext& ctx);
absl::StatusOr<HostTensor> EvalSampleTokens(const Node& node, Operands xs, const EvalContext& ctx);

// --- Shared helpers (tensor_layout.cc) ---

// Loops over elements split across the pool in chunks big enough to amortize the hand-off.
inline constexpr int64_t kElementsPerChunk = 1 << 14;

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims);

// dst[i] = src[base + sum_d index_d(i) * src_strides[d]], i running row-major over
// `dims`: one routine for transpose, broadcast (stride 0), slice and reduction layouts.
void StridedCopy(const double* src, int64_t base, const std::vector<int64_t>& dims,
                 const std::vector<int64_t>& src_strides, double* dst, ThreadPool& pool);

// Offsets of the elements of a group of dims flattened row-major:
// offsets[i] = sum_d index_d(i) * strides[d] over a [sizes...] index space.
std::vector<int64_t> GroupOffsets(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);

// "[1,0,2]": the multi-index of row-major position `flat` in `dims`, for error messages.
std::string MultiIndexString(int64_t flat, const std::vector<int64_t>& dims);

// The length of the last dim and the number of rows before it (for row-wise ops).
struct Rows {
  int64_t count;
  int64_t length;
};
Rows RowsOf(const TensorType& t);

}  // namespace kiln::reference
