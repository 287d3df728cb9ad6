#include "ir/paged_kv_shapes.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

absl::Status Invalid(absl::string_view op, std::string msg) {
  return absl::InvalidArgumentError(absl::StrCat(op, " ", msg));
}

// The pool [L, NB, Hkv, BS, D], of f32 or bf16, and a layer index inside it.
absl::Status CheckPool(absl::string_view op, absl::string_view what, const TensorType& pool, const AttrMap& attrs) {
  if (pool.rank() != 5 || (pool.dtype != DType::kF32 && pool.dtype != DType::kBF16)) {
    return Invalid(op, absl::StrCat(what, " ", pool.ToString(),
                                    " must be f32 or bf16 [layers, blocks, kv_heads, block_size, head_dim]"));
  }
  for (int64_t d : pool.dims) {
    if (d < 1) return Invalid(op, absl::StrCat(what, " ", pool.ToString(), " must have every dim >= 1"));
  }
  ASSIGN_OR_RETURN(int64_t layer, attrs.GetInt("layer"));
  if (layer < 0 || layer >= pool.dims[0]) {
    return Invalid(op, absl::StrCat("layer ", layer, " is outside the pool's ", pool.dims[0], " layers"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TensorType> InferKvCacheWrite(absl::Span<const TensorType> xs, const AttrMap& attrs) {
  constexpr absl::string_view kOp = "kv_cache_write";
  const TensorType& pool = xs[0];
  const TensorType& x = xs[1];
  const TensorType& slots = xs[2];
  RETURN_IF_ERROR(CheckPool(kOp, "pool", pool, attrs));
  if (!IsFloat(x.dtype) || x.rank() != 3 || x.dims[1] != pool.dims[2] || x.dims[2] != pool.dims[4]) {
    return Invalid(kOp, absl::StrCat("rows ", x.ToString(), " must be float [N, ", pool.dims[2], ", ", pool.dims[4],
                                     "] (kv heads and head dim of the pool ", pool.ToString(), ")"));
  }
  if (slots.dtype != DType::kI32 || slots.dims != std::vector<int64_t>{x.dims[0]}) {
    return Invalid(kOp, absl::StrCat("slots ", slots.ToString(), " must be i32[", x.dims[0], "], one per row"));
  }
  return pool;
}

absl::StatusOr<TensorType> InferPagedAttention(absl::Span<const TensorType> xs, const AttrMap& attrs) {
  constexpr absl::string_view kOp = "paged_attention";
  const TensorType& q = xs[0];
  const TensorType& k_pool = xs[1];
  const TensorType& v_pool = xs[2];
  const TensorType& tables = xs[3];
  const TensorType& positions = xs[4];
  ASSIGN_OR_RETURN(double scale, attrs.GetFloat("scale"));
  if (!(scale > 0) || !std::isfinite(scale)) return Invalid(kOp, absl::StrCat("scale ", scale, " must be finite and > 0"));
  RETURN_IF_ERROR(CheckPool(kOp, "k_pool", k_pool, attrs));
  if (v_pool != k_pool) {
    return Invalid(kOp, absl::StrCat("v_pool ", v_pool.ToString(), " must have k_pool's type ", k_pool.ToString()));
  }
  if (q.dtype != k_pool.dtype || q.rank() != 4 || q.dims[3] != k_pool.dims[4] || q.dims[2] < 1 ||
      q.dims[2] % k_pool.dims[2] != 0) {
    return Invalid(kOp, absl::StrCat("q ", q.ToString(), " must be ", DTypeName(k_pool.dtype), " [B, T, H, ",
                                     k_pool.dims[4], "] with H a multiple of the pool's ", k_pool.dims[2],
                                     " kv heads"));
  }
  if (tables.dtype != DType::kI32 || tables.rank() != 2 || tables.dims[0] != q.dims[0] || tables.dims[1] < 1) {
    return Invalid(kOp, absl::StrCat("block_tables ", tables.ToString(), " must be i32[", q.dims[0],
                                     ", M] with M >= 1"));
  }
  if (positions.dtype != DType::kI32 || positions.dims != std::vector<int64_t>{q.dims[0], q.dims[1]}) {
    return Invalid(kOp, absl::StrCat("positions ", positions.ToString(), " must be i32[", q.dims[0], ",", q.dims[1],
                                     "], one per query"));
  }
  DType out = DType::kF32;
  if (attrs.Has("out_dtype")) {
    ASSIGN_OR_RETURN(out, attrs.GetDType("out_dtype"));
    if (!IsFloat(out)) return Invalid(kOp, absl::StrCat("out_dtype ", DTypeName(out), " must be a float type"));
  }
  return TensorType{out, q.dims};
}

}  // namespace kiln
