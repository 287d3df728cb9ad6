// A compiled program: everything codegen decides about running one Function on a GPU, for
// the runtime to load and run without compiling or planning anything itself
// (runtime/cuda/executable.h). It holds
//   - the kernels' cubins, each distinct body once;
//   - the launch list: each step a kernel launch (which cubin, its geometry, its arguments),
//     a cuBLASLt GEMM (its description), or a device copy (the finish: outputs held in
//     parameter buffers, then donations), in run order;
//   - the memory plan (passes/buffer_plan.h): every buffer's offset in one arena, the GEMM
//     workspaces included.
// Arguments name buffers by the node whose value they hold, so the runtime turns each into an
// address with the plan and nothing else. This header is the whole interface between the two
// layers: the runtime includes it and calls nothing of codegen (kiln_cuda does not link
// kiln_codegen).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "codegen/kernel_spec.h"
#include "ir/graph.h"
#include "passes/buffer_plan.h"

namespace kiln {

// One gemm node (ir/op_table.h) as cuBLASLt needs it: D = alpha A B + beta C per batch.
struct GemmDescription {
  int64_t batch = 1, m = 1, n = 1, k = 1;
  bool a_k_inner = true;  // a is [batch, M, K] (mk); else [batch, K, M] (km)
  bool b_k_inner = true;  // b is [batch, N, K] (nk); else [batch, K, N] (kn)
  float alpha = 1.0f, beta = 0.0f;
  DType a_dtype = DType::kBF16, b_dtype = DType::kBF16, d_dtype = DType::kF32;
  // epilogue=bias: a vector [n] added to each row of D (cuBLASLt's CUBLASLT_EPILOGUE_BIAS).
  bool bias = false;
  DType bias_dtype = DType::kF32;
  // scaled=1 (an FP8 GEMM: a and b f8e4m3/f8e5m2): three f32 scalars on the device, a_scale,
  // b_scale and d_scale, and D = d_scale (alpha a_scale b_scale A B + beta C). d_scale is read
  // only for an fp8 D: cuBLASLt (CUDA 13) refuses CUBLASLT_MATMUL_DESC_D_SCALE_POINTER for any
  // other, so GemmDescriptionOf admits there only a d_scale that is the constant 1.
  bool scaled = false;
  // amax=1: the gemm's second result, an f32 scalar, max |alpha a_scale b_scale A B + beta C|
  // before d_scale (cuBLASLt's CUBLASLT_MATMUL_DESC_AMAX_D_POINTER), for an fp8 D only: the
  // plan refuses it for another (GemmPlan::CheckSupported).
  bool amax = false;
  // The most workspace cuBLASLt's algorithm may use; the plan reserves this much scratch.
  int64_t max_workspace_bytes = 0;
  std::string context;  // "%name (gemm)", for errors
};

struct ProgramStep {
  enum class Kind { kKernel, kGemm, kCopy };
  // A kGemm step's args, in order: D (the gemm node, or its result 0 with amax=1), a, b, c
  // (-1 when beta is 0), bias (-1 without epilogue=bias), a_scale, b_scale, d_scale (-1
  // without scaled=1), amax (its result 1; -1 without amax=1).
  enum GemmArg : int { kGemmOut, kGemmA, kGemmB, kGemmC, kGemmBias, kGemmAScale, kGemmBScale, kGemmDScale, kGemmAmax,
                       kGemmArgs };
  Kind kind = Kind::kKernel;
  // The node it computes (errors, profiles); null for the finishing copies.
  const Node* node = nullptr;
  // kKernel: the cubin (an index into CompiledProgram::kernels, launched under that cubin's
  // symbol) and the launch geometry; `label` is what a profile groups it under.
  int kernel = -1;
  KernelSpec launch;  // name and geometry; the source is dropped
  std::string label;
  // kKernel: the outputs (one per result, -1 where a result is not needed), then the
  // operands; kGemm: the buffers GemmArg lists, -1 where one is left out. Node indices
  // into the function's nodes(), whose buffers the plan gives.
  std::vector<int64_t> args;
  // kGemm
  GemmDescription gemm;
  // kGemm: the plan's buffer for the workspace; kKernel: for the node's scratch
  // (LoweredNode::scratch_bytes), passed after `args`; -1 for none.
  int64_t scratch_buffer = -1;
  // kKernel: the plan's buffer for the node's persistent bytes (LoweredNode::persistent_bytes),
  // passed after the scratch; -1 for none.
  int64_t persistent_buffer = -1;
  // kCopy: buffer indices of the plan, the byte count, and what it is for.
  int64_t dst_buffer = -1, src_buffer = -1, bytes = 0;
  std::string what;
};

struct CompiledProgram {
  const Function* function = nullptr;
  std::vector<CompiledKernel> kernels;  // one per distinct kernel body
  std::vector<ProgramStep> steps;
  BufferPlan plan;
  // How the compile went: distinct kernels read from the kernel cache, the launch count,
  // and the compile's phases in order ({"codegen + NVRTC (...)", 1.2}, {"memory plan", ...}).
  int64_t cache_hits = 0;
  int64_t num_launches = 0;
  int64_t num_gemms = 0;
  std::vector<std::pair<std::string, double>> phases;
};

}  // namespace kiln
