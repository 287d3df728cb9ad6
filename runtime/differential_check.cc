#include "runtime/differential_check.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// splitmix64: decorrelates the per-parameter seeds of neighbouring (seed, index) pairs.
uint64_t MixSeed(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string MultiIndex(const std::vector<int64_t>& dims, int64_t flat) {
  std::vector<int64_t> index(dims.size());
  for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
    index[i] = flat % dims[i];
    flat /= dims[i];
  }
  return absl::StrCat("[", absl::StrJoin(index, ","), "]");
}

absl::Status CheckSameSignature(const Function& before, const Function& after) {
  const std::vector<Node*> pb = before.parameters(), pa = after.parameters();
  if (pb.size() != pa.size()) {
    return absl::InvalidArgumentError(absl::StrCat("function ", before.name(), " has ", pb.size(),
                                                   " parameters before and ", pa.size(), " after"));
  }
  for (size_t i = 0; i < pb.size(); ++i) {
    if (pb[i]->type() != pa[i]->type()) {
      return absl::InvalidArgumentError(absl::StrCat("function ", before.name(), ", parameter ", i, " is ",
                                                     pb[i]->type().ToString(), " before and ",
                                                     pa[i]->type().ToString(), " after"));
    }
  }
  if (before.outputs().size() != after.outputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat("function ", before.name(), " has ", before.outputs().size(),
                                                   " outputs before and ", after.outputs().size(), " after"));
  }
  return absl::OkStatus();
}

OutputDifference Compare(int output, const std::string& name, const HostTensor& before, const HostTensor& after,
                         const DifferentialCheckOptions& o) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  OutputDifference d;
  d.output = output;
  d.name = name;
  bool worst_outside = false;
  double worst_abs_error = -1;
  for (int64_t i = 0; i < before.num_elements(); ++i) {
    const double b = before[i], a = after[i];
    // NaN matches NaN and an infinity the same infinity; any other non-finite mismatch is
    // infinitely far off, whatever the tolerance.
    const bool same = b == a || (std::isnan(b) && std::isnan(a));
    const bool finite = std::isfinite(b) && std::isfinite(a);
    const double abs_error = same ? 0.0 : finite ? std::fabs(a - b) : kInf;
    const double rel_error = same ? 0.0 : (b == 0 || !finite) ? kInf : abs_error / std::fabs(b);
    const bool outside = !same && (!finite || abs_error > o.abs_tolerance + o.rel_tolerance * std::fabs(b));
    d.max_abs_error = std::max(d.max_abs_error, abs_error);
    d.max_rel_error = std::max(d.max_rel_error, rel_error);
    // The worst element: outside the tolerance first, then the largest absolute error.
    if ((outside && !worst_outside) || (outside == worst_outside && abs_error > worst_abs_error)) {
      worst_outside = outside;
      worst_abs_error = abs_error;
      d.worst_element = i;
      d.before = b;
      d.after = a;
    }
    if (outside) d.within_tolerance = false;
  }
  return d;
}

std::string Describe(const DifferentialReport& report, const OutputDifference& d, const TensorType& type,
                     const DifferentialCheckOptions& o) {
  std::string s = absl::StrCat("function ", report.function, ", output ", d.output, " (%", d.name, ": ",
                               type.ToString(), "): ");
  if (d.worst_element < 0) return absl::StrCat(s, "empty");
  absl::StrAppend(&s, "element ", d.worst_element, " ", MultiIndex(type.dims, d.worst_element), " is ",
                  FormatDouble(d.before), " before and ", FormatDouble(d.after), " after (max abs error ",
                  d.max_abs_error, ", max rel error ", d.max_rel_error, "; allowed abs ", o.abs_tolerance,
                  " + rel ", o.rel_tolerance, " * |before|)");
  return s;
}

}  // namespace

bool DifferentialReport::within_tolerance() const {
  for (const OutputDifference& d : outputs) {
    if (!d.within_tolerance) return false;
  }
  return true;
}

std::string DifferentialReport::ToString() const {
  std::string s;
  for (const OutputDifference& d : outputs) {
    absl::StrAppend(&s, "function ", function, ", output ", d.output, " (%", d.name, "): ",
                    d.within_tolerance ? "ok" : "MISMATCH", ", max abs error ", d.max_abs_error,
                    ", max rel error ", d.max_rel_error, "\n");
  }
  return s;
}

std::vector<HostTensor> RandomInputs(const Function& f, const DifferentialCheckOptions& options) {
  std::vector<HostTensor> inputs;
  const std::vector<Node*> params = f.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const TensorType& type = params[i]->type();
    ValueRange range = IsInteger(type.dtype) ? options.int_range : options.float_range;
    if (auto it = options.ranges.find(static_cast<int64_t>(i)); it != options.ranges.end()) range = it->second;
    inputs.push_back(HostTensor::Random(type, MixSeed(options.seed, i), range.lo, range.hi));
  }
  return inputs;
}

absl::StatusOr<DifferentialReport> CompareFunctions(const Function& before, const Function& after,
                                                    const DifferentialCheckOptions& options) {
  RETURN_IF_ERROR(CheckSameSignature(before, after));
  const std::vector<HostTensor> inputs = RandomInputs(before, options);
  absl::StatusOr<std::vector<HostTensor>> expected = EvaluateFunction(before, inputs, options.reference);
  if (!expected.ok()) {
    return absl::Status(expected.status().code(), absl::StrCat("evaluating before: ", expected.status().message()));
  }
  absl::StatusOr<std::vector<HostTensor>> actual = EvaluateFunction(after, inputs, options.reference);
  if (!actual.ok()) {
    return absl::Status(actual.status().code(), absl::StrCat("evaluating after: ", actual.status().message()));
  }
  DifferentialReport report;
  report.function = before.name();
  for (size_t i = 0; i < expected->size(); ++i) {
    const HostTensor& b = (*expected)[i];
    const HostTensor& a = (*actual)[i];
    if (b.type() != a.type()) {
      return absl::InvalidArgumentError(absl::StrCat("function ", before.name(), ", output ", i, " is ",
                                                     b.type().ToString(), " before and ", a.type().ToString(),
                                                     " after"));
    }
    report.outputs.push_back(Compare(static_cast<int>(i), before.outputs()[i]->name(), b, a, options));
  }
  return report;
}

absl::Status CheckMeaningPreserved(const Function& before, const Function& after,
                                   const DifferentialCheckOptions& options) {
  ASSIGN_OR_RETURN(DifferentialReport report, CompareFunctions(before, after, options));
  for (size_t i = 0; i < report.outputs.size(); ++i) {
    const OutputDifference& d = report.outputs[i];
    if (d.within_tolerance) continue;
    return absl::FailedPreconditionError(
        absl::StrCat("meaning changed: ", Describe(report, d, before.outputs()[i]->type(), options)));
  }
  return absl::OkStatus();
}

absl::Status CheckMeaningPreserved(const Module& before, const Module& after,
                                   const DifferentialCheckOptions& options) {
  for (const auto& f : before.functions()) {
    const Function* g = after.FindFunction(f->name());
    if (g == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("function ", f->name(), " is missing after"));
    }
    RETURN_IF_ERROR(CheckMeaningPreserved(*f, *g, options));
  }
  return absl::OkStatus();
}

}  // namespace kiln
