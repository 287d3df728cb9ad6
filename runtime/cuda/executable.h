// One compiled program (codegen/program.h) loaded onto one GPU: a flat list of steps (kernel
// launches, cuBLASLt GEMMs, device copies) over byte offsets in ONE arena
// (passes/buffer_plan.h), run in order on the device's stream. Codegen decided everything
// (kernels, launch list, memory plan, GEMM descriptions); Load allocates the arena, loads the
// cubins, plans the GEMMs with cuBLASLt and resolves every argument to an address. Run only
// enqueues. Nothing here compiles: frontends/gpu_compile.h compiles, then loads.
//
// Parameters have fixed buffers: SetInput writes one, and Run leaves every donated output
// (Function::output_aliases) in its parameter's buffer, so parameters and optimizer state
// stay on the device from one run to the next.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codegen/program.h"
#include "ir/graph.h"
#include "passes/buffer_plan.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/gemm.h"
#include "runtime/cuda/kernel_launch.h"
#include "ir/host_tensor.h"
#include "runtime/step_profile.h"

namespace kiln {

struct CudaExecutableOptions {
  // Fill the arena with 0xFF bytes (NaN for every float width) before the first run, so a
  // kernel that fails to write part of its output shows up as NaNs.
  bool poison_arena = false;
  // Synchronize after every step, so that an asynchronous fault (a bad address in a kernel)
  // is reported for the step that caused it. Slow: for debugging.
  // Implies running without a CUDA graph.
  bool check_each_step = false;
  // Capture the run once as a CUDA graph and replay it. false launches the same steps one by
  // one (`--no-cuda-graph`), for debugging and for telling a capture problem from a kernel's.
  bool cuda_graph = true;
  // Time cuBLASLt's candidate algorithms for each distinct GEMM on the arena's buffers at
  // load and keep the fastest (GemmPlan::Autotune); false keeps the heuristic's first choice.
  bool autotune_gemms = true;
  // Where autotuning's choices persist between runs, by key (frontends/gpu_compile.cc backs
  // them with the kernel cache). Unset, a choice is kept for this process only.
  std::function<std::optional<std::string>(const std::string& key)> load_tuning;
  std::function<void(const std::string& key, const std::string& value)> save_tuning;
  // Parameters whose buffers the caller owns, by parameter index: device memory of at least
  // the parameter type's num_bytes(), aligned to 256 bytes, outliving the executable. The
  // arena leaves them out, so several executables can share one copy: the inference
  // functions of a model (frontends/generator.h) bind the same weights and KV pool. A donated
  // output of a bound parameter lands in the bound memory, as it would in the arena.
  absl::flat_hash_map<int64_t, void*> bound_parameters;
};


class CudaExecutable {
 public:
  ~CudaExecutable();
  // `program.function` must outlive the executable.
  static absl::StatusOr<std::unique_ptr<CudaExecutable>> Load(CompiledProgram program, CudaDevice& device,
                                                               const CudaExecutableOptions& options = {});

  // Host -> the parameter's buffer, encoded in its dtype. The type must match exactly.
  absl::Status SetInput(int64_t param_index, const HostTensor& value);
  // The parameter's buffer set to zeros (of any dtype, +0 is all zero bits) on the device.
  absl::Status ZeroInput(int64_t param_index);
  // Every step on the stream, then the donations; synchronizes at the end (between runs, never
  // inside one). With options.cuda_graph, the first call captures and later calls replay.
  absl::Status Run();
  // Run without the synchronization: the run is queued on the device's stream behind what is
  // there and Enqueue returns at once. The caller synchronizes (an asynchronous fault of a
  // step surfaces there) before it reads an output or runs again from the host's inputs;
  // work it queues on the same stream meanwhile (copies in and out, the next run) is ordered
  // after this run. The inference engine pipelines decode steps with it.
  absl::Status Enqueue();
  // With options.cuda_graph: captures the run into its graph now (else the first Enqueue
  // does), so that the first call replays like every later one; the inference engine does it
  // as it loads a function, a setup cost of the function, not of its first call. A no-op
  // without a graph, or once captured.
  absl::Status Prepare();
  // Run, and where the time went: the same results as Run. With options.cuda_graph, the graph
  // replayed once under CUPTI's activity trace (runtime/cuda/activity_trace.h), each step's
  // span and exposed time as it ran in the graph; without a graph, or where CUPTI is absent or
  // its trace does not match the steps, the steps launched one by one between CUDA events
  // (slower: no graph, an event a step), and profile_fallback() says why. For --trace/--report.
  absl::StatusOr<std::vector<StepTiming>> Profile();
  // Why the last Profile launched one by one although a graph was wanted; empty otherwise.
  const std::string& profile_fallback() const { return profile_fallback_; }
  // Device -> host. Output(i) is the value of output i of the last Run.
  absl::StatusOr<HostTensor> Output(int i) const;
  absl::StatusOr<HostTensor> Input(int64_t param_index) const;
  // Where parameter `param_index`'s buffer is in the arena (its type's num_bytes(), encoded
  // in its dtype), for a caller that fills it on the device between runs; and where output i
  // of the last Run is (until the next Run). frontends/compile.h's device-buffer runs use them.
  absl::StatusOr<void*> InputAddress(int64_t param_index) const;
  absl::StatusOr<const void*> OutputAddress(int i) const;

  struct Stats {
    int64_t kernels = 0;           // kernel launches per run (GEMM operand transposes included)
    int64_t gemms = 0;             // cuBLASLt calls per run
    int64_t distinct_kernels = 0;  // cubins loaded
    int64_t cache_hits = 0;        // of those, read from the kernel cache
    int64_t arena_bytes = 0;
    double compile_seconds = 0;    // the program's compile and Load, end to end
    // The program's compile phases, Load's, then the capture, in order: {"codegen + NVRTC", 1.2}, ...
    std::vector<std::pair<std::string, double>> phases;
    int64_t graph_nodes = 0;       // nodes of the captured CUDA graph; 0 before the first Run
    // Bytes a run moves, counted from the plan: for every node that launches work, the bytes
    // of each buffer it reads or writes once (operands, results; a GEMM's A, B, C and D; both
    // sides of a copy). A floor for the DRAM traffic: it ignores re-reads (a GEMM's tiles, a
    // reduction's second pass) and whatever L2 keeps.
    int64_t bytes_moved = 0;
    // Each distinct GEMM autotuned at load: what it is, how many calls of the run share it,
    // and what the timing found (in the program's order of first use).
    struct GemmTuningRecord {
      std::string gemm;  // "M16384 N768 K2048 mk,kn beta=1 bf16->f32"
      int64_t calls = 0;
      GemmPlan::Tuning tuning;  // only `chosen` when from_cache
      bool from_cache = false;  // the choice of an earlier run on this GPU (the kernel cache)
    };
    std::vector<GemmTuningRecord> gemm_tuning;
  };
  const Stats& stats() const { return stats_; }
  const BufferPlan& buffer_plan() const { return plan_; }
  const Function& function() const { return *function_; }

 private:
  // A program step resolved to addresses.
  struct Step {
    const ProgramStep* program = nullptr;  // what it is: kind, node, label, copy purpose
    const KernelLaunch* launch = nullptr;  // kernel
    const KernelLibrary* library = nullptr;  // kernel: its cubin, whose symbol a trace names
    std::vector<void*> pointers;           // kernel: outputs, operands (then its scratch)
    const GemmPlan* gemm = nullptr;
    GemmBuffers gemm_buffers;
    void* dst = nullptr;                   // copy
    const void* src = nullptr;
  };

  CudaExecutable(const Function& f, CudaDevice& device) : function_(&f), device_(&device) {}
  // Records every step into graph_exec_; an error names the step that broke the capture.
  absl::Status Capture();
  absl::Status EnqueueAll(bool check_each_step) const;
  // Whether a call replays the captured graph (else it enqueues step by step).
  bool ReplaysGraph() const { return options_.cuda_graph && !options_.check_each_step; }
  // *ran: whether the graph was launched (a failure after that must not run the step again).
  absl::StatusOr<std::vector<StepTiming>> ProfileInGraph(bool* ran);
  absl::StatusOr<std::vector<StepTiming>> ProfileOneByOne();
  // A step's name, group, node and scope for a profile (times left 0).
  StepTiming DescribeStep(const Step& step) const;
  absl::Status BuildSteps();
  // Autotunes `gemm` (a plan of step `ps`, resolved to `buffers`) unless a GEMM of the same
  // description was tuned already, whose choice it then takes; `tuned` maps descriptions to
  // their records in stats_.gemm_tuning.
  absl::Status TuneGemm(const ProgramStep& ps, GemmPlan& gemm, const GemmBuffers& buffers,
                        absl::flat_hash_map<std::string, int>* tuned);
  // What autotuning writes between timed calls so that each starts from a cold L2 (twice
  // L2's size, allocated at the first tuning and freed when BuildSteps ends); empty (timed
  // warm) where the device has no memory to spare for it.
  GemmL2Flush AutotuneL2Flush();
  absl::Status EnqueueStep(const Step& step) const;
  static std::string StepContext(const Step& step);  // "%h (exp)" or the copy's purpose
  char* BufferAddress(int64_t buffer) const { return buffer_address_[buffer]; }
  // Every buffer's address: bound parameters where the caller put them, the rest in the
  // arena, whose planned offsets close up over the bound parameters' space. Returns the
  // arena's size.
  absl::StatusOr<int64_t> PlaceBuffers();
  char* NodeAddress(const Node* node) const { return BufferAddress(plan_.node_buffer[index_of_.at(node)]); }
  // The address of node `index`'s buffer; null for -1 (an argument left out).
  void* ArgAddress(int64_t index) const {
    return index < 0 ? nullptr : BufferAddress(plan_.node_buffer[index]);
  }
  absl::StatusOr<const Node*> ParameterNode(int64_t param_index) const;
  absl::StatusOr<HostTensor> Download(const TensorType& type, const void* src, absl::string_view what) const;

  const Function* function_;
  CudaDevice* device_;
  CudaExecutableOptions options_;
  CompiledProgram program_;
  const BufferPlan& plan_ = program_.plan;
  DeviceMemory arena_;
  DeviceMemory gemm_l2_flush_;  // see AutotuneL2Flush
  int64_t gemm_l2_flush_bytes_ = -1;  // -1: not yet tried
  std::vector<char*> buffer_address_;  // by plan_.buffers index
  std::vector<std::unique_ptr<KernelLibrary>> libraries_;
  std::vector<std::unique_ptr<KernelLaunch>> launches_;
  std::vector<std::unique_ptr<GemmPlan>> gemms_;
  std::vector<Step> steps_;
  absl::flat_hash_map<const Node*, int64_t> index_of_;  // position in function_->nodes()
  std::vector<int64_t> node_index_of_parameter_;       // by parameter index
  Stats stats_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t graph_exec_ = nullptr;
  std::string profile_fallback_;  // why the last Profile did not trace the graph
};

}  // namespace kiln
