#include "passes/target.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln {
namespace {

struct NominalTarget {
  const char* arch;
  int major, minor;
  int sm_count;
  int64_t shared_kib;
};

// One row per architecture kiln generates code for.
constexpr NominalTarget kNominal[] = {
    {"sm_90a", 9, 0, 132, 227},  // H100 SXM, H200
    {"sm_90", 9, 0, 132, 227},   // Hopper without the 'a' features (no wgmma)
    {"sm_89", 8, 9, 142, 99},    // L40S
    {"sm_86", 8, 6, 84, 99},     // A40
    {"sm_80", 8, 0, 108, 163},   // A100
};

}  // namespace

std::string Target::ToString() const {
  std::vector<std::string> features;
  if (has_wgmma) features.push_back("wgmma");
  if (has_tma) features.push_back("tma");
  if (has_fp8) features.push_back("fp8");
  return absl::StrCat(arch, ": ", sm_count, " SMs, ", shared_memory_per_block / 1024, " KiB shared memory per block",
                      features.empty() ? "" : ", ", absl::StrJoin(features, ", "), " (", source, ")");
}

Target TargetForDevice(int major, int minor, int sm_count, int64_t shared_memory_per_block, std::string source) {
  Target t;
  t.compute_capability = major * 10 + minor;
  // kiln uses Hopper's architecture-specific features, so compute capability 9.0 is sm_90a.
  t.arch = absl::StrCat("sm_", major, minor, t.compute_capability == 90 ? "a" : "");
  t.sm_count = sm_count;
  t.shared_memory_per_block = shared_memory_per_block;
  t.has_wgmma = t.arch == "sm_90a";
  t.has_tma = t.compute_capability >= 90;
  t.has_fp8 = t.compute_capability >= 89;
  t.source = std::move(source);
  return t;
}

absl::StatusOr<Target> TargetForArch(absl::string_view arch) {
  for (const NominalTarget& n : kNominal) {
    if (arch != n.arch) continue;
    Target t = TargetForDevice(n.major, n.minor, n.sm_count, n.shared_kib * 1024,
                               absl::StrCat("--target ", arch, ", nominal"));
    t.arch = n.arch;  // sm_90 stays sm_90: no 'a' features
    t.has_wgmma = t.arch == "sm_90a";
    return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown target architecture '", arch, "' (known: ",
                                                 absl::StrJoin(KnownTargetArchs(), ", "), ")"));
}

std::vector<std::string> KnownTargetArchs() {
  std::vector<std::string> names;
  for (const NominalTarget& n : kNominal) names.push_back(n.arch);
  return names;
}

}  // namespace kiln
