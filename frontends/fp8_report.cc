#include "frontends/fp8_report.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ir/fp8_scaling.h"

namespace kiln {

std::string FormatFp8Report(const Function& step, const TrainingStepLayout& layout,
                            const std::vector<std::string>& decisions, const std::vector<HostTensor>& states) {
  if (layout.fp8_tensors.empty()) return "";
  int64_t fp8_gemms = 0, copies = 0, copy_bytes = 0, fp8_bytes = 0;
  for (const auto& n : step.nodes()) {
    if (n->opcode() == Opcode::kGemm && n->attrs().Has("scaled")) ++fp8_gemms;
    if (n->opcode() == Opcode::kFp8Quantize) {
      fp8_bytes += n->result_type(Fp8QuantizeResults::kQ).num_bytes();
      const absl::StatusOr<Fp8QuantizeResults> results = Fp8QuantizeResultsOf(n->attrs());
      if (results.ok() && results->transposed()) {
        ++copies;
        copy_bytes += n->result_type(results->q_t).num_bytes();
        fp8_bytes += n->result_type(results->q_t).num_bytes();
      }
    }
  }
  std::vector<std::string> kept;
  for (const std::string& d : decisions) {
    if (absl::StrContains(d, ": bf16, ")) kept.push_back(d);
  }
  int64_t e4m3 = 0, e5m2 = 0;
  for (const Fp8Tensor& t : layout.fp8_tensors) (t.format == DType::kF8E4M3 ? e4m3 : e5m2)++;
  std::string out = absl::StrFormat(
      "kiln train: FP8 (passes/fp8_policy.h): %d gemms run in FP8, %d of the policy's stay bf16%s\n"
      "  %d scaled tensors: %d e4m3 (weights, activations), %d e5m2 (gradients); FP8 copies %.1f MiB written "
      "per step, of which %d transposed (K-inner) copies %.1f MiB\n",
      fp8_gemms, kept.size(), kept.empty() ? "" : absl::StrCat(" (first: ", kept[0], ")"), layout.fp8_tensors.size(),
      e4m3, e5m2, fp8_bytes / 1048576.0, copies, copy_bytes / 1048576.0);
  if (states.size() != layout.fp8_tensors.size()) return out;
  // Scales by format, overflows by tensor.
  std::map<DType, std::pair<int, int>> exponents;
  int64_t overflows = 0;
  std::vector<std::pair<int64_t, std::string>> overflowed;
  for (size_t i = 0; i < states.size(); ++i) {
    const HostTensor& s = states[i];
    const int e = Fp8ScaleExponent(s[0]);
    auto [it, fresh] = exponents.try_emplace(layout.fp8_tensors[i].format, e, e);
    it->second = {std::min(it->second.first, e), std::max(it->second.second, e)};
    const int64_t count = static_cast<int64_t>(s[1]);
    overflows += count;
    if (count > 0) overflowed.emplace_back(count, layout.fp8_tensors[i].name);
  }
  absl::StrAppendFormat(&out, "  scales now:");
  for (const auto& [format, range] : exponents) {
    absl::StrAppendFormat(&out, " %s 2^%d .. 2^%d;", DTypeName(format), range.first, range.second);
  }
  absl::StrAppendFormat(&out, " overflowed steps (amax inf/NaN, scale halved): %d\n", overflows);
  std::sort(overflowed.rbegin(), overflowed.rend());
  for (size_t i = 0; i < overflowed.size() && i < 5; ++i) {
    absl::StrAppendFormat(&out, "    %s: %d\n", overflowed[i].second, overflowed[i].first);
  }
  return out;
}

}  // namespace kiln
