// Unary, binary, compare, select and convert: plain loops split across the pool.
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {
namespace {

template <typename Fn>
HostTensor Map(const Node& node, const EvalContext& ctx, Fn fn) {
  HostTensor out(node.type());
  double* dst = out.mutable_values().data();
  ctx.pool.ParallelFor(out.num_elements(), kElementsPerChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = fn(i);
  });
  return out;
}

template <typename Fn>
HostTensor MapUnary(const Node& node, const HostTensor& x, const EvalContext& ctx, Fn fn) {
  const double* a = x.values().data();
  return Map(node, ctx, [&](int64_t i) { return fn(a[i]); });
}

template <typename Fn>
HostTensor MapBinary(const Node& node, const HostTensor& x, const HostTensor& y, const EvalContext& ctx, Fn fn) {
  const double* a = x.values().data();
  const double* b = y.values().data();
  return Map(node, ctx, [&](int64_t i) { return fn(a[i], b[i]); });
}

// NaN-propagating, like torch.maximum and XLA's max (fmax would drop the NaN).
double MaxPropagatingNaN(double a, double b) { return std::isnan(a) || std::isnan(b) ? a + b : (a > b ? a : b); }
double MinPropagatingNaN(double a, double b) { return std::isnan(a) || std::isnan(b) ? a + b : (a < b ? a : b); }

// Integer division truncating toward zero, exact for every int64 value a double holds.
absl::StatusOr<HostTensor> IntegerDivide(const Node& node, const HostTensor& x, const HostTensor& y,
                                         const EvalContext& ctx) {
  const std::vector<double>& b = y.values();
  for (int64_t i = 0; i < y.num_elements(); ++i) {
    if (b[i] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("integer division by zero at ",
                                                     MultiIndexString(i, y.type().dims)));
    }
  }
  return MapBinary(node, x, y, ctx, [](double a, double b) {
    // -2^63 / -1 does not fit int64; the quotient saturates when rounded to the dtype.
    if (b == -1) return -a;
    return static_cast<double>(static_cast<int64_t>(a) / static_cast<int64_t>(b));
  });
}

}  // namespace

absl::StatusOr<HostTensor> EvalUnary(const Node& node, Operands xs, const EvalContext& ctx) {
  const HostTensor& x = *xs[0];
  switch (node.opcode()) {
    case Opcode::kNeg:
      return MapUnary(node, x, ctx, [](double a) { return -a; });
    case Opcode::kAbs:
      return MapUnary(node, x, ctx, [](double a) { return std::fabs(a); });
    case Opcode::kExp:
      return MapUnary(node, x, ctx, [](double a) { return std::exp(a); });
    case Opcode::kLog:
      return MapUnary(node, x, ctx, [](double a) { return std::log(a); });
    case Opcode::kSqrt:
      return MapUnary(node, x, ctx, [](double a) { return std::sqrt(a); });
    case Opcode::kRsqrt:
      return MapUnary(node, x, ctx, [](double a) { return 1.0 / std::sqrt(a); });
    case Opcode::kTanh:
      return MapUnary(node, x, ctx, [](double a) { return std::tanh(a); });
    case Opcode::kSigmoid:
      return MapUnary(node, x, ctx, [](double a) { return 1.0 / (1.0 + std::exp(-a)); });
    case Opcode::kGelu:
      return MapUnary(node, x, ctx, [](double a) {
        constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
        return 0.5 * a * (1.0 + std::tanh(kSqrt2OverPi * (a + 0.044715 * a * a * a)));
      });
    default:
      return absl::InternalError(absl::StrCat(node.op_name(), " is not a unary op"));
  }
}

absl::StatusOr<HostTensor> EvalBinary(const Node& node, Operands xs, const EvalContext& ctx) {
  const HostTensor& x = *xs[0];
  const HostTensor& y = *xs[1];
  switch (node.opcode()) {
    case Opcode::kAdd:
      return MapBinary(node, x, y, ctx, [](double a, double b) { return a + b; });
    case Opcode::kSub:
      return MapBinary(node, x, y, ctx, [](double a, double b) { return a - b; });
    case Opcode::kMul:
      return MapBinary(node, x, y, ctx, [](double a, double b) { return a * b; });
    case Opcode::kDiv:
      if (IsInteger(node.type().dtype)) return IntegerDivide(node, x, y, ctx);
      return MapBinary(node, x, y, ctx, [](double a, double b) { return a / b; });
    case Opcode::kMax:
      return MapBinary(node, x, y, ctx, MaxPropagatingNaN);
    case Opcode::kMin:
      return MapBinary(node, x, y, ctx, MinPropagatingNaN);
    default:
      return absl::InternalError(absl::StrCat(node.op_name(), " is not a binary op"));
  }
}

absl::StatusOr<HostTensor> EvalCompare(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(std::string direction, node.attrs().GetSymbol("direction"));
  const HostTensor& x = *xs[0];
  const HostTensor& y = *xs[1];
  // IEEE comparisons: every one but `ne` is false when a NaN is involved.
  auto as_pred = [](bool b) { return b ? 1.0 : 0.0; };
  if (direction == "eq") return MapBinary(node, x, y, ctx, [&](double a, double b) { return as_pred(a == b); });
  if (direction == "ne") return MapBinary(node, x, y, ctx, [&](double a, double b) { return as_pred(a != b); });
  if (direction == "lt") return MapBinary(node, x, y, ctx, [&](double a, double b) { return as_pred(a < b); });
  if (direction == "le") return MapBinary(node, x, y, ctx, [&](double a, double b) { return as_pred(a <= b); });
  if (direction == "gt") return MapBinary(node, x, y, ctx, [&](double a, double b) { return as_pred(a > b); });
  if (direction == "ge") return MapBinary(node, x, y, ctx, [&](double a, double b) { return as_pred(a >= b); });
  return absl::InvalidArgumentError(absl::StrCat("unknown compare direction '", direction, "'"));
}

absl::StatusOr<HostTensor> EvalSelect(const Node& node, Operands xs, const EvalContext& ctx) {
  const double* p = xs[0]->values().data();
  const double* a = xs[1]->values().data();
  const double* b = xs[2]->values().data();
  return Map(node, ctx, [&](int64_t i) { return p[i] != 0 ? a[i] : b[i]; });
}

absl::StatusOr<HostTensor> EvalConvert(const Node& node, Operands xs, const EvalContext& ctx) {
  // The values carry over; the evaluator's rounding to the result dtype is the conversion.
  HostTensor out(node.type());
  out.mutable_values() = xs[0]->values();
  return out;
}

}  // namespace kiln::reference
