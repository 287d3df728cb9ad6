#include "ir/host_tensor.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "ir/attributes.h"
#include "ir/status_macros.h"
#include "ir/numerics.h"
#include "ir/thread_pool.h"

namespace kiln {

HostTensor::HostTensor(TensorType type) : type_(std::move(type)), values_(type_.num_elements(), 0.0) {}

HostTensor HostTensor::FromValues(TensorType type, std::vector<double> values) {
  KILN_CHECK(static_cast<int64_t>(values.size()) == type.num_elements());
  HostTensor t;
  t.type_ = std::move(type);
  t.values_ = std::move(values);
  // On all cores for large tensors; each value rounds alone, so the split changes nothing.
  ThreadPool::Shared(0).ParallelFor(t.num_elements(), int64_t{1} << 18, [&](int64_t begin, int64_t end) {
    RoundValuesToDType(t.values_.data() + begin, end - begin, t.type_.dtype);
  });
  return t;
}

HostTensor HostTensor::Random(TensorType type, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::vector<double> values(type.num_elements());
  if (type.dtype == DType::kPred) {
    std::bernoulli_distribution coin(0.5);
    for (double& v : values) v = coin(rng) ? 1.0 : 0.0;
  } else if (IsInteger(type.dtype)) {
    std::uniform_int_distribution<int64_t> pick(static_cast<int64_t>(std::ceil(lo)),
                                                static_cast<int64_t>(std::ceil(hi)) - 1);
    for (double& v : values) v = static_cast<double>(pick(rng));
  } else {
    std::uniform_real_distribution<double> pick(lo, hi);
    for (double& v : values) v = pick(rng);
  }
  return FromValues(std::move(type), std::move(values));
}

std::string HostTensor::ToString(int64_t max_values) const {
  std::string s = absl::StrCat(type_.ToString(), "{");
  for (int64_t i = 0; i < num_elements() && i < max_values; ++i) {
    absl::StrAppend(&s, i > 0 ? ", " : "", FormatDouble(values_[i]));
  }
  if (num_elements() > max_values) absl::StrAppend(&s, ", ...");
  return absl::StrCat(s, "}");
}

}  // namespace kiln
