#include "passes/fusion.h"

#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ir/fusion.h"
#include "ir/node_predicates.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// Reads no memory: an iota, a splat constant, or a loop op of such nodes only. Copying it
// into every fusion that uses it costs arithmetic, never bytes. The depth bound keeps a
// pathological chain from being copied without end.
bool ReadsNoMemory(const Node& node, int depth = 0) {
  if (node.opcode() == Opcode::kIota || IsSplatConstant(node)) return !IsFp8(node.type().dtype);
  if (depth > 8 || node.opcode() == Opcode::kParameter || node.num_operands() == 0 || !IsLoopOp(node)) {
    return false;
  }
  for (const Node* o : node.operands()) {
    if (!ReadsNoMemory(*o, depth + 1)) return false;
  }
  return true;
}

std::string WhyNeverFused(const Node& producer);

// Cheap to recompute in each kernel that uses it: a chain of at most kMaxRecomputedOps loop
// ops (no reshape, broadcast, slice, concatenate or transpose: they change what a kernel
// indexes, and a copy would read the stored value out of order) over
// exactly one stored value (a GEMM's result, a function input, a kernel's result: stored
// whatever fusion does) of the chain's element count and a dtype no wider than its own,
// besides values that read no memory. A copy in each user's kernel reads that one value
// instead of the result, the same bytes or fewer, so the result need never be stored:
// SwiGLU's sigmoid(gate) and silu(gate), read by the forward's product and again by the
// backward, are recomputed from the gate there, as torch.compile's partitioner recomputes
// them, instead of being written in the forward and read back. `leaf` is the stored value.
// A slice of a stored value stands for that value: it reads exactly the elements it yields,
// row by row, so SwiGLU's gate and up are recomputed from where merge-sibling-gemms's one
// GEMM wrote them ([gate, up] along the last dim) as they were from two GEMMs' results. So does
// a reshape of such a slice (StandsForAStoredValue).
constexpr int kMaxRecomputedOps = 6;
// A reshape of such a slice stands for it as well: the same elements, indexed by other dims.
// (After CSE one reshape of a slice may feed two kernels, as the K of a batch-1 @fresh_prefill
// feeds its cache write and its attention's RoPE; without this the slice was stored by a
// kernel of its own for them to read. A reshape of a stored value itself needs nothing: each
// kernel reads the stored buffer through it as a view.)
bool StandsForAStoredValue(const Node& node) {
  if (IsFunctionOutput(node)) return false;
  if (node.opcode() == Opcode::kSlice) return !WhyNeverFused(*node.operand(0)).empty();
  return node.opcode() == Opcode::kReshape && StandsForAStoredValue(*node.operand(0));
}

bool RecomputableFrom(const Node& node, const Node*& leaf, int& ops) {
  if (ReadsNoMemory(node)) return true;
  if (!WhyNeverFused(node).empty() || StandsForAStoredValue(node)) {
    if (leaf != nullptr && leaf != &node) return false;
    leaf = &node;
    return true;
  }
  if (!IsLoopOp(node) || node.opcode() == Opcode::kReshape || node.opcode() == Opcode::kBroadcast ||
      node.opcode() == Opcode::kSlice || node.opcode() == Opcode::kConcatenate || node.opcode() == Opcode::kTranspose ||
      ++ops > kMaxRecomputedOps) {
    return false;
  }
  for (const Node* o : node.operands()) {
    if (!RecomputableFrom(*o, leaf, ops)) return false;
  }
  return true;
}

bool CheapToRecompute(const Node& node) {
  if (IsFunctionOutput(node) || !IsLoopOp(node) || !WhyNeverFused(node).empty() || ReadsNoMemory(node)) return false;
  const Node* leaf = nullptr;
  int ops = 0;
  if (!RecomputableFrom(node, leaf, ops) || leaf == nullptr) return false;
  return leaf->type().dims == node.type().dims && DTypeBytes(leaf->type().dtype) <= DTypeBytes(node.type().dtype);
}

// Why `producer` can never be computed inside another node's kernel, or "" if it can be.
std::string WhyNeverFused(const Node& producer) {
  switch (producer.opcode()) {
    case Opcode::kParameter:
      return "a function input: read from memory";
    case Opcode::kDotGeneral:
    case Opcode::kGemm:
      return "a GEMM: cuBLASLt writes it (epilogue fusion not implemented)";
    case Opcode::kConstant:
      if (!IsSplatConstant(producer)) return "a dense constant: read from its own buffer";
      break;
    case Opcode::kFusion:
      return "a fusion's result: its kernel stores it";
    case Opcode::kGetResult:
      return absl::StrCat("a result of ", producer.operand(0)->op_name(), ": its kernel stores it");
    default:
      break;
  }
  if (IsFp8(producer.type().dtype)) return "fp8 values are not fused";
  if (!IsLoopOp(producer)) {
    const OpCategory category = GetOpInfo(producer.opcode()).category;
    if (category == OpCategory::kReduction) return "a reduction: it roots a kernel of its own";
    if (category == OpCategory::kComposite) return "a hand-written kernel template";
    return absl::StrCat(producer.op_name(), " is not a loop op");
  }
  if (IsFunctionOutput(producer)) return "a function output: it is stored";
  return "";
}

// One fusion found by the walk: its members (the root last in definition order) and the
// decisions on the edges into it.
struct Group {
  Node* root = nullptr;
  absl::flat_hash_set<const Node*> members;
  std::vector<FusionDecision> decisions;
};

// Grows a fusion from `root` over its operands, deciding each edge once.
Group GrowFrom(Node* root, const absl::flat_hash_set<const Node*>& taken) {
  Group group{.root = root, .members = {root}};
  std::vector<Node*> worklist = {root};
  absl::flat_hash_set<std::pair<const Node*, const Node*>> decided;
  while (!worklist.empty()) {
    Node* consumer = worklist.back();
    worklist.pop_back();
    for (Node* producer : consumer->operands()) {
      if (!decided.insert({producer, consumer}).second) continue;
      // A producer another fusion took is used only there, so never by `consumer` (a node
      // that reads no memory is never taken): this guards the invariant, nothing more.
      FusionDecision d = taken.contains(producer) ? FusionDecision::Forbid("inside another fusion")
                                                  : DecideFusion(*producer, group.members);
      d.producer = producer->name();
      d.producer_op = std::string(producer->op_name());
      d.consumer = consumer->name();
      d.consumer_op = std::string(consumer->op_name());
      const bool fused = d.fused;
      group.decisions.push_back(std::move(d));
      if (fused && group.members.insert(producer).second) worklist.push_back(producer);
    }
  }
  return group;
}

// Replaces the group's members by one fusion node holding copies of them, named after the
// root and placed where the root was. Members used only inside go; a member that reads no
// memory and has other users stays for them.
absl::Status Outline(Function& f, const Group& group, absl::flat_hash_set<const Node*>& removed) {
  std::vector<Node*> members;  // definition order
  for (const auto& n : f.nodes()) {
    if (group.members.contains(n.get())) members.push_back(n.get());
  }
  // The inputs, in order of first use, are the body's parameters, declared first.
  std::vector<Node*> inputs;
  absl::flat_hash_set<const Node*> is_input;
  for (Node* m : members) {
    for (Node* o : m->operands()) {
      if (!group.members.contains(o) && is_input.insert(o).second) inputs.push_back(o);
    }
  }
  auto body = std::make_unique<Function>(FusionBodyName(group.root->name()));
  absl::flat_hash_map<const Node*, Node*> copy_of;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Node* p = body->AppendNode(Opcode::kParameter, {}, AttrMap{{"index", static_cast<int64_t>(i)}}, inputs[i]->type(),
                               inputs[i]->name(), inputs[i]->scope());
    if (p == nullptr) {
      return absl::InternalError(absl::StrCat("fuse-loops: cannot name a body parameter %", inputs[i]->name()));
    }
    copy_of[inputs[i]] = p;
  }
  for (Node* m : members) {
    std::vector<Node*> operands;
    for (Node* o : m->operands()) operands.push_back(copy_of.at(o));
    Node* copy = body->AppendNode(m->opcode(), std::move(operands), m->attrs(), m->type(), m->name(), m->scope());
    if (copy == nullptr) return absl::InternalError(absl::StrCat("fuse-loops: cannot copy %", m->name()));
    copy_of[m] = copy;
  }
  body->SetOutputs({copy_of.at(group.root)});
  const FusionKind kind = IsFusibleReduction(*group.root) ? FusionKind::kReduction : FusionKind::kLoop;

  Node* root = group.root;
  const std::string name = root->name();
  if (!f.RenameNode(root, f.UniqueName(absl::StrCat(name, ".fused")))) {
    return absl::InternalError(absl::StrCat("fuse-loops: cannot rename %", name));
  }
  std::vector<Node*> fusion = AddFusionNode(f, kind, inputs, std::move(body), {name}, root->scope(), root);
  if (fusion.empty()) return absl::InternalError(absl::StrCat("fuse-loops: cannot add the fusion %", name));
  root->ReplaceAllUsesWith(fusion[0]);
  // Members in reverse definition order: each one's users are gone before it is asked.
  for (auto it = members.rbegin(); it != members.rend(); ++it) {
    if ((*it)->users().empty() && !IsFunctionOutput(**it)) {
      removed.insert(*it);
      f.RemoveNode(*it);
    }
  }
  return absl::OkStatus();
}

}  // namespace

FusionDecision DecideFusion(const Node& producer, const absl::flat_hash_set<const Node*>& members) {
  if (std::string why = WhyNeverFused(producer); !why.empty()) return FusionDecision::Forbid(std::move(why));
  bool all_uses_inside = true;
  for (const Node* user : producer.users()) all_uses_inside &= members.contains(user);
  if (all_uses_inside) return FusionDecision::Fuse("every use is in the kernel");
  if (ReadsNoMemory(producer)) return FusionDecision::Fuse("reads no memory (copied where used)");
  if (CheapToRecompute(producer)) {
    return FusionDecision::Fuse("recomputed where used from the one stored value it reads (never stored)");
  }
  return FusionDecision::Forbid("used outside this kernel: stored once, read by each user");
}

absl::StatusOr<bool> FusionPass::RunOnFunction(Function& f) {
  // Roots from the last node up, so that a fusion takes every producer only it uses before
  // an earlier root could claim it.
  std::vector<Node*> order;
  for (const auto& n : f.nodes()) order.push_back(n.get());
  absl::flat_hash_set<const Node*> taken;  // members of a fusion found so far (copies aside)
  std::vector<Group> groups;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* root = *it;
    // A root computes something from memory: leaves and reshapes alone are not kernels.
    if (taken.contains(root) || !(IsLoopOp(*root) || IsFusibleReduction(*root)) || root->num_operands() == 0 ||
        root->opcode() == Opcode::kReshape) {
      continue;
    }
    Group group = GrowFrom(root, taken);
    if (group.members.size() < 2) continue;
    // A member that reads no memory or is cheap to recompute may be copied into other
    // fusions too (and so may everything it is computed from); every other member is this
    // fusion's alone.
    for (const Node* m : group.members) {
      if (m == root || !(ReadsNoMemory(*m) || CheapToRecompute(*m))) taken.insert(m);
    }
    groups.push_back(std::move(group));
  }
  // A node that reads no memory or is recomputed may be copied into fusions and also root one
  // of its own; when the copies took its last users, it is gone by its turn, and so is its
  // fusion.
  absl::flat_hash_set<const Node*> removed;
  bool changed = false;
  for (Group& group : groups) {
    if (removed.contains(group.root)) continue;
    const std::string name = group.root->name();
    RETURN_IF_ERROR(Outline(f, group, removed));
    for (FusionDecision& d : group.decisions) {
      d.function = f.name();
      d.fusion = name;
      decisions_.push_back(std::move(d));
    }
    changed = true;
  }
  return changed;
}

std::string FormatFusionReport(const Function& f, absl::Span<const FusionDecision> decisions, bool list_all) {
  int64_t fusions = 0, members = 0;
  for (const auto& n : f.nodes()) {
    if (n->body() == nullptr) continue;
    ++fusions;
    for (const auto& m : n->body()->nodes()) members += m->opcode() != Opcode::kParameter;
  }
  std::map<std::string, int64_t> fused, not_fused;
  int64_t fused_total = 0, not_total = 0;
  for (const FusionDecision& d : decisions) {
    if (d.function != f.name()) continue;
    ++(d.fused ? fused : not_fused)[d.why];
    ++(d.fused ? fused_total : not_total);
  }
  std::string out = absl::StrCat("@", f.name(), ": ", fusions, " fusions of ", members,
                                 " nodes; operand edges into fusions: ", fused_total, " fused, ", not_total, " not\n");
  for (const auto& [why, count] : fused) absl::StrAppend(&out, "  fused      ", count, "  ", why, "\n");
  for (const auto& [why, count] : not_fused) absl::StrAppend(&out, "  not fused  ", count, "  ", why, "\n");
  if (list_all) {
    for (const FusionDecision& d : decisions) {
      if (d.function != f.name()) continue;
      absl::StrAppend(&out, "  %", d.fusion, ": %", d.producer, " (", d.producer_op, ") -> %", d.consumer, " (",
                      d.consumer_op, "): ", d.fused ? "fused, " : "not fused: ", d.why, "\n");
    }
  }
  return out;
}

}  // namespace kiln
