// Declarative patterns over the IR graph (after XLA's pattern_matcher.h and tinygrad's UPat):
// a rewrite reads as the shape it matches, sub-patterns compose, matched nodes are captured
// into variables, and a failed match says which sub-pattern failed on which node.
//
//   namespace m = kiln::match;
//   Node* x = nullptr;
//   // mul(x, 1) or mul(1, x), "1" being a constant (or broadcast of one) that is 1.0 everywhere
//   if (m::Match(node, m::AnyOrder(Opcode::kMul, m::Any(&x), m::SplatOf(1.0)))) use(x);
//
//   std::string why;
//   if (!m::Match(node, m::Op(Opcode::kConvert, {m::Op(Opcode::kSoftmax)}).WithDType(DType::kBF16), &why)) {
//     // why == "operand 0 of %p (convert): %s is exp, not softmax"
//   }
//
// A pattern is a value: build it once and match it many times, or inline where it is used.
// Conditions are checked in the order they were added, the node's own before its operands'
// when written that way, and matching stops at the first that fails. Captures are written
// only when the whole match succeeds (a failed alternative leaves no trace), so a capture
// variable keeps its old value after a failed match.
//
// The predicates about splats come from ir/node_predicates.h: a pass and its pattern agree on
// what "a splat of 1.0" is because there is one definition.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ir/attributes.h"
#include "ir/graph.h"

namespace kiln::match {

class MatchState;  // bindings made so far, undone when a branch fails (pattern_match.cc)

class Pattern {
 public:
  // Matches any node.
  Pattern() = default;

  // Conditions on the node itself.
  Pattern WithOpcode(Opcode op) const;
  Pattern WithDType(DType dtype) const;
  Pattern WithShape(std::vector<int64_t> dims) const;
  Pattern WithRank(int rank) const;
  Pattern WithType(TensorType type) const;
  // Attribute `name` holds exactly `value` (same kind: an int is not a float).
  Pattern WithAttr(std::string name, AttrValue value) const;
  Pattern WithInt(std::string name, int64_t value) const { return WithAttr(std::move(name), value); }
  Pattern WithInts(std::string name, std::vector<int64_t> value) const { return WithAttr(std::move(name), std::move(value)); }
  Pattern WithSymbol(std::string name, std::string value) const {
    return WithAttr(std::move(name), Symbol{std::move(value)});
  }
  // A condition the pattern language does not have; `what` names it in explanations
  // ("%x (mul) is not <what>"), so phrase it as a noun: "a function output".
  Pattern Where(std::string what, std::function<bool(const Node&)> holds) const;

  // Conditions on operands.
  Pattern WithNumOperands(int n) const;
  Pattern WithOperand(int i, Pattern operand) const;  // fails when there is no operand i
  // Every operand (there may be none) matches `operand`: for variadic ops and "all inputs"
  // conditions.
  Pattern WithEveryOperand(Pattern operand) const;
  // Exactly these operands, in this order.
  Pattern WithOperands(std::vector<Pattern> operands) const;
  // Exactly two operands, matching (a, b) or else (b, a): for ops that commute, where the
  // pass author vouches that swapping them keeps the value.
  Pattern WithOperandsInAnyOrder(Pattern a, Pattern b) const;

  // On success, *slot = the matched node.
  Pattern Capture(Node** slot) const;

 private:
  friend bool Match(const Node* node, const Pattern& pattern, std::string* why);
  friend Pattern AnyOf(std::vector<Pattern> alternatives);
  friend Pattern Splat(double* value);
  friend Pattern SplatOf(double want);

  // Whether `node` passes every check; on failure, when `why` is given, says why in terms of
  // `node`. Bindings go to `state`, which the caller rolls back on failure.
  bool Matches(const Node& node, MatchState& state, std::string* why) const;
  using Check = std::function<bool(const Node& node, MatchState& state, std::string* why)>;
  Pattern With(Check check) const;
  std::vector<Check> checks_;
};

// Whether `node` matches `pattern`. On success the captures are written; on failure none is,
// and `why` (when given) says which condition failed on which node, e.g.
//   "operand 2 of %m (select): %c (constant) is a splat of 0.0, not -inf".
// Captures hand back mutable nodes, as Node::operand() does from a const node: a Function
// owns its nodes mutably.
bool Match(const Node* node, const Pattern& pattern, std::string* why = nullptr);

// Any node; the second form captures it.
Pattern Any();
Pattern Any(Node** capture);
// A node of this op, optionally with exactly these operands.
Pattern Op(Opcode op);
Pattern Op(Opcode op, std::vector<Pattern> operands);
// op(a, b) or op(b, a); see WithOperandsInAnyOrder.
Pattern AnyOrder(Opcode op, Pattern a, Pattern b);
// A node every element of which holds one value (SplatValue: a splat constant, dense equal
// values, or a broadcast of such); the value goes to *value on success when given.
Pattern Splat(double* value = nullptr);
// A node that is exactly `want` everywhere (IsSplatOf: -0.0 is not 0.0).
Pattern SplatOf(double want);
// The first of `alternatives` that matches; its captures are the ones written.
Pattern AnyOf(std::vector<Pattern> alternatives);

}  // namespace kiln::match
