#include "passes/fusion.h"

#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "ir/node_predicates.h"

namespace kiln {
namespace {

bool IsOutput(const Node& node) {
  for (const Node* out : node.parent()->outputs()) {
    if (out == &node) return true;
  }
  return false;
}

// Reads no memory: an iota, a splat constant, or a loop op of such nodes only. Duplicating
// it into every group that uses it costs arithmetic, never bytes. The depth bound keeps a
// pathological chain from being copied without end.
bool ReadsNoMemory(const Node& node, int depth = 0) {
  if (node.opcode() == Opcode::kIota || IsSplatConstant(node)) return !IsFp8(node.type().dtype);
  if (depth > 8 || node.opcode() == Opcode::kParameter || node.num_operands() == 0 || !IsLoopFusible(node)) {
    return false;
  }
  for (const Node* o : node.operands()) {
    if (!ReadsNoMemory(*o, depth + 1)) return false;
  }
  return true;
}

// Why `producer` cannot be computed inside the kernel of `consumer`'s group, or "" if it
// can be (when each of its uses is in that group, or it reads no memory).
std::string WhyNotFusible(const Node& producer) {
  switch (producer.opcode()) {
    case Opcode::kParameter:
      return "a function input: read from memory";
    case Opcode::kDotGeneral:
      return "a GEMM: cuBLASLt writes it (epilogue fusion not implemented)";
    case Opcode::kConstant:
      if (!IsSplatConstant(producer)) return "a dense constant: read from its own buffer";
      break;
    case Opcode::kGetResult:
      return absl::StrCat("a result of ", producer.operand(0)->op_name(), ": its kernel stores it");
    default:
      break;
  }
  if (IsFp8(producer.type().dtype)) return "fp8 values are not fused";
  if (!IsLoopFusible(producer)) {
    const OpCategory category = GetOpInfo(producer.opcode()).category;
    if (category == OpCategory::kReduction) return "a reduction: it roots a kernel of its own";
    if (category == OpCategory::kComposite) return "a hand-written kernel template";
    return absl::StrCat(producer.op_name(), " is not a loop op");
  }
  if (IsOutput(producer)) return "a function output: it is stored";
  return "";
}

}  // namespace

bool IsLoopFusible(const Node& node) {
  // A multi-result kernel stores each result, so a result is read from memory.
  if (node.has_multiple_results() || node.opcode() == Opcode::kGetResult) return false;
  if (IsFp8(node.type().dtype)) return false;  // no storage literal or rounding path here yet
  for (const Node* o : node.operands()) {
    if (IsFp8(o->type().dtype)) return false;
  }
  if (IsElementwise(node.opcode())) return true;
  switch (node.opcode()) {
    case Opcode::kBroadcast:
    case Opcode::kReshape:
    case Opcode::kTranspose:
    case Opcode::kIota:
      return true;
    case Opcode::kConstant:
      return IsSplatConstant(node);
    default:
      return false;
  }
}

bool IsFusibleReduction(const Node& node) {
  return (node.opcode() == Opcode::kReduceSum || node.opcode() == Opcode::kReduceMax) && !IsFp8(node.type().dtype) &&
         !IsFp8(node.operand(0)->type().dtype);
}

std::string KernelGroupOf(const Node& node) {
  absl::StatusOr<std::string> group = node.attrs().GetString(kKernelGroupAttr);
  return group.ok() ? *group : "";
}

absl::StatusOr<bool> FusionPass::RunOnFunction(Function& f) {
  bool changed = false;
  std::vector<Node*> order;
  for (const auto& n : f.nodes()) order.push_back(n.get());
  absl::flat_hash_set<const Node*> grouped;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* root = *it;
    // A root computes something from memory: leaves and reshapes alone are not kernels.
    if (grouped.contains(root) || !KernelGroupOf(*root).empty() ||
        !(IsLoopFusible(*root) || IsFusibleReduction(*root)) || root->num_operands() == 0 ||
        root->opcode() == Opcode::kReshape) {
      continue;
    }
    absl::flat_hash_set<const Node*> members = {root};
    std::vector<Node*> worklist = {root};
    while (!worklist.empty()) {
      Node* consumer = worklist.back();
      worklist.pop_back();
      for (int i = 0; i < consumer->num_operands(); ++i) {
        Node* producer = consumer->operand(i);
        if (members.contains(producer) || !WhyNotFusible(*producer).empty() || grouped.contains(producer)) continue;
        bool all_uses_inside = true;
        for (const Node* user : producer->users()) all_uses_inside &= members.contains(user);
        if (!all_uses_inside) {
          if (!ReadsNoMemory(*producer)) continue;
          // Its own copy for this group; the original stays for its other users.
          producer = f.InsertNodeBefore(consumer, producer->opcode(), producer->operands(), producer->attrs(),
                                        producer->type(), f.UniqueName(absl::StrCat(producer->name(), ".dup")),
                                        producer->scope());
          consumer->ReplaceOperand(i, producer);
        }
        members.insert(producer);
        worklist.push_back(producer);
      }
    }
    if (members.size() < 2) continue;
    for (const Node* m : members) {
      grouped.insert(m);
      const_cast<Node*>(m)->mutable_attrs().Set(std::string(kKernelGroupAttr), root->name());
    }
    changed = true;
  }
  return changed;
}

std::vector<FusionDecision> ExplainFusion(const Function& f) {
  std::vector<FusionDecision> decisions;
  for (const auto& n : f.nodes()) {
    const std::string group = KernelGroupOf(*n);
    if (group.empty()) continue;
    for (const Node* producer : n->operands()) {
      FusionDecision d{.producer = producer, .consumer = n.get()};
      if (KernelGroupOf(*producer) == group) {
        d.fused = true;
        d.why = ReadsNoMemory(*producer) ? "reads no memory (duplicated where used)" : "every use is in the kernel";
      } else if (std::string why = WhyNotFusible(*producer); !why.empty()) {
        d.why = why;
      } else if (!KernelGroupOf(*producer).empty()) {
        d.why = "the root of another kernel group (used by more than one kernel)";
      } else {
        d.why = "used outside this kernel: stored once, read by each user";
      }
      decisions.push_back(std::move(d));
    }
  }
  return decisions;
}

std::string FormatFusionReport(const Function& f, bool list_all) {
  absl::flat_hash_set<std::string> groups;
  int64_t members = 0;
  for (const auto& n : f.nodes()) {
    if (std::string g = KernelGroupOf(*n); !g.empty()) {
      groups.insert(g);
      ++members;
    }
  }
  const std::vector<FusionDecision> decisions = ExplainFusion(f);
  std::map<std::string, int64_t> fused, not_fused;
  for (const FusionDecision& d : decisions) ++(d.fused ? fused : not_fused)[d.why];
  int64_t fused_total = 0, not_total = 0;
  for (const auto& [why, count] : fused) fused_total += count;
  for (const auto& [why, count] : not_fused) not_total += count;
  std::string out = absl::StrCat("@", f.name(), ": ", groups.size(), " kernel groups of ", members,
                                 " nodes; operand edges into groups: ", fused_total, " fused, ", not_total, " not\n");
  for (const auto& [why, count] : fused) absl::StrAppend(&out, "  fused      ", count, "  ", why, "\n");
  for (const auto& [why, count] : not_fused) absl::StrAppend(&out, "  not fused  ", count, "  ", why, "\n");
  if (list_all) {
    for (const FusionDecision& d : decisions) {
      absl::StrAppend(&out, "  %", d.producer->name(), " (", d.producer->op_name(), ") -> %", d.consumer->name(), " (",
                      d.consumer->op_name(), "): ", d.fused ? "fused, " : "not fused: ", d.why, "\n");
    }
  }
  return out;
}

}  // namespace kiln
