#include "codegen/compile_function.h"

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Lowers every node; fails listing each op that failed (with its first node's error).
absl::Status LowerAll(const std::vector<const Function*>& functions, const CodegenOptions& codegen,
                      KernelCompileReport* report) {
  std::map<std::string, std::pair<int, std::string>> failures;  // op -> (count, first error)
  for (const Function* f : functions) {
    for (const auto& node : f->nodes()) {
      absl::StatusOr<LoweredNode> lowered = LowerNode(*node, codegen);
      if (!lowered.ok()) {
        auto& [count, first] = failures[std::string(node->op_name())];
        if (count++ == 0) first = absl::StrCat("@", f->name(), " %", node->name(), ": ", lowered.status().message());
        continue;
      }
      report->num_kernels += static_cast<int64_t>(lowered->kernels.size());
      report->nodes.push_back(NodeKernels{node.get(), *std::move(lowered), {}});
    }
  }
  if (failures.empty()) return absl::OkStatus();
  std::string message = absl::StrCat("codegen failed for ", failures.size(), " op(s):");
  for (const auto& [op, failure] : failures) {
    absl::StrAppend(&message, "\n  ", op, " (", failure.first, " node(s)), first: ", failure.second);
  }
  return absl::UnimplementedError(message);
}

absl::StatusOr<KernelCompileReport> CompileAll(const std::vector<const Function*>& functions,
                                               const NvrtcOptions& options, KernelCache* cache, int num_threads,
                                               const CodegenOptions& codegen) {
  const Clock::time_point start = Clock::now();
  KernelCompileReport report;
  if (absl::Status lowered = LowerAll(functions, codegen, &report); !lowered.ok()) return lowered;

  // One job per distinct body; the first kernel with that body is the one compiled.
  std::vector<const KernelSpec*> jobs;
  absl::flat_hash_map<std::string, int> job_of_body;
  for (NodeKernels& n : report.nodes) {
    for (const KernelSpec& k : n.lowered.kernels) {
      auto [it, inserted] = job_of_body.try_emplace(KernelBodyKey(k), static_cast<int>(jobs.size()));
      if (inserted) jobs.push_back(&k);
      n.compiled.push_back(it->second);
    }
  }

  report.kernels.resize(jobs.size());
  std::vector<absl::Status> errors(jobs.size());
  std::vector<double> seconds(jobs.size(), 0);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t j = next++; j < jobs.size(); j = next++) {
      const Clock::time_point t = Clock::now();
      absl::StatusOr<CompiledKernel> compiled = CompileKernel(*jobs[j], options, cache);
      if (compiled.ok()) {
        report.kernels[j] = *std::move(compiled);
        if (!report.kernels[j].from_cache) seconds[j] = SecondsSince(t);
      } else {
        errors[j] = compiled.status();
      }
    }
  };
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (int i = 1; i < std::min<int>(num_threads, static_cast<int>(jobs.size())); ++i) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();

  // Report the first failure in job order, so the error does not depend on scheduling.
  for (const absl::Status& e : errors) {
    if (!e.ok()) return e;
  }
  report.num_distinct = static_cast<int64_t>(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    report.cache_hits += report.kernels[j].from_cache ? 1 : 0;
    report.nvrtc_seconds += seconds[j];
  }
  report.wall_seconds = SecondsSince(start);
  return report;
}

}  // namespace

std::string KernelBodyKey(const KernelSpec& kernel) {
  absl::string_view body = kernel.source;
  while (body.substr(0, 2) == "//") {
    const size_t eol = body.find('\n');
    body = eol == absl::string_view::npos ? absl::string_view() : body.substr(eol + 1);
  }
  return absl::StrReplaceAll(body, {{kernel.name, "KILN_KERNEL"}});
}

absl::StatusOr<KernelCompileReport> CompileFunctionKernels(const Function& f, const NvrtcOptions& options,
                                                           KernelCache* cache, int num_threads,
                                                           const CodegenOptions& codegen) {
  return CompileAll({&f}, options, cache, num_threads, codegen);
}

absl::StatusOr<KernelCompileReport> CompileModuleKernels(const Module& module, const NvrtcOptions& options,
                                                         KernelCache* cache, int num_threads,
                                                         const CodegenOptions& codegen) {
  std::vector<const Function*> functions;
  for (const auto& f : module.functions()) functions.push_back(f.get());
  return CompileAll(functions, options, cache, num_threads, codegen);
}

}  // namespace kiln
