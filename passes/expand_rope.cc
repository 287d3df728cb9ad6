#include "passes/expand_rope.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ir/node_predicates.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// rope_table nodes made so far, by (positions, theta, head size, inverse).
using TableKey = std::tuple<Node*, double, int64_t, int64_t>;

class Expander {
 public:
  explicit Expander(Function& f) : f_(f) {}

  absl::Status Expand(Node* rope) {
    ASSIGN_OR_RETURN(double theta, rope->attrs().GetFloat("theta"));
    ASSIGN_OR_RETURN(int64_t inverse, rope->attrs().GetInt("inverse"));
    Node* x = rope->operand(0);
    Node* positions = rope->operand(1);
    const std::vector<int64_t> dims = x->type().dims;  // [B, T, H, D]
    const int64_t batch = dims[0], seq = dims[1], heads = dims[2], head_dim = dims[3], half = head_dim / 2;
    rope_ = rope;
    base_ = rope->name();

    Node* table = Table(positions, theta, head_dim, inverse, seq);
    Node* xf = x->type().dtype == DType::kF32 ? x : Insert(Opcode::kConvert, {x}, {}, F32(dims), "x");
    const std::vector<int64_t> half_dims = {batch, seq, heads, half};
    Node* lo = Insert(Opcode::kSlice, {xf}, SliceAttrs({0, 0, 0, 0}, half_dims), F32(half_dims), "lo");
    Node* hi = Insert(Opcode::kSlice, {xf}, SliceAttrs({0, 0, 0, half}, dims), F32(half_dims), "hi");
    Node* cos_rows = Insert(Opcode::kSlice, {table}, SliceAttrs({0, 0}, {seq, half}), F32({seq, half}), "cos_rows");
    Node* sin_rows =
        Insert(Opcode::kSlice, {table}, SliceAttrs({0, half}, {seq, head_dim}), F32({seq, half}), "sin_rows");
    const AttrMap over_rows{{"dims", std::vector<int64_t>{1, 3}}};
    Node* cos = Insert(Opcode::kBroadcast, {cos_rows}, over_rows, F32(half_dims), "cos");
    Node* sin = Insert(Opcode::kBroadcast, {sin_rows}, over_rows, F32(half_dims), "sin");
    Node* lo_cos = Insert(Opcode::kMul, {lo, cos}, {}, F32(half_dims), "lo_cos");
    Node* hi_sin = Insert(Opcode::kMul, {hi, sin}, {}, F32(half_dims), "hi_sin");
    Node* hi_cos = Insert(Opcode::kMul, {hi, cos}, {}, F32(half_dims), "hi_cos");
    Node* lo_sin = Insert(Opcode::kMul, {lo, sin}, {}, F32(half_dims), "lo_sin");
    Node* out_lo = Insert(Opcode::kSub, {lo_cos, hi_sin}, {}, F32(half_dims), "out_lo");
    Node* out_hi = Insert(Opcode::kAdd, {hi_cos, lo_sin}, {}, F32(half_dims), "out_hi");
    Node* out = Insert(Opcode::kConcatenate, {out_lo, out_hi}, AttrMap{{"dim", int64_t{3}}}, F32(dims), "rotated");
    if (rope->type().dtype != DType::kF32) out = Insert(Opcode::kConvert, {out}, {}, rope->type(), "out");
    if (out == nullptr) return absl::InternalError(absl::StrCat("expand-rope: could not expand %", base_));
    rope->ReplaceAllUsesWith(out);
    const std::string name = rope->name();
    f_.RemoveNode(rope);
    f_.RenameNode(out, name);
    return absl::OkStatus();
  }

 private:
  static TensorType F32(std::vector<int64_t> dims) { return TensorType{DType::kF32, std::move(dims)}; }

  static AttrMap SliceAttrs(std::vector<int64_t> start, std::vector<int64_t> limit) {
    return AttrMap{{"start", start}, {"limit", limit}, {"stride", std::vector<int64_t>(start.size(), 1)}};
  }

  // A node before the rope being expanded, named after it, in its scope. Null (and then the
  // expansion fails as a whole) only if an operand is null.
  Node* Insert(Opcode op, std::vector<Node*> operands, AttrMap attrs, TensorType type, absl::string_view part) {
    for (Node* o : operands) {
      if (o == nullptr) return nullptr;
    }
    return f_.InsertNodeBefore(rope_, op, std::move(operands), std::move(attrs), std::move(type),
                               f_.UniqueName(absl::StrCat(base_, ".", part)), rope_->scope());
  }

  // The one table of these positions and angles, placed before the first rope that needs it
  // (the function's node order is a topological order, and the positions come before it).
  Node* Table(Node* positions, double theta, int64_t head_dim, int64_t inverse, int64_t seq) {
    const TableKey key{positions, theta, head_dim, inverse};
    if (auto it = tables_.find(key); it != tables_.end()) return it->second;
    Node* table = Insert(Opcode::kRopeTable, {positions},
                         AttrMap{{"theta", theta}, {"head_dim", head_dim}, {"inverse", inverse}},
                         F32({seq, head_dim}), "table");
    tables_[key] = table;
    return table;
  }

  Function& f_;
  Node* rope_ = nullptr;
  std::string base_;
  std::map<TableKey, Node*> tables_;
};

}  // namespace

absl::StatusOr<bool> ExpandRopePass::RunOnFunction(Function& function) {
  std::vector<Node*> ropes;
  for (const auto& n : function.nodes()) {
    if (n->opcode() == Opcode::kRope) ropes.push_back(n.get());
  }
  Expander expander(function);
  for (Node* rope : ropes) RETURN_IF_ERROR(expander.Expand(rope));
  return !ropes.empty();
}

}  // namespace kiln
