#include "ir/shape_inference.h"

#include "ir/fusion.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/fp8_scaling.h"
#include "ir/gemm_slots.h"
#include "ir/paged_kv_shapes.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

absl::Status Invalid(std::string msg) { return absl::InvalidArgumentError(std::move(msg)); }

absl::Status RequireFloat(const TensorType& t, absl::string_view what) {
  if (!IsFloat(t.dtype)) {
    return Invalid(absl::StrCat(what, " must be a float type, got ", t.ToString()));
  }
  return absl::OkStatus();
}

absl::Status RequireInteger(const TensorType& t, absl::string_view what) {
  if (!IsInteger(t.dtype)) {
    return Invalid(absl::StrCat(what, " must be i32 or i64, got ", t.ToString()));
  }
  return absl::OkStatus();
}

absl::Status RequireSame(const TensorType& a, const TensorType& b, absl::string_view what) {
  if (a != b) return Invalid(absl::StrCat(what, " differ: ", a.ToString(), " vs ", b.ToString()));
  return absl::OkStatus();
}

absl::Status RequireRank(const TensorType& t, int rank, absl::string_view what) {
  if (t.rank() != rank) {
    return Invalid(absl::StrCat(what, " must have rank ", rank, ", got ", t.ToString()));
  }
  return absl::OkStatus();
}

absl::Status RequireNonNegativeDims(const TensorType& t) {
  for (int64_t d : t.dims) {
    if (d < 0) return Invalid(absl::StrCat("negative dimension in ", t.ToString()));
  }
  return absl::OkStatus();
}

// Checks that `dims` are distinct, in [0, rank), and returns them as a set.
absl::StatusOr<std::set<int64_t>> DimSet(const std::vector<int64_t>& dims, int rank,
                                         absl::string_view what) {
  std::set<int64_t> s;
  for (int64_t d : dims) {
    if (d < 0 || d >= rank) {
      return Invalid(absl::StrCat(what, " has dimension ", d, " out of range for rank ", rank));
    }
    if (!s.insert(d).second) return Invalid(absl::StrCat(what, " repeats dimension ", d));
  }
  return s;
}

absl::StatusOr<TensorType> InferConstant(const AttrMap& attrs, const TensorType& declared) {
  if (attrs.Has("value") == attrs.Has("values")) {
    return Invalid("constant needs exactly one of 'value' (a splat) or 'values' (dense)");
  }
  if (attrs.Has("values")) {
    ASSIGN_OR_RETURN(std::vector<double> values, attrs.GetFloats("values"));
    if (static_cast<int64_t>(values.size()) != declared.num_elements()) {
      return Invalid(absl::StrCat("constant has ", values.size(), " values but type ",
                                  declared.ToString(), " holds ", declared.num_elements()));
    }
  } else {
    RETURN_IF_ERROR(attrs.GetFloat("value").status());
  }
  return declared;
}

absl::StatusOr<TensorType> InferBroadcast(const TensorType& x, const AttrMap& attrs,
                                          const TensorType& declared) {
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, attrs.GetInts("dims"));
  if (static_cast<int>(dims.size()) != x.rank()) {
    return Invalid(absl::StrCat("broadcast dims ", DimsToString(dims), " must name one result dim for each of the ",
                                x.rank(), " operand dims"));
  }
  if (x.dtype != declared.dtype) {
    return Invalid(absl::StrCat("broadcast cannot change dtype: ", x.ToString(), " to ", declared.ToString()));
  }
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= declared.rank()) {
      return Invalid(absl::StrCat("broadcast dim ", dims[i], " out of range for result ", declared.ToString()));
    }
    if (i > 0 && dims[i] <= dims[i - 1]) {
      return Invalid(absl::StrCat("broadcast dims ", DimsToString(dims), " must be strictly increasing"));
    }
    if (x.dims[i] != declared.dims[dims[i]] && x.dims[i] != 1) {
      return Invalid(absl::StrCat("broadcast operand dim ", i, " has size ", x.dims[i], " but result dim ", dims[i],
                                  " has size ", declared.dims[dims[i]]));
    }
  }
  return declared;
}

absl::StatusOr<TensorType> InferSlice(const TensorType& x, const AttrMap& attrs) {
  ASSIGN_OR_RETURN(std::vector<int64_t> start, attrs.GetInts("start"));
  ASSIGN_OR_RETURN(std::vector<int64_t> limit, attrs.GetInts("limit"));
  ASSIGN_OR_RETURN(std::vector<int64_t> stride, attrs.GetInts("stride"));
  if (static_cast<int>(start.size()) != x.rank() || static_cast<int>(limit.size()) != x.rank() ||
      static_cast<int>(stride.size()) != x.rank()) {
    return Invalid(absl::StrCat("slice start/limit/stride must each have ", x.rank(), " entries"));
  }
  TensorType out{x.dtype, {}};
  for (int i = 0; i < x.rank(); ++i) {
    if (stride[i] < 1) return Invalid(absl::StrCat("slice stride ", stride[i], " in dim ", i, " must be >= 1"));
    if (start[i] < 0 || start[i] > limit[i] || limit[i] > x.dims[i]) {
      return Invalid(absl::StrCat("slice [", start[i], ", ", limit[i], ") out of bounds in dim ", i, " of size ",
                                  x.dims[i]));
    }
    // ceil((limit - start) / stride), written so that a huge stride cannot overflow.
    out.dims.push_back(limit[i] > start[i] ? (limit[i] - start[i] - 1) / stride[i] + 1 : 0);
  }
  return out;
}

absl::StatusOr<TensorType> InferConcatenate(absl::Span<const TensorType> xs, const AttrMap& attrs) {
  if (xs.empty()) return Invalid("concatenate needs at least one operand");
  ASSIGN_OR_RETURN(int64_t dim, attrs.GetInt("dim"));
  const TensorType& first = xs[0];
  if (dim < 0 || dim >= first.rank()) {
    return Invalid(absl::StrCat("concatenate dim ", dim, " out of range for ", first.ToString()));
  }
  TensorType out = first;
  out.dims[dim] = 0;
  for (const TensorType& x : xs) {
    if (x.dtype != first.dtype || x.rank() != first.rank()) {
      return Invalid(absl::StrCat("concatenate operands disagree: ", first.ToString(), " vs ", x.ToString()));
    }
    for (int i = 0; i < x.rank(); ++i) {
      if (i != dim && x.dims[i] != first.dims[i]) {
        return Invalid(absl::StrCat("concatenate operands differ in dim ", i, ": ", first.ToString(), " vs ",
                                    x.ToString()));
      }
    }
    out.dims[dim] += x.dims[dim];
  }
  return out;
}

absl::StatusOr<TensorType> InferDotGeneral(const TensorType& a, const TensorType& b, const AttrMap& attrs) {
  ASSIGN_OR_RETURN(std::vector<int64_t> lb, attrs.GetInts("lhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> rb, attrs.GetInts("rhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> lc, attrs.GetInts("lhs_contract"));
  ASSIGN_OR_RETURN(std::vector<int64_t> rc, attrs.GetInts("rhs_contract"));
  if (a.dtype != b.dtype) {
    return Invalid(absl::StrCat("dot_general operand dtypes differ: ", a.ToString(), " vs ", b.ToString()));
  }
  if (!IsFloat(a.dtype)) return Invalid(absl::StrCat("dot_general needs float operands, got ", a.ToString()));
  if (lb.size() != rb.size()) return Invalid("dot_general lhs_batch and rhs_batch differ in length");
  if (lc.size() != rc.size()) return Invalid("dot_general lhs_contract and rhs_contract differ in length");
  std::vector<int64_t> lall = lb, rall = rb;
  lall.insert(lall.end(), lc.begin(), lc.end());
  rall.insert(rall.end(), rc.begin(), rc.end());
  ASSIGN_OR_RETURN(std::set<int64_t> lused, DimSet(lall, a.rank(), "dot_general lhs batch+contract"));
  ASSIGN_OR_RETURN(std::set<int64_t> rused, DimSet(rall, b.rank(), "dot_general rhs batch+contract"));
  for (size_t i = 0; i < lb.size(); ++i) {
    if (a.dims[lb[i]] != b.dims[rb[i]]) {
      return Invalid(absl::StrCat("dot_general batch dims differ: lhs dim ", lb[i], " (", a.dims[lb[i]],
                                  ") vs rhs dim ", rb[i], " (", b.dims[rb[i]], ")"));
    }
  }
  for (size_t i = 0; i < lc.size(); ++i) {
    if (a.dims[lc[i]] != b.dims[rc[i]]) {
      return Invalid(absl::StrCat("dot_general contracting dims differ: lhs dim ", lc[i], " (", a.dims[lc[i]],
                                  ") vs rhs dim ", rc[i], " (", b.dims[rc[i]], ")"));
    }
  }
  TensorType out{a.dtype, {}};
  if (attrs.Has("out_dtype")) {
    ASSIGN_OR_RETURN(out.dtype, attrs.GetDType("out_dtype"));
    if (!IsFloat(out.dtype)) return Invalid("dot_general out_dtype must be a float type");
  }
  for (int64_t d : lb) out.dims.push_back(a.dims[d]);
  for (int i = 0; i < a.rank(); ++i) {
    if (!lused.count(i)) out.dims.push_back(a.dims[i]);
  }
  for (int i = 0; i < b.rank(); ++i) {
    if (!rused.count(i)) out.dims.push_back(b.dims[i]);
  }
  return out;
}

// Rows of a table: idx.dims ++ table.dims[1:].
std::vector<int64_t> GatheredDims(const TensorType& table, const TensorType& idx) {
  std::vector<int64_t> dims = idx.dims;
  dims.insert(dims.end(), table.dims.begin() + 1, table.dims.end());
  return dims;
}

// fp8_quantize's and fp8_scale_update's delayed-scaling state: f32 [L + 2] (ir/op_table.h).
absl::Status RequireFp8State(const TensorType& state, absl::string_view op) {
  if (state.dtype != DType::kF32 || state.rank() != 1 || state.dims[0] < 3) {
    return Invalid(absl::StrCat(op, " state ", state.ToString(),
                                " must be f32[L + 2] ([exponent, overflows, L >= 1 amaxes])"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> Fp8FormatAttr(const AttrMap& attrs, absl::string_view name, absl::string_view op) {
  ASSIGN_OR_RETURN(DType format, attrs.GetDType(name));
  if (!IsFp8(format)) {
    return Invalid(absl::StrCat(op, " ", name, " must be f8e4m3 or f8e5m2, got ", DTypeName(format)));
  }
  return format;
}

// (q, amax, scale_inv[, q_t]): see ir/op_table.h.
absl::StatusOr<std::vector<TensorType>> InferFp8Quantize(absl::Span<const TensorType> xs, const AttrMap& attrs) {
  const TensorType& x = xs[0];
  RETURN_IF_ERROR(RequireFloat(x, "fp8_quantize input"));
  if (IsFp8(x.dtype)) return Invalid(absl::StrCat("fp8_quantize input ", x.ToString(), " is fp8 already"));
  if (x.rank() < 1) return Invalid("fp8_quantize input must have rank >= 1");
  RETURN_IF_ERROR(RequireFp8State(xs[1], "fp8_quantize"));
  ASSIGN_OR_RETURN(DType format, Fp8FormatAttr(attrs, "out_dtype", "fp8_quantize"));
  ASSIGN_OR_RETURN(const Fp8QuantizeResults results, Fp8QuantizeResultsOf(attrs));
  const TensorType scalar{DType::kF32, {}};
  std::vector<TensorType> types{TensorType{format, x.dims}, scalar, scalar};
  if (results.transposed()) {
    const int64_t cols = x.dims.back();
    types.push_back(TensorType{format, {cols, cols == 0 ? 0 : x.num_elements() / cols}});
  }
  if (results.updates_state()) types.push_back(xs[1]);  // the next state
  return types;
}

// A norm's result: x's type, or with {out_dtype} x's f32 result rounded to out_dtype (the
// kernel computes in f32 and rounds once on store, so x must be f32 for that to be one
// rounding on the GPU as in the reference).
absl::StatusOr<TensorType> WithOutDtype(TensorType x, const AttrMap& attrs, absl::string_view op) {
  if (!attrs.Has("out_dtype")) return x;
  ASSIGN_OR_RETURN(DType out, attrs.GetDType("out_dtype"));
  if (!IsFloat(out)) return Invalid(absl::StrCat(op, " out_dtype must be a float type"));
  if (x.dtype != DType::kF32) {
    return Invalid(absl::StrCat(op, " with out_dtype takes an f32 input, got ", x.ToString()));
  }
  x.dtype = out;
  return x;
}

absl::StatusOr<TensorType> InferRmsNormFamily(Opcode op, absl::Span<const TensorType> xs, const AttrMap& attrs) {
  ASSIGN_OR_RETURN(double eps, attrs.GetFloat("eps"));
  if (!(eps >= 0)) return Invalid("rms_norm eps must be >= 0");
  const TensorType& x = xs[0];
  const TensorType& w = xs[1];
  RETURN_IF_ERROR(RequireFloat(x, "rms_norm input"));
  RETURN_IF_ERROR(RequireFloat(w, "rms_norm weight"));
  if (x.rank() < 1) return Invalid("rms_norm input must have rank >= 1");
  if (w.rank() != 1 || w.dims[0] != x.dims.back()) {
    return Invalid(absl::StrCat("rms_norm weight ", w.ToString(), " must be [", x.dims.back(),
                                "], the input's last dim"));
  }
  if (op == Opcode::kRmsNorm) return WithOutDtype(x, attrs, "rms_norm");
  if (xs[2].dims != x.dims || !IsFloat(xs[2].dtype)) {
    return Invalid(absl::StrCat("rms_norm gradient dy ", xs[2].ToString(), " must have the input's shape ",
                                DimsToString(x.dims)));
  }
  return op == Opcode::kRmsNormGradInput ? x : w;
}

// layer_norm(x, w, b): w and b the input's last dim.
absl::StatusOr<TensorType> InferLayerNorm(absl::Span<const TensorType> xs, const AttrMap& attrs) {
  ASSIGN_OR_RETURN(double eps, attrs.GetFloat("eps"));
  if (!(eps >= 0)) return Invalid("layer_norm eps must be >= 0");
  const TensorType& x = xs[0];
  RETURN_IF_ERROR(RequireFloat(x, "layer_norm input"));
  if (x.rank() < 1) return Invalid("layer_norm input must have rank >= 1");
  for (int i : {1, 2}) {
    RETURN_IF_ERROR(RequireFloat(xs[i], i == 1 ? "layer_norm weight" : "layer_norm bias"));
    if (xs[i].rank() != 1 || xs[i].dims[0] != x.dims.back()) {
      return Invalid(absl::StrCat("layer_norm ", i == 1 ? "weight " : "bias ", xs[i].ToString(), " must be [",
                                  x.dims.back(), "], the input's last dim"));
    }
  }
  return WithOutDtype(x, attrs, "layer_norm");
}

// The checks cross_entropy and cross_entropy_grad share on (logits, labels) and {classes};
// the type of one f32 per row (the loss, the lse, dloss).
absl::StatusOr<TensorType> CrossEntropyRowsType(absl::Span<const TensorType> xs, const AttrMap& attrs) {
  const TensorType& logits = xs[0];
  const TensorType& labels = xs[1];
  RETURN_IF_ERROR(RequireFloat(logits, "logits"));
  RETURN_IF_ERROR(RequireRank(logits, 2, "logits"));
  RETURN_IF_ERROR(RequireInteger(labels, "labels"));
  if (labels.dims != std::vector<int64_t>{logits.dims[0]}) {
    return Invalid(absl::StrCat("labels ", labels.ToString(), " must be [", logits.dims[0], "] for logits ",
                                logits.ToString()));
  }
  if (attrs.Has("classes")) {
    ASSIGN_OR_RETURN(int64_t classes, attrs.GetInt("classes"));
    if (classes < 1 || classes > logits.dims[1]) {
      return Invalid(absl::StrCat("classes ", classes, " must be in [1, ", logits.dims[1], "] for logits ",
                                  logits.ToString()));
    }
  }
  return TensorType{DType::kF32, {logits.dims[0]}};
}

// add_rms_norm(h, branch, w) and add_layer_norm(h, branch, w, b): the norm's checks on the
// sum; results (sum, y).
absl::StatusOr<std::vector<TensorType>> InferAddNorm(Opcode op, absl::Span<const TensorType> xs,
                                                     const AttrMap& attrs) {
  const absl::string_view name = OpName(op);
  const TensorType& h = xs[0];
  if (h.dtype != DType::kF32 || xs[1] != h) {
    return Invalid(absl::StrCat(name, " h ", h.ToString(), " and branch ", xs[1].ToString(),
                                " must be f32 of one shape"));
  }
  std::vector<TensorType> norm_operands(xs.begin() + 1, xs.end());
  norm_operands[0] = h;  // the sum's type
  TensorType y;
  if (op == Opcode::kAddRmsNorm) {
    ASSIGN_OR_RETURN(y, InferRmsNormFamily(Opcode::kRmsNorm, norm_operands, attrs));
  } else {
    ASSIGN_OR_RETURN(y, InferLayerNorm(norm_operands, attrs));
  }
  return std::vector<TensorType>{h, y};
}

// {weight_grad}: absent or 0 (dx only), or 1 (dw too, as the last result).
absl::StatusOr<bool> WeightGradFlag(const AttrMap& attrs, absl::string_view op) {
  if (!attrs.Has("weight_grad")) return false;
  ASSIGN_OR_RETURN(int64_t v, attrs.GetInt("weight_grad"));
  if (v != 0 && v != 1) return Invalid(absl::StrCat(op, " weight_grad=", v, " must be 0 or 1"));
  return v == 1;
}

// rms_norm_grad_input(x, w, dy): dx (x's type) and, with {weight_grad=1}, dw
// (rms_norm_grad_weight's type: w's).
absl::StatusOr<std::vector<TensorType>> InferRmsNormGradInput(absl::Span<const TensorType> xs,
                                                              const AttrMap& attrs) {
  ASSIGN_OR_RETURN(TensorType dx, InferRmsNormFamily(Opcode::kRmsNormGradInput, xs, attrs));
  ASSIGN_OR_RETURN(bool weight_grad, WeightGradFlag(attrs, "rms_norm_grad_input"));
  std::vector<TensorType> results = {dx};
  if (weight_grad) results.push_back(xs[1]);
  return results;
}

// add_rms_norm_grad_input(dres, x, w, dy): rms_norm_grad_input's checks on (x, w, dy); dres
// of x's type, f32; results dx (dres's type), with {copy_dtype} its copy, with
// {weight_grad=1} dw (w's type), in that order.
absl::StatusOr<std::vector<TensorType>> InferAddRmsNormGradInput(absl::Span<const TensorType> xs,
                                                                 const AttrMap& attrs) {
  const TensorType& dres = xs[0];
  if (dres.dtype != DType::kF32 || xs[1] != dres) {
    return Invalid(absl::StrCat("add_rms_norm_grad_input dres ", dres.ToString(), " and x ", xs[1].ToString(),
                                " must be f32 of one shape"));
  }
  ASSIGN_OR_RETURN(TensorType dx, InferRmsNormFamily(Opcode::kRmsNormGradInput, xs.subspan(1), attrs));
  std::vector<TensorType> results = {dx};
  if (attrs.Has("copy_dtype")) {
    ASSIGN_OR_RETURN(DType copy, attrs.GetDType("copy_dtype"));
    if (!IsFloat(copy)) return Invalid("add_rms_norm_grad_input copy_dtype must be a float type");
    results.push_back(TensorType{copy, dx.dims});
  }
  ASSIGN_OR_RETURN(bool weight_grad, WeightGradFlag(attrs, "add_rms_norm_grad_input"));
  if (weight_grad) results.push_back(xs[2]);
  return results;
}

// layer_norm_grad_input(x, w, dy) and add_layer_norm_grad_input(dres, x, w, dy): x float of
// rank >= 1, w [D] (its last dim), dy float of x's shape; dres f32 of x's type. Results dx
// (x's type), with {copy_dtype} (the residual form) its copy, with {weight_grad=1} dw and db
// (w's type), in that order.
absl::StatusOr<std::vector<TensorType>> InferLayerNormGradInput(Opcode op, absl::Span<const TensorType> xs,
                                                                const AttrMap& attrs) {
  const absl::string_view name = OpName(op);
  const bool residual = op == Opcode::kAddLayerNormGradInput;
  const absl::Span<const TensorType> norm = residual ? xs.subspan(1) : xs;
  ASSIGN_OR_RETURN(double eps, attrs.GetFloat("eps"));
  if (!(eps >= 0)) return Invalid(absl::StrCat(name, " eps must be >= 0"));
  const TensorType& x = norm[0];
  const TensorType& w = norm[1];
  const TensorType& dy = norm[2];
  RETURN_IF_ERROR(RequireFloat(x, absl::StrCat(name, " input")));
  RETURN_IF_ERROR(RequireFloat(w, absl::StrCat(name, " weight")));
  if (x.rank() < 1) return Invalid(absl::StrCat(name, " input must have rank >= 1"));
  if (w.rank() != 1 || w.dims[0] != x.dims.back()) {
    return Invalid(absl::StrCat(name, " weight ", w.ToString(), " must be [", x.dims.back(), "], the input's last dim"));
  }
  if (dy.dims != x.dims || !IsFloat(dy.dtype)) {
    return Invalid(absl::StrCat(name, " dy ", dy.ToString(), " must be a float of the input's shape ",
                                DimsToString(x.dims)));
  }
  std::vector<TensorType> results = {x};
  if (residual) {
    if (xs[0].dtype != DType::kF32 || xs[0] != x) {
      return Invalid(absl::StrCat(name, " dres ", xs[0].ToString(), " and x ", x.ToString(),
                                  " must be f32 of one shape"));
    }
    if (attrs.Has("copy_dtype")) {
      ASSIGN_OR_RETURN(DType copy, attrs.GetDType("copy_dtype"));
      if (!IsFloat(copy)) return Invalid(absl::StrCat(name, " copy_dtype must be a float type"));
      results.push_back(TensorType{copy, x.dims});
    }
  }
  ASSIGN_OR_RETURN(bool weight_grad, WeightGradFlag(attrs, name));
  if (weight_grad) results.insert(results.end(), {w, w});
  return results;
}

// gemm(a, b[, c]): sizes from the attributes, each operand's element count checked against
// them; the declared result holds batch x M x N elements.
absl::StatusOr<std::vector<TensorType>> InferGemm(absl::Span<const TensorType> xs, const AttrMap& attrs,
                                                  const TensorType& declared) {
  absl::StatusOr<GemmSlots> slots = GemmSlotsOf(attrs);
  if (!slots.ok()) return Invalid(std::string(slots.status().message()));
  const bool scaled = slots->a_scale >= 0, amax = slots->amax;
  ASSIGN_OR_RETURN(double beta, attrs.GetFloat("beta"));
  const size_t want = slots->num_operands;
  if (xs.size() != want) {
    return Invalid(absl::StrCat("gemm takes a, b", beta != 0 ? ", c (beta != 0)" : "",
                                slots->bias >= 0 ? ", bias (epilogue=bias)" : "",
                                scaled ? ", a_scale, b_scale, d_scale (scaled=1)" : "", ": ", want,
                                " operands, got ", xs.size()));
  }
  int64_t size[4];
  const char* const kSizes[] = {"batch", "m", "n", "k"};
  for (int i = 0; i < 4; ++i) {
    ASSIGN_OR_RETURN(size[i], attrs.GetInt(kSizes[i]));
    if (size[i] < 0 || size[i] > (int64_t{1} << 40)) return Invalid(absl::StrCat("gemm ", kSizes[i], "=", size[i], " out of range"));
  }
  const int64_t batch = size[0], m = size[1], n = size[2], k = size[3];
  ASSIGN_OR_RETURN(std::string a_layout, attrs.GetSymbol("a_layout"));
  ASSIGN_OR_RETURN(std::string b_layout, attrs.GetSymbol("b_layout"));
  if (a_layout != "mk" && a_layout != "km") return Invalid(absl::StrCat("gemm a_layout '", a_layout, "' is not mk or km"));
  if (b_layout != "nk" && b_layout != "kn") return Invalid(absl::StrCat("gemm b_layout '", b_layout, "' is not nk or kn"));
  ASSIGN_OR_RETURN(double alpha, attrs.GetFloat("alpha"));
  if (!std::isfinite(alpha) || !std::isfinite(beta)) return Invalid("gemm alpha and beta must be finite");
  const TensorType& a = xs[0];
  const TensorType& b = xs[1];
  RETURN_IF_ERROR(RequireFloat(a, "gemm a"));
  RETURN_IF_ERROR(RequireFloat(b, "gemm b"));
  if (scaled) {
    if (IsFp8(a.dtype) != IsFp8(b.dtype) || (!IsFp8(a.dtype) && b.dtype != a.dtype)) {
      return Invalid(absl::StrCat("scaled gemm operands must be both fp8 or of one dtype: ", a.ToString(), " vs ",
                                  b.ToString()));
    }
  } else if (b.dtype != a.dtype || IsFp8(a.dtype)) {
    return Invalid(absl::StrCat("gemm operands must share a non-fp8 dtype (fp8 takes scaled=1): ", a.ToString(),
                                " vs ", b.ToString()));
  }
  if (a.num_elements() != batch * m * k || b.num_elements() != batch * n * k) {
    return Invalid(absl::StrCat("gemm a ", a.ToString(), " and b ", b.ToString(), " must hold batch*m*k = ", batch * m * k,
                                " and batch*n*k = ", batch * n * k, " elements"));
  }
  const bool dtype_ok = scaled ? IsFloat(declared.dtype) : (declared.dtype == DType::kF32 || declared.dtype == a.dtype);
  if (declared.num_elements() != batch * m * n || !dtype_ok) {
    return Invalid(absl::StrCat("gemm result ", declared.ToString(), " must hold batch*m*n = ", batch * m * n,
                                scaled ? " elements of a float type" : absl::StrCat(" elements of f32 or ", DTypeName(a.dtype))));
  }
  if (slots->c >= 0 && xs[slots->c] != declared) {
    return Invalid(absl::StrCat("gemm c ", xs[slots->c].ToString(), " must have the result's type ", declared.ToString()));
  }
  if (slots->bias >= 0) {
    const TensorType& bias = xs[slots->bias];
    // The result's dtype: cuBLASLt (13.0, H200) refuses an f32 bias for a bf16 D.
    if (bias.dims != std::vector<int64_t>{n} || bias.dtype != declared.dtype) {
      return Invalid(absl::StrCat("gemm bias ", bias.ToString(), " must be [n] = [", n, "] of the result's dtype ",
                                  DTypeName(declared.dtype)));
    }
  }
  if (scaled) {
    const TensorType scalar{DType::kF32, {}};
    for (int i = slots->a_scale; i <= slots->d_scale; ++i) {
      if (xs[i] != scalar) return Invalid(absl::StrCat("gemm scales must be f32[], got ", xs[i].ToString()));
    }
  }
  std::vector<TensorType> results = {declared};
  if (amax) results.push_back(TensorType{DType::kF32, {}});
  return results;
}

// adamw_update(p_1, g_1, m_1, v_1, ..., p_K, g_K, m_K, v_K, step_size, decay, sqrt_bc2,
// grad_scale), K >= 1 groups: the state tensors of a group share one f32 type (master weights
// and optimizer state), the per-step values are f32 scalars; group i's results p'_i, m'_i,
// v'_i have its type. K = 1 is the one-parameter node, whose messages name no group.
absl::StatusOr<std::vector<TensorType>> InferAdamWUpdate(absl::Span<const TensorType> xs, const AttrMap& attrs) {
  if (xs.size() < 8 || xs.size() % 4 != 0) {
    return Invalid(absl::StrCat("expects 4 operands (p, g, m, v) per parameter group and 4 scalars, at least 8, got ",
                                xs.size()));
  }
  for (absl::string_view beta : {"beta1", "beta2"}) {
    ASSIGN_OR_RETURN(double value, attrs.GetFloat(beta));
    if (!(value >= 0 && value < 1)) return Invalid(absl::StrCat(beta, "=", value, " must be in [0, 1)"));
  }
  ASSIGN_OR_RETURN(double eps, attrs.GetFloat("eps"));
  if (!(eps >= 0) || std::isinf(eps)) return Invalid(absl::StrCat("eps=", eps, " must be finite and >= 0"));
  const size_t groups = xs.size() / 4 - 1;
  std::vector<TensorType> results;
  for (size_t k = 0; k < groups; ++k) {
    const std::string group = groups == 1 ? "" : absl::StrCat("group ", k, ": ");
    const TensorType& p = xs[4 * k];
    if (p.dtype != DType::kF32) {
      return Invalid(absl::StrCat(group, "p must be f32 (master weights), got ", p.ToString()));
    }
    static constexpr absl::string_view kState[] = {"p", "g", "m", "v"};
    for (int i = 1; i < 4; ++i) {
      if (xs[4 * k + i] != p) {
        return Invalid(absl::StrCat(group, kState[i], " ", xs[4 * k + i].ToString(), " must have p's type ",
                                    p.ToString()));
      }
    }
    results.insert(results.end(), {p, p, p});
  }
  static constexpr absl::string_view kScalars[] = {"step_size", "decay", "sqrt_bc2", "grad_scale"};
  for (int i = 0; i < 4; ++i) {
    if (xs[4 * groups + i] != TensorType{DType::kF32, {}}) {
      return Invalid(
          absl::StrCat(kScalars[i], " must be an f32[] scalar, got ", xs[4 * groups + i].ToString()));
    }
  }
  return results;
}

// q bf16 [B,H,T,D]; k (and v) bf16 [B,Hkv,T,D] with H a multiple of Hkv.
absl::Status CheckAttentionQkv(absl::Span<const TensorType> xs, int count) {
  const TensorType& q = xs[0];
  if (q.dtype != DType::kBF16 || q.rank() != 4) {
    return Invalid(absl::StrCat("attention q ", q.ToString(), " must be bf16 [B,H,T,D]"));
  }
  for (int i = 1; i < count; ++i) {
    const TensorType& kv = xs[i];
    if (kv.dtype != DType::kBF16 || kv.rank() != 4 || kv.dims[0] != q.dims[0] || kv.dims[2] != q.dims[2] ||
        kv.dims[3] != q.dims[3] || kv.dims[1] < 1 || q.dims[1] % kv.dims[1] != 0) {
      return Invalid(absl::StrCat("attention ", i == 1 ? "k " : "v ", kv.ToString(), " must be bf16 [", q.dims[0],
                                  ",Hkv,", q.dims[2], ",", q.dims[3], "] with ", q.dims[1],
                                  " query heads a multiple of Hkv"));
    }
  }
  if (count == 3 && xs[1] != xs[2]) return Invalid("attention k and v types must match");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorType>> InferAttentionFamily(Opcode op, absl::Span<const TensorType> xs,
                                                             const AttrMap& attrs) {
  if (op != Opcode::kAttentionDelta) {
    ASSIGN_OR_RETURN(double scale, attrs.GetFloat("scale"));
    if (!(scale > 0) || !std::isfinite(scale)) return Invalid("attention scale must be finite and > 0");
  }
  switch (op) {
    case Opcode::kAttention: {
      RETURN_IF_ERROR(CheckAttentionQkv(xs, 3));
      // O is f32, or stored bf16 (the f32 O rounded once): the kernels take those two, and
      // bf16 is what every reader of a narrowed O wants (ir/op_table.h).
      DType out = DType::kF32;
      if (attrs.Has("out_dtype")) {
        ASSIGN_OR_RETURN(out, attrs.GetDType("out_dtype"));
        if (out != DType::kBF16) {
          return Invalid(absl::StrCat("attention out_dtype ", DTypeName(out),
                                      " is not supported: only bf16 (f32, the default, is written without it)"));
        }
      }
      return std::vector<TensorType>{TensorType{out, xs[0].dims},
                                     TensorType{DType::kF32, {xs[0].dims[0], xs[0].dims[1], xs[0].dims[2]}}};
    }
    case Opcode::kAttentionDelta: {
      const TensorType& o = xs[0];
      // O as attention writes it: f32, or bf16 with {out_dtype=bf16} (Delta rounds it to bf16
      // either way, so both give the same Delta).
      if ((o.dtype != DType::kF32 && o.dtype != DType::kBF16) || o.rank() != 4) {
        return Invalid(absl::StrCat("attention_delta o ", o.ToString(), " must be f32 or bf16 [B,H,T,D]"));
      }
      if (!IsFloat(xs[1].dtype) || xs[1].dims != o.dims) {
        return Invalid(absl::StrCat("attention_delta do ", xs[1].ToString(), " must be a float tensor of o's shape ",
                                    o.ToString()));
      }
      return std::vector<TensorType>{TensorType{DType::kF32, {o.dims[0], o.dims[1], o.dims[2]}}};
    }
    case Opcode::kAttentionGrad: {
      RETURN_IF_ERROR(CheckAttentionQkv(xs, 3));
      const TensorType rows{DType::kF32, {xs[0].dims[0], xs[0].dims[1], xs[0].dims[2]}};
      if (xs[3] != TensorType{DType::kBF16, xs[0].dims}) {
        return Invalid(absl::StrCat("attention_grad do ", xs[3].ToString(), " must be bf16 of q's shape"));
      }
      if (xs[4] != rows || xs[5] != rows) {
        return Invalid(absl::StrCat("attention_grad lse ", xs[4].ToString(), " and delta ", xs[5].ToString(),
                                    " must be ", rows.ToString()));
      }
      return std::vector<TensorType>{TensorType{DType::kF32, xs[0].dims}, TensorType{DType::kF32, xs[1].dims},
                                     TensorType{DType::kF32, xs[2].dims}};
    }
    default:
      break;
  }
  return Invalid("not an attention op");
}

// The type of a node of a single-result op (arity already checked).
absl::StatusOr<TensorType> InferOneResult(Opcode op, absl::Span<const TensorType> xs, const AttrMap& attrs,
                                          const TensorType* declared) {
  const OpInfo& info = GetOpInfo(op);
  if (info.result == ResultRule::kDeclared) {
    if (declared == nullptr) return Invalid("needs a declared result type");
    RETURN_IF_ERROR(RequireNonNegativeDims(*declared));
  }
  for (const TensorType& x : xs) RETURN_IF_ERROR(RequireNonNegativeDims(x));

  switch (op) {
    case Opcode::kParameter: {
      ASSIGN_OR_RETURN(int64_t index, attrs.GetInt("index"));
      if (index < 0) return Invalid(absl::StrCat("parameter index ", index, " must be >= 0"));
      return *declared;
    }
    case Opcode::kConstant:
      return InferConstant(attrs, *declared);
    case Opcode::kIota: {
      ASSIGN_OR_RETURN(int64_t dim, attrs.GetInt("dim"));
      if (dim < 0 || dim >= declared->rank()) {
        return Invalid(absl::StrCat("iota dim ", dim, " out of range for ", declared->ToString()));
      }
      if (declared->dtype == DType::kPred) return Invalid("iota cannot produce pred");
      return *declared;
    }
    case Opcode::kNeg:
    case Opcode::kAbs:
    case Opcode::kExp:
    case Opcode::kLog:
    case Opcode::kSqrt:
    case Opcode::kRsqrt:
    case Opcode::kTanh:
    case Opcode::kSigmoid:
    case Opcode::kGelu:
      if (op == Opcode::kNeg || op == Opcode::kAbs) {
        if (xs[0].dtype == DType::kPred) return Invalid("operand must be numeric, got pred");
      } else {
        RETURN_IF_ERROR(RequireFloat(xs[0], "operand"));
      }
      return xs[0];
    case Opcode::kAdd:
    case Opcode::kSub:
    case Opcode::kMul:
    case Opcode::kDiv:
    case Opcode::kMax:
    case Opcode::kMin:
      RETURN_IF_ERROR(RequireSame(xs[0], xs[1], "operand types"));
      if (xs[0].dtype == DType::kPred) return Invalid("operands must be numeric, got pred");
      return xs[0];
    case Opcode::kCompare: {
      RETURN_IF_ERROR(RequireSame(xs[0], xs[1], "operand types"));
      ASSIGN_OR_RETURN(std::string dir, attrs.GetSymbol("direction"));
      if (!IsCompareDirection(dir)) {
        return Invalid(absl::StrCat("compare direction '", dir, "' is not one of eq, ne, lt, le, gt, ge"));
      }
      return TensorType{DType::kPred, xs[0].dims};
    }
    case Opcode::kSelect:
      if (xs[0].dtype != DType::kPred || xs[0].dims != xs[1].dims) {
        return Invalid(absl::StrCat("select predicate ", xs[0].ToString(), " must be pred with the shape of ",
                                    xs[1].ToString()));
      }
      RETURN_IF_ERROR(RequireSame(xs[1], xs[2], "select branch types"));
      return xs[1];
    case Opcode::kConvert:
      if (xs[0].dims != declared->dims) {
        return Invalid(absl::StrCat("convert cannot change shape: ", xs[0].ToString(), " to ", declared->ToString()));
      }
      return *declared;
    case Opcode::kBroadcast:
      return InferBroadcast(xs[0], attrs, *declared);
    case Opcode::kReshape:
      if (xs[0].dtype != declared->dtype || xs[0].num_elements() != declared->num_elements()) {
        return Invalid(absl::StrCat("reshape must keep dtype and element count: ", xs[0].ToString(), " to ",
                                    declared->ToString()));
      }
      return *declared;
    case Opcode::kTranspose: {
      ASSIGN_OR_RETURN(std::vector<int64_t> perm, attrs.GetInts("perm"));
      if (static_cast<int>(perm.size()) != xs[0].rank()) {
        return Invalid(absl::StrCat("transpose perm ", DimsToString(perm), " must have ", xs[0].rank(), " entries"));
      }
      RETURN_IF_ERROR(DimSet(perm, xs[0].rank(), "transpose perm").status());
      TensorType out{xs[0].dtype, {}};
      for (int64_t p : perm) out.dims.push_back(xs[0].dims[p]);
      return out;
    }
    case Opcode::kSlice:
      return InferSlice(xs[0], attrs);
    case Opcode::kConcatenate:
      return InferConcatenate(xs, attrs);
    case Opcode::kReduceSum:
    case Opcode::kReduceMax: {
      ASSIGN_OR_RETURN(std::vector<int64_t> dims, attrs.GetInts("dims"));
      ASSIGN_OR_RETURN(std::set<int64_t> s, DimSet(dims, xs[0].rank(), "reduce dims"));
      if (xs[0].dtype == DType::kPred) return Invalid("cannot reduce pred");
      TensorType out{xs[0].dtype, {}};
      for (int i = 0; i < xs[0].rank(); ++i) {
        if (!s.count(i)) out.dims.push_back(xs[0].dims[i]);
      }
      return out;
    }
    case Opcode::kDotGeneral:
      return InferDotGeneral(xs[0], xs[1], attrs);
    case Opcode::kGather:
      if (xs[0].rank() < 1) return Invalid("gather table must have rank >= 1");
      RETURN_IF_ERROR(RequireInteger(xs[1], "gather indices"));
      return TensorType{xs[0].dtype, GatheredDims(xs[0], xs[1])};
    case Opcode::kScatterAdd:
      RETURN_IF_ERROR(RequireInteger(xs[0], "scatter_add indices"));
      if (declared->rank() < 1) return Invalid("scatter_add result must have rank >= 1");
      if (xs[1].dtype != declared->dtype || xs[1].dims != GatheredDims(*declared, xs[0])) {
        return Invalid(absl::StrCat("scatter_add updates ", xs[1].ToString(), " must be ",
                                    TensorType{declared->dtype, GatheredDims(*declared, xs[0])}.ToString(),
                                    " for indices ", xs[0].ToString(), " and result ", declared->ToString()));
      }
      return *declared;
    case Opcode::kRmsNorm:
    case Opcode::kRmsNormGradWeight:
      return InferRmsNormFamily(op, xs, attrs);
    case Opcode::kLayerNorm:
      return InferLayerNorm(xs, attrs);
    case Opcode::kSoftmax:
      RETURN_IF_ERROR(RequireFloat(xs[0], "softmax input"));
      if (xs[0].rank() < 1) return Invalid("softmax input must have rank >= 1");
      return xs[0];
    case Opcode::kSoftmaxGrad:
      RETURN_IF_ERROR(RequireFloat(xs[0], "softmax output"));
      if (xs[0].rank() < 1) return Invalid("softmax output must have rank >= 1");
      RETURN_IF_ERROR(RequireSame(xs[0], xs[1], "softmax y and dy types"));
      return xs[0];
    case Opcode::kCrossEntropyGrad: {
      const TensorType& logits = xs[0];
      ASSIGN_OR_RETURN(TensorType loss, CrossEntropyRowsType(xs, attrs));
      RETURN_IF_ERROR(RequireSame(xs[2], loss, "dloss and per-row loss types"));
      RETURN_IF_ERROR(RequireSame(xs[3], loss, "lse (cross_entropy's second result) and per-row loss types"));
      // The gradient is computed in f32 and rounded once to its dtype, whatever the logits'
      // (ir/op_table.h), so any float out_dtype is one rounding.
      TensorType dlogits = logits;
      if (attrs.Has("out_dtype")) {
        ASSIGN_OR_RETURN(dlogits.dtype, attrs.GetDType("out_dtype"));
        if (!IsFloat(dlogits.dtype)) return Invalid("cross_entropy_grad out_dtype must be a float type");
      }
      return dlogits;
    }
    case Opcode::kRope: {
      ASSIGN_OR_RETURN(double theta, attrs.GetFloat("theta"));
      ASSIGN_OR_RETURN(int64_t inverse, attrs.GetInt("inverse"));
      if (!(theta > 0)) return Invalid("rope theta must be > 0");
      if (inverse != 0 && inverse != 1) return Invalid("rope inverse must be 0 or 1");
      const TensorType& x = xs[0];
      RETURN_IF_ERROR(RequireFloat(x, "rope input"));
      RETURN_IF_ERROR(RequireRank(x, 4, "rope input [B,T,H,D]"));
      if (x.dims[3] % 2 != 0) return Invalid(absl::StrCat("rope head dim ", x.dims[3], " must be even"));
      if (xs[1].dtype != DType::kI32 || xs[1].dims != std::vector<int64_t>{x.dims[1]}) {
        return Invalid(absl::StrCat("rope positions ", xs[1].ToString(), " must be i32[", x.dims[1], "]"));
      }
      return x;
    }
    case Opcode::kRopeTable: {
      ASSIGN_OR_RETURN(double theta, attrs.GetFloat("theta"));
      ASSIGN_OR_RETURN(int64_t head_dim, attrs.GetInt("head_dim"));
      ASSIGN_OR_RETURN(int64_t inverse, attrs.GetInt("inverse"));
      if (!(theta > 0)) return Invalid("rope_table theta must be > 0");
      if (inverse != 0 && inverse != 1) return Invalid("rope_table inverse must be 0 or 1");
      if (head_dim <= 0 || head_dim % 2 != 0) {
        return Invalid(absl::StrCat("rope_table head_dim ", head_dim, " must be even and positive"));
      }
      if (xs[0].dtype != DType::kI32 || xs[0].rank() != 1) {
        return Invalid(absl::StrCat("rope_table positions ", xs[0].ToString(), " must be i32[T]"));
      }
      return TensorType{DType::kF32, {xs[0].dims[0], head_dim}};
    }
    case Opcode::kAttentionDelta: {
      ASSIGN_OR_RETURN(std::vector<TensorType> types, InferAttentionFamily(op, xs, attrs));
      return types[0];
    }
    case Opcode::kSumOfSquares: {
      if (xs.empty()) return Invalid("sum_of_squares takes at least one operand");
      for (const TensorType& x : xs) {
        if (!IsFloat(x.dtype) || x.dtype != xs[0].dtype) {
          return Invalid(absl::StrCat("sum_of_squares operands must be floats of one dtype: ", xs[0].ToString(),
                                      " and ", x.ToString()));
        }
      }
      return TensorType{DType::kF32, {}};
    }
    case Opcode::kFp8Dequantize: {
      if (!IsFp8(xs[0].dtype)) return Invalid(absl::StrCat("fp8_dequantize input ", xs[0].ToString(), " must be fp8"));
      if (xs[1] != TensorType{DType::kF32, {}}) {
        return Invalid(absl::StrCat("fp8_dequantize scale_inv ", xs[1].ToString(), " must be f32[]"));
      }
      ASSIGN_OR_RETURN(DType out, attrs.GetDType("out_dtype"));
      if (!IsFloat(out) || IsFp8(out)) {
        return Invalid(absl::StrCat("fp8_dequantize out_dtype must be f32, bf16 or f16, got ", DTypeName(out)));
      }
      return TensorType{out, xs[0].dims};
    }
    case Opcode::kFp8ScaleUpdate: {
      RETURN_IF_ERROR(RequireFp8State(xs[0], "fp8_scale_update"));
      if (xs[1] != TensorType{DType::kF32, {}}) {
        return Invalid(absl::StrCat("fp8_scale_update amax ", xs[1].ToString(), " must be f32[]"));
      }
      RETURN_IF_ERROR(Fp8FormatAttr(attrs, "fp8_format", "fp8_scale_update").status());
      ASSIGN_OR_RETURN(int64_t margin, attrs.GetInt("margin"));
      if (margin < 0 || margin > 16) return Invalid(absl::StrCat("fp8_scale_update margin ", margin, " must be in [0, 16]"));
      return xs[0];
    }
    case Opcode::kKvCacheWrite:
      return InferKvCacheWrite(xs, attrs);
    case Opcode::kPagedAttention:
      return InferPagedAttention(xs, attrs);
    case Opcode::kSampleTokens: {
      // logits float [..., V], sampling f32 [..., 3], draws i32 [..., 3] -> i32 [...]
      const TensorType& logits = xs[0];
      if (!IsFloat(logits.dtype) || IsFp8(logits.dtype) || logits.rank() < 1 || logits.dims.back() < 1) {
        return Invalid(absl::StrCat("sample_tokens logits ", logits.ToString(),
                                    " must be f32, bf16 or f16 [..., V] with V >= 1"));
      }
      std::vector<int64_t> rows(logits.dims.begin(), logits.dims.end() - 1), per_row = rows;
      per_row.push_back(3);
      if (xs[1] != TensorType{DType::kF32, per_row}) {
        return Invalid(absl::StrCat("sample_tokens sampling ", xs[1].ToString(), " must be ",
                                    TensorType{DType::kF32, per_row}.ToString(), ": temperature, top_k, top_p a row"));
      }
      if (xs[2] != TensorType{DType::kI32, per_row}) {
        return Invalid(absl::StrCat("sample_tokens draws ", xs[2].ToString(), " must be ",
                                    TensorType{DType::kI32, per_row}.ToString(),
                                    ": the seed's low and high 32 bits and the draw index a row"));
      }
      return TensorType{DType::kI32, rows};
    }
    case Opcode::kAdamWUpdate:
    case Opcode::kFp8Quantize:
    case Opcode::kAddRmsNorm:
    case Opcode::kAddLayerNorm:
    case Opcode::kRmsNormGradInput:
    case Opcode::kAddRmsNormGradInput:
    case Opcode::kLayerNormGradInput:
    case Opcode::kAddLayerNormGradInput:
    case Opcode::kCrossEntropy:
    case Opcode::kAttention:
    case Opcode::kAttentionGrad:
    case Opcode::kGetResult:
    case Opcode::kFusion:
    case Opcode::kGemm:
      break;  // several results, or a body's: InferResultTypes
  }
  return Invalid("unknown opcode");
}

}  // namespace

bool IsCompareDirection(absl::string_view d) {
  return d == "eq" || d == "ne" || d == "lt" || d == "le" || d == "gt" || d == "ge";
}

absl::StatusOr<std::vector<TensorType>> InferResultTypes(Opcode op, absl::Span<const TensorType> xs,
                                                         const AttrMap& attrs, const TensorType* declared) {
  const OpInfo& info = GetOpInfo(op);
  if (op == Opcode::kGetResult) {  // xs: every result of the one multi-result operand
    ASSIGN_OR_RETURN(int64_t index, attrs.GetInt("index"));
    if (xs.size() < 2) return Invalid("get_result reads a result of a multi-result node");
    if (index < 0 || index >= static_cast<int64_t>(xs.size())) {
      return Invalid(absl::StrCat("get_result index ", index, " out of range for ", xs.size(), " results"));
    }
    return std::vector<TensorType>{xs[index]};
  }
  if (op == Opcode::kFusion) {
    return Invalid("a fusion's result types are its body's outputs (InferNodeResultTypes reads them)");
  }
  if (info.arity != kVariadic && static_cast<int>(xs.size()) != info.arity) {
    return Invalid(absl::StrCat("expects ", info.arity, " operand(s), got ", xs.size()));
  }
  for (const TensorType& x : xs) RETURN_IF_ERROR(RequireNonNegativeDims(x));
  switch (op) {
    case Opcode::kAdamWUpdate:
      return InferAdamWUpdate(xs, attrs);
    case Opcode::kFp8Quantize:
      return InferFp8Quantize(xs, attrs);
    case Opcode::kAddRmsNorm:
    case Opcode::kAddLayerNorm:
      return InferAddNorm(op, xs, attrs);
    case Opcode::kRmsNormGradInput:
      return InferRmsNormGradInput(xs, attrs);
    case Opcode::kAddRmsNormGradInput:
      return InferAddRmsNormGradInput(xs, attrs);
    case Opcode::kLayerNormGradInput:
    case Opcode::kAddLayerNormGradInput:
      return InferLayerNormGradInput(op, xs, attrs);
    case Opcode::kAttention:
    case Opcode::kAttentionGrad:
      return InferAttentionFamily(op, xs, attrs);
    case Opcode::kCrossEntropy: {  // (loss, lse)
      ASSIGN_OR_RETURN(TensorType rows, CrossEntropyRowsType(xs, attrs));
      return std::vector<TensorType>{rows, rows};
    }
    case Opcode::kGemm:
      if (declared == nullptr) return Invalid("gemm declares its result type");
      return InferGemm(xs, attrs, *declared);
    default: {
      ASSIGN_OR_RETURN(TensorType type, InferOneResult(op, xs, attrs, declared));
      return std::vector<TensorType>{std::move(type)};
    }
  }
}


absl::StatusOr<TensorType> InferResultType(Opcode op, absl::Span<const TensorType> operands, const AttrMap& attrs,
                                           const TensorType* declared) {
  ASSIGN_OR_RETURN(std::vector<TensorType> types, InferResultTypes(op, operands, attrs, declared));
  if (types.size() != 1) {
    return absl::InternalError(absl::StrCat(OpName(op), " has ", types.size(), " results: use InferResultTypes"));
  }
  return std::move(types[0]);
}

absl::StatusOr<std::vector<TensorType>> InferNodeResultTypes(const Node& node) {
  ASSIGN_OR_RETURN(std::vector<TensorType> operands, OperandTypes(node.opcode(), node.operands()));
  if (node.opcode() == Opcode::kFusion) {
    if (node.body() == nullptr) return Invalid("a fusion needs a body");
    return FusionResultTypes(operands, *node.body());
  }
  // A declared type is the first result's (an op of several results that declares one, the
  // gemm with its amax, declares its first); ops that infer theirs ignore it.
  const TensorType* declared = node.num_results() > 0 ? &node.result_type(0) : nullptr;
  return InferResultTypes(node.opcode(), operands, node.attrs(), declared);
}

absl::StatusOr<std::vector<TensorType>> OperandTypes(Opcode op, absl::Span<Node* const> operands) {
  std::vector<TensorType> types;
  for (size_t i = 0; i < operands.size(); ++i) {
    const Node* o = operands[i];
    if (!o->has_multiple_results()) {
      if (op == Opcode::kGetResult) {
        return Invalid(absl::StrCat("get_result operand %", o->name(), " (", o->op_name(), ") has one result"));
      }
      types.push_back(o->type());
      continue;
    }
    if (op != Opcode::kGetResult) {
      return Invalid(absl::StrCat("operand ", i, " %", o->name(), " is a multi-result ", o->op_name(),
                                  ": use one of its results"));
    }
    types.insert(types.end(), o->result_types().begin(), o->result_types().end());
  }
  return types;
}

}  // namespace kiln
