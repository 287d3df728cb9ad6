#include "passes/lower_gemm.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ir/builder.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// How an operand's non-unit dims sit in memory, if they form [batch, free, contract] or
// [batch, contract, free] runs.
struct OperandView {
  bool fits = false;
  bool k_inner = true;
  std::vector<int64_t> contract_order;  // positions in the contract list, in memory order
};

OperandView ViewOperand(const std::vector<int64_t>& dims, const std::vector<int64_t>& batch,
                        const std::vector<int64_t>& contract) {
  OperandView view;
  std::string runs;  // one letter per run of dims: B(atch), F(ree), C(ontract)
  int64_t last_batch = -1;
  bool batch_in_order = true;
  for (int64_t d = 0; d < static_cast<int64_t>(dims.size()); ++d) {
    if (dims[d] == 1) continue;
    char group = 'F';
    if (auto it = std::find(batch.begin(), batch.end(), d); it != batch.end()) {
      group = 'B';
      const int64_t j = it - batch.begin();
      batch_in_order &= j > last_batch;
      last_batch = j;
    } else if (auto it = std::find(contract.begin(), contract.end(), d); it != contract.end()) {
      group = 'C';
      view.contract_order.push_back(it - contract.begin());
    }
    if (runs.empty() || runs.back() != group) runs.push_back(group);
  }
  static const char* const kFitting[] = {"", "B", "F", "C", "BF", "BC", "FC", "CF", "BFC", "BCF"};
  view.fits = batch_in_order && std::find(std::begin(kFitting), std::end(kFitting), runs) != std::end(kFitting);
  view.k_inner = runs.find("CF") == std::string::npos;
  return view;
}

// The transpose that makes an operand [batch (listed order), free, contract (in `order`,
// then any contract dims of size 1)].
std::vector<int64_t> CanonicalPermutation(int64_t rank, const std::vector<int64_t>& batch,
                                          const std::vector<int64_t>& contract, const std::vector<int64_t>& order) {
  std::vector<int64_t> perm = batch;
  for (int64_t d = 0; d < rank; ++d) {
    if (std::find(batch.begin(), batch.end(), d) == batch.end() &&
        std::find(contract.begin(), contract.end(), d) == contract.end()) {
      perm.push_back(d);
    }
  }
  for (int64_t j : order) perm.push_back(contract[j]);
  for (int64_t j = 0; j < static_cast<int64_t>(contract.size()); ++j) {
    if (std::find(order.begin(), order.end(), j) == order.end()) perm.push_back(contract[j]);
  }
  return perm;
}

int64_t Product(const std::vector<int64_t>& dims, const std::vector<int64_t>& which) {
  int64_t p = 1;
  for (int64_t d : which) p *= dims[d];
  return p;
}

// The transposed copy of `x` that `perm` makes, just before `before`, in `before`'s scope.
Node* InsertTranspose(Function& f, Node* x, const std::vector<int64_t>& perm, Node* before) {
  std::vector<int64_t> dims;
  for (int64_t p : perm) dims.push_back(x->type().dims[p]);
  return f.InsertNodeBefore(before, Opcode::kTranspose, {x}, AttrMap{{"perm", perm}}, TensorType{x->type().dtype, dims},
                            f.UniqueName(absl::StrCat(before->name(), x == before->operand(0) ? ".lhs" : ".rhs",
                                                      ".transposed")),
                            before->scope());
}

}  // namespace

absl::StatusOr<GemmShape> AnalyzeDotGeneral(const Node& dot) {
  if (dot.opcode() != Opcode::kDotGeneral || dot.num_operands() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(absl::StrCat("%", dot.name(), " (", dot.op_name(), ")"), " is not a dot_general"));
  }
  const std::vector<int64_t>& a_dims = dot.operand(0)->type().dims;
  const std::vector<int64_t>& b_dims = dot.operand(1)->type().dims;
  ASSIGN_OR_RETURN(std::vector<int64_t> a_batch, dot.attrs().GetInts("lhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> b_batch, dot.attrs().GetInts("rhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> a_contract, dot.attrs().GetInts("lhs_contract"));
  ASSIGN_OR_RETURN(std::vector<int64_t> b_contract, dot.attrs().GetInts("rhs_contract"));
  auto in_range = [](const std::vector<int64_t>& ds, size_t rank) {
    return std::all_of(ds.begin(), ds.end(), [&](int64_t d) { return d >= 0 && d < static_cast<int64_t>(rank); });
  };
  if (a_batch.size() != b_batch.size() || a_contract.size() != b_contract.size() || !in_range(a_batch, a_dims.size()) ||
      !in_range(a_contract, a_dims.size()) || !in_range(b_batch, b_dims.size()) || !in_range(b_contract, b_dims.size())) {
    return absl::InvalidArgumentError(absl::StrCat(absl::StrCat("%", dot.name(), " (", dot.op_name(), ")"), ": malformed dot_general dims ", dot.attrs().ToString()));
  }

  GemmShape layout;
  layout.batch = Product(a_dims, a_batch);
  layout.k = Product(a_dims, a_contract);
  layout.m = dot.operand(0)->type().num_elements() / std::max<int64_t>(1, layout.batch * layout.k);
  layout.n = dot.operand(1)->type().num_elements() / std::max<int64_t>(1, layout.batch * layout.k);
  if (layout.batch * layout.k == 0) {  // no elements to multiply: m and n come from the dims
    layout.m = layout.n = 1;
    for (int64_t d = 0; d < static_cast<int64_t>(a_dims.size()); ++d) {
      if (!std::count(a_batch.begin(), a_batch.end(), d) && !std::count(a_contract.begin(), a_contract.end(), d)) layout.m *= a_dims[d];
    }
    for (int64_t d = 0; d < static_cast<int64_t>(b_dims.size()); ++d) {
      if (!std::count(b_batch.begin(), b_batch.end(), d) && !std::count(b_contract.begin(), b_contract.end(), d)) layout.n *= b_dims[d];
    }
  }

  const OperandView a = ViewOperand(a_dims, a_batch, a_contract);
  const OperandView b = ViewOperand(b_dims, b_batch, b_contract);
  layout.a_k_inner = a.k_inner;
  layout.b_k_inner = b.k_inner;
  auto permute_a = [&](const std::vector<int64_t>& order) {
    layout.a_permutation = CanonicalPermutation(a_dims.size(), a_batch, a_contract, order);
    layout.a_k_inner = true;
  };
  auto permute_b = [&](const std::vector<int64_t>& order) {
    layout.b_permutation = CanonicalPermutation(b_dims.size(), b_batch, b_contract, order);
    layout.b_k_inner = true;
  };
  if (a.fits && b.fits) {
    if (a.contract_order != b.contract_order) {  // copy the smaller operand
      if (dot.operand(1)->type().num_elements() <= dot.operand(0)->type().num_elements()) {
        permute_b(a.contract_order);
      } else {
        permute_a(b.contract_order);
      }
    }
  } else if (a.fits) {
    permute_b(a.contract_order);
  } else if (b.fits) {
    permute_a(b.contract_order);
  } else {
    std::vector<int64_t> listed(a_contract.size());
    for (size_t j = 0; j < listed.size(); ++j) listed[j] = static_cast<int64_t>(j);
    permute_a(listed);
    permute_b(listed);
  }
  return layout;
}

absl::StatusOr<bool> LowerGemmPass::RunOnFunction(Function& f) {
  std::vector<Node*> dots;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kDotGeneral) dots.push_back(n.get());
  }
  for (Node* dot : dots) {
    ASSIGN_OR_RETURN(GemmShape shape, AnalyzeDotGeneral(*dot));
    Node* a = dot->operand(0);
    Node* b = dot->operand(1);
    if (!shape.a_permutation.empty()) a = InsertTranspose(f, a, shape.a_permutation, dot);
    if (!shape.b_permutation.empty()) b = InsertTranspose(f, b, shape.b_permutation, dot);
    AttrMap attrs{{"batch", shape.batch},
                  {"m", shape.m},
                  {"n", shape.n},
                  {"k", shape.k},
                  {"a_layout", Symbol{shape.a_k_inner ? "mk" : "km"}},
                  {"b_layout", Symbol{shape.b_k_inner ? "nk" : "kn"}},
                  {"alpha", 1.0},
                  {"beta", 0.0},
                  {"epilogue", Symbol{"none"}}};
    const std::string name = dot->name();
    std::vector<Node*> operands = {a, b};
    if (IsFp8(a->type().dtype)) {  // fp8 operands take the FP8 slots: unit scales (see the header)
      attrs.Set("scaled", int64_t{1});
      Node* one = f.InsertNodeBefore(dot, Opcode::kConstant, {}, AttrMap{{"value", 1.0}}, TensorType{DType::kF32, {}},
                                     f.UniqueName(name + ".unit_scale"), dot->scope());
      operands.insert(operands.end(), {one, one, one});
    }
    Node* gemm = f.InsertNodeBefore(dot, Opcode::kGemm, operands, attrs, dot->type(), f.UniqueName(name + ".gemm"),
                                    dot->scope());
    dot->ReplaceAllUsesWith(gemm);
    f.RemoveNode(dot);
    f.RenameNode(gemm, name);
  }
  return !dots.empty();
}

}  // namespace kiln
