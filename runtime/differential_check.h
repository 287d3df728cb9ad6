// Differential checking (DESIGN.md principle 3): run two functions, typically one before and
// after a pass or pipeline, on the same fresh random inputs in the CPU reference backend and
// compare every output. Pure rewrites must match exactly (the default); a transformation
// that changes rounding is compared with the tolerance its policy allows.
//
//   std::unique_ptr<Module> before = CloneModule(*module);
//   RETURN_IF_ERROR(RunDefaultPipeline(*module, options).status());
//   RETURN_IF_ERROR(CheckMeaningPreserved(*before, *module));
//   // "function main, output 1 (%y): element 5 [1,2] is 0.25 before and 0.5 after
//   //  (abs error 0.25, rel error 1; allowed abs 0 + rel 0 * |before|)"
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "ir/reference_backend.h"

namespace kiln {

struct ValueRange {
  double lo = -1.0;
  double hi = 1.0;  // exclusive; integers are drawn from [ceil(lo), ceil(hi) - 1]
};

struct DifferentialCheckOptions {
  uint64_t seed = 0;
  // An element matches when |after - before| <= abs_tolerance + rel_tolerance * |before|.
  // Both 0 (the default) asks for equal values. NaN matches NaN, an infinity matches the
  // same infinity, and -0.0 matches +0.0: they are equal values, and a flipped sign that
  // matters downstream (1/x, log) shows up there as a different value.
  double abs_tolerance = 0.0;
  double rel_tolerance = 0.0;
  ValueRange float_range;
  // Integer inputs are usually indices (token ids, labels) or positions; [0, 2) stays inside
  // any dim they can index. Give a wider range per parameter where it matters.
  ValueRange int_range{0.0, 2.0};
  // Per-parameter ranges by parameter index (they override the two above).
  absl::flat_hash_map<int64_t, ValueRange> ranges;
  ReferenceOptions reference;
};

// How one output differs. The worst element is the one furthest outside the tolerance, or
// with the largest absolute error when every element is inside it.
struct OutputDifference {
  int output = 0;
  std::string name;  // the output node's name in `before`
  double max_abs_error = 0;
  double max_rel_error = 0;  // |after - before| / |before|; inf when only before is 0
  int64_t worst_element = -1;  // flat row-major index; -1 for an empty tensor
  double before = 0;
  double after = 0;
  bool within_tolerance = true;
};

struct DifferentialReport {
  std::string function;
  std::vector<OutputDifference> outputs;
  bool within_tolerance() const;
  std::string ToString() const;  // one line per output
};

// The inputs a check feeds `f`: parameter i gets HostTensor::Random with a seed derived from
// (options.seed, i) and the range for its dtype or index.
std::vector<HostTensor> RandomInputs(const Function& f, const DifferentialCheckOptions& options);

// Runs both functions on RandomInputs(before) and compares output by output. Errors: the
// two signatures differ (parameter or output types), or either function fails to evaluate
// (the message says which).
absl::StatusOr<DifferentialReport> CompareFunctions(const Function& before, const Function& after,
                                                    const DifferentialCheckOptions& options = {});

// OK when every output is within tolerance; otherwise an error naming the function, the
// output and its worst element with both values.
absl::Status CheckMeaningPreserved(const Function& before, const Function& after,
                                   const DifferentialCheckOptions& options = {});
// Every function of `before` against the function of the same name in `after`.
absl::Status CheckMeaningPreserved(const Module& before, const Module& after,
                                   const DifferentialCheckOptions& options = {});

}  // namespace kiln
