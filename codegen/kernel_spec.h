// What codegen makes of one IR node (codegen/lower_node.h), for the GPU runtime to run.
//
// A kernel is a complete CUDA C++ translation unit with one `extern "C" __global__`
// function whose parameters are, in order: the node's output buffer (for a node of several
// results, one buffer per result, in result order, null where a result is not needed), then
// one pointer per operand (device memory, row-major, the operand's dtype), then, only when
// the node asks for scratch (LoweredNode::scratch_bytes), one pointer to that scratch, then,
// only when it asks for persistent bytes (LoweredNode::persistent_bytes), one pointer to
// those, and nothing else: every shape is a compile-time constant in the source (kiln shapes are
// static). Launch geometry is decided here, at compile time.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// The instructions that open every kernel when CodegenOptions::programmatic_dependent_launch
// (codegen/lower_node.h) holds: let the next kernel of the stream launch now, then wait for
// the kernels before this one to finish and flush their writes; nothing in global memory is
// read or written before.
inline constexpr char kGridDependencyWait[] = "  asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n";
inline constexpr char kGridDependencyLaunch[] = "  asm volatile(\"griddepcontrol.launch_dependents;\");\n";
inline constexpr char kGridDependencyPrologue[] =
    "  asm volatile(\"griddepcontrol.launch_dependents;\");\n"
    "  asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n";

struct KernelSpec {
  std::string name;    // the extern "C" symbol, unique within the source
  std::string source;  // CUDA C++; may #include kernel templates by their kernels/ path
  std::array<uint32_t, 3> grid{1, 1, 1};
  std::array<uint32_t, 3> block{1, 1, 1};
  uint32_t shared_bytes = 0;
  // The kernel opens with kGridDependencyPrologue (LowerNode puts it there): it executes
  // griddepcontrol.wait before it reads or writes global memory. The runtime then launches it
  // with programmatic dependent launch (runtime/cuda/kernel_launch.h): it may start while the
  // kernel ahead of it in the stream still runs.
  bool waits_for_grid_dependency = false;
  // The kernel executes griddepcontrol.launch_dependents itself, late (LowerNode's prologue
  // then opens it with the wait alone): a kernel whose loads lean on L1 (SmallMGemm's A) keeps
  // the next kernels' blocks, which programmatic launch would make resident early (their
  // shared memory taking L1's share of the SM), off its SMs while it streams.
  bool launches_dependents_itself = false;
  // The kernel executes griddepcontrol.wait itself (kernels/common.cuh, GridDependencyWait),
  // after reading only memory that no kernel of the step writes: parameters of the function
  // that no output aliases (codegen IsStepInvariant), such as a decode step's weights, block
  // tables and positions. LowerNode's prologue then opens it with launch_dependents alone, and
  // those reads overlap the kernels ahead instead of following them.
  bool waits_itself = false;
};

// A kernel compiled by NVRTC (codegen/nvrtc_compiler.h): what the runtime loads.
struct CompiledKernel {
  std::string name;   // the kernel symbol
  std::string cubin;  // ELF for the target's arch
  bool from_cache = false;
  // NVRTC's log when NvrtcOptions::ptxas_info asked for ptxas's resource report (registers,
  // spill stores and loads, stack); empty otherwise and for cached kernels.
  std::string log;
};

enum class LoweringKind {
  kInput,    // parameter: bound to an input buffer by the executable; no work
  kAlias,    // the output is operand 0's bytes reinterpreted (reshape): no work, no buffer
  kKernels,  // run `kernels` in order (e.g. zero-fill, then a scatter-add)
  kGemm,     // gemm: a cuBLASLt call planned by the runtime (runtime/cuda/gemm.h)
  kResult,   // get_result: written by its multi-result node's kernels; a buffer of its own, no launch
};

struct LoweredNode {
  LoweringKind kind = LoweringKind::kKernels;
  std::vector<KernelSpec> kernels;
  // What a profile groups these kernels under ("fused loop", "fused reduce_sum"); empty:
  // the node's op name.
  std::string label;
  // The kernels read each element of their operands only to write the same element of their
  // outputs, before writing it: an output may take an operand's buffer (a donated parameter
  // updated in place). With in_place_operand_of_results, only for the pairs it names: an
  // fp8_quantize with update_state=1 reads all of its state before its last block writes the
  // next state (kernels/fp8.cuh), which is as safe.
  bool elementwise_in_place = false;
  // Bytes the kernels need only while this node runs (a two-stage reduction's partials),
  // planned as the node's scratch (passes/buffer_plan.h: live at its step alone, 256-byte
  // aligned, contents undefined at the start). When > 0, every kernel of the node takes the
  // scratch pointer as its last parameter; the kernels pass data through it in launch
  // order (the runtime runs one node's kernels back to back on one stream).
  int64_t scratch_bytes = 0;
  // Bytes the node's kernels keep from one run of the function to the next, the node's own
  // (never shared with another buffer), zero when the executable is made: state that the
  // kernels return to zero themselves before each run ends (fuse-norm-between-gemvs' sums of
  // squares, which the last block to read them clears). When > 0, every kernel of the node
  // takes the pointer after the scratch's (or in its place, with no scratch).
  int64_t persistent_bytes = 0;
  // >= 0: the kernels read element i of this operand only to write element i of the node's one
  // result, before writing it, and read nothing else of it (or, one block, read all of it
  // before their first write: fp8_scale_update's history shift); so the result may take the
  // operand's buffer where the operand dies at this node and has the result's size
  // (cross_entropy_grad's dlogits over the logits, as llm.c writes them).
  int in_place_operand = -1;
  // The first copy_kernel_results.size() kernels only copy an in-place operand into a result
  // (kv_cache_write's pool copy): kernel j fills result copy_kernel_results[j] from
  // in_place_operand (a node of one result) or in_place_operand_of_results[that result], and
  // the launch list leaves it out where the plan gives the result that operand's buffer.
  std::vector<int> copy_kernel_results;
  // For a node of several results: one entry per result, the one operand whose buffer that
  // result may take, or -1 for none. With elementwise_in_place, the result is computed from it
  // element by element at the same index and may take it when donated: a grouped
  // adamw_update's result 3i+j is group i's p, m or v (operand 4i+{0,2,3}); another group's
  // operand is still being read by other blocks of the same launch. Without, as
  // in_place_operand is for one result (a cache_write fusion's pools, each written in place
  // by its own kv_cache_write). Empty: any operand (elementwise_in_place), or none.
  std::vector<int> in_place_operand_of_results;
};

}  // namespace kiln
