// A tensor in host memory for the CPU reference backend. Every dtype is held as row-major
// doubles that are always already rounded to the dtype (ir/numerics.h), so a value
// means the same thing whatever the dtype, and comparisons against GPU results need no
// decoding. Integers are exact up to 2^53; pred is 0.0 or 1.0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/types.h"

namespace kiln {

class HostTensor {
 public:
  HostTensor() = default;
  explicit HostTensor(TensorType type);  // zeros

  // Rounds each value with RoundToDType. KILN_CHECKs that there is one value per element.
  static HostTensor FromValues(TensorType type, std::vector<double> values);
  // Uniform random values from a seeded generator, for tests that run graphs on fresh
  // inputs: floats in [lo, hi) then rounded; integers uniform in [ceil(lo), ceil(hi) - 1];
  // pred 0 or 1 with equal odds (lo and hi ignored).
  static HostTensor Random(TensorType type, uint64_t seed, double lo = -1.0, double hi = 1.0);

  const TensorType& type() const { return type_; }
  int64_t num_elements() const { return static_cast<int64_t>(values_.size()); }
  const std::vector<double>& values() const { return values_; }
  // The caller keeps the values representable in the dtype.
  std::vector<double>& mutable_values() { return values_; }
  double operator[](int64_t i) const { return values_[i]; }

  // "f32[2,2]{1, 2.5, -0, 3}"; long tensors are cut after `max_values`.
  std::string ToString(int64_t max_values = 16) const;

 private:
  TensorType type_;
  std::vector<double> values_;
};

}  // namespace kiln
