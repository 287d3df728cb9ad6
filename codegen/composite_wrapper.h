// What the composite lowerings (codegen/lower_*.cc, one file per family of kernels/) share:
// the generated wrapper, its literals and checks, and the geometry of the row kernels.
// Internal to those files and codegen/lower_composite.cc, whose LowerCompositeNode is the
// one entry point.
//
// Each composite node becomes a small translation unit: the kernels/ header of its family
// and an extern "C" __global__ wrapper that instantiates the family's template with the
// node's shapes, dtypes, attributes and the launch geometry chosen here. For example
//
//   // k_h_rms_norm: node %h of @forward
//   // %h = rms_norm(%x, %w) {eps=1e-05} : bf16[4096,768]
//   // 4096 rows of 768, 8 elements per access, a warp per row, 8 rows per block
//   #include "kernels/rms_norm.cuh"
//
//   extern "C" __global__ void __launch_bounds__(256) k_h_rms_norm(
//       __nv_bfloat16* out, const __nv_bfloat16* x, const float* w) {
//     kiln::kernels::RmsNormForward<__nv_bfloat16, float, __nv_bfloat16, 4096LL, 768, 8, 32, 8>(
//         out, x, w, 0x1.4f8b58p-17f);
//   }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codegen/kernel_spec.h"
#include "codegen/lower_node.h"
#include "ir/graph.h"

namespace kiln::codegen::composite {

inline constexpr int kWarpSize = 32;
inline constexpr int kMaxThreadsPerBlock = 1024;
inline constexpr int kRowElementsPerThread = 32;
inline constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;

// Row lengths are `int` template arguments and chunk offsets are computed in int.
inline constexpr int64_t kMaxRowLength = int64_t{1} << 30;

int64_t CeilDiv(int64_t a, int64_t b);
int64_t RoundUp(int64_t a, int64_t multiple);

// What a generated wrapper needs besides the node: its family's header, module-scope
// declarations, the named parameters after `out`, and the call of the template.
struct Wrapper {
  std::string header;              // "rms_norm" for kernels/rms_norm.cuh
  std::string comment;             // geometry, in words
  std::string globals;             // module-scope declarations, may be empty
  std::vector<std::string> params; // one per operand, e.g. "const float* w"
  std::string call;                // "RmsNormForward<...>(out, x, w, eps)"
  std::string out_type;            // the output pointer's type; empty: the node's dtype
  // A multi-result node's output parameters, one per result in order (e.g. "float* lse");
  // empty for a node of one result, whose output is "T* out".
  std::vector<std::string> outputs;
};

std::string Param(DType t, absl::string_view name);

// A float attribute as an exact hexadecimal fp32 literal ("0x1.4f8b58p-17f"); valid C++ for
// every finite value, zero included.
std::string FloatLiteral(double v);
std::string DoubleLiteral(double v);

// "1 block", "256 blocks".
std::string Count(int64_t n, absl::string_view noun);

std::string Where(const Node& node);

absl::StatusOr<double> FiniteFloatAttr(const Node& node, absl::string_view name);

// Whether no kernel of the step writes `value`: a parameter of a module function that no
// output of it aliases (its buffer is then only ever written by the host, before the step).
// A kernel may read such a value before waiting for the kernels ahead of it
// (KernelSpec::waits_itself).
bool IsStepInvariant(const Node& value);

// Whether a kernel of `options` may read before its grid-dependency wait: programmatic
// dependent launch and CodegenOptions::reads_before_wait on, for a GPU that has griddepcontrol
// (sm_90 on).
bool EarlyReadsAllowed(const CodegenOptions& options);

// Elements per 16-byte access of the narrowest dtype, when `length` is a multiple of it
// (then every row of every dtype starts on a chunk boundary); else 1, the scalar path.
int ChunkWidth(int64_t length, const std::vector<DType>& dtypes);

// Geometry of the row kernels (norms, softmax, cross-entropy): a thread keeps at most
// kRowElementsPerThread elements of each row it caches in registers. A row short enough for
// a warp under that limit gets a warp (threads_per_block / 32 rows per block, reductions by
// shuffles only); a longer row gets a whole block, as many warps as the limit asks, up to
// 1024 threads. Past 1024 * 32 elements a row no longer fits the registers a 1024-thread
// block leaves each thread (64), nor past 1024 * 16 for kernels that cache two inputs
// (softmax_grad, rms_norm_grad_input): the excess spills to local memory, still correct.
struct RowGeometry {
  int vec = 1;
  int threads_per_row = kWarpSize;
  int rows_per_block = 1;
  int64_t blocks = 0;
  int block_threads() const { return threads_per_row * rows_per_block; }
};

RowGeometry ChooseRowGeometry(int64_t rows, int64_t length, int vec, const CodegenOptions& options);

std::string RowComment(int64_t rows, int64_t length, const RowGeometry& g);

// The template arguments every row kernel ends with.
std::string RowArgs(int64_t rows, int64_t length, const RowGeometry& g);

// The input-gradient norms {weight_grad=1} (rms_norm's and layer_norm's): the row kernel
// over `g`'s rows in fewer blocks, each summing a partial row of the weight gradient (and
// layer_norm's bias gradient) for a fold kernel to add in block order. About this many
// threads per SM (16 warps, the rows' loads keep the memory busy; llama-S's [16384, 768]: 256
// blocks of 8 rows x 8 groups), at most this many partial rows; the fold runs 32 columns x 8
// groups of partial rows per block.
inline constexpr int64_t kWeightGradThreadsPerSm = 512;
inline constexpr int64_t kMaxWeightGradPartials = 512;
inline constexpr int kWeightGradFoldThreads = 256;

// {weight_grad=1}?
bool WritesWeightGrad(const Node& node);

// Row groups per block and blocks of the {weight_grad=1} launch: `g` as the plain input
// gradient's (so dx is the same bits), fewer blocks that each run several of its blocks' rows.
struct WeightGradGeometry {
  int64_t row_groups = 1;
  int64_t blocks = 1;
};
WeightGradGeometry ChooseWeightGradGeometry(const RowGeometry& g, const CodegenOptions& options);

// The {weight_grad=1} lowering both norm families share: stage 1, the input-gradient row
// kernel over `g`'s rows in ChooseWeightGradGeometry's fewer blocks, each summing its rows'
// partial rows of the weight gradients into the node's scratch; stage 2, the fold adding them in
// block order. `family` names the header and the templates (`rms_norm`: RmsNormGradInputAndWeight
// and RmsNormWeightGradFold); `weight_grads` the gradient results after dx [and its copy]: {"dw"}
// for rms_norm, {"dw", "db"} for layer_norm (its stage 1 sums both; its fold takes 2 D columns).
struct NormFamily {
  std::string header;     // "rms_norm" or "layer_norm"
  std::string templates;  // "RmsNorm" or "LayerNorm"
  std::vector<std::string> weight_grads;
};
absl::StatusOr<LoweredNode> LowerNormGradInputAndWeight(const Node& node, const CodegenOptions& options,
                                                        const RowGeometry& g, const NormFamily& family);

struct Rows {
  int64_t count = 0;
  int64_t length = 0;
};
Rows RowsOf(const TensorType& t);

absl::Status CheckRowLength(const Node& node, int64_t length);

absl::Status CheckGrid(const Node& node, int64_t blocks);

KernelSpec Emit(const Node& node, const std::string& name, const Wrapper& w, int64_t blocks, int threads);

LoweredNode Kernels(std::vector<KernelSpec> kernels);

}  // namespace kiln::codegen::composite
