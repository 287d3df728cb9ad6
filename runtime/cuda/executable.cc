#include "runtime/cuda/executable.h"

#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"
#include "runtime/cuda/cuda_status.h"
#include "runtime/tensor_bytes.h"

namespace kiln {
namespace {

// Nodes some output depends on; only these run.
std::vector<bool> NeededNodes(const Function& f, const absl::flat_hash_map<const Node*, int64_t>& index_of) {
  std::vector<bool> needed(f.num_nodes(), false);
  for (const Node* out : f.outputs()) needed[index_of.at(out)] = true;
  for (int64_t i = f.num_nodes() - 1; i >= 0; --i) {
    if (!needed[i]) continue;
    for (const Node* o : f.nodes()[i]->operands()) needed[index_of.at(o)] = true;
  }
  return needed;
}

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
std::string GemmName(const GemmLayout& g) {
  return absl::StrCat("gemm ", g.batch, "x", g.m, "x", g.n, "x", g.k);
}

}  // namespace

CudaExecutable::~CudaExecutable() {
  // Errors here cannot be reported, and the arena goes right after.
  if (graph_exec_ != nullptr) cudaGraphExecDestroy(graph_exec_);
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
}

absl::StatusOr<std::unique_ptr<CudaExecutable>> CudaExecutable::Create(const Function& f, CudaDevice& device,
                                                                       const CudaExecutableOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto phase_start = start;
  RETURN_IF_ERROR(device.MakeCurrent());
  std::unique_ptr<CudaExecutable> exe(new CudaExecutable(f, device));
  exe->options_ = options;
  for (int64_t i = 0; i < f.num_nodes(); ++i) exe->index_of_[f.nodes()[i].get()] = i;
  for (const Node* p : f.parameters()) exe->node_index_of_parameter_.push_back(exe->index_of_.at(p));

  // The kernel cache is an optimization: without a usable default directory kiln compiles
  // every time; a directory the caller named must work.
  absl::StatusOr<KernelCache> cache = KernelCache::Open(options.cache_dir);
  if (!cache.ok() && !options.cache_dir.empty()) return cache.status();
  KernelCache* cache_ptr = cache.ok() ? &*cache : nullptr;
  const NvrtcOptions nvrtc{.arch = device.arch()};
  ASSIGN_OR_RETURN(KernelCompileReport report, CompileFunctionKernels(f, nvrtc, cache_ptr, options.compile_threads,
                                                                      CodegenOptions{.target = device.target()}));
  if (static_cast<int64_t>(report.nodes.size()) != f.num_nodes()) {
    return absl::InternalError(absl::StrCat("codegen lowered ", report.nodes.size(), " of the ", f.num_nodes(),
                                            " nodes of @", f.name()));
  }
  exe->stats_.phases.emplace_back(
      absl::StrCat("codegen + NVRTC (", report.num_distinct - report.cache_hits, " of ", report.num_distinct,
                   " kernels compiled, the rest from the cache)"),
      Lap(&phase_start));

  // Buffer roles from the lowering; GEMM plans (and so their scratch sizes) before the plan.
  // A needed result needs its multi-result node (its operand); an unneeded one gets no
  // buffer, and the node's kernels are passed null for it.
  std::vector<bool> needed = NeededNodes(f, exe->index_of_);
  BufferPlanRequest request;
  request.roles.assign(f.num_nodes(), BufferRole::kNone);
  request.scratch_bytes.assign(f.num_nodes(), 0);
  request.run_step.resize(f.num_nodes());
  request.elementwise_in_place.assign(f.num_nodes(), false);
  for (int64_t i = 0; i < f.num_nodes(); ++i) request.run_step[i] = i;
  exe->gemms_.resize(f.num_nodes());
  for (int64_t i = 0; i < f.num_nodes(); ++i) {
    const Node& node = *f.nodes()[i];
    const LoweredNode& lowered = report.nodes[i].lowered;
    if (report.nodes[i].node != &node) return absl::InternalError("codegen reported the nodes out of order");
    if (!needed[i] && node.opcode() != Opcode::kParameter) continue;
    request.roles[i] = lowered.kind == LoweringKind::kAlias    ? BufferRole::kAlias
                       : lowered.kind == LoweringKind::kResult ? BufferRole::kResult
                       : node.has_multiple_results()          ? BufferRole::kMultiResult
                                                               : BufferRole::kOwn;
    request.elementwise_in_place[i] = lowered.elementwise_in_place;
    if (lowered.kind == LoweringKind::kResult) {  // written by its node's kernels, at that node's step
      request.run_step[i] = exe->index_of_.at(node.operand(0));
    }
    if (lowered.kind == LoweringKind::kGemm) {
      ASSIGN_OR_RETURN(exe->gemms_[i], GemmPlan::Create(node, device));
      request.scratch_bytes[i] = exe->gemms_[i]->scratch_bytes();
    }
  }
  exe->stats_.phases.emplace_back("cuBLASLt plans", Lap(&phase_start));
  ASSIGN_OR_RETURN(exe->plan_, PlanBuffers(f, request));
  exe->stats_.phases.emplace_back("memory plan", Lap(&phase_start));

  ASSIGN_OR_RETURN(void* arena, device.Allocate(std::max<int64_t>(exe->plan_.arena_bytes, 1),
                                                absl::StrCat("the arena of @", f.name(), " (", exe->plan_.Summary(), ")")));
  exe->arena_.reset(arena);
  if (options.poison_arena) {
    KILN_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(arena, 0xFF, exe->plan_.arena_bytes, device.stream()), "poisoning the arena");
    KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(device.stream()), "poisoning the arena");
  }

  exe->stats_.phases.emplace_back("arena allocation", Lap(&phase_start));
  RETURN_IF_ERROR(exe->BuildSteps(report, request.roles));
  exe->stats_.phases.emplace_back("kernel loading", Lap(&phase_start));
  exe->stats_.cache_hits = report.cache_hits;
  exe->stats_.arena_bytes = exe->plan_.arena_bytes;
  exe->stats_.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return exe;
}

absl::Status CudaExecutable::BuildSteps(const KernelCompileReport& report, const std::vector<BufferRole>& roles) {
  const Function& f = *function_;
  std::vector<const KernelLibrary*> library_of(report.kernels.size(), nullptr);  // each cubin loaded once
  for (int64_t i = 0; i < f.num_nodes(); ++i) {
    const Node& node = *f.nodes()[i];
    const NodeKernels& nk = report.nodes[i];
    if (roles[i] == BufferRole::kNone) continue;
    bool empty = true;
    for (const TensorType& t : node.result_types()) empty &= t.num_elements() == 0;
    if (empty) continue;
    if (nk.lowered.kind == LoweringKind::kGemm) {
      void* scratch = plan_.scratch_buffer[i] >= 0 ? BufferAddress(plan_.scratch_buffer[i]) : nullptr;
      steps_.push_back({.kind = Step::Kind::kGemm,
                        .node = &node,
                        .pointers = {NodeAddress(&node), NodeAddress(node.operand(0)), NodeAddress(node.operand(1)),
                                     node.num_operands() > 2 ? NodeAddress(node.operand(2)) : nullptr, scratch},
                        .gemm = gemms_[i].get()});
      ++stats_.gemms;
      continue;
    }
    if (nk.lowered.kind != LoweringKind::kKernels) continue;  // parameters and aliases do no work
    // The outputs (each result of a multi-result node, null where it is not needed), then the inputs.
    std::vector<void*> pointers;
    if (node.has_multiple_results()) {
      for (int r = 0; r < node.num_results(); ++r) {
        const Node* result = node.result(r);
        pointers.push_back(roles[index_of_.at(result)] == BufferRole::kNone ? nullptr : NodeAddress(result));
      }
    } else {
      pointers.push_back(NodeAddress(&node));
    }
    for (const Node* input : node.operands()) pointers.push_back(NodeAddress(input));
    for (size_t k = 0; k < nk.lowered.kernels.size(); ++k) {
      const int compiled = nk.compiled[k];
      if (library_of[compiled] == nullptr) {
        absl::StatusOr<std::unique_ptr<KernelLibrary>> library = KernelLibrary::Load(report.kernels[compiled]);
        if (!library.ok()) return ForNode(library.status(), node);
        library_of[compiled] = library->get();
        libraries_.push_back(*std::move(library));
      }
      absl::StatusOr<KernelLaunch> launch =
          PrepareLaunch(*library_of[compiled], nk.lowered.kernels[k], device_->ordinal());
      if (!launch.ok()) return ForNode(launch.status(), node);
      launches_.push_back(std::make_unique<KernelLaunch>(*std::move(launch)));
      steps_.push_back({.kind = Step::Kind::kKernel,
                        .node = &node,
                        .launch = launches_.back().get(),
                        .pointers = pointers,
                        .label = nk.lowered.label.empty() ? std::string(node.op_name()) : nk.lowered.label});
      ++stats_.kernels;
    }
  }
  stats_.distinct_kernels += static_cast<int64_t>(libraries_.size());

  // The finish: outputs held in parameter buffers are copied out first, then donated outputs
  // are copied into their parameters' buffers (never a source of any of these copies).
  for (size_t o = 0; o < f.outputs().size(); ++o) {
    if (plan_.output_copy_source[o] < 0) continue;
    steps_.push_back({.kind = Step::Kind::kCopy,
                      .dst = BufferAddress(plan_.output_buffer[o]),
                      .src = BufferAddress(plan_.output_copy_source[o]),
                      .bytes = f.outputs()[o]->type().num_bytes(),
                      .what = absl::StrCat("output ", o, " (%", f.outputs()[o]->name(), ")")});
  }
  for (size_t o = 0; o < f.output_aliases().size(); ++o) {
    const int64_t p = f.output_aliases()[o];
    if (p < 0) continue;
    if (p >= static_cast<int64_t>(node_index_of_parameter_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("@", f.name(), ": output ", o, " is donated to parameter ", p,
                                                     ", which does not exist"));
    }
    const int64_t param_buffer = plan_.node_buffer[node_index_of_parameter_[p]];
    steps_.push_back({.kind = Step::Kind::kCopy,
                      .dst = BufferAddress(param_buffer),
                      .src = BufferAddress(plan_.output_buffer[o]),
                      .bytes = f.outputs()[o]->type().num_bytes(),
                      .what = absl::StrCat("donating output ", o, " (%", f.outputs()[o]->name(), ") to ",
                                           ParameterContext(*f.nodes()[node_index_of_parameter_[p]]))});
  }
  return absl::OkStatus();
}

absl::Status CudaExecutable::EnqueueStep(const Step& step) const {
  const cudaStream_t stream = device_->stream();
  switch (step.kind) {
    case Step::Kind::kKernel:
      return EnqueueLaunch(*step.launch, step.pointers, stream, NodeContext(*step.node));
    case Step::Kind::kGemm:
      return step.gemm->Enqueue(step.pointers[0], step.pointers[1], step.pointers[2], step.pointers[3],
                                step.pointers[4], stream);
    case Step::Kind::kCopy:
      if (step.bytes == 0 || step.dst == step.src) return absl::OkStatus();
      KILN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(step.dst, step.src, step.bytes, cudaMemcpyDeviceToDevice, stream),
                                step.what);
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
  return step.node != nullptr ? NodeContext(*step.node) : step.what;
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

absl::Status CudaExecutable::Run() {
  RETURN_IF_ERROR(device_->MakeCurrent());
  const std::string run = absl::StrCat("running @", function_->name());
  if (options_.cuda_graph && !options_.check_each_step) {
    if (graph_exec_ == nullptr) RETURN_IF_ERROR(Capture());
    KILN_RETURN_IF_CUDA_ERROR(cudaGraphLaunch(graph_exec_, device_->stream()), run);
  } else {
    RETURN_IF_ERROR(EnqueueAll(options_.check_each_step));
  }
  KILN_RETURN_IF_CUDA_ERROR(
      cudaStreamSynchronize(device_->stream()),
      absl::StrCat(run, " (an asynchronous error of some step; CudaExecutableOptions::check_each_step names it)"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StepTiming>> CudaExecutable::Profile() {
  RETURN_IF_ERROR(device_->MakeCurrent());
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
    const Step& step = steps_[i];
    float start_ms = 0, end_ms = 0;
    KILN_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&start_ms, events[0], events[i]), what);
    KILN_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&end_ms, events[0], events[i + 1]), what);
    StepTiming t;
    switch (step.kind) {
      case Step::Kind::kKernel:
        t.name = step.launch->name;
        t.group = step.label;
        break;
      case Step::Kind::kGemm:
        t.name = GemmName(step.gemm->layout());
        t.group = "gemm";
        break;
      case Step::Kind::kCopy:
        t.name = step.what;
        t.group = "copy";
        break;
    }
    if (step.node != nullptr) {
      t.node = absl::StrCat("%", step.node->name());
      t.scope = step.node->scope();
    }
    t.start_us = start_ms * 1e3;
    t.duration_us = (end_ms - start_ms) * 1e3;
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

absl::StatusOr<HostTensor> CudaExecutable::Input(int64_t param_index) const {
  ASSIGN_OR_RETURN(const Node* p, ParameterNode(param_index));
  return Download(p->type(), NodeAddress(p), absl::StrCat("reading @", function_->name(), " ", ParameterContext(*p)));
}

absl::StatusOr<std::vector<HostTensor>> EvaluateOnGpu(const Function& f, absl::Span<const HostTensor> args,
                                                      CudaDevice& device, const CudaExecutableOptions& options) {
  if (args.size() != f.parameters().size()) {
    return absl::InvalidArgumentError(absl::StrCat("@", f.name(), " takes ", f.parameters().size(), " arguments, got ",
                                                   args.size()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutable> exe, CudaExecutable::Create(f, device, options));
  for (size_t i = 0; i < args.size(); ++i) RETURN_IF_ERROR(exe->SetInput(static_cast<int64_t>(i), args[i]));
  RETURN_IF_ERROR(exe->Run());
  std::vector<HostTensor> outputs;
  for (size_t i = 0; i < f.outputs().size(); ++i) {
    ASSIGN_OR_RETURN(HostTensor out, exe->Output(static_cast<int>(i)));
    outputs.push_back(std::move(out));
  }
  return outputs;
}

}  // namespace kiln
