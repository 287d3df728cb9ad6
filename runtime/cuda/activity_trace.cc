#include "runtime/cuda/activity_trace.h"

#include <cupti_activity.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/dynamic_library.h"

namespace kiln {

struct ActivityTracer::Api {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) get_next_record = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) get_num_dropped_records = nullptr;
  decltype(&cuptiGetResultString) get_result_string = nullptr;

  std::unique_ptr<DynamicLibrary> library;  // libcupti, which the entry points are of

  // What the buffer-completed callback (CUPTI's thread, or the flushing one) collected.
  std::mutex mu;
  std::vector<TracedActivity> collected;
  size_t dropped = 0;
};

namespace {

constexpr size_t kBufferBytes = 8 << 20;  // CUPTI fills a buffer, then hands it back
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

ActivityTracer::Api* g_api = nullptr;  // for the callbacks, which CUPTI calls without a context

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // CUPTI wants 8-byte aligned buffers.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI BufferCompleted(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  ActivityTracer::Api& api = *g_api;
  std::lock_guard<std::mutex> lock(api.mu);
  CUpti_Activity* record = nullptr;
  while (api.get_next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    TracedActivity a;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        a = {TracedActivity::Kind::kKernel, k->name != nullptr ? k->name : "", k->start, k->end};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        a = {TracedActivity::Kind::kMemcpy, "", m->start, m->end};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        a = {TracedActivity::Kind::kMemset, "", m->start, m->end};
        break;
      }
      default:
        continue;
    }
    api.collected.push_back(std::move(a));
  }
  size_t dropped = 0;
  if (api.get_num_dropped_records(context, stream, &dropped) == CUPTI_SUCCESS) api.dropped += dropped;
  std::free(buffer);
}

std::string ResultString(const ActivityTracer::Api& api, CUptiResult result) {
  const char* s = nullptr;
  if (api.get_result_string != nullptr && api.get_result_string(result, &s) == CUPTI_SUCCESS && s != nullptr) {
    return absl::StrCat(s, " (CUptiResult ", static_cast<int>(result), ")");
  }
  return absl::StrCat("CUptiResult ", static_cast<int>(result));
}

absl::Status Check(const ActivityTracer::Api& api, CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", ResultString(api, result)));
}

absl::StatusOr<ActivityTracer::Api*> LoadCupti() {
  // The loader's path first (LD_LIBRARY_PATH), then where the toolkit keeps it.
  const char* candidates[] = {"libcupti.so.13", "/usr/local/cuda/lib64/libcupti.so.13",
                              "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"};
  std::unique_ptr<DynamicLibrary> library;
  std::vector<std::string> failures;
  for (const char* path : candidates) {
    absl::StatusOr<std::unique_ptr<DynamicLibrary>> opened = DynamicLibrary::Open(path);
    if (opened.ok()) {
      library = *std::move(opened);
      break;
    }
    failures.push_back(std::string(opened.status().message()));
  }
  if (library == nullptr) return absl::NotFoundError(absl::StrCat("CUPTI not found (", absl::StrJoin(failures, "; "), ")"));
  auto api = std::make_unique<ActivityTracer::Api>();
  absl::Status resolved = absl::OkStatus();
  auto resolve = [&](const char* symbol, auto& fn) {
    if (resolved.ok()) resolved = library->Resolve(symbol, fn);
  };
  resolve("cuptiActivityRegisterCallbacks", api->register_callbacks);
  resolve("cuptiActivityEnable", api->enable);
  resolve("cuptiActivityDisable", api->disable);
  resolve("cuptiActivityFlushAll", api->flush_all);
  resolve("cuptiActivityGetNextRecord", api->get_next_record);
  resolve("cuptiActivityGetNumDroppedRecords", api->get_num_dropped_records);
  resolve("cuptiGetResultString", api->get_result_string);
  if (!resolved.ok()) return resolved;
  g_api = api.get();
  if (absl::Status s = Check(*api, api->register_callbacks(BufferRequested, BufferCompleted),
                             "cuptiActivityRegisterCallbacks");
      !s.ok()) {
    g_api = nullptr;
    return s;
  }
  api->library = std::move(library);  // open for the process's life, as CUPTI's callbacks are
  return api.release();
}

}  // namespace

absl::StatusOr<ActivityTracer*> ActivityTracer::Get() {
  static absl::StatusOr<ActivityTracer*>* tracer = [] {
    absl::StatusOr<Api*> api = LoadCupti();
    if (!api.ok()) return new absl::StatusOr<ActivityTracer*>(api.status());
    return new absl::StatusOr<ActivityTracer*>(new ActivityTracer(*api));
  }();
  return *tracer;
}

absl::Status ActivityTracer::Start() {
  if (tracing_) return absl::FailedPreconditionError("a CUPTI trace is already running");
  {
    std::lock_guard<std::mutex> lock(api_->mu);
    api_->collected.clear();
    api_->dropped = 0;
  }
  for (CUpti_ActivityKind kind : kKinds) {
    if (absl::Status s = Check(*api_, api_->enable(kind), "cuptiActivityEnable"); !s.ok()) {
      for (CUpti_ActivityKind k : kKinds) api_->disable(k);
      return s;
    }
  }
  tracing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TracedActivity>> ActivityTracer::Stop() {
  if (!tracing_) return absl::FailedPreconditionError("no CUPTI trace is running");
  tracing_ = false;
  for (CUpti_ActivityKind kind : kKinds) api_->disable(kind);
  // Forced: hand back the buffers still being filled, not only full ones.
  if (absl::Status s = Check(*api_, api_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
      !s.ok()) {
    return s;
  }
  std::vector<TracedActivity> out;
  size_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(api_->mu);
    out.swap(api_->collected);
    dropped = api_->dropped;
  }
  if (dropped > 0) return absl::ResourceExhaustedError(absl::StrCat("CUPTI dropped ", dropped, " activity records"));
  std::stable_sort(out.begin(), out.end(), [](const TracedActivity& a, const TracedActivity& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns < b.end_ns;
  });
  return out;
}

absl::StatusOr<std::vector<std::vector<int>>> MatchActivitiesToSteps(const std::vector<TracedActivity>& activities,
                                                                     const std::vector<TracedStep>& steps) {
  std::vector<std::vector<int>> result(steps.size());
  std::vector<int> unnamed;  // unnamed steps waiting for the activities before the next named kernel
  size_t next = 0;           // the first activity not yet given to a step
  auto hand_out = [&](size_t end) {
    for (size_t u = 0; u < unnamed.size() && next < end; ++u) {
      result[unnamed[u]].push_back(static_cast<int>(next++));
      if (u + 1 == unnamed.size()) {
        while (next < end) result[unnamed[u]].push_back(static_cast<int>(next++));
      }
    }
    next = std::max(next, end);  // nothing to take them: not this run's (another stream's)
    unnamed.clear();
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const TracedStep& step = steps[i];
    if (!step.launches_work) continue;
    if (step.kernel.empty()) {
      unnamed.push_back(static_cast<int>(i));
      continue;
    }
    size_t found = next;
    while (found < activities.size() &&
           !(activities[found].kind == TracedActivity::Kind::kKernel && activities[found].name == step.kernel)) {
      ++found;
    }
    if (found == activities.size()) {
      return absl::NotFoundError(absl::StrCat("step ", i, "'s kernel ", step.kernel, " is not in the trace's ",
                                              activities.size(), " activities after the ", next, " matched"));
    }
    hand_out(found);
    result[i].push_back(static_cast<int>(found));
    next = found + 1;
  }
  hand_out(activities.size());
  return result;
}

}  // namespace kiln
