#include "runtime/memory_estimate.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kiln {
namespace {

constexpr int64_t kSaturated = std::numeric_limits<int64_t>::max();

int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum;
  return __builtin_add_overflow(a, b, &sum) ? kSaturated : sum;
}

int64_t ValueBytes(const TensorType& type, int64_t element_bytes) {
  int64_t bytes = element_bytes;
  for (int64_t d : type.dims) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) return kSaturated;
  }
  return bytes;
}

// The liveness walk of EvaluateFunction: values an output depends on, freed after their
// last reader; outputs kept to the end. `element_bytes` < 0 means each dtype's own size.
int64_t PeakBytes(const Function& f, int64_t element_bytes, bool count_arguments) {
  const auto& nodes = f.nodes();
  const int64_t n = static_cast<int64_t>(nodes.size());
  absl::flat_hash_map<const Node*, int64_t> position;
  for (int64_t i = 0; i < n; ++i) position[nodes[i].get()] = i;
  // A multi-result node holds all its results; each get_result moves one out (no new bytes),
  // and frees it after its last reader.
  auto bytes_of = [&](const Node& node) {
    int64_t bytes = 0;
    for (const TensorType& t : node.result_types()) {
      bytes = SaturatingAdd(bytes, ValueBytes(t, element_bytes > 0 ? element_bytes : DTypeBytes(t.dtype)));
    }
    return bytes;
  };
  std::vector<bool> live(n, false), is_output(n, false);
  for (const Node* out : f.outputs()) {
    auto it = position.find(out);
    if (it != position.end()) live[it->second] = is_output[it->second] = true;
  }
  std::vector<int64_t> remaining_uses(n, 0);
  for (int64_t i = n - 1; i >= 0; --i) {
    if (!live[i]) continue;
    for (const Node* operand : nodes[i]->operands()) {
      auto it = position.find(operand);
      if (it == position.end()) continue;
      live[it->second] = true;
      ++remaining_uses[it->second];
    }
  }
  int64_t held = 0;
  if (count_arguments) {
    for (const Node* p : f.parameters()) held = SaturatingAdd(held, bytes_of(*p));
  }
  int64_t peak = held;
  for (int64_t i = 0; i < n; ++i) {
    if (!live[i]) continue;
    if (nodes[i]->opcode() != Opcode::kGetResult) held = SaturatingAdd(held, bytes_of(*nodes[i]));
    peak = std::max(peak, held);
    for (const Node* operand : nodes[i]->operands()) {
      auto it = position.find(operand);
      if (it == position.end()) continue;
      if (--remaining_uses[it->second] == 0 && !is_output[it->second] && !operand->has_multiple_results()) {
        held -= bytes_of(*operand);
      }
    }
  }
  return peak;
}

}  // namespace

int64_t ReferencePeakBytes(const Function& f) {
  return PeakBytes(f, static_cast<int64_t>(sizeof(double)), /*count_arguments=*/true);
}

int64_t DevicePeakBytes(const Function& f) { return PeakBytes(f, -1, /*count_arguments=*/false); }

int64_t SaturatingSum(std::initializer_list<int64_t> bytes) {
  int64_t sum = 0;
  for (int64_t b : bytes) sum = SaturatingAdd(sum, b);
  return sum;
}

int64_t HostTensorBytes(double elements) {
  const double bytes = elements * static_cast<double>(sizeof(double));
  return bytes >= static_cast<double>(kSaturated) ? kSaturated : static_cast<int64_t>(bytes);
}

absl::StatusOr<HostMemory> AvailableHostMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    // "MemAvailable:   23058764 kB"
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (words.size() >= 2 && words[0] == "MemAvailable:" && absl::SimpleAtoi(words[1], &kib)) {
      return HostMemory{kib * 1024, "MemAvailable in /proc/meminfo"};
    }
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) {
    return HostMemory{static_cast<int64_t>(pages) * page_size, "free pages (sysconf)"};
  }
  return absl::UnavailableError("cannot tell how much memory is available (no /proc/meminfo, no sysconf)");
}

absl::Status CheckFitsHostMemory(int64_t needed_bytes, absl::string_view what, absl::string_view detail) {
  absl::StatusOr<HostMemory> memory = AvailableHostMemory();
  if (!memory.ok()) return absl::OkStatus();  // nothing to compare with: the allocations will tell
  if (needed_bytes <= memory->available_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(what, " needs about ", FormatBytes(needed_bytes),
                                                   " of host memory (", detail, "), but ",
                                                   FormatBytes(memory->available_bytes), " are available (",
                                                   memory->source, ")"));
}

std::string FormatBytes(int64_t bytes) {
  if (bytes == kSaturated) return "more than 8 EiB";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " bytes");
  double v = static_cast<double>(bytes);
  int unit = -1;
  while (v >= 1024 && unit < 5) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[unit]);
  return buf;
}

}  // namespace kiln
