// Codegen's product for the GPU runtime: one Function compiled into a CompiledProgram
// (codegen/program.h) for a Target. The steps, in order:
//   1. lower every node and compile each distinct kernel body with NVRTC, through the
//      kernel cache (codegen/compile_function.h);
//   2. describe every gemm node for cuBLASLt (GemmDescriptionOf);
//   3. decide each node's buffer role and plan the arena (passes/buffer_plan.h), the GEMM
//      workspaces included;
//   4. write the launch list: the nodes some output needs, in order, then the finishing
//      copies (outputs held in parameter buffers, then donations).
// `kiln train` and `kiln eval` do this, then CudaExecutable::Load (frontends/gpu_compile.h
// ties the two together).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codegen/lower_node.h"
#include "codegen/program.h"
#include "ir/graph.h"
#include "passes/target.h"

namespace kiln {

struct ProgramOptions {
  Target target;               // the GPU: its arch for NVRTC, its SM count for grids
  std::string cache_dir;       // kernel cache (codegen/kernel_cache.h); empty: its default
  int compile_threads = 0;     // NVRTC threads; 0: one per core
  // Kernels open with griddepcontrol and launch programmatically (CodegenOptions).
  bool programmatic_dependent_launch = true;
  bool reads_before_wait = true;  // CodegenOptions::reads_before_wait
  CodegenOptions::PagedAttentionGeometry paged_attention;  // CodegenOptions::paged_attention
  std::vector<CodegenOptions::GemvShapeGeometry> gemv_shape_geometries;  // CodegenOptions::small_m_gemv_shape_geometries
};

// Errors name the node (an op codegen cannot lower, a dot_general that lower-gemm did not
// make a gemm, a gemm of dtypes cuBLASLt is not used for, an NVRTC failure with its log).
absl::StatusOr<CompiledProgram> CompileProgram(const Function& f, const ProgramOptions& options);

// The cuBLASLt description of one gemm node. InvalidArgument for a node that is not a gemm
// (a dot_general names the lower-gemm pass); Unimplemented for an epilogue or dtypes that are
// not planned (operands f32, bf16 or f16 alike, the result f32 or the operands' dtype; or, with
// the FP8 slots, fp8 operands, and for a result that is not fp8 a d_scale that is the
// constant 1). Whether cuBLASLt runs an fp8 description (its dtype combinations, the TN
// layout) GemmPlan::CheckSupported says (runtime/cuda/gemm.h), without a GPU.
absl::StatusOr<GemmDescription> GemmDescriptionOf(const Node& gemm);

// What cuBLASLt may use for its split-K and stream-K variants (NVIDIA suggests 32 MiB on
// Hopper): each GEMM's scratch in the plan. Scratch lives for its step alone, so the arena
// holds one such region however many GEMMs there are.
inline constexpr int64_t kGemmWorkspaceBytes = int64_t{32} << 20;

}  // namespace kiln
