#include "ir/pattern_match.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/node_predicates.h"

namespace kiln::match {

// Captures made so far on the way to a match. They are applied only when the whole pattern
// matched; a branch that fails (an operand order, an alternative) truncates back to where it
// started, so nothing of it is written.
class MatchState {
 public:
  void Bind(Node** slot, Node* node) { nodes_.emplace_back(slot, node); }
  void Bind(double* slot, double value) { values_.emplace_back(slot, value); }
  struct Mark {
    size_t nodes, values;
  };
  Mark mark() const { return {nodes_.size(), values_.size()}; }
  void RollBack(Mark mark) {
    nodes_.resize(mark.nodes);
    values_.resize(mark.values);
  }
  void Commit() const {
    for (const auto& [slot, node] : nodes_) *slot = node;
    for (const auto& [slot, value] : values_) *slot = value;
  }

 private:
  std::vector<std::pair<Node**, Node*>> nodes_;
  std::vector<std::pair<double*, double>> values_;
};

namespace {

// "%s (mul)": how explanations name a node.
std::string Describe(const Node& node) { return absl::StrCat("%", node.name(), " (", node.op_name(), ")"); }

bool Fail(std::string* why, const std::function<std::string()>& explain) {
  if (why != nullptr) *why = explain();
  return false;
}

// A multi-result node (attention's O and LSE, an FP8 gemm's D and amax) has no one type:
// WithDType, WithShape, WithRank and WithType do not match it (its results, get_result nodes, have types).
bool SingleResult(const Node& n, std::string* why) {
  return !n.has_multiple_results() || Fail(why, [&] {
    return absl::StrCat(Describe(n), " has ", n.num_results(), " results, not one type");
  });
}

}  // namespace

bool Pattern::Matches(const Node& node, MatchState& state, std::string* why) const {
  for (const Check& check : checks_) {
    if (!check(node, state, why)) return false;
  }
  return true;
}

Pattern Pattern::With(Check check) const {
  Pattern p = *this;
  p.checks_.push_back(std::move(check));
  return p;
}

Pattern Pattern::WithOpcode(Opcode op) const {
  return With([op](const Node& n, MatchState&, std::string* why) {
    return n.opcode() == op ||
           Fail(why, [&] { return absl::StrCat("%", n.name(), " is ", n.op_name(), ", not ", OpName(op)); });
  });
}

Pattern Pattern::WithDType(DType dtype) const {
  return With([dtype](const Node& n, MatchState&, std::string* why) {
    if (!SingleResult(n, why)) return false;
    return n.type().dtype == dtype || Fail(why, [&] {
             return absl::StrCat(Describe(n), " is ", n.type().ToString(), ", not dtype ", DTypeName(dtype));
           });
  });
}

Pattern Pattern::WithShape(std::vector<int64_t> dims) const {
  return With([dims = std::move(dims)](const Node& n, MatchState&, std::string* why) {
    if (!SingleResult(n, why)) return false;
    return n.type().dims == dims || Fail(why, [&] {
             return absl::StrCat(Describe(n), " is ", n.type().ToString(), ", not shape ", DimsToString(dims));
           });
  });
}

Pattern Pattern::WithRank(int rank) const {
  return With([rank](const Node& n, MatchState&, std::string* why) {
    if (!SingleResult(n, why)) return false;
    return n.type().rank() == rank ||
           Fail(why, [&] { return absl::StrCat(Describe(n), " is ", n.type().ToString(), ", not rank ", rank); });
  });
}

Pattern Pattern::WithType(TensorType type) const {
  return With([type = std::move(type)](const Node& n, MatchState&, std::string* why) {
    if (!SingleResult(n, why)) return false;
    return n.type() == type || Fail(why, [&] {
             return absl::StrCat(Describe(n), " is ", n.type().ToString(), ", not ", type.ToString());
           });
  });
}

Pattern Pattern::WithAttr(std::string name, AttrValue value) const {
  return With([name = std::move(name), value = std::move(value)](const Node& n, MatchState&, std::string* why) {
    auto it = n.attrs().entries().find(name);
    if (it == n.attrs().entries().end()) {
      return Fail(why, [&] {
        return absl::StrCat(Describe(n), " has no attribute ", name, " (wanted ", name, "=", AttrValueToString(value),
                            ")");
      });
    }
    return it->second == value || Fail(why, [&] {
             return absl::StrCat(Describe(n), " has ", name, "=", AttrValueToString(it->second), ", not ", name, "=",
                                 AttrValueToString(value));
           });
  });
}

Pattern Pattern::Where(std::string what, std::function<bool(const Node&)> holds) const {
  return With([what = std::move(what), holds = std::move(holds)](const Node& n, MatchState&, std::string* why) {
    return holds(n) || Fail(why, [&] { return absl::StrCat(Describe(n), " is not ", what); });
  });
}

Pattern Pattern::WithNumOperands(int count) const {
  return With([count](const Node& n, MatchState&, std::string* why) {
    return n.num_operands() == count || Fail(why, [&] {
             return absl::StrCat(Describe(n), " has ", n.num_operands(), " operands, not ", count);
           });
  });
}

Pattern Pattern::WithOperand(int i, Pattern operand) const {
  return With([i, operand = std::move(operand)](const Node& n, MatchState& state, std::string* why) {
    if (i >= n.num_operands()) {
      return Fail(why, [&] { return absl::StrCat(Describe(n), " has no operand ", i); });
    }
    if (operand.Matches(*n.operand(i), state, why)) return true;
    if (why != nullptr) *why = absl::StrCat("operand ", i, " of ", Describe(n), ": ", *why);
    return false;
  });
}

Pattern Pattern::WithEveryOperand(Pattern operand) const {
  return With([operand = std::move(operand)](const Node& n, MatchState& state, std::string* why) {
    for (int i = 0; i < n.num_operands(); ++i) {
      if (operand.Matches(*n.operand(i), state, why)) continue;
      if (why != nullptr) *why = absl::StrCat("operand ", i, " of ", Describe(n), ": ", *why);
      return false;
    }
    return true;
  });
}

Pattern Pattern::WithOperands(std::vector<Pattern> operands) const {
  Pattern p = WithNumOperands(static_cast<int>(operands.size()));
  for (size_t i = 0; i < operands.size(); ++i) p = p.WithOperand(static_cast<int>(i), std::move(operands[i]));
  return p;
}

Pattern Pattern::WithOperandsInAnyOrder(Pattern a, Pattern b) const {
  const Pattern in_order = Pattern().WithOperand(0, a).WithOperand(1, b);
  const Pattern swapped = Pattern().WithOperand(0, std::move(b)).WithOperand(1, std::move(a));
  return WithNumOperands(2).With([in_order, swapped](const Node& n, MatchState& state, std::string* why) {
    const MatchState::Mark mark = state.mark();
    std::string why_in_order, why_swapped;
    if (in_order.Matches(n, state, why ? &why_in_order : nullptr)) return true;
    state.RollBack(mark);
    if (swapped.Matches(n, state, why ? &why_swapped : nullptr)) return true;
    state.RollBack(mark);
    return Fail(why, [&] {
      return absl::StrCat(Describe(n), " matches in neither operand order: as written, ", why_in_order,
                          "; swapped, ", why_swapped);
    });
  });
}

Pattern Pattern::Capture(Node** slot) const {
  return With([slot](const Node& n, MatchState& state, std::string*) {
    // Nodes are owned mutably by their function; see Match in the header.
    Node* node = const_cast<Node*>(&n);
    state.Bind(slot, node);
    return true;
  });
}

bool Match(const Node* node, const Pattern& pattern, std::string* why) {
  MatchState state;
  if (!pattern.Matches(*node, state, why)) return false;
  state.Commit();
  return true;
}

Pattern Any() { return Pattern(); }
Pattern Any(Node** capture) { return Pattern().Capture(capture); }
Pattern Op(Opcode op) { return Pattern().WithOpcode(op); }
Pattern Op(Opcode op, std::vector<Pattern> operands) { return Op(op).WithOperands(std::move(operands)); }
Pattern AnyOrder(Opcode op, Pattern a, Pattern b) { return Op(op).WithOperandsInAnyOrder(std::move(a), std::move(b)); }

Pattern Splat(double* value) {
  return Pattern().With([value](const Node& n, MatchState& state, std::string* why) {
    std::optional<double> v = SplatValue(n);
    if (!v) return Fail(why, [&] { return absl::StrCat(Describe(n), " is not a splat constant"); });
    if (value != nullptr) state.Bind(value, *v);
    return true;
  });
}

Pattern SplatOf(double want) {
  return Pattern().With([want](const Node& n, MatchState&, std::string* why) {
    if (IsSplatOf(n, want)) return true;
    return Fail(why, [&] {
      std::optional<double> v = SplatValue(n);
      if (!v) return absl::StrCat(Describe(n), " is not a splat constant (wanted ", FormatDouble(want), ")");
      return absl::StrCat(Describe(n), " is a splat of ", FormatDouble(*v), ", not ", FormatDouble(want));
    });
  });
}

Pattern AnyOf(std::vector<Pattern> alternatives) {
  return Pattern().With([alternatives = std::move(alternatives)](const Node& n, MatchState& state, std::string* why) {
    std::vector<std::string> whys;
    for (const Pattern& alternative : alternatives) {
      const MatchState::Mark mark = state.mark();
      std::string why_not;
      if (alternative.Matches(n, state, why ? &why_not : nullptr)) return true;
      state.RollBack(mark);
      whys.push_back(std::move(why_not));
    }
    return Fail(why, [&] {
      std::string out = absl::StrCat(Describe(n), " matches none of ", alternatives.size(), " alternatives");
      for (size_t i = 0; i < whys.size(); ++i) absl::StrAppend(&out, i == 0 ? ": " : "; ", i + 1, ": ", whys[i]);
      return out;
    });
  });
}

}  // namespace kiln::match
