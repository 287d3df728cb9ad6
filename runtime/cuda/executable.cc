#include "runtime/cuda/executable.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"
#include "runtime/cuda/activity_trace.h"
#include "runtime/cuda/cuda_status.h"
#include "runtime/tensor_bytes.h"

namespace kiln {
namespace {

std::string ParameterContext(const Node& p) {
  return absl::StrCat("parameter %", p.name(), ": ", p.type().ToString());
}

// `error`, saying which node it was for.
absl::Status ForNode(const absl::Status& error, const Node& node) {
  return absl::Status(error.code(), absl::StrCat(error.message(), " (for ", NodeContext(node), ")"));
}

// Seconds since `*since`, which moves to now: consecutive calls time consecutive phases.
double Lap(std::chrono::steady_clock::time_point* since) {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - *since).count();
  *since = now;
  return seconds;
}

// "gemm 16x1024x1024x64 (batch x M x N x K)": GEMMs of one shape share a name in a trace.
std::string GemmName(const GemmDescription& g) {
  return absl::StrCat("gemm ", g.batch, "x", g.m, "x", g.n, "x", g.k);
}

// Everything cuBLASLt's choice of algorithm depends on (GEMMs that agree share one tuning).
// (The FP8 parts are written only for a gemm that has them, so the keys of the others, kept
// on disk, stay what they were.)
std::string GemmTuningKey(const GemmDescription& g) {
  const bool fp8 = g.a_dtype != g.b_dtype || g.scaled || g.amax;
  return absl::StrCat(g.batch > 1 ? absl::StrCat("batch ", g.batch, " ") : "", "M", g.m, " N", g.n, " K", g.k, " ",
                      g.a_k_inner ? "mk" : "km", ",", g.b_k_inner ? "nk" : "kn", " alpha=", g.alpha, " beta=", g.beta,
                      " ", DTypeName(g.a_dtype), fp8 ? absl::StrCat("x", DTypeName(g.b_dtype)) : "", "->",
                      DTypeName(g.d_dtype), g.bias ? absl::StrCat(" +bias ", DTypeName(g.bias_dtype)) : "",
                      g.scaled ? " scaled" : "", g.amax ? " +amax" : "", " ws=", g.max_workspace_bytes);
}

// Autotuning's choices made in this process, by store key (see TuneGemm).
absl::Mutex tuning_mutex(absl::kConstInit);
absl::flat_hash_map<std::string, std::string>& TuningsKept() ABSL_EXCLUSIVE_LOCKS_REQUIRED(tuning_mutex) {
  static auto* kept = new absl::flat_hash_map<std::string, std::string>();
  return *kept;
}

std::optional<std::string> KeptTuning(const std::string& key) {
  absl::MutexLock lock(&tuning_mutex);
  auto it = TuningsKept().find(key);
  if (it == TuningsKept().end()) return std::nullopt;
  return it->second;
}

void KeepTuning(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&tuning_mutex);
  TuningsKept()[key] = value;
}

}  // namespace

CudaExecutable::~CudaExecutable() {
  // Errors here cannot be reported, and the arena goes right after.
  if (graph_exec_ != nullptr) cudaGraphExecDestroy(graph_exec_);
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
}

absl::StatusOr<std::unique_ptr<CudaExecutable>> CudaExecutable::Load(CompiledProgram program, CudaDevice& device,
                                                                     const CudaExecutableOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto phase_start = start;
  if (program.function == nullptr) return absl::InvalidArgumentError("a compiled program without its function");
  const Function& f = *program.function;
  RETURN_IF_ERROR(device.MakeCurrent());
  std::unique_ptr<CudaExecutable> exe(new CudaExecutable(f, device));
  exe->options_ = options;
  exe->program_ = std::move(program);
  for (int64_t i = 0; i < f.num_nodes(); ++i) exe->index_of_[f.nodes()[i].get()] = i;
  for (const Node* p : f.parameters()) exe->node_index_of_parameter_.push_back(exe->index_of_.at(p));
  if (static_cast<int64_t>(exe->plan_.node_buffer.size()) != f.num_nodes()) {
    return absl::InvalidArgumentError(absl::StrCat("the program's memory plan has ", exe->plan_.node_buffer.size(),
                                                   " nodes; @", f.name(), " has ", f.num_nodes()));
  }
  exe->stats_.phases = exe->program_.phases;
  double compile_seconds = 0;
  for (const auto& [phase, seconds] : exe->program_.phases) compile_seconds += seconds;

  ASSIGN_OR_RETURN(const int64_t arena_bytes, exe->PlaceBuffers());
  if (options.poison_arena) {
    KILN_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(exe->arena_.get(), 0xFF, arena_bytes, device.stream()),
                              "poisoning the arena");
    KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(device.stream()), "poisoning the arena");
  }
  // Persistent bytes start at zero; their kernels leave them so at the end of every run.
  for (size_t b = 0; b < exe->plan_.buffers.size(); ++b) {
    if (exe->plan_.buffers[b].kind != PlannedBuffer::Kind::kPersistent) continue;
    KILN_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(exe->BufferAddress(static_cast<int64_t>(b)), 0,
                                              exe->plan_.buffers[b].bytes, device.stream()),
                              "zeroing the persistent bytes");
  }
  KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(device.stream()), "zeroing the persistent bytes");
  exe->stats_.phases.emplace_back("arena allocation", Lap(&phase_start));
  RETURN_IF_ERROR(exe->BuildSteps());
  exe->stats_.phases.emplace_back("kernel loading and cuBLASLt plans", Lap(&phase_start));
  exe->stats_.cache_hits = exe->program_.cache_hits;
  exe->stats_.arena_bytes = arena_bytes;
  exe->stats_.compile_seconds =
      compile_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return exe;
}

absl::StatusOr<int64_t> CudaExecutable::PlaceBuffers() {
  const int64_t alignment = 256;  // BufferPlanRequest's, and what cudaMalloc and cuBLASLt want
  absl::flat_hash_map<int64_t, char*> bound;  // buffer -> the caller's memory
  for (const auto& [param_index, address] : options_.bound_parameters) {
    ASSIGN_OR_RETURN(const Node* p, ParameterNode(param_index));
    if (address == nullptr || reinterpret_cast<uintptr_t>(address) % alignment != 0) {
      return absl::InvalidArgumentError(absl::StrCat("@", function_->name(), " ", ParameterContext(*p),
                                                     ": its bound memory must be a non-null address aligned to ",
                                                     alignment, " bytes"));
    }
    bound[plan_.node_buffer[index_of_.at(p)]] = static_cast<char*>(address);
  }
  // Parameters come first in the plan (offsets [0, parameter_bytes)); the unbound ones are
  // packed at the arena's start and every other buffer moves down by the bound bytes, by a
  // multiple of the alignment so that each keeps its own.
  std::vector<int64_t> offset(plan_.buffers.size(), -1);
  int64_t packed = 0, first_other = plan_.arena_bytes;
  for (size_t b = 0; b < plan_.buffers.size(); ++b) {
    const PlannedBuffer& buffer = plan_.buffers[b];
    if (buffer.kind != PlannedBuffer::Kind::kParameter) {
      first_other = std::min(first_other, buffer.offset);
    } else if (!bound.contains(static_cast<int64_t>(b))) {
      offset[b] = packed;
      packed += (buffer.bytes + alignment - 1) / alignment * alignment;
    }
  }
  const int64_t shift = bound.empty() ? 0 : std::max<int64_t>(0, (first_other - packed) / alignment * alignment);
  const int64_t arena_bytes = plan_.arena_bytes - shift;
  ASSIGN_OR_RETURN(void* arena, device_->Allocate(std::max<int64_t>(arena_bytes, 1),
                                                  absl::StrCat("the arena of @", function_->name(), " (",
                                                               plan_.Summary(), ")")));
  arena_.reset(arena);
  buffer_address_.resize(plan_.buffers.size());
  for (size_t b = 0; b < plan_.buffers.size(); ++b) {
    if (auto it = bound.find(static_cast<int64_t>(b)); it != bound.end()) {
      buffer_address_[b] = it->second;
    } else if (bound.empty()) {
      buffer_address_[b] = static_cast<char*>(arena) + plan_.buffers[b].offset;
    } else {
      buffer_address_[b] = static_cast<char*>(arena) + (offset[b] >= 0 ? offset[b] : plan_.buffers[b].offset - shift);
    }
  }
  return arena_bytes;
}

absl::Status CudaExecutable::TuneGemm(const ProgramStep& ps, GemmPlan& gemm, const GemmBuffers& buffers,
                                      absl::flat_hash_map<std::string, int>* tuned) {
  const std::string key = GemmTuningKey(ps.gemm);
  if (auto it = tuned->find(key); it != tuned->end()) {
    ++stats_.gemm_tuning[it->second].calls;
    return gemm.UseCandidate(stats_.gemm_tuning[it->second].tuning.chosen);
  }
  // A choice made once is kept (in this process, and through the options' store beside the
  // kernels on disk, keyed by the GPU and cuBLASLt's version), so that every run on this
  // machine takes the same algorithms: timing noise must not make two runs of one seed round
  // differently.
  const std::string store_key =
      absl::StrCat("gemm tuning v2 (cold L2): ", key, " on ", device_->name(), ", cublasLt ", cublasLtGetVersion());
  std::optional<std::string> kept = KeptTuning(store_key);
  if (!kept.has_value() && options_.load_tuning) kept = options_.load_tuning(store_key);
  int rank = -1;
  if (kept.has_value() && absl::SimpleAtoi(*kept, &rank) && rank >= 0 && rank < gemm.num_candidates()) {
    RETURN_IF_ERROR(gemm.UseCandidate(rank));
    KeepTuning(store_key, *kept);
    tuned->emplace(key, static_cast<int>(stats_.gemm_tuning.size()));
    stats_.gemm_tuning.push_back({key, 1, GemmPlan::Tuning{.chosen = rank}, /*from_cache=*/true});
    return absl::OkStatus();
  }
  // Timing overwrites the output (and the amax): only step-local values may take them (never
  // a parameter's buffer, whose contents the run starts from).
  for (const int arg : {ProgramStep::kGemmOut, ProgramStep::kGemmAmax}) {
    if (ps.args[arg] < 0) continue;
    const int64_t buffer = plan_.node_buffer[ps.args[arg]];
    if (buffer < 0 || plan_.buffers[buffer].kind != PlannedBuffer::Kind::kValue) return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(GemmPlan::Tuning tuning, gemm.Autotune(buffers, device_->stream(), AutotuneL2Flush()));
  if (tuning.candidates > 0) {
    KeepTuning(store_key, absl::StrCat(tuning.chosen));
    if (options_.save_tuning) options_.save_tuning(store_key, absl::StrCat(tuning.chosen));
  }
  tuned->emplace(key, static_cast<int>(stats_.gemm_tuning.size()));
  stats_.gemm_tuning.push_back({key, 1, tuning, /*from_cache=*/false});
  return absl::OkStatus();
}

GemmL2Flush CudaExecutable::AutotuneL2Flush() {
  if (gemm_l2_flush_bytes_ < 0) {
    gemm_l2_flush_bytes_ = 0;
    int l2_bytes = 0;
    if (cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device_->ordinal()) == cudaSuccess &&
        l2_bytes > 0 && device_->free_bytes() > 8 * static_cast<int64_t>(l2_bytes)) {
      absl::StatusOr<void*> flush = device_->Allocate(2 * static_cast<int64_t>(l2_bytes), "cuBLASLt autotuning's L2 flush");
      if (flush.ok()) {
        gemm_l2_flush_.reset(*flush);
        gemm_l2_flush_bytes_ = 2 * static_cast<int64_t>(l2_bytes);
      }
    }
    cudaGetLastError();  // a refused attribute or allocation leaves tuning warm, not the run failed
  }
  return {.buffer = gemm_l2_flush_.get(), .bytes = gemm_l2_flush_bytes_};
}

absl::Status CudaExecutable::BuildSteps() {
  absl::Cleanup free_l2_flush = [this] { gemm_l2_flush_.reset(); };
  const CompiledProgram& program = program_;
  absl::flat_hash_map<std::string, int> tuned;  // GemmTuningKey -> its record in stats_.gemm_tuning
  std::vector<const KernelLibrary*> library_of(program.kernels.size(), nullptr);  // each cubin loaded once
  const Node* counted = nullptr;  // the node whose buffers bytes_moved counted last
  for (const ProgramStep& ps : program.steps) {
    Step step{.program = &ps};
    if (ps.kind == ProgramStep::Kind::kCopy) {
      stats_.bytes_moved += 2 * ps.bytes;
    } else if (ps.node != counted) {  // a node's second kernel (a two-stage reduction) reads the same
      counted = ps.node;
      for (int64_t arg : ps.args) {
        if (arg >= 0) stats_.bytes_moved += function_->nodes()[arg]->type().num_bytes();
      }
    }
    switch (ps.kind) {
      case ProgramStep::Kind::kGemm: {
        if (ps.args.size() != ProgramStep::kGemmArgs) {
          return absl::InvalidArgumentError(
              absl::StrCat(ps.gemm.context, ": a GEMM step takes ", int{ProgramStep::kGemmArgs}, " buffers"));
        }
        absl::StatusOr<std::unique_ptr<GemmPlan>> plan = GemmPlan::Create(ps.gemm, *device_);
        if (!plan.ok()) return plan.status();
        gemms_.push_back(*std::move(plan));
        GemmPlan& gemm = *gemms_.back();
        step.gemm = &gemm;
        step.gemm_buffers = {.out = ArgAddress(ps.args[ProgramStep::kGemmOut]),
                             .a = ArgAddress(ps.args[ProgramStep::kGemmA]),
                             .b = ArgAddress(ps.args[ProgramStep::kGemmB]),
                             .c = ArgAddress(ps.args[ProgramStep::kGemmC]),
                             .bias = ArgAddress(ps.args[ProgramStep::kGemmBias]),
                             .a_scale = ArgAddress(ps.args[ProgramStep::kGemmAScale]),
                             .b_scale = ArgAddress(ps.args[ProgramStep::kGemmBScale]),
                             .d_scale = ArgAddress(ps.args[ProgramStep::kGemmDScale]),
                             .amax = ArgAddress(ps.args[ProgramStep::kGemmAmax]),
                             .scratch = ps.scratch_buffer >= 0 ? BufferAddress(ps.scratch_buffer) : nullptr};
        ++stats_.gemms;
        if (options_.autotune_gemms) RETURN_IF_ERROR(TuneGemm(ps, gemm, step.gemm_buffers, &tuned));
        break;
      }
      case ProgramStep::Kind::kKernel: {
        if (ps.kernel < 0 || ps.kernel >= static_cast<int>(program.kernels.size())) {
          return absl::InvalidArgumentError(absl::StrCat(NodeContext(*ps.node), ": kernel ", ps.kernel,
                                                         " is not one of the program's ", program.kernels.size()));
        }
        if (library_of[ps.kernel] == nullptr) {
          absl::StatusOr<std::unique_ptr<KernelLibrary>> library = KernelLibrary::Load(program.kernels[ps.kernel]);
          if (!library.ok()) return ForNode(library.status(), *ps.node);
          library_of[ps.kernel] = library->get();
          libraries_.push_back(*std::move(library));
        }
        absl::StatusOr<KernelLaunch> launch = PrepareLaunch(*library_of[ps.kernel], ps.launch, device_->ordinal());
        if (!launch.ok()) return ForNode(launch.status(), *ps.node);
        launches_.push_back(std::make_unique<KernelLaunch>(*std::move(launch)));
        step.launch = launches_.back().get();
        step.library = library_of[ps.kernel];
        for (int64_t arg : ps.args) step.pointers.push_back(ArgAddress(arg));
        if (ps.scratch_buffer >= 0) step.pointers.push_back(BufferAddress(ps.scratch_buffer));
        if (ps.persistent_buffer >= 0) step.pointers.push_back(BufferAddress(ps.persistent_buffer));
        ++stats_.kernels;
        break;
      }
      case ProgramStep::Kind::kCopy:
        step.dst = BufferAddress(ps.dst_buffer);
        step.src = BufferAddress(ps.src_buffer);
        break;
    }
    steps_.push_back(std::move(step));
  }
  stats_.distinct_kernels += static_cast<int64_t>(libraries_.size());
  return absl::OkStatus();
}

absl::Status CudaExecutable::EnqueueStep(const Step& step) const {
  const cudaStream_t stream = device_->stream();
  switch (step.program->kind) {
    case ProgramStep::Kind::kKernel:
      return EnqueueLaunch(*step.launch, step.pointers, stream, NodeContext(*step.program->node));
    case ProgramStep::Kind::kGemm:
      return step.gemm->Enqueue(step.gemm_buffers, stream);
    case ProgramStep::Kind::kCopy:
      if (step.program->bytes == 0 || step.dst == step.src) return absl::OkStatus();
      KILN_RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(step.dst, step.src, step.program->bytes, cudaMemcpyDeviceToDevice, stream),
          step.program->what);
      return absl::OkStatus();
  }
  return absl::InternalError("unknown step kind");
}

absl::Status CudaExecutable::EnqueueAll(bool check_each_step) const {
  for (const Step& step : steps_) {
    RETURN_IF_ERROR(EnqueueStep(step));
    if (check_each_step) {
      KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(device_->stream()),
                                absl::StrCat("running @", function_->name(), ", after ", StepContext(step)));
    }
  }
  return absl::OkStatus();
}

std::string CudaExecutable::StepContext(const Step& step) {
  return step.program->node != nullptr ? NodeContext(*step.program->node) : step.program->what;
}

absl::Status CudaExecutable::Capture() {
  const auto start = std::chrono::steady_clock::now();
  const cudaStream_t stream = device_->stream();
  const std::string what = absl::StrCat("capturing @", function_->name(), " into a CUDA graph");
  // Thread-local mode: another thread's unsafe call (cudaMalloc, a sync) does not break this
  // capture, and this thread's unsafe calls are reported right here.
  KILN_RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), what);
  absl::Status broken;
  for (const Step& step : steps_) {
    broken = EnqueueStep(step);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (broken.ok()) {
      const cudaError_t e = cudaStreamIsCapturing(stream, &capture);
      if (e != cudaSuccess) broken = CudaStatus(e, "cudaStreamIsCapturing", "checking the capture");
      else if (capture != cudaStreamCaptureStatusActive) broken = absl::InternalError("the capture was invalidated");
    }
    if (!broken.ok()) {
      broken = absl::Status(broken.code(), absl::StrCat(what, ": ", StepContext(step), " broke it: ", broken.message(),
                                                        ". `--no-cuda-graph` runs the same launches without a graph"));
      break;
    }
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!broken.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // the capture's error is reported above, not by the next call
    return broken;
  }
  KILN_RETURN_IF_CUDA_ERROR(end, what);
  graph_ = graph;
  KILN_RETURN_IF_CUDA_ERROR(cudaGraphInstantiate(&graph_exec_, graph_, 0), what);
  // Uploading now keeps the first replay's setup out of the first step.
  KILN_RETURN_IF_CUDA_ERROR(cudaGraphUpload(graph_exec_, stream), what);
  size_t nodes = 0;
  KILN_RETURN_IF_CUDA_ERROR(cudaGraphGetNodes(graph_, nullptr, &nodes), what);
  stats_.graph_nodes = static_cast<int64_t>(nodes);
  stats_.phases.emplace_back("CUDA graph capture", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return absl::OkStatus();
}

absl::Status CudaExecutable::Prepare() {
  if (!ReplaysGraph() || graph_exec_ != nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(device_->MakeCurrent());
  return Capture();
}

absl::Status CudaExecutable::Enqueue() {
  RETURN_IF_ERROR(device_->MakeCurrent());
  RETURN_IF_ERROR(Prepare());  // the graph, at the first call of one not prepared at load
  if (ReplaysGraph()) {
    // The message is built only on an error: a decode call is ~1 ms, and this runs every call.
    KILN_RETURN_IF_CUDA_ERROR(cudaGraphLaunch(graph_exec_, device_->stream()),
                              absl::StrCat("running @", function_->name()));
    return absl::OkStatus();
  }
  return EnqueueAll(options_.check_each_step);
}

absl::Status CudaExecutable::Run() {
  RETURN_IF_ERROR(Enqueue());
  KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(device_->stream()),
                            absl::StrCat("running @", function_->name(),
                                         " (an asynchronous error of some step; "
                                         "CudaExecutableOptions::check_each_step names it)"));
  return absl::OkStatus();
}

StepTiming CudaExecutable::DescribeStep(const Step& step) const {
  StepTiming t;
  const ProgramStep& ps = *step.program;
  switch (ps.kind) {
    case ProgramStep::Kind::kKernel:
      t.name = step.launch->name;
      t.group = ps.label;
      break;
    case ProgramStep::Kind::kGemm:
      t.name = GemmName(ps.gemm);
      t.group = "gemm";
      break;
    case ProgramStep::Kind::kCopy:
      t.name = ps.what;
      t.group = "copy";
      break;
  }
  if (ps.node != nullptr) {
    t.node = absl::StrCat("%", ps.node->name());
    t.scope = ps.node->scope();
  }
  return t;
}

absl::StatusOr<std::vector<StepTiming>> CudaExecutable::Profile() {
  RETURN_IF_ERROR(device_->MakeCurrent());
  profile_fallback_.clear();
  if (ReplaysGraph()) {
    bool ran = false;
    absl::StatusOr<std::vector<StepTiming>> traced = ProfileInGraph(&ran);
    // Falling back runs the step again: only when the traced run did not happen (a second
    // training step would update the weights twice).
    if (traced.ok() || ran) return traced;
    profile_fallback_ = std::string(traced.status().message());
  }
  return ProfileOneByOne();
}

absl::StatusOr<std::vector<StepTiming>> CudaExecutable::ProfileInGraph(bool* ran) {
  ASSIGN_OR_RETURN(ActivityTracer * tracer, ActivityTracer::Get());
  if (graph_exec_ == nullptr) RETURN_IF_ERROR(Capture());
  const cudaStream_t stream = device_->stream();
  const std::string what = absl::StrCat("profiling @", function_->name(), " in its CUDA graph");
  // A fresh instance of the graph, made while the trace runs, so that CUPTI sees its nodes
  // from the start; uploaded before the replay, as Capture does.
  RETURN_IF_ERROR(tracer->Start());
  cudaGraphExec_t exec = nullptr;
  cudaError_t error = cudaGraphInstantiate(&exec, graph_, 0);
  if (error == cudaSuccess) error = cudaGraphUpload(exec, stream);
  if (error == cudaSuccess) {
    *ran = true;
    error = cudaGraphLaunch(exec, stream);
  }
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  absl::StatusOr<std::vector<TracedActivity>> activities = tracer->Stop();
  KILN_RETURN_IF_CUDA_ERROR(error, what);
  const std::string ran_but = absl::StrCat(
      what, ": the step ran, its trace did not (`--no-cuda-graph` profiles the launches one by one): ");
  if (!activities.ok()) {
    return absl::Status(activities.status().code(), absl::StrCat(ran_but, activities.status().message()));
  }

  std::vector<TracedStep> traced;
  traced.reserve(steps_.size());
  for (const Step& step : steps_) {
    const ProgramStep& ps = *step.program;
    if (ps.kind == ProgramStep::Kind::kKernel) {
      traced.push_back({.kernel = step.library->name()});
    } else {
      const bool elided = ps.kind == ProgramStep::Kind::kCopy && (ps.bytes == 0 || step.dst == step.src);
      traced.push_back({.launches_work = !elided});
    }
  }
  absl::StatusOr<std::vector<std::vector<int>>> matched = MatchActivitiesToSteps(*activities, traced);
  if (!matched.ok()) {
    return absl::InternalError(absl::StrCat(ran_but, matched.status().message()));
  }
  uint64_t origin = UINT64_MAX;
  for (const std::vector<int>& of_step : *matched) {
    for (int a : of_step) origin = std::min(origin, (*activities)[a].start_ns);
  }
  std::vector<StepTiming> timings;
  timings.reserve(steps_.size());
  double latest_end_us = 0, previous_start_us = 0;
  for (size_t i = 0; i < steps_.size(); ++i) {
    StepTiming t = DescribeStep(steps_[i]);
    t.in_graph = true;
    const std::vector<int>& of_step = (*matched)[i];
    if (of_step.empty()) {
      t.start_us = previous_start_us;  // enqueued nothing: no time
    } else {
      uint64_t start = UINT64_MAX, end = 0;
      for (int a : of_step) {
        start = std::min(start, (*activities)[a].start_ns);
        end = std::max(end, (*activities)[a].end_ns);
      }
      t.start_us = static_cast<double>(start - origin) / 1e3;
      const double end_us = static_cast<double>(end - origin) / 1e3;
      t.duration_us = end_us - t.start_us;
      t.exposed_us = std::max(0.0, end_us - latest_end_us);
      latest_end_us = std::max(latest_end_us, end_us);
      previous_start_us = t.start_us;
    }
    timings.push_back(std::move(t));
  }
  return timings;
}

absl::StatusOr<std::vector<StepTiming>> CudaExecutable::ProfileOneByOne() {
  const cudaStream_t stream = device_->stream();
  const std::string what = absl::StrCat("profiling @", function_->name());
  // events[i] is recorded before step i, events.back() after the last.
  std::vector<cudaEvent_t> events(steps_.size() + 1, nullptr);
  absl::Cleanup destroy = [&events] {
    for (cudaEvent_t e : events) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  };
  for (cudaEvent_t& e : events) KILN_RETURN_IF_CUDA_ERROR(cudaEventCreate(&e), what);
  for (size_t i = 0; i < steps_.size(); ++i) {
    KILN_RETURN_IF_CUDA_ERROR(cudaEventRecord(events[i], stream), what);
    RETURN_IF_ERROR(EnqueueStep(steps_[i]));
  }
  KILN_RETURN_IF_CUDA_ERROR(cudaEventRecord(events.back(), stream), what);
  KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream), what);
  std::vector<StepTiming> timings;
  timings.reserve(steps_.size());
  for (size_t i = 0; i < steps_.size(); ++i) {
    float start_ms = 0, end_ms = 0;
    KILN_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&start_ms, events[0], events[i]), what);
    KILN_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&end_ms, events[0], events[i + 1]), what);
    StepTiming t = DescribeStep(steps_[i]);
    t.start_us = start_ms * 1e3;
    t.duration_us = (end_ms - start_ms) * 1e3;
    t.exposed_us = t.duration_us;
    timings.push_back(std::move(t));
  }
  return timings;
}

absl::StatusOr<const Node*> CudaExecutable::ParameterNode(int64_t param_index) const {
  if (param_index < 0 || param_index >= static_cast<int64_t>(node_index_of_parameter_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("@", function_->name(), " has ", node_index_of_parameter_.size(),
                                                   " parameters; there is no parameter ", param_index));
  }
  return function_->nodes()[node_index_of_parameter_[param_index]].get();
}

absl::Status CudaExecutable::SetInput(int64_t param_index, const HostTensor& value) {
  ASSIGN_OR_RETURN(const Node* p, ParameterNode(param_index));
  if (value.type() != p->type()) {
    return absl::InvalidArgumentError(absl::StrCat("@", function_->name(), " ", ParameterContext(*p), " given ",
                                                   value.type().ToString()));
  }
  RETURN_IF_ERROR(device_->MakeCurrent());
  const std::string bytes = EncodeTensorBytes(value);
  const std::string what = absl::StrCat("setting @", function_->name(), " ", ParameterContext(*p));
  KILN_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(NodeAddress(p), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, device_->stream()), what);
  KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(device_->stream()), what);
  return absl::OkStatus();
}

absl::Status CudaExecutable::ZeroInput(int64_t param_index) {
  ASSIGN_OR_RETURN(const Node* p, ParameterNode(param_index));
  RETURN_IF_ERROR(device_->MakeCurrent());
  const std::string what = absl::StrCat("zeroing @", function_->name(), " ", ParameterContext(*p));
  KILN_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(NodeAddress(p), 0, p->type().num_bytes(), device_->stream()), what);
  KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(device_->stream()), what);
  return absl::OkStatus();
}

absl::StatusOr<HostTensor> CudaExecutable::Download(const TensorType& type, const void* src,
                                                    absl::string_view what) const {
  RETURN_IF_ERROR(device_->MakeCurrent());
  std::string bytes(type.num_bytes(), '\0');
  KILN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(bytes.data(), src, bytes.size(), cudaMemcpyDeviceToHost, device_->stream()),
                            what);
  KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(device_->stream()), what);
  return DecodeTensorBytes(type, bytes);
}

absl::StatusOr<HostTensor> CudaExecutable::Output(int i) const {
  if (i < 0 || i >= static_cast<int>(function_->outputs().size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("@", function_->name(), " has ", function_->outputs().size(), " outputs; there is no output ", i));
  }
  const Node* out = function_->outputs()[i];
  return Download(out->type(), BufferAddress(plan_.output_buffer[i]),
                  absl::StrCat("reading output ", i, " (%", out->name(), ") of @", function_->name()));
}

absl::StatusOr<void*> CudaExecutable::InputAddress(int64_t param_index) const {
  ASSIGN_OR_RETURN(const Node* p, ParameterNode(param_index));
  return static_cast<void*>(NodeAddress(p));
}

absl::StatusOr<const void*> CudaExecutable::OutputAddress(int i) const {
  if (i < 0 || i >= static_cast<int>(function_->outputs().size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("@", function_->name(), " has ", function_->outputs().size(), " outputs; there is no output ", i));
  }
  return static_cast<const void*>(BufferAddress(plan_.output_buffer[i]));
}

absl::StatusOr<HostTensor> CudaExecutable::Input(int64_t param_index) const {
  ASSIGN_OR_RETURN(const Node* p, ParameterNode(param_index));
  return Download(p->type(), NodeAddress(p), absl::StrCat("reading @", function_->name(), " ", ParameterContext(*p)));
}

}  // namespace kiln
