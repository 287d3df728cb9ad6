// Compiles every kernel of a function (or module): lowers each node (codegen/lower_node.h),
// compiles each distinct kernel body once with NVRTC, in parallel threads, through the
// on-disk cache. This is what `kiln compile --target sm_90a` and the GPU executable run.
//
// Distinct bodies: a kernel's source names its node (the kernel symbol and a comment), so
// the 16 layers of a model give 16 sources that differ only there. Sources equal once the
// opening comment lines are dropped and the symbol is replaced by a placeholder compile
// once: every such kernel runs from the cubin of the first one, under that one's symbol
// (CompiledKernel::name).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "codegen/kernel_cache.h"
#include "codegen/kernel_spec.h"
#include "codegen/lower_node.h"
#include "codegen/nvrtc_compiler.h"
#include "ir/graph.h"

namespace kiln {

struct NodeKernels {
  const Node* node = nullptr;
  LoweredNode lowered;
  // For each of lowered.kernels, its cubin: an index into KernelCompileReport::kernels. Launch
  // it as kernels[compiled[i]].name, with lowered.kernels[i]'s geometry.
  std::vector<int> compiled;
};

struct KernelCompileReport {
  std::vector<NodeKernels> nodes;       // every node, in definition order (function by function)
  std::vector<CompiledKernel> kernels;  // one per distinct kernel body
  int64_t num_kernels = 0;              // kernel launches of one run of every function
  int64_t num_distinct = 0;             // kernels.size()
  int64_t cache_hits = 0;               // distinct bodies read from the cache
  double nvrtc_seconds = 0;             // NVRTC time summed over threads (cache misses)
  double wall_seconds = 0;              // lowering + compiling, start to end
};

// `num_threads` <= 0: std::thread::hardware_concurrency(). `cache` may be null.
absl::StatusOr<KernelCompileReport> CompileFunctionKernels(const Function& f, const NvrtcOptions& options,
                                                           KernelCache* cache, int num_threads = 0,
                                                           const CodegenOptions& codegen = {});
// Every function of `module`, bodies shared across functions.
absl::StatusOr<KernelCompileReport> CompileModuleKernels(const Module& module, const NvrtcOptions& options,
                                                         KernelCache* cache, int num_threads = 0,
                                                         const CodegenOptions& codegen = {});

// The text two kernels with the same body share (the source without its opening comment
// lines, the symbol replaced by a placeholder).
std::string KernelBodyKey(const KernelSpec& kernel);

}  // namespace kiln
