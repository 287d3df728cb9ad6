#include "frontends/fp8_report.h"

#include <algorithm>
#include <cmath>
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
  // Saturation, delayed scaling's silent failure: a step whose amax outgrows the scale its
  // history chose clips its largest values to the format's largest (no inf, so no overflow
  // is counted). The last step's scale came from the history before it: the state's amaxes
  // after the newest, less the one that has aged out since (so a tensor whose aged-out amax
  // was its history's max shows as saturated when it was not).
  std::map<const Node*, int64_t> margins;  // by state parameter
  for (const auto& n : step.nodes()) {
    const bool update = n->opcode() == Opcode::kFp8ScaleUpdate ||
                        (n->opcode() == Opcode::kFp8Quantize && n->attrs().Has("update_state"));
    if (update) margins[n->operand(n->opcode() == Opcode::kFp8ScaleUpdate ? 0 : 1)] = *n->attrs().GetInt("margin");
  }
  const std::vector<Node*> params = step.parameters();
  int64_t saturated = 0;
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < states.size(); ++i) {
    const HostTensor& s = states[i];
    const int64_t p = layout.first_fp8_state() + static_cast<int64_t>(i);
    if (s.num_elements() < kFp8StateHeader + 2 || p >= static_cast<int64_t>(params.size())) continue;
    double before = 0;  // the max of the history the last step's scale came from
    for (int64_t j = kFp8StateHeader + 1; j < s.num_elements(); ++j) before = std::max(before, s[j]);
    const double newest = s[kFp8StateHeader];
    if (!(before > 0) || !std::isfinite(newest) || !std::isfinite(before)) continue;
    const DType format = layout.fp8_tensors[i].format;
    const auto margin = margins.find(params[p]);
    const int e = Fp8ExponentForAmax(before, format, margin == margins.end() ? 0 : static_cast<int>(margin->second));
    const double over = std::ldexp(newest, e) / Fp8MaxFinite(format);
    if (over <= 1) continue;
    ++saturated;
    if (over > worst) worst = over, worst_name = layout.fp8_tensors[i].name;
  }
  absl::StrAppendFormat(&out, "  saturated at the last step (amax past the scale's range, the largest values clipped): %d",
                        saturated);
  if (saturated > 0) absl::StrAppendFormat(&out, "; worst %s, amax %.2fx the range", worst_name, worst);
  absl::StrAppend(&out, "\n");
  return out;
}

}  // namespace kiln
