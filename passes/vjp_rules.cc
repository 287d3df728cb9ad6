#include "passes/vjp_rules.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ir/node_predicates.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

using Grads = std::vector<Node*>;

absl::StatusOr<Node*> Zeros(Builder& b, const TensorType& type) { return b.Constant(0.0, type); }

std::vector<int64_t> Iota(int64_t n, int64_t from = 0) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// The dims of a rank-`rank` tensor that are not in `removed`, ascending.
std::vector<int64_t> KeptDims(int rank, const std::vector<int64_t>& removed) {
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < rank; ++d) {
    if (std::find(removed.begin(), removed.end(), d) == removed.end()) kept.push_back(d);
  }
  return kept;
}

// reduce_sum over the last dim, broadcast back to x's shape: per-row dot products.
absl::StatusOr<Node*> RowSum(Builder& b, Node* x) {
  const int last = x->type().rank() - 1;
  ASSIGN_OR_RETURN(Node * sum, b.ReduceSum(x, {last}));
  return b.Broadcast(sum, Iota(last), x->type().dims);
}

absl::StatusOr<Node*> MulAll(Builder& b, std::initializer_list<Node*> xs) {
  Node* product = *xs.begin();
  for (auto it = xs.begin() + 1; it != xs.end(); ++it) {
    ASSIGN_OR_RETURN(product, b.Mul(product, *it));
  }
  return product;
}

// A narrow float value (bf16) widened to f32 for a VJP's arithmetic: the slopes of sigmoid,
// tanh and gelu are computed in f32 and the product is rounded once to the operand's dtype
// (NarrowedLike), as autocast's backward kernels compute them (a chain of bf16 ops would
// round at every step; an f32 result would be stored at twice the bytes and converted by
// its consumer, the next GEMM). An f32 value is returned as it is.
absl::StatusOr<Node*> Widened(Builder& b, Node* x) {
  if (IsFloat(x->type().dtype) && DTypeBytes(x->type().dtype) < DTypeBytes(DType::kF32)) {
    return b.Convert(x, DType::kF32);
  }
  return x;
}

// `dx` rounded once to the dtype of the operand it is the cotangent of.
absl::StatusOr<Node*> NarrowedLike(Builder& b, Node* dx, const Node* operand) {
  return b.Convert(dx, operand->type().dtype);
}

// ---- leaves, compare, adamw_update ---------------------------------------------------------

absl::StatusOr<Grads> NoCotangents(const VjpArgs& a) { return Grads(a.node->num_operands(), nullptr); }

// fuse-loops runs after autodiff, so a fusion met here was written by hand or by a pass run
// in the wrong order: say so rather than guess its derivative.
absl::StatusOr<Grads> FusionVjp(const VjpArgs& a) {
  return absl::InvalidArgumentError(absl::StrCat("%", a.node->name(),
                                                 " is a fusion: autodiff differentiates the ops before fuse-loops "
                                                 "groups them, so run it on the unfused function"));
}

// ---- unary ---------------------------------------------------------------------------------

absl::StatusOr<Grads> NegVjp(const VjpArgs& a) {
  ASSIGN_OR_RETURN(Node * dx, a.builder->Unary(Opcode::kNeg, a.cotangent));
  return Grads{dx};
}

// d|x|/dx = sign(x); at 0 the cotangent passes through (a subgradient).
absl::StatusOr<Grads> AbsVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  Node* x = a.node->operand(0);
  ASSIGN_OR_RETURN(Node * zero, Zeros(b, x->type()));
  ASSIGN_OR_RETURN(Node * negative, b.Compare(x, zero, "lt"));
  ASSIGN_OR_RETURN(Node * flipped, b.Unary(Opcode::kNeg, a.cotangent));
  ASSIGN_OR_RETURN(Node * dx, b.Select(negative, flipped, a.cotangent));
  return Grads{dx};
}

absl::StatusOr<Grads> ExpVjp(const VjpArgs& a) {
  ASSIGN_OR_RETURN(Node * dx, a.builder->Mul(a.cotangent, a.node));
  return Grads{dx};
}

absl::StatusOr<Grads> LogVjp(const VjpArgs& a) {
  ASSIGN_OR_RETURN(Node * dx, a.builder->Div(a.cotangent, a.node->operand(0)));
  return Grads{dx};
}

// y = sqrt(x): dx = dy / (2y).
absl::StatusOr<Grads> SqrtVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  ASSIGN_OR_RETURN(Node * two_y, b.Add(a.node, a.node));
  ASSIGN_OR_RETURN(Node * dx, b.Div(a.cotangent, two_y));
  return Grads{dx};
}

// y = x^-1/2: dx = -0.5 y^3 dy.
absl::StatusOr<Grads> RsqrtVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  ASSIGN_OR_RETURN(Node * minus_half, b.Constant(-0.5, a.node->type()));
  ASSIGN_OR_RETURN(Node * dx, MulAll(b, {a.cotangent, a.node, a.node, a.node, minus_half}));
  return Grads{dx};
}

// y = tanh(x): dx = dy (1 - y^2).
absl::StatusOr<Grads> TanhVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  ASSIGN_OR_RETURN(Node * y, Widened(b, a.node));
  ASSIGN_OR_RETURN(Node * dy, Widened(b, a.cotangent));
  ASSIGN_OR_RETURN(Node * one, b.Constant(1.0, y->type()));
  ASSIGN_OR_RETURN(Node * y2, b.Mul(y, y));
  ASSIGN_OR_RETURN(Node * slope, b.Sub(one, y2));
  ASSIGN_OR_RETURN(Node * dx, b.Mul(dy, slope));
  ASSIGN_OR_RETURN(dx, NarrowedLike(b, dx, a.node->operand(0)));
  return Grads{dx};
}

// y = sigmoid(x): dx = dy y (1 - y).
absl::StatusOr<Grads> SigmoidVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  ASSIGN_OR_RETURN(Node * y, Widened(b, a.node));
  ASSIGN_OR_RETURN(Node * dy, Widened(b, a.cotangent));
  ASSIGN_OR_RETURN(Node * one, b.Constant(1.0, y->type()));
  ASSIGN_OR_RETURN(Node * one_minus_y, b.Sub(one, y));
  ASSIGN_OR_RETURN(Node * dx, MulAll(b, {dy, y, one_minus_y}));
  ASSIGN_OR_RETURN(dx, NarrowedLike(b, dx, a.node->operand(0)));
  return Grads{dx};
}

// y = gelu(x) = x Phi(x) with Phi(x) = (1 + t) / 2, t = tanh(u), u = k (x + c x^3):
// dx = dy (Phi(x) + x (1 - t^2) k (1 + 3 c x^2) / 2), elementwise ops that fuse-loops
// puts in one kernel with their neighbours (no gelu_grad op needed).
absl::StatusOr<Grads> GeluVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  ASSIGN_OR_RETURN(Node * x, Widened(b, a.node->operand(0)));
  ASSIGN_OR_RETURN(Node * dy, Widened(b, a.cotangent));
  const TensorType& type = x->type();
  constexpr double kSqrt2OverPi = 0.7978845608028654, kCubic = 0.044715;
  ASSIGN_OR_RETURN(Node * one, b.Constant(1.0, type));
  ASSIGN_OR_RETURN(Node * half, b.Constant(0.5, type));
  ASSIGN_OR_RETURN(Node * k, b.Constant(kSqrt2OverPi, type));
  ASSIGN_OR_RETURN(Node * c, b.Constant(kCubic, type));
  ASSIGN_OR_RETURN(Node * c3, b.Constant(3 * kCubic, type));
  ASSIGN_OR_RETURN(Node * x2, b.Mul(x, x));
  ASSIGN_OR_RETURN(Node * cubic, MulAll(b, {c, x2, x}));
  ASSIGN_OR_RETURN(Node * inner, b.Add(x, cubic));
  ASSIGN_OR_RETURN(Node * u, b.Mul(k, inner));
  ASSIGN_OR_RETURN(Node * t, b.Unary(Opcode::kTanh, u));
  ASSIGN_OR_RETURN(Node * one_plus_t, b.Add(one, t));
  ASSIGN_OR_RETURN(Node * phi, b.Mul(half, one_plus_t));
  ASSIGN_OR_RETURN(Node * t2, b.Mul(t, t));
  ASSIGN_OR_RETURN(Node * sech2, b.Sub(one, t2));
  ASSIGN_OR_RETURN(Node * c3x2, b.Mul(c3, x2));
  ASSIGN_OR_RETURN(Node * du_inner, b.Add(one, c3x2));
  ASSIGN_OR_RETURN(Node * rest, MulAll(b, {half, x, sech2, k, du_inner}));
  ASSIGN_OR_RETURN(Node * slope, b.Add(phi, rest));
  ASSIGN_OR_RETURN(Node * dx, b.Mul(dy, slope));
  ASSIGN_OR_RETURN(dx, NarrowedLike(b, dx, a.node->operand(0)));
  return Grads{dx};
}

// ---- binary, select, convert -----------------------------------------------------------------

absl::StatusOr<Grads> AddVjp(const VjpArgs& a) { return Grads{a.cotangent, a.cotangent}; }

absl::StatusOr<Grads> SubVjp(const VjpArgs& a) {
  Grads g{a.cotangent, nullptr};
  if (a.wanted[1]) {
    ASSIGN_OR_RETURN(g[1], a.builder->Unary(Opcode::kNeg, a.cotangent));
  }
  return g;
}

absl::StatusOr<Grads> MulVjp(const VjpArgs& a) {
  Grads g(2, nullptr);
  if (a.wanted[0]) {
    ASSIGN_OR_RETURN(g[0], a.builder->Mul(a.cotangent, a.node->operand(1)));
  }
  if (a.wanted[1]) {
    ASSIGN_OR_RETURN(g[1], a.builder->Mul(a.cotangent, a.node->operand(0)));
  }
  return g;
}

// y = a / b: da = dy / b, db = -dy y / b.
absl::StatusOr<Grads> DivVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  Node* denominator = a.node->operand(1);
  Grads g(2, nullptr);
  if (a.wanted[0]) {
    ASSIGN_OR_RETURN(g[0], b.Div(a.cotangent, denominator));
  }
  if (a.wanted[1]) {
    ASSIGN_OR_RETURN(Node * dy_y, b.Mul(a.cotangent, a.node));
    ASSIGN_OR_RETURN(Node * quotient, b.Div(dy_y, denominator));
    ASSIGN_OR_RETURN(g[1], b.Unary(Opcode::kNeg, quotient));
  }
  return g;
}

// The cotangent goes to operand 0 where `a <direction> b` holds, else to operand 1.
absl::StatusOr<Grads> RouteByCompare(const VjpArgs& a, const char* direction) {
  Builder& b = *a.builder;
  ASSIGN_OR_RETURN(Node * first_wins, b.Compare(a.node->operand(0), a.node->operand(1), direction));
  ASSIGN_OR_RETURN(Node * zero, Zeros(b, a.node->type()));
  Grads g(2, nullptr);
  if (a.wanted[0]) {
    ASSIGN_OR_RETURN(g[0], b.Select(first_wins, a.cotangent, zero));
  }
  if (a.wanted[1]) {
    ASSIGN_OR_RETURN(g[1], b.Select(first_wins, zero, a.cotangent));
  }
  return g;
}

absl::StatusOr<Grads> MaxVjp(const VjpArgs& a) { return RouteByCompare(a, "ge"); }
absl::StatusOr<Grads> MinVjp(const VjpArgs& a) { return RouteByCompare(a, "le"); }

absl::StatusOr<Grads> SelectVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  Node* pred = a.node->operand(0);
  ASSIGN_OR_RETURN(Node * zero, Zeros(b, a.node->type()));
  Grads g(3, nullptr);
  if (a.wanted[1]) {
    ASSIGN_OR_RETURN(g[1], b.Select(pred, a.cotangent, zero));
  }
  if (a.wanted[2]) {
    ASSIGN_OR_RETURN(g[2], b.Select(pred, zero, a.cotangent));
  }
  return g;
}

// Float to float only: an integer source is never wanted.
absl::StatusOr<Grads> ConvertVjp(const VjpArgs& a) {
  Grads g(1, nullptr);
  if (a.wanted[0]) {
    ASSIGN_OR_RETURN(g[0], a.builder->Convert(a.cotangent, a.node->operand(0)->type().dtype));
  }
  return g;
}

// ---- data movement -----------------------------------------------------------------------------

// Sums over the result dims that no operand dim maps to and over the operand's size-1 dims
// that were expanded; the reshape puts those size-1 dims back.
absl::StatusOr<Grads> BroadcastVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  const TensorType& x = a.node->operand(0)->type();
  const TensorType& y = a.node->type();
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, a.node->attrs().GetInts("dims"));
  std::vector<int64_t> summed = KeptDims(y.rank(), dims);
  for (size_t i = 0; i < dims.size(); ++i) {
    if (x.dims[i] == 1 && y.dims[dims[i]] != 1) summed.push_back(dims[i]);
  }
  std::sort(summed.begin(), summed.end());
  Node* dx = a.cotangent;
  if (!summed.empty()) {
    ASSIGN_OR_RETURN(dx, b.ReduceSum(dx, summed));
  }
  if (dx->type().dims != x.dims) {
    ASSIGN_OR_RETURN(dx, b.Reshape(dx, x.dims));
  }
  return Grads{dx};
}

absl::StatusOr<Grads> ReshapeVjp(const VjpArgs& a) {
  ASSIGN_OR_RETURN(Node * dx, a.builder->Reshape(a.cotangent, a.node->operand(0)->type().dims));
  return Grads{dx};
}

absl::StatusOr<Grads> TransposeVjp(const VjpArgs& a) {
  ASSIGN_OR_RETURN(std::vector<int64_t> perm, a.node->attrs().GetInts("perm"));
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  ASSIGN_OR_RETURN(Node * dx, a.builder->Transpose(a.cotangent, inverse));
  return Grads{dx};
}

// Pads `g` with zeros along `dim` to `low + size + high`, by concatenation (there is no pad op).
absl::StatusOr<Node*> PadWithZeros(Builder& b, Node* g, int64_t dim, int64_t low, int64_t high) {
  std::vector<Node*> parts;
  for (int64_t width : {low, int64_t{-1}, high}) {
    if (width < 0) {
      parts.push_back(g);
    } else if (width > 0) {
      TensorType zeros_type = g->type();
      zeros_type.dims[dim] = width;
      ASSIGN_OR_RETURN(Node * zeros, Zeros(b, zeros_type));
      parts.push_back(zeros);
    }
  }
  if (parts.size() == 1) return g;
  return b.Concatenate(std::move(parts), dim);
}

// Spreads the n entries of `g` along `dim` to every `stride`-th position: [.., n, ..] becomes
// [.., n, 1, ..] ++ zeros [.., n, stride-1, ..] along dim+1, reshaped to [.., n*stride, ..].
absl::StatusOr<Node*> InterleaveZeros(Builder& b, Node* g, int64_t dim, int64_t stride) {
  std::vector<int64_t> split = g->type().dims;
  split.insert(split.begin() + dim + 1, 1);
  ASSIGN_OR_RETURN(Node * column, b.Reshape(g, split));
  TensorType gaps{g->type().dtype, split};
  gaps.dims[dim + 1] = stride - 1;
  ASSIGN_OR_RETURN(Node * zeros, Zeros(b, gaps));
  ASSIGN_OR_RETURN(Node * spread, b.Concatenate({column, zeros}, dim + 1));
  std::vector<int64_t> merged = g->type().dims;
  merged[dim] *= stride;
  return b.Reshape(spread, merged);
}

// The cotangent of a slice is the cotangent placed back where the slice came from, with
// zeros elsewhere; built one dim at a time.
absl::StatusOr<Grads> SliceVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  const TensorType& x = a.node->operand(0)->type();
  if (a.node->type().num_elements() == 0) {
    ASSIGN_OR_RETURN(Node * zeros, Zeros(b, x));
    return Grads{zeros};
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> start, a.node->attrs().GetInts("start"));
  ASSIGN_OR_RETURN(std::vector<int64_t> stride, a.node->attrs().GetInts("stride"));
  Node* g = a.cotangent;
  for (int d = 0; d < x.rank(); ++d) {
    if (stride[d] > 1) {
      const int64_t taken = g->type().dims[d];
      ASSIGN_OR_RETURN(g, InterleaveZeros(b, g, d, stride[d]));
      // The trailing gap after the last taken element may run past the operand's end.
      const int64_t fits = std::min(taken * stride[d], x.dims[d] - start[d]);
      if (fits < g->type().dims[d]) {
        std::vector<int64_t> limit = g->type().dims;
        limit[d] = fits;
        ASSIGN_OR_RETURN(g, b.Slice(g, std::vector<int64_t>(x.rank(), 0), limit));
      }
    }
    ASSIGN_OR_RETURN(g, PadWithZeros(b, g, d, start[d], x.dims[d] - start[d] - g->type().dims[d]));
  }
  return Grads{g};
}

absl::StatusOr<Grads> ConcatenateVjp(const VjpArgs& a) {
  ASSIGN_OR_RETURN(int64_t dim, a.node->attrs().GetInt("dim"));
  const std::vector<int64_t>& dims = a.node->type().dims;
  Grads g(a.node->num_operands(), nullptr);
  int64_t offset = 0;
  for (int i = 0; i < a.node->num_operands(); ++i) {
    const int64_t width = a.node->operand(i)->type().dims[dim];
    if (a.wanted[i]) {
      std::vector<int64_t> start(dims.size(), 0), limit = dims;
      start[dim] = offset;
      limit[dim] = offset + width;
      ASSIGN_OR_RETURN(g[i], a.builder->Slice(a.cotangent, start, limit));
    }
    offset += width;
  }
  return g;
}

// ---- reductions --------------------------------------------------------------------------------

absl::StatusOr<Grads> ReduceSumVjp(const VjpArgs& a) {
  const TensorType& x = a.node->operand(0)->type();
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, a.node->attrs().GetInts("dims"));
  ASSIGN_OR_RETURN(Node * dx, a.builder->Broadcast(a.cotangent, KeptDims(x.rank(), dims), x.dims));
  return Grads{dx};
}

// Every element equal to its maximum receives the full cotangent (see the header on ties).
absl::StatusOr<Grads> ReduceMaxVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  Node* x = a.node->operand(0);
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, a.node->attrs().GetInts("dims"));
  const std::vector<int64_t> kept = KeptDims(x->type().rank(), dims);
  ASSIGN_OR_RETURN(Node * max, b.Broadcast(a.node, kept, x->type().dims));
  ASSIGN_OR_RETURN(Node * is_max, b.Compare(x, max, "eq"));
  ASSIGN_OR_RETURN(Node * spread, b.Broadcast(a.cotangent, kept, x->type().dims));
  ASSIGN_OR_RETURN(Node * zero, Zeros(b, x->type()));
  ASSIGN_OR_RETURN(Node * dx, b.Select(is_max, spread, zero));
  return Grads{dx};
}

// ---- dot_general --------------------------------------------------------------------------------

// One operand's dims, split by the role they play in a dot_general.
struct DotSide {
  Node* node;
  std::vector<int64_t> batch, contract, free;  // free: neither batch nor contracting, ascending
  std::vector<int64_t> free_in_result;         // where the free dims sit in the result
};

DotSide MakeDotSide(Node* node, std::vector<int64_t> batch, std::vector<int64_t> contract, int64_t result_offset) {
  DotSide s{node, std::move(batch), std::move(contract), {}, {}};
  std::vector<int64_t> used = s.batch;
  used.insert(used.end(), s.contract.begin(), s.contract.end());
  s.free = KeptDims(node->type().rank(), used);
  s.free_in_result = Iota(static_cast<int64_t>(s.free.size()), result_offset);
  return s;
}

// d(self) = dy contracted with `other` over other's free dims (batch dims stay batch). The
// contraction leaves self's free dims (from dy) and other's contracting dims (which pair with
// self's); of the two operand orders, the one that lands in self's layout avoids a transpose.
// `dy` comes rounded to the operands' dtype; the product accumulates in `out_dtype`.
absl::StatusOr<Node*> DotOperandCotangent(Builder& b, Node* dy, const DotSide& self, const DotSide& other,
                                          DType out_dtype) {
  const int64_t num_batch = static_cast<int64_t>(self.batch.size());
  std::vector<std::pair<int64_t, int64_t>> paired;  // (other's contracting dim, self's), by other's
  for (size_t k = 0; k < self.contract.size(); ++k) paired.push_back({other.contract[k], self.contract[k]});
  std::sort(paired.begin(), paired.end());
  std::vector<int64_t> other_leftover;  // self dims that other's leftover dims stand for
  for (const auto& [o, s] : paired) other_leftover.push_back(s);

  auto concat = [](std::initializer_list<const std::vector<int64_t>*> parts) {
    std::vector<int64_t> v;
    for (const auto* p : parts) v.insert(v.end(), p->begin(), p->end());
    return v;
  };
  // Which self dim each result dim is, for each operand order.
  const std::vector<int64_t> dy_first = concat({&self.batch, &self.free, &other_leftover});
  const std::vector<int64_t> other_first = concat({&self.batch, &other_leftover, &self.free});
  const std::vector<int64_t> identity = Iota(static_cast<int64_t>(dy_first.size()));
  const bool use_other_first = other_first == identity && dy_first != identity;

  const std::vector<int64_t> dy_batch = Iota(num_batch);
  Node* result;
  if (use_other_first) {
    ASSIGN_OR_RETURN(result, b.DotGeneral(other.node, dy,
                                          {other.batch, dy_batch, other.free, other.free_in_result}, out_dtype));
  } else {
    ASSIGN_OR_RETURN(result, b.DotGeneral(dy, other.node,
                                          {dy_batch, other.batch, other.free_in_result, other.free}, out_dtype));
  }
  const std::vector<int64_t>& source = use_other_first ? other_first : dy_first;
  if (source == identity) return result;
  std::vector<int64_t> perm(source.size());
  for (size_t j = 0; j < source.size(); ++j) perm[source[j]] = static_cast<int64_t>(j);
  return b.Transpose(result, perm);
}

// The dtype a backward product rounds its f32 accumulator to, for an operand `x`. An operand
// that is a narrowing convert (a weight's or the residual stream's bf16 copy) gets its
// cotangent in the wider source dtype: the convert's VJP would widen it straight back, so a
// narrow result would only round the gradient for nothing (and a weight gradient stays the
// f32 the GEMM can accumulate into across contributions and micro-batches). Any other
// operand, an activation stored narrow, gets a cotangent of its own dtype, as autocast's
// gradient of a bf16 tensor is bf16.
DType DotCotangentDtype(const Node& x) {
  if (x.opcode() == Opcode::kConvert) {
    const DType source = x.operand(0)->type().dtype;
    if (IsFloat(source) && DTypeBytes(source) > DTypeBytes(x.type().dtype)) return source;
  }
  return x.type().dtype;
}

absl::StatusOr<Grads> DotGeneralVjp(const VjpArgs& a) {
  const AttrMap& attrs = a.node->attrs();
  ASSIGN_OR_RETURN(std::vector<int64_t> lhs_batch, attrs.GetInts("lhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> rhs_batch, attrs.GetInts("rhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> lhs_contract, attrs.GetInts("lhs_contract"));
  ASSIGN_OR_RETURN(std::vector<int64_t> rhs_contract, attrs.GetInts("rhs_contract"));
  const int64_t num_batch = static_cast<int64_t>(lhs_batch.size());
  DotSide lhs = MakeDotSide(a.node->operand(0), lhs_batch, lhs_contract, num_batch);
  DotSide rhs = MakeDotSide(a.node->operand(1), rhs_batch, rhs_contract,
                            num_batch + static_cast<int64_t>(lhs.free.size()));
  // Autocast: the cotangent is rounded once to the operands' dtype (bf16), and both backward
  // products accumulate in f32 like the forward product.
  ASSIGN_OR_RETURN(Node * dy, a.builder->Convert(a.cotangent, lhs.node->type().dtype));
  Grads g(2, nullptr);
  if (a.wanted[0]) {
    ASSIGN_OR_RETURN(g[0], DotOperandCotangent(*a.builder, dy, lhs, rhs, DotCotangentDtype(*lhs.node)));
  }
  if (a.wanted[1]) {
    ASSIGN_OR_RETURN(g[1], DotOperandCotangent(*a.builder, dy, rhs, lhs, DotCotangentDtype(*rhs.node)));
  }
  return g;
}

// ---- indexing ------------------------------------------------------------------------------------

absl::StatusOr<Grads> GatherVjp(const VjpArgs& a) {
  Node* table = a.node->operand(0);
  ASSIGN_OR_RETURN(Node * dtable, a.builder->ScatterAdd(a.node->operand(1), a.cotangent, table->type()));
  return Grads{dtable, nullptr};
}

absl::StatusOr<Grads> ScatterAddVjp(const VjpArgs& a) {
  ASSIGN_OR_RETURN(Node * dupdates, a.builder->Gather(a.cotangent, a.node->operand(0)));
  return Grads{nullptr, dupdates};
}

// ---- composites -----------------------------------------------------------------------------------

absl::StatusOr<Node*> RmsNormFamily(Builder& b, Opcode op, Node* x, Node* w, Node* dy, double eps) {
  return b.Op(op, {x, w, dy}, AttrMap{{"eps", eps}});
}

absl::StatusOr<Grads> RmsNormVjp(const VjpArgs& a) {
  ASSIGN_OR_RETURN(double eps, a.node->attrs().GetFloat("eps"));
  Node* x = a.node->operand(0);
  Node* w = a.node->operand(1);
  Grads g(2, nullptr);
  if (a.wanted[0]) {
    ASSIGN_OR_RETURN(g[0], RmsNormFamily(*a.builder, Opcode::kRmsNormGradInput, x, w, a.cotangent, eps));
  }
  if (a.wanted[1]) {
    ASSIGN_OR_RETURN(g[1], RmsNormFamily(*a.builder, Opcode::kRmsNormGradWeight, x, w, a.cotangent, eps));
  }
  return g;
}

// layer_norm(x, w, b) = rms_norm(c, w) + b with c = x - mean(x) (row-wise, over the last
// dim). Centering is linear and symmetric (P = I - 11^T / D), so dx = P (rms_norm's dx at c):
// rms_norm_grad_input of c, minus its row mean; dw = rms_norm_grad_weight of c; db = the sum
// of dy over the leading dims. The rms_norm kernels do the work (and give second
// derivatives); on the finished step fuse-residual-norm makes the whole of it, with the
// residual gradient's add, one layer_norm_grad_input kernel (passes/fuse_residual_norm.h).
absl::StatusOr<Grads> LayerNormVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  ASSIGN_OR_RETURN(double eps, a.node->attrs().GetFloat("eps"));
  Node* x = a.node->operand(0);
  Node* w = a.node->operand(1);
  const int last = x->type().rank() - 1;
  const double inv_d = 1.0 / static_cast<double>(x->type().dims.back());
  auto center = [&](Node* v) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * sum, RowSum(b, v));
    ASSIGN_OR_RETURN(Node * scale, b.Constant(inv_d, v->type()));
    ASSIGN_OR_RETURN(Node * mean, b.Mul(sum, scale));
    return b.Sub(v, mean);
  };
  Grads g(3, nullptr);
  if (a.wanted[0] || a.wanted[1]) {
    ASSIGN_OR_RETURN(Node * c, center(x));
    if (a.wanted[0]) {
      ASSIGN_OR_RETURN(Node * dc, RmsNormFamily(b, Opcode::kRmsNormGradInput, c, w, a.cotangent, eps));
      ASSIGN_OR_RETURN(g[0], center(dc));
    }
    if (a.wanted[1]) {
      ASSIGN_OR_RETURN(g[1], RmsNormFamily(b, Opcode::kRmsNormGradWeight, c, w, a.cotangent, eps));
    }
  }
  if (a.wanted[2]) {
    ASSIGN_OR_RETURN(g[2], b.ReduceSum(a.cotangent, Iota(last)));
  }
  return g;
}

// Per row, with n = x r, r = (mean(x^2) + eps)^-1/2 and D the row length, the normalization's
// Jacobian J = r I - r^3 x x^T / D is symmetric, and rms_norm_grad_input(x, w, dy) = J (w dy).
// So with v = w dy and cotangent G: d(dy) = w (J G), d(w) = sum over rows of dy (J G), and
// d(x) = grad of G.(J v) = (r^3 / D) [(3 r^2 (x.v)(x.G) / D - v.G) x - (x.G) v - (x.v) G].
absl::StatusOr<Grads> RmsNormGradInputVjp(const VjpArgs& a) {
  if (a.node->has_multiple_results()) {  // {weight_grad=1}: fuse-residual-norm's form
    return absl::UnimplementedError(
        "rms_norm_grad_input {weight_grad=1} is made by fuse-residual-norm on the finished training step; "
        "differentiate rms_norm_grad_input and rms_norm_grad_weight, which it merges");
  }
  Builder& b = *a.builder;
  ASSIGN_OR_RETURN(double eps, a.node->attrs().GetFloat("eps"));
  Node* x = a.node->operand(0);
  Node* w = a.node->operand(1);
  Node* dy = a.node->operand(2);
  Node* G = a.cotangent;
  const std::vector<int64_t>& shape = x->type().dims;
  const int last = x->type().rank() - 1;
  ASSIGN_OR_RETURN(Node * w_rows, b.Broadcast(w, {last}, shape));
  Grads g(3, nullptr);
  if (a.wanted[1] || a.wanted[2]) {
    ASSIGN_OR_RETURN(Node * ones, b.Constant(1.0, w->type()));
    ASSIGN_OR_RETURN(Node * jg, RmsNormFamily(b, Opcode::kRmsNormGradInput, x, ones, G, eps));
    if (a.wanted[2]) {
      ASSIGN_OR_RETURN(g[2], b.Mul(w_rows, jg));
    }
    if (a.wanted[1]) {
      ASSIGN_OR_RETURN(Node * dy_jg, b.Mul(dy, jg));
      ASSIGN_OR_RETURN(g[1], b.ReduceSum(dy_jg, Iota(last)));
    }
  }
  if (a.wanted[0]) {
    const double row_length = static_cast<double>(shape.back());
    ASSIGN_OR_RETURN(Node * v, b.Mul(w_rows, dy));
    ASSIGN_OR_RETURN(Node * xx, b.Mul(x, x));
    ASSIGN_OR_RETURN(Node * sum_xx, RowSum(b, xx));
    ASSIGN_OR_RETURN(Node * inv_d, b.Constant(1.0 / row_length, x->type()));
    ASSIGN_OR_RETURN(Node * eps_node, b.Constant(eps, x->type()));
    ASSIGN_OR_RETURN(Node * mean_xx, b.Mul(sum_xx, inv_d));
    ASSIGN_OR_RETURN(Node * var, b.Add(mean_xx, eps_node));
    ASSIGN_OR_RETURN(Node * r, b.Unary(Opcode::kRsqrt, var));
    ASSIGN_OR_RETURN(Node * r2, b.Mul(r, r));
    ASSIGN_OR_RETURN(Node * xv_prod, b.Mul(x, v));
    ASSIGN_OR_RETURN(Node * xv, RowSum(b, xv_prod));
    ASSIGN_OR_RETURN(Node * xg_prod, b.Mul(x, G));
    ASSIGN_OR_RETURN(Node * xg, RowSum(b, xg_prod));
    ASSIGN_OR_RETURN(Node * vg_prod, b.Mul(v, G));
    ASSIGN_OR_RETURN(Node * vg, RowSum(b, vg_prod));
    ASSIGN_OR_RETURN(Node * three, b.Constant(3.0, x->type()));
    ASSIGN_OR_RETURN(Node * curvature, MulAll(b, {three, r2, xv, xg, inv_d}));
    ASSIGN_OR_RETURN(Node * x_coeff, b.Sub(curvature, vg));
    ASSIGN_OR_RETURN(Node * x_term, b.Mul(x_coeff, x));
    ASSIGN_OR_RETURN(Node * v_term, b.Mul(xg, v));
    ASSIGN_OR_RETURN(Node * g_term, b.Mul(xv, G));
    ASSIGN_OR_RETURN(Node * bracket, b.Sub(x_term, v_term));
    ASSIGN_OR_RETURN(bracket, b.Sub(bracket, g_term));
    ASSIGN_OR_RETURN(g[0], MulAll(b, {r2, r, inv_d, bracket}));
  }
  return g;
}

// rms_norm_grad_weight(x, w, dy) = sum over rows of dy x r, which is linear in dy and does
// not depend on w. With cotangent G [D]: d(dy) = x r G = rms_norm(x, G), and per row the
// value is (G dy).n(x), whose gradient is J (G dy) = rms_norm_grad_input(x, G, dy).
absl::StatusOr<Grads> RmsNormGradWeightVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  ASSIGN_OR_RETURN(double eps, a.node->attrs().GetFloat("eps"));
  Node* x = a.node->operand(0);
  Node* dy = a.node->operand(2);
  Grads g(3, nullptr);
  if (a.wanted[0]) {
    ASSIGN_OR_RETURN(g[0], RmsNormFamily(b, Opcode::kRmsNormGradInput, x, a.cotangent, dy, eps));
  }
  if (a.wanted[2]) {
    ASSIGN_OR_RETURN(g[2], b.RmsNorm(x, a.cotangent, eps));
  }
  return g;
}

// attention(q, k, v) -> (O, LSE): the flash backward, reading the LSE the forward kernel
// stored. dO is rounded to bf16 once (the kernels' products take bf16); one attention_grad
// node gives dq, dk and dv.
absl::StatusOr<Grads> AttentionVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  if (a.cotangents[1] != nullptr) {
    return absl::UnimplementedError("the LSE result of attention is not differentiable (only its output is)");
  }
  Node* q = a.node->operand(0);
  Node* k = a.node->operand(1);
  Node* v = a.node->operand(2);
  Node* out = a.node->result(0);
  Node* lse = a.node->result(1);
  ASSIGN_OR_RETURN(double scale, a.node->attrs().GetFloat("scale"));
  ASSIGN_OR_RETURN(Node * dout, b.Convert(a.cotangents[0], DType::kBF16));
  ASSIGN_OR_RETURN(Node * delta, b.Op(Opcode::kAttentionDelta, {out, dout}));
  std::vector<std::string> names;
  for (const char* which : {"dq", "dk", "dv"}) names.push_back(absl::StrCat(out->name(), ".", which));
  ASSIGN_OR_RETURN(std::vector<Node*> grads, b.MultiResultOp(Opcode::kAttentionGrad, {q, k, v, dout, lse, delta},
                                                             {{"scale", scale}}, std::move(names)));
  Grads g(3, nullptr);
  for (int i = 0; i < 3; ++i) {
    if (a.wanted[i]) g[i] = grads[i];
  }
  return g;
}

absl::StatusOr<Grads> SoftmaxVjp(const VjpArgs& a) {
  ASSIGN_OR_RETURN(Node * dx, a.builder->Op(Opcode::kSoftmaxGrad, {a.node, a.cotangent}));
  return Grads{dx};
}

// softmax_grad(y, dy) = y (dy - s) with s = rowsum(y dy). It is symmetric in dy, so
// d(dy) = softmax_grad(y, G); and d(y) = G (dy - s) - dy rowsum(G y).
absl::StatusOr<Grads> SoftmaxGradVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  Node* y = a.node->operand(0);
  Node* dy = a.node->operand(1);
  Node* G = a.cotangent;
  Grads g(2, nullptr);
  if (a.wanted[1]) {
    ASSIGN_OR_RETURN(g[1], b.Op(Opcode::kSoftmaxGrad, {y, G}));
  }
  if (a.wanted[0]) {
    ASSIGN_OR_RETURN(Node * y_dy, b.Mul(y, dy));
    ASSIGN_OR_RETURN(Node * s, RowSum(b, y_dy));
    ASSIGN_OR_RETURN(Node * g_y, b.Mul(G, y));
    ASSIGN_OR_RETURN(Node * t, RowSum(b, g_y));
    ASSIGN_OR_RETURN(Node * centered, b.Sub(dy, s));
    ASSIGN_OR_RETURN(Node * first, b.Mul(G, centered));
    ASSIGN_OR_RETURN(Node * second, b.Mul(dy, t));
    ASSIGN_OR_RETURN(g[0], b.Sub(first, second));
  }
  return g;
}

// softmax(z) over a cross-entropy's classes, f32, from the row's lse: exp(z - lse), 0 in the
// padding columns (whatever z holds there).
absl::StatusOr<Node*> ClassProbabilities(Builder& b, Node* logits, Node* lse, int64_t classes) {
  const std::vector<int64_t>& dims = logits->type().dims;
  Node* z = logits;
  if (z->type().dtype != DType::kF32) {
    ASSIGN_OR_RETURN(z, b.Convert(z, DType::kF32));
  }
  ASSIGN_OR_RETURN(Node * lse_rows, b.Broadcast(lse, {0}, dims));
  ASSIGN_OR_RETURN(Node * shifted, b.Sub(z, lse_rows));
  ASSIGN_OR_RETURN(Node * p, b.Unary(Opcode::kExp, shifted));
  if (classes == dims[1]) return p;
  ASSIGN_OR_RETURN(Node * column, b.Iota({DType::kI32, dims}, 1));
  ASSIGN_OR_RETURN(Node * limit, b.Constant(static_cast<double>(classes), {DType::kI32, dims}));
  ASSIGN_OR_RETURN(Node * is_class, b.Compare(column, limit, "lt"));
  ASSIGN_OR_RETURN(Node * zeros, Zeros(b, p->type()));
  return b.Select(is_class, p, zeros);
}

// cross_entropy(z, labels) -> (loss, lse). The loss's cotangent is cross_entropy_grad, which
// reads the lse this node computed; an lse cotangent (a z-loss, or the second derivative
// through cross_entropy_grad's lse operand) adds softmax(z) times it, d lse / dz.
absl::StatusOr<Grads> CrossEntropyVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  Grads g(2, nullptr);
  if (!a.wanted[0]) return g;
  Node* logits = a.node->operand(0);
  Node* labels = a.node->operand(1);
  Node* lse = a.node->result(1);
  if (a.cotangents[0] != nullptr) {
    ASSIGN_OR_RETURN(g[0], b.Op(Opcode::kCrossEntropyGrad, {logits, labels, a.cotangents[0], lse}, a.node->attrs()));
  }
  if (a.cotangents[1] != nullptr) {
    ASSIGN_OR_RETURN(Node * p, ClassProbabilities(b, logits, lse, CrossEntropyClasses(*a.node)));
    ASSIGN_OR_RETURN(Node * dlse_rows, b.Broadcast(a.cotangents[1], {0}, logits->type().dims));
    ASSIGN_OR_RETURN(Node * via_lse, b.Mul(p, dlse_rows));
    if (g[0] == nullptr) {
      g[0] = via_lse;
    } else {
      if (g[0]->type().dtype != DType::kF32) {
        ASSIGN_OR_RETURN(g[0], b.Convert(g[0], DType::kF32));
      }
      ASSIGN_OR_RETURN(g[0], b.Add(g[0], via_lse));
    }
  }
  return g;
}

// cross_entropy_grad(z, labels, dl, lse) = (p - onehot(labels)) dl with p = exp(z - lse) on
// the classes, 0 on the padding, each operand independent (the softmax's coupling comes
// back through cross_entropy's lse result, above). With cotangent G (in f32):
//   d(z) = G p dl;  d(dl) = rowsum(G (p - onehot));  d(lse) = -rowsum(G p dl).
absl::StatusOr<Grads> CrossEntropyGradVjp(const VjpArgs& a) {
  Builder& b = *a.builder;
  Node* logits = a.node->operand(0);
  Node* labels = a.node->operand(1);
  Node* dloss = a.node->operand(2);
  Node* lse = a.node->operand(3);
  const int64_t classes = CrossEntropyClasses(*a.node);
  const std::vector<int64_t>& dims = logits->type().dims;
  Node* G = a.cotangent;
  if (G->type().dtype != DType::kF32) {
    ASSIGN_OR_RETURN(G, b.Convert(G, DType::kF32));
  }
  Grads g(4, nullptr);
  if (a.wanted[0] || a.wanted[3]) {
    ASSIGN_OR_RETURN(Node * p, ClassProbabilities(b, logits, lse, classes));
    ASSIGN_OR_RETURN(Node * dloss_rows, b.Broadcast(dloss, {0}, dims));
    ASSIGN_OR_RETURN(Node * dz, MulAll(b, {G, p, dloss_rows}));
    if (a.wanted[0]) g[0] = dz;
    if (a.wanted[3]) {
      ASSIGN_OR_RETURN(Node * per_row, b.ReduceSum(dz, {1}));
      ASSIGN_OR_RETURN(g[3], b.Unary(Opcode::kNeg, per_row));
    }
  }
  if (a.wanted[2]) {
    // The same gradient at dl = 1, in f32 whatever the logits' dtype.
    AttrMap unit_attrs;
    if (a.node->attrs().Has("classes")) unit_attrs.Set("classes", classes);
    unit_attrs.Set("out_dtype", Symbol{std::string(DTypeName(DType::kF32))});
    ASSIGN_OR_RETURN(Node * ones, b.Constant(1.0, dloss->type()));
    ASSIGN_OR_RETURN(Node * unit, b.Op(Opcode::kCrossEntropyGrad, {logits, labels, ones, lse}, unit_attrs));
    ASSIGN_OR_RETURN(Node * g_unit, b.Mul(G, unit));
    ASSIGN_OR_RETURN(g[2], b.ReduceSum(g_unit, {1}));
  }
  return g;
}

// A rotation's transpose is the rotation by the opposite angle.
absl::StatusOr<Grads> RopeVjp(const VjpArgs& a) {
  ASSIGN_OR_RETURN(double theta, a.node->attrs().GetFloat("theta"));
  ASSIGN_OR_RETURN(int64_t inverse, a.node->attrs().GetInt("inverse"));
  ASSIGN_OR_RETURN(Node * dx, a.builder->Rope(a.cotangent, a.node->operand(1), theta, inverse == 0));
  return Grads{dx, nullptr};
}

absl::StatusOr<Grads> GemmVjp(const VjpArgs&) {
  return absl::UnimplementedError("gemm is a backend op made by lower-gemm after autodiff; differentiate dot_general");
}

// An error, not zero gradients: a fused residual norm reaching autodiff means a pass ran in
// the wrong order, which silent zeros would hide.
absl::StatusOr<Grads> FusedResidualNormVjp(const VjpArgs& a) {
  return absl::UnimplementedError(absl::StrCat(a.node->op_name(),
                                               " is made by fuse-residual-norm on the finished training step; "
                                               "differentiate the add and the norm it fuses"));
}

// layer_norm_grad_input and its residual form are made from LayerNormVjp's decomposition (the
// rms_norm gradients of the centered input), whose rules give second derivatives.
absl::StatusOr<Grads> LayerNormGradInputVjp(const VjpArgs& a) {
  return absl::UnimplementedError(absl::StrCat(a.node->op_name(),
                                               " is made by fuse-residual-norm on the finished training step; "
                                               "differentiate layer_norm, whose VJP it fuses"));
}

constexpr CotangentType kNode = CotangentType::kNodeType;

constexpr std::array kVjpRows = {
    VjpRow{Opcode::kParameter, NoCotangents, kNode},
    VjpRow{Opcode::kConstant, NoCotangents, kNode},
    VjpRow{Opcode::kIota, NoCotangents, kNode},
    VjpRow{Opcode::kNeg, NegVjp, kNode},
    VjpRow{Opcode::kAbs, AbsVjp, kNode},
    VjpRow{Opcode::kExp, ExpVjp, kNode},
    VjpRow{Opcode::kLog, LogVjp, kNode},
    VjpRow{Opcode::kSqrt, SqrtVjp, kNode},
    VjpRow{Opcode::kRsqrt, RsqrtVjp, kNode},
    VjpRow{Opcode::kTanh, TanhVjp, kNode},
    VjpRow{Opcode::kSigmoid, SigmoidVjp, kNode},
    VjpRow{Opcode::kGelu, GeluVjp, kNode},
    VjpRow{Opcode::kAdd, AddVjp, kNode},
    VjpRow{Opcode::kSub, SubVjp, kNode},
    VjpRow{Opcode::kMul, MulVjp, kNode},
    VjpRow{Opcode::kDiv, DivVjp, kNode},
    VjpRow{Opcode::kMax, MaxVjp, kNode},
    VjpRow{Opcode::kMin, MinVjp, kNode},
    VjpRow{Opcode::kCompare, NoCotangents, kNode},
    VjpRow{Opcode::kSelect, SelectVjp, kNode},
    VjpRow{Opcode::kConvert, ConvertVjp, CotangentType::kAsAccumulated},
    VjpRow{Opcode::kBroadcast, BroadcastVjp, kNode},
    VjpRow{Opcode::kReshape, ReshapeVjp, kNode},
    VjpRow{Opcode::kTranspose, TransposeVjp, kNode},
    VjpRow{Opcode::kSlice, SliceVjp, kNode},
    VjpRow{Opcode::kConcatenate, ConcatenateVjp, kNode},
    VjpRow{Opcode::kReduceSum, ReduceSumVjp, kNode},
    VjpRow{Opcode::kReduceMax, ReduceMaxVjp, kNode},
    VjpRow{Opcode::kDotGeneral, DotGeneralVjp, kNode},
    // gemm appears only after lower-gemm, which runs on the finished step: differentiate the
    // dot_general it came from.
    VjpRow{Opcode::kGemm, GemmVjp, kNode},
    VjpRow{Opcode::kGather, GatherVjp, kNode},
    VjpRow{Opcode::kScatterAdd, ScatterAddVjp, kNode},
    VjpRow{Opcode::kRmsNorm, RmsNormVjp, kNode},
    VjpRow{Opcode::kRmsNormGradInput, RmsNormGradInputVjp, kNode},
    VjpRow{Opcode::kRmsNormGradWeight, RmsNormGradWeightVjp, kNode},
    VjpRow{Opcode::kLayerNorm, LayerNormVjp, kNode},
    VjpRow{Opcode::kAddRmsNorm, FusedResidualNormVjp, kNode},
    VjpRow{Opcode::kAddLayerNorm, FusedResidualNormVjp, kNode},
    VjpRow{Opcode::kAddRmsNormGradInput, FusedResidualNormVjp, kNode},
    VjpRow{Opcode::kLayerNormGradInput, LayerNormGradInputVjp, kNode},
    VjpRow{Opcode::kAddLayerNormGradInput, LayerNormGradInputVjp, kNode},
    VjpRow{Opcode::kSoftmax, SoftmaxVjp, kNode},
    VjpRow{Opcode::kSoftmaxGrad, SoftmaxGradVjp, kNode},
    VjpRow{Opcode::kCrossEntropy, CrossEntropyVjp, kNode},
    VjpRow{Opcode::kCrossEntropyGrad, CrossEntropyGradVjp, kNode},
    VjpRow{Opcode::kRope, RopeVjp, kNode},
    VjpRow{Opcode::kRopeTable, NoCotangents, kNode},
    VjpRow{Opcode::kAdamWUpdate, NoCotangents, kNode},
    VjpRow{Opcode::kSumOfSquares, NoCotangents, kNode},
    // The FP8 policy adds these after autodiff (passes/fp8_policy.h): not differentiable.
    VjpRow{Opcode::kFp8Quantize, NoCotangents, kNode},
    VjpRow{Opcode::kFp8Dequantize, NoCotangents, kNode},
    VjpRow{Opcode::kFp8ScaleUpdate, NoCotangents, kNode},
    VjpRow{Opcode::kAttention, AttentionVjp, kNode},
    // Used only inside attention's VJP: a second derivative of attention is not supported.
    VjpRow{Opcode::kAttentionDelta, NoCotangents, kNode},
    VjpRow{Opcode::kAttentionGrad, NoCotangents, kNode},
    // The paged-KV ops run only in the inference functions (frontends/llama_inference.h):
    // not differentiable.
    VjpRow{Opcode::kKvCacheWrite, NoCotangents, kNode},
    VjpRow{Opcode::kPagedAttention, NoCotangents, kNode},
    // A token id is not a differentiable function of the logits.
    VjpRow{Opcode::kSampleTokens, NoCotangents, kNode},
    // A get_result's cotangent goes to its multi-result node's rule (passes/autodiff.cc).
    VjpRow{Opcode::kGetResult, NoCotangents, kNode},
    VjpRow{Opcode::kFusion, FusionVjp, kNode},
};

}  // namespace

const VjpRow* FindVjpRow(Opcode op) {
  for (const VjpRow& row : kVjpRows) {
    if (row.op == op) return &row;
  }
  return nullptr;
}

}  // namespace kiln
