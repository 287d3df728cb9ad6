#include "runtime/step_profile.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln {
namespace {

// A JSON string literal, escaped by the JSON library.
std::string JsonString(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

std::string TimingMethod(absl::Span<const StepTiming> timings) {
  return !timings.empty() && timings.front().in_graph ? "in the CUDA graph (CUPTI)"
                                                      : "launched one by one with CUDA events";
}

std::string ChromeTraceJson(absl::Span<const StepTiming> timings, const std::string& run_name) {
  std::string json = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  absl::StrAppend(&json, "  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": ",
                  JsonString(run_name), "}}");
  // Overlapping spans (a graph's launches under programmatic dependent launch) on tracks of
  // their own: each launch on the first track whose last span has ended.
  std::vector<double> track_end;
  for (const StepTiming& t : timings) {
    size_t track = 0;
    while (track < track_end.size() && track_end[track] > t.start_us) ++track;
    if (track == track_end.size()) track_end.push_back(0);
    track_end[track] = t.start_us + t.duration_us;
    absl::StrAppendFormat(&json,
                          ",\n  {\"name\": %s, \"cat\": %s, \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, "
                          "\"dur\": %.3f, \"args\": {\"group\": %s, \"node\": %s, \"scope\": %s, \"exposed_us\": %.3f}}",
                          JsonString(t.name), JsonString(t.group), track, t.start_us, t.duration_us,
                          JsonString(t.group), JsonString(t.node), JsonString(t.scope), t.exposed_us);
  }
  json += "\n]}\n";
  return json;
}

std::vector<TimeGroup> GroupTimes(absl::Span<const StepTiming> timings) {
  absl::flat_hash_map<std::string, size_t> index;
  std::vector<TimeGroup> groups;
  for (const StepTiming& t : timings) {
    auto [it, inserted] = index.try_emplace(t.group, groups.size());
    if (inserted) groups.push_back({.group = t.group});
    TimeGroup& g = groups[it->second];
    ++g.launches;
    g.total_us += t.exposed_us;
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](const TimeGroup& a, const TimeGroup& b) { return a.total_us > b.total_us; });
  return groups;
}

std::string FormatGroupTable(absl::Span<const StepTiming> timings, int rows) {
  const std::vector<TimeGroup> groups = GroupTimes(timings);
  double total = 0;
  for (const TimeGroup& g : groups) total += g.total_us;
  std::string out = absl::StrFormat("  %-28s %9s %10s %7s\n", "group", "launches", "ms", "share");
  for (int i = 0; i < static_cast<int>(groups.size()) && i < rows; ++i) {
    const TimeGroup& g = groups[i];
    absl::StrAppendFormat(&out, "  %-28s %9d %10.3f %6.1f%%\n", g.group, g.launches, g.total_us / 1e3,
                          total > 0 ? 100.0 * g.total_us / total : 0.0);
  }
  absl::StrAppendFormat(&out, "  %-28s %9d %10.3f\n", "total", static_cast<int64_t>(timings.size()), total / 1e3);
  return out;
}

std::string FormatSlowestLaunches(absl::Span<const StepTiming> timings, int rows) {
  std::vector<const StepTiming*> sorted;
  for (const StepTiming& t : timings) sorted.push_back(&t);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const StepTiming* a, const StepTiming* b) { return a->exposed_us > b->exposed_us; });
  std::string out =
      absl::StrFormat("  %10s %10s  %-22s %-28s %-16s %s\n", "exposed us", "span us", "group", "node", "scope", "launch");
  for (int i = 0; i < static_cast<int>(sorted.size()) && i < rows; ++i) {
    const StepTiming& t = *sorted[i];
    // The launch's own name last: a node lowered to several kernels (attention_grad's dq and
    // dk/dv) shows which of them this is.
    absl::StrAppendFormat(&out, "  %10.1f %10.1f  %-22s %-28s %-16s %s\n", t.exposed_us, t.duration_us, t.group,
                          t.node.empty() ? t.name : t.node, t.scope.empty() ? "-" : t.scope,
                          t.node.empty() ? "" : t.name);
  }
  return out;
}

}  // namespace kiln
