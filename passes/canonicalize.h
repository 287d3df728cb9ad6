// Canonicalization: local rewrites that make a graph smaller without changing any value, bit
// for bit, in the CPU reference backend. It is a table of (pattern -> rewrite) rules
// (tinygrad's PatternMatcher shape), the patterns written with ir/pattern_match.h, applied by
// one sweep in definition order:
//
//   fold-constants      an op whose operands are all constants, with at most
//                       max_fold_elements elements in and out, becomes a constant. The
//                       value comes from the reference backend's own kernel for the op
//                       (ir/reference_backend.h), so op semantics have one source.
//   mul-by-one          mul(x, 1), mul(1, x), div(x, 1) -> x
//   add-zero            add(x, -0.0), add(-0.0, x), sub(x, +0.0) -> x for floats (0 for
//                       integers). Not add(x, +0.0): -0.0 + +0.0 is +0.0, and the sign of a
//                       zero is observable (1/x).
//   convert-identity    convert(x) to x's own type -> x
//   convert-chain       convert(convert(x, B), C) -> convert(x, C) when B holds every value
//                       of x's type (bf16 -> f32 -> bf16 is x; f32 -> bf16 -> f32 stays)
//   reshape-chain       reshape(reshape(x)) -> reshape(x); reshape to x's own type -> x
//   transpose-chain     transpose(transpose(x, p), q) -> transpose(x, p∘q); identity -> x
//   broadcast-chain     broadcast(broadcast(x, d), e) -> broadcast(x, e∘d); a broadcast to
//                       the operand's own shape with identity dims -> x
//   slice-identity      a slice that keeps every element -> x
//   concatenate-single  concatenate(x) -> x
// "1" and "0" mean a constant whose every element is exactly that (a splat, dense equal
// values, or a broadcast of such a constant: SplatValue in ir/node_predicates.h).
//
// Before:
//   %x = parameter() {index=0} : f32[2,3]
//   %one = constant() {value=1.0} : f32[]
//   %ones = broadcast(%one) {dims=[]} : f32[2,3]
//   %y = mul(%x, %ones) : f32[2,3]
//   %t = transpose(%y) {perm=[1,0]} : f32[3,2]
//   %u = transpose(%t) {perm=[1,0]} : f32[2,3]
//   %two = constant() {value=2.0} : f32[]
//   %four = add(%two, %two) : f32[]
//   return %u, %four
// After (the constants left unused are removed by dce):
//   %x = parameter() {index=0} : f32[2,3]
//   %one = constant() {value=1.0} : f32[]
//   %ones = constant() {value=1.0} : f32[2,3]
//   %t = transpose(%x) {perm=[1,0]} : f32[3,2]
//   %two = constant() {value=2.0} : f32[]
//   %four = constant() {value=4.0} : f32[]
//   return %x, %four
#pragma once

#include <cstdint>

#include "passes/pass.h"

namespace kiln {

class CanonicalizePass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "canonicalize";
  // Folding evaluates on the host, so it is kept to small tensors (masks, scalars, shapes).
  explicit CanonicalizePass(int64_t max_fold_elements = 1024) : max_fold_elements_(max_fold_elements) {}

  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;

 private:
  int64_t max_fold_elements_;
};

// The same on one function; returns whether any rule fired.
bool Canonicalize(Function& function, int64_t max_fold_elements = 1024);

}  // namespace kiln
