// The lowerings LowerCompositeNode (codegen/lower_composite.cc) dispatches to, one file per
// family of kernels/*.cuh. Each returns a LoweredNode of kind kKernels; threads_per_block has
// been checked by LowerCompositeNode. Internal to codegen/.
#pragma once

#include "absl/status/statusor.h"
#include "codegen/kernel_spec.h"
#include "codegen/lower_node.h"
#include "ir/graph.h"

namespace kiln::codegen::composite {

// lower_rms_norm.cc: rms_norm and rms_norm_grad_input and their residual forms add_rms_norm
// and add_rms_norm_grad_input (a row kernel each), rms_norm_grad_weight.
absl::StatusOr<LoweredNode> LowerRmsNorm(const Node& node, const CodegenOptions& options);
absl::StatusOr<LoweredNode> LowerRmsNormGradWeight(const Node& node, const CodegenOptions& options);

// lower_layer_norm.cc: layer_norm and add_layer_norm (a row kernel), and the fused input
// gradient layer_norm_grad_input and add_layer_norm_grad_input (a row kernel, or with
// {weight_grad=1} a row kernel summing dw's and db's partial rows and their fold).
absl::StatusOr<LoweredNode> LowerLayerNorm(const Node& node, const CodegenOptions& options);
absl::StatusOr<LoweredNode> LowerLayerNormGradInput(const Node& node, const CodegenOptions& options);

// lower_softmax.cc: softmax and softmax_grad.
absl::StatusOr<LoweredNode> LowerSoftmax(const Node& node, const CodegenOptions& options);

// lower_cross_entropy.cc: cross_entropy and cross_entropy_grad.
absl::StatusOr<LoweredNode> LowerCrossEntropy(const Node& node, const CodegenOptions& options);

// lower_rope.cc: rope, rope_table.
absl::StatusOr<LoweredNode> LowerRope(const Node& node, const CodegenOptions& options);
absl::StatusOr<LoweredNode> LowerRopeTable(const Node& node, const CodegenOptions& options);

// lower_adamw.cc: adamw_update.
absl::StatusOr<LoweredNode> LowerAdamWUpdate(const Node& node, const CodegenOptions& options);

// lower_sum_of_squares.cc: sum_of_squares.
absl::StatusOr<LoweredNode> LowerSumOfSquares(const Node& node, const CodegenOptions& options);

// lower_fp8.cc: fp8_quantize (zeroing its amax first; with q_t through shared-memory tiles),
// fp8_dequantize, fp8_scale_update (one block).
absl::StatusOr<LoweredNode> LowerFp8Quantize(const Node& node, const CodegenOptions& options);
absl::StatusOr<LoweredNode> LowerFp8Dequantize(const Node& node, const CodegenOptions& options);
absl::StatusOr<LoweredNode> LowerFp8ScaleUpdate(const Node& node, const CodegenOptions& options);

// lower_embedding.cc: gather and scatter_add.
absl::StatusOr<LoweredNode> LowerGather(const Node& node, const CodegenOptions& options);
absl::StatusOr<LoweredNode> LowerScatterAdd(const Node& node, const CodegenOptions& options);

// lower_attention.cc: attention and attention_grad (on wgmma when options.target has it and
// the shape fits its tiles, else mma.sync), and attention_delta.
absl::StatusOr<LoweredNode> LowerAttention(const Node& node, const CodegenOptions& options);
absl::StatusOr<LoweredNode> LowerAttentionGrad(const Node& node, const CodegenOptions& options);
absl::StatusOr<LoweredNode> LowerAttentionDelta(const Node& node, const CodegenOptions& options);

// lower_paged_kv.cc: kv_cache_write (a copy of the pool unless it is written in place, then
// the rows) and paged_attention (a warp per query and head).
absl::StatusOr<LoweredNode> LowerKvCacheWrite(const Node& node, const CodegenOptions& options);
absl::StatusOr<LoweredNode> LowerPagedAttention(const Node& node, const CodegenOptions& options);
// sample_tokens: kernels/sampling.cuh, a block per row.
absl::StatusOr<LoweredNode> LowerSampleTokens(const Node& node, const CodegenOptions& options);

}  // namespace kiln::codegen::composite
