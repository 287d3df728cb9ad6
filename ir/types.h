// Element types and static tensor types of the kiln IR.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace kiln {

// X(enum, text name, bytes per element)
#define KILN_DTYPES(X)   \
  X(kF32, "f32", 4)      \
  X(kF16, "f16", 2)      \
  X(kBF16, "bf16", 2)    \
  X(kF8E4M3, "f8e4m3", 1) \
  X(kF8E5M2, "f8e5m2", 1) \
  X(kI32, "i32", 4)      \
  X(kI64, "i64", 8)      \
  X(kPred, "pred", 1)

enum class DType : uint8_t {
#define KILN_DTYPE_ENUM(e, name, bytes) e,
  KILN_DTYPES(KILN_DTYPE_ENUM)
#undef KILN_DTYPE_ENUM
};

inline constexpr int kNumDTypes = 8;

absl::string_view DTypeName(DType t);
int DTypeBytes(DType t);
absl::StatusOr<DType> ParseDType(absl::string_view name);
bool IsFloat(DType t);    // f32, f16, bf16, f8*
bool IsInteger(DType t);  // i32, i64
bool IsFp8(DType t);      // f8e4m3, f8e5m2

// A tensor type: element type plus static dimensions. Rank 0 is a scalar.
struct TensorType {
  DType dtype = DType::kF32;
  std::vector<int64_t> dims;

  int rank() const { return static_cast<int>(dims.size()); }
  int64_t num_elements() const;
  int64_t num_bytes() const { return num_elements() * DTypeBytes(dtype); }
  bool operator==(const TensorType& o) const { return dtype == o.dtype && dims == o.dims; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
  // "bf16[16,1024,768]"; a scalar prints as "f32[]".
  std::string ToString() const;
};

std::string DimsToString(const std::vector<int64_t>& dims);  // "[16,1024,768]"
// "f32[2], f32[2], ... (99992 more, 100000 in all)": a list of types for an error message,
// the first `max_shown` and a count, since an op may have 100k operands.
std::string TypeListToString(const std::vector<TensorType>& types, size_t max_shown = 8);

// The one limit on tensor sizes that every reader (IR text, protobuf, JSON, safetensors)
// and every builder input (model configs, --batch and --seq) applies, so that no input can
// reach element or byte arithmetic that overflows, or ask for a tensor no machine holds:
// at most kMaxTensorRank dims, and at most kMaxTensorElements elements (zero dims left
// out of the product, so that an empty tensor cannot hide a huge neighbour).
inline constexpr int kMaxTensorRank = 64;
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;
// Ok, or why `dims` is beyond the limit ("type f32[...] has more than 2^40 elements").
absl::Status CheckTensorSizeLimit(DType dtype, const std::vector<int64_t>& dims);

}  // namespace kiln
