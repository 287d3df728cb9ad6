#include "passes/elide_grad_zeroing.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ir/node_predicates.h"
#include "ir/pattern_match.h"

namespace kiln {
namespace {

namespace m = match;


// A gemm that writes a fresh result (beta 0) read by one node alone, which may take it over.
m::Pattern SoleUseGemm(Node** gemm) {
  return m::Op(Opcode::kGemm)
      .WithNumOperands(2)
      .WithAttr("beta", 0.0)
      .Where("without FP8 slots", [](const Node& n) { return !HasFp8Slots(n); })
      .Where("used once, not a function output",
             [](const Node& n) { return n.users().size() == 1 && !IsFunctionOutput(n); })
      .Capture(gemm);
}

bool IsPowerOfTwo(double c) {
  int exponent = 0;
  return std::isfinite(c) && c != 0.0 && std::abs(std::frexp(c, &exponent)) == 0.5;
}

// Removes `n` if nothing reads it any more, then its operands likewise (a splat constant
// whose mul folded into a gemm's alpha, and its broadcast).
void RemoveIfDead(Function& f, Node* n) {
  if (!n->users().empty() || IsFunctionOutput(*n) || n->opcode() == Opcode::kParameter) return;
  const std::vector<Node*> operands = n->operands();
  f.RemoveNode(n);
  for (Node* operand : operands) RemoveIfDead(f, operand);
}

// mul(gemm(a, b) {alpha=1}, splat c) -> gemm(a, b) {alpha=c}.
bool FoldScale(Function& f, Node* mul) {
  Node* gemm = nullptr;
  double c = 0;
  const m::Pattern pattern = m::AnyOrder(Opcode::kMul, SoleUseGemm(&gemm).WithAttr("alpha", 1.0), m::Splat(&c));
  if (!m::Match(mul, pattern) || !IsPowerOfTwo(c) || mul->type() != gemm->type()) return false;
  gemm->mutable_attrs().Set("alpha", c);
  std::vector<Node*> operands = mul->operands();
  mul->ReplaceAllUsesWith(gemm);
  f.RemoveNode(mul);
  for (Node* operand : operands) RemoveIfDead(f, operand);
  return true;
}

// add(x, gemm(a, b)) (either order) -> gemm(a, b, x) {beta=1}.
bool FoldAccumulation(Function& f, Node* add) {
  if (add->opcode() != Opcode::kAdd) return false;
  Node* gemm = nullptr;
  int gemm_side = -1;
  for (int side : {1, 0}) {  // the training step writes add(sum so far, new contribution)
    if (m::Match(add->operand(side), SoleUseGemm(&gemm))) {
      gemm_side = side;
      break;
    }
  }
  if (gemm_side < 0 || gemm->type() != add->type()) return false;
  Node* sum_so_far = add->operand(1 - gemm_side);
  AttrMap attrs = gemm->attrs();
  attrs.Set("beta", 1.0);
  const std::string name = gemm->name();
  Node* accumulate = f.InsertNodeBefore(add, Opcode::kGemm, {gemm->operand(0), gemm->operand(1), sum_so_far},
                                        std::move(attrs), add->type(), f.UniqueName(absl::StrCat(name, ".acc")),
                                        gemm->scope());
  add->ReplaceAllUsesWith(accumulate);
  f.RemoveNode(add);
  f.RemoveNode(gemm);
  f.RenameNode(accumulate, name);
  return true;
}

int64_t CountIn(const Function& f) {
  int64_t count = 0;
  auto zero = [](const Node* n) {
    const std::optional<double> v = SplatValue(*n);
    return v.has_value() && *v == 0.0;  // +0.0 or -0.0
  };
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kAdd && (zero(n->operand(0)) || zero(n->operand(1)))) ++count;
    if (n->opcode() == Opcode::kGemm && n->num_operands() >= 3 && *n->attrs().GetFloat("beta") != 0.0 &&
        zero(n->operand(2))) {
      ++count;
    }
    if (n->body() != nullptr) count += CountIn(*n->body());
  }
  return count;
}

}  // namespace

absl::StatusOr<bool> ElideGradZeroingPass::RunOnFunction(Function& f) {
  bool changed = false;
  // Scales first, so that each accumulation sees the gemm that now computes its addend.
  for (Node* mul : [&] {
         std::vector<Node*> muls;
         for (const auto& n : f.nodes()) {
           if (n->opcode() == Opcode::kMul) muls.push_back(n.get());
         }
         return muls;
       }()) {
    changed |= FoldScale(f, mul);
  }
  std::vector<Node*> adds;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kAdd) adds.push_back(n.get());
  }
  for (Node* add : adds) changed |= FoldAccumulation(f, add);
  return changed;
}

int64_t CountZeroInitialisedAccumulators(const Module& module) {
  int64_t count = 0;
  for (const auto& f : module.functions()) count += CountIn(*f);
  return count;
}

}  // namespace kiln
