#include "ir/types.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln {

absl::string_view DTypeName(DType t) {
  switch (t) {
#define KILN_DTYPE_NAME(e, name, bytes) \
  case DType::e:                        \
    return name;
    KILN_DTYPES(KILN_DTYPE_NAME)
#undef KILN_DTYPE_NAME
  }
  return "?";
}

int DTypeBytes(DType t) {
  switch (t) {
#define KILN_DTYPE_BYTES(e, name, bytes) \
  case DType::e:                         \
    return bytes;
    KILN_DTYPES(KILN_DTYPE_BYTES)
#undef KILN_DTYPE_BYTES
  }
  return 0;
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
#define KILN_DTYPE_PARSE(e, text, bytes) \
  if (name == text) return DType::e;
  KILN_DTYPES(KILN_DTYPE_PARSE)
#undef KILN_DTYPE_PARSE
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown element type '", name, "' (expected one of f32, f16, bf16, f8e4m3, f8e5m2, i32, i64, pred)"));
}

bool IsFloat(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF8E4M3 ||
         t == DType::kF8E5M2;
}

bool IsInteger(DType t) { return t == DType::kI32 || t == DType::kI64; }
bool IsFp8(DType t) { return t == DType::kF8E4M3 || t == DType::kF8E5M2; }

int64_t TensorType::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string DimsToString(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

std::string TypeListToString(const std::vector<TensorType>& types, size_t max_shown) {
  std::string out;
  for (size_t i = 0; i < types.size() && i < max_shown; ++i) absl::StrAppend(&out, i ? ", " : "", types[i].ToString());
  if (types.size() > max_shown) absl::StrAppend(&out, ", ... (", types.size() - max_shown, " more, ", types.size(), " in all)");
  return out;
}

absl::Status CheckTensorSizeLimit(DType dtype, const std::vector<int64_t>& dims) {
  const std::string shown = absl::StrCat(DTypeName(dtype), DimsToString(dims));
  if (static_cast<int>(dims.size()) > kMaxTensorRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("type ", DTypeName(dtype), " of rank ", dims.size(), " has more than ", kMaxTensorRank,
                     " dimensions (kiln's limit)"));
  }
  int64_t elements = 1;
  for (int64_t d : dims) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("type ", shown, " has a negative dimension"));
    if (d == 0) continue;
    if (elements > kMaxTensorElements / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("type ", shown, " has more than 2^40 elements (kiln's limit on a tensor's size)"));
    }
    elements *= d;
  }
  return absl::OkStatus();
}

std::string TensorType::ToString() const { return absl::StrCat(DTypeName(dtype), DimsToString(dims)); }

}  // namespace kiln
