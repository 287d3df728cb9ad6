#include "codegen/lower_fusion.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codegen/composite_lowerings.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "codegen/lower_gemv.h"
#include "codegen/lowerings.h"
#include "ir/status_macros.h"
#include "ir/fusion.h"

namespace kiln::codegen {
namespace {

// The most elements one thread of a loop kernel computes as a vector (lanes of straight-line
// code): 8 gives bf16 its 16-byte accesses.
constexpr int kMaxVectorLanes = 8;

// A fusion's body seen as a kernel: the members it computes (definition order) and its
// inputs (the body's parameters, by index: kernel input i is parameter i). `roots` are the
// body's outputs, the kernel's results in order: one for a reduction, one or more of one
// shape for a loop (each element index computes every root there).
struct KernelGroup {
  const Node* root = nullptr;  // roots[0]
  std::vector<const Node*> roots;
  std::vector<const Node*> members;
  std::vector<const Node*> inputs;
};

// A fusion kernel's source opening: a comment naming its members, then SourceOpening's
// includes. The member list is the first line: kernels of groups that differ only in their
// nodes' names share one compiled body (compile_function.h).
std::string FusionSourceOpening(absl::string_view what, const KernelGroup& group, const Node& node,
                                const std::vector<DType>& dtypes) {
  std::string members;
  for (const Node* m : group.members) absl::StrAppend(&members, " %", m->name());
  return absl::StrCat("// ", what, " of", members, "\n", SourceOpening(node, dtypes));
}

absl::StatusOr<KernelGroup> GroupOf(const Node& fusion, FusionKind kind) {
  const Function* body = fusion.body();
  if (body == nullptr || body->outputs().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("fusion %", fusion.name(), " has no body outputs"));
  }
  if (kind == FusionKind::kReduction && body->outputs().size() != 1) {
    return absl::UnimplementedError(absl::StrCat("codegen renders reduction fusions of one result; %", fusion.name(),
                                                 " has ", body->outputs().size()));
  }
  KernelGroup group;
  for (const Node* out : body->outputs()) {
    if (out->opcode() == Opcode::kParameter) {
      return absl::UnimplementedError(absl::StrCat("fusion %", fusion.name(), " returns its parameter %", out->name()));
    }
    if (out->type().dims != body->outputs()[0]->type().dims) {
      return absl::UnimplementedError(absl::StrCat("loop fusion %", fusion.name(), ": its results differ in shape (",
                                                   out->type().ToString(), " and ",
                                                   body->outputs()[0]->type().ToString(), "): one loop computes all"));
    }
    group.roots.push_back(out);
  }
  group.root = group.roots[0];
  for (const Node* p : body->parameters()) group.inputs.push_back(p);
  for (const auto& n : body->nodes()) {
    if (n->opcode() != Opcode::kParameter) group.members.push_back(n.get());
  }
  if (group.members.empty() || (group.roots.size() == 1 && group.members.back() != group.root)) {
    return absl::InvalidArgumentError(absl::StrCat("fusion %", fusion.name(), ": its body must end with the node it returns"));
  }
  return group;
}

// Writes the straight-line code computing members' values at given indices.
class GroupEmitter {
 public:
  explicit GroupEmitter(const KernelGroup& group) : group_(group) {
    for (const Node* m : group.members) members_.insert(m);
    for (size_t i = 0; i < group.inputs.size(); ++i) input_index_[group.inputs[i]] = static_cast<int>(i);
  }

  // The variable holding `node`'s storage value at linear index `index` (a variable name).
  absl::StatusOr<std::string> Value(const Node* node, const std::string& index) {
    const auto key = std::make_pair(node, index);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    std::string expression;
    const std::string type = CudaTypeName(node->type().dtype);
    if (!members_.contains(node)) {
      const int input = input_index_.at(node);
      if (auto lane = lanes_.find(index); lane != lanes_.end() && lane->second.run == 0) {
        // Read at the element's own index: the lane of the vector loaded once per thread.
        expression = absl::StrCat("a", input, ".v[", lane->second.lane, "]");
        vector_inputs_.insert(input);
      } else if (lane != lanes_.end()) {
        // Read along a run the index maps carried contiguously (a transpose, slice or
        // broadcast that keeps the last dim): one vector from the run's first index, loaded
        // where lane 0 first reads it.
        const auto vector_key = std::make_pair(input, lane->second.run);
        auto vector = run_vectors_.find(vector_key);
        if (vector == run_vectors_.end() && lane->second.lane == 0) {
          const std::string name = absl::StrCat("a", input, "_r", lane->second.run);
          absl::StrAppendFormat(&code_, "      const Vec<%s, kWidth> %s = LoadVec<kWidth>(in%d, %s / kWidth);\n", type,
                                name, input, runs_[lane->second.run]);
          vector = run_vectors_.emplace(vector_key, name).first;
          run_inputs_.insert(input);
        }
        expression = vector != run_vectors_.end() ? absl::StrCat(vector->second, ".v[", lane->second.lane, "]")
                                                  : absl::StrCat("in", input, "[", index, "]");
      } else {
        expression = absl::StrCat("in", input, "[", index, "]");
      }
    } else {
      switch (node->opcode()) {
        case Opcode::kReshape: {  // row-major: the same linear index
          ASSIGN_OR_RETURN(std::string v, Value(node->operand(0), index));
          memo_[key] = v;
          return v;
        }
        case Opcode::kConstant: {
          ASSIGN_OR_RETURN(expression, SplatStorageExpression(*node));
          break;
        }
        case Opcode::kIota: {
          ASSIGN_OR_RETURN(int64_t dim, node->attrs().GetInt("dim"));
          const std::vector<int64_t> strides = RowMajorStrides(node->type().dims);
          expression = absl::StrFormat("kiln::Round<%s>::From(static_cast<double>((%s / %d) %% %d))", type, index,
                                       strides[dim], node->type().dims[dim]);
          break;
        }
        case Opcode::kTranspose: {
          ASSIGN_OR_RETURN(std::string operand_index, TransposeIndex(*node, index));
          CarryRun(*node, index, operand_index);
          ASSIGN_OR_RETURN(std::string v, Value(node->operand(0), operand_index));
          memo_[key] = v;
          return v;
        }
        case Opcode::kBroadcast: {
          ASSIGN_OR_RETURN(std::string operand_index, BroadcastIndex(*node, index));
          CarryRun(*node, index, operand_index);
          ASSIGN_OR_RETURN(std::string v, Value(node->operand(0), operand_index));
          memo_[key] = v;
          return v;
        }
        case Opcode::kSlice: {
          ASSIGN_OR_RETURN(std::string operand_index, SliceIndex(*node, index));
          CarryRun(*node, index, operand_index);
          ASSIGN_OR_RETURN(std::string v, Value(node->operand(0), operand_index));
          memo_[key] = v;
          return v;
        }
        case Opcode::kConcatenate: {
          ASSIGN_OR_RETURN(std::string v, Concatenate(*node, index));
          memo_[key] = v;
          return v;
        }
        default: {
          std::vector<std::string> operands;
          for (const Node* o : node->operands()) {
            ASSIGN_OR_RETURN(std::string v, Value(o, index));
            operands.push_back(v);
          }
          ASSIGN_OR_RETURN(expression, ElementExpression(*node, operands));
        }
      }
    }
    const std::string var = absl::StrCat("v", next_var_++);
    absl::StrAppend(&code_, "      const ", type, " ", var, " = ", expression, ";  // ", node->op_name(), "\n");
    memo_[key] = var;
    return var;
  }

  const std::string& code() const { return code_; }

  // Makes `index` (a variable holding an element's own linear index) lane `lane` of a vector
  // of `width` lanes: an input read at exactly that index is then read from the vector
  // `a<input>`, loaded once for all lanes (vector_inputs() lists them). Element-preserving ops
  // (elementwise, reshape) pass the index on unchanged, so such an input has the result's
  // element count. Index maps that keep a run of lanes contiguous (CarryRun) pass it on too,
  // to a vector of its own (run_inputs() lists the inputs read so).
  void SetLane(const std::string& index, int lane, int width) {
    lanes_[index] = {lane, 0};
    width_ = width;
    if (runs_.empty()) runs_.push_back("vec * kWidth");
  }
  const std::set<int>& vector_inputs() const { return vector_inputs_; }
  const std::set<int>& run_inputs() const { return run_inputs_; }

 private:
  // A vector's lanes are `width_` consecutive linear indices from a multiple of width_ (the
  // element's own, or carried here). Where `node` keeps its last dim (a transpose that does
  // not move it, a slice of stride 1 starting at a multiple of width_, a broadcast whose
  // operand's last dim is the result's) and that dim is a multiple of width_, the lanes are
  // one row's consecutive elements, and so are the operand indices they map to, again from a
  // multiple of width_: lane l of `index`'s run reads lane l of a run starting at lane 0's
  // operand index. Lane 0 makes the run (its operand index is the run's start); later lanes
  // find it and name theirs start + l.
  void CarryRun(const Node& node, const std::string& index, std::string& operand_index) {
    const auto lane = lanes_.find(index);
    if (lane == lanes_.end() || width_ <= 1 || !KeepsRows(node)) return;
    const auto key = std::make_pair(&node, lane->second.run);
    if (lane->second.lane == 0) {
      if (operand_index.empty() || operand_index[0] != 'i') return;  // a constant index: no run
      runs_.push_back(operand_index);
      derived_runs_[key] = static_cast<int>(runs_.size()) - 1;
      lanes_[operand_index] = {0, derived_runs_[key]};
      return;
    }
    const auto run = derived_runs_.find(key);
    if (run == derived_runs_.end()) return;
    const std::string var = absl::StrCat("i", next_var_++);
    absl::StrAppendFormat(&code_, "      const Index %s = %s + %d;\n", var, runs_[run->second], lane->second.lane);
    operand_index = var;
    lanes_[var] = {lane->second.lane, run->second};
  }

  bool KeepsRows(const Node& node) const {
    const std::vector<int64_t>& out = node.type().dims;
    const std::vector<int64_t>& in = node.operand(0)->type().dims;
    if (out.empty() || in.empty() || out.back() % width_ != 0) return false;
    const size_t last = out.size() - 1;
    switch (node.opcode()) {
      case Opcode::kTranspose: {
        absl::StatusOr<std::vector<int64_t>> perm = node.attrs().GetInts("perm");
        return perm.ok() && perm->size() == out.size() && (*perm)[last] == static_cast<int64_t>(last);
      }
      case Opcode::kSlice: {
        absl::StatusOr<std::vector<int64_t>> start = node.attrs().GetInts("start");
        absl::StatusOr<std::vector<int64_t>> stride = node.attrs().GetInts("stride");
        return start.ok() && stride.ok() && start->size() == out.size() && (*stride)[last] == 1 &&
               (*start)[last] % width_ == 0 && in.back() % width_ == 0;
      }
      case Opcode::kBroadcast: {
        absl::StatusOr<std::vector<int64_t>> dims = node.attrs().GetInts("dims");
        return dims.ok() && dims->size() == in.size() && dims->back() == static_cast<int64_t>(last) &&
               in.back() == out.back();
      }
      default:
        return false;
    }
  }

  // The operand's linear index for element `index` of a broadcast: each operand dim i sits at
  // result dim dims[i]; a size-1 operand dim contributes nothing.
  absl::StatusOr<std::string> BroadcastIndex(const Node& broadcast, const std::string& index) {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, broadcast.attrs().GetInts("dims"));
    const std::vector<int64_t>& out_dims = broadcast.type().dims;
    const std::vector<int64_t>& in_dims = broadcast.operand(0)->type().dims;
    const std::vector<int64_t> out_strides = RowMajorStrides(out_dims);
    const std::vector<int64_t> in_strides = RowMajorStrides(in_dims);
    std::string sum;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (in_dims[i] == 1) continue;
      absl::StrAppendFormat(&sum, "%s((%s / %d) %% %d) * %d", sum.empty() ? "" : " + ", index, out_strides[dims[i]],
                            out_dims[dims[i]], in_strides[i]);
    }
    if (sum.empty()) return std::string("0");
    const std::string var = absl::StrCat("i", next_var_++);
    absl::StrAppend(&code_, "      const Index ", var, " = ", sum, ";\n");
    return var;
  }

  // The operand's linear index for element `index` of a transpose: result dim d is operand
  // dim perm[d].
  absl::StatusOr<std::string> TransposeIndex(const Node& transpose, const std::string& index) {
    ASSIGN_OR_RETURN(std::vector<int64_t> perm, transpose.attrs().GetInts("perm"));
    const std::vector<int64_t>& out_dims = transpose.type().dims;
    const std::vector<int64_t> out_strides = RowMajorStrides(out_dims);
    const std::vector<int64_t> in_strides = RowMajorStrides(transpose.operand(0)->type().dims);
    std::string sum;
    for (size_t d = 0; d < perm.size(); ++d) {
      if (out_dims[d] == 1) continue;
      absl::StrAppendFormat(&sum, "%s((%s / %d) %% %d) * %d", sum.empty() ? "" : " + ", index, out_strides[d],
                            out_dims[d], in_strides[perm[d]]);
    }
    if (sum.empty()) return std::string("0");
    const std::string var = absl::StrCat("i", next_var_++);
    absl::StrAppend(&code_, "      const Index ", var, " = ", sum, ";\n");
    return var;
  }

  // The operand's linear index for element `index` of a slice: result coordinate c along
  // dim d reads operand coordinate start[d] + c * stride[d].
  absl::StatusOr<std::string> SliceIndex(const Node& slice, const std::string& index) {
    ASSIGN_OR_RETURN(std::vector<int64_t> start, slice.attrs().GetInts("start"));
    ASSIGN_OR_RETURN(std::vector<int64_t> stride, slice.attrs().GetInts("stride"));
    const std::vector<int64_t>& out_dims = slice.type().dims;
    const std::vector<int64_t> out_strides = RowMajorStrides(out_dims);
    const std::vector<int64_t> in_strides = RowMajorStrides(slice.operand(0)->type().dims);
    int64_t base = 0;
    for (size_t d = 0; d < start.size(); ++d) base += start[d] * in_strides[d];
    std::string sum = absl::StrCat(base);
    for (size_t d = 0; d < out_dims.size(); ++d) {
      if (out_dims[d] == 1) continue;
      absl::StrAppendFormat(&sum, " + ((%s / %d) %% %d) * %d", index, out_strides[d], out_dims[d],
                            stride[d] * in_strides[d]);
    }
    const std::string var = absl::StrCat("i", next_var_++);
    absl::StrAppend(&code_, "      const Index ", var, " = ", sum, ";\n");
    return var;
  }

  // Element `index` of a concatenate: the operand whose run along `dim` holds it, computed
  // in a branch of its own, so that only that operand's inputs are read. Values computed
  // inside a branch are scoped to it: the memo forgets them when the branch closes.
  //
  // A run of lanes (CarryRun) all take one branch where the concatenate keeps rows whole (the
  // result's last dim a multiple of the width, and, along the last dim, every operand's run
  // too): lane 0 then computes every lane inside its branch, along the operand's own run,
  // into an array the later lanes read.
  absl::StatusOr<std::string> Concatenate(const Node& concat, const std::string& index) {
    ASSIGN_OR_RETURN(int64_t dim, concat.attrs().GetInt("dim"));
    const std::vector<int64_t>& out_dims = concat.type().dims;
    int64_t inner = 1;
    for (size_t d = dim + 1; d < out_dims.size(); ++d) inner *= out_dims[d];
    const auto lane = lanes_.find(index);
    bool whole_runs = lane != lanes_.end() && width_ > 1 && out_dims.back() % width_ == 0;
    if (whole_runs && dim == static_cast<int64_t>(out_dims.size()) - 1) {
      for (const Node* operand : concat.operands()) whole_runs = whole_runs && operand->type().dims[dim] % width_ == 0;
    }
    if (whole_runs && lane->second.lane > 0) {
      const auto lanes = concat_runs_.find(std::make_pair(&concat, lane->second.run));
      if (lanes != concat_runs_.end()) return absl::StrCat(lanes->second, "[", lane->second.lane, "]");
      whole_runs = false;
    }
    const int n = next_var_++;
    const std::string var = absl::StrCat("v", n);
    const std::string c = absl::StrCat("c", n), o = absl::StrCat("o", n), r = absl::StrCat("r", n);
    if (whole_runs) {
      concat_runs_[std::make_pair(&concat, lane->second.run)] = var;
      absl::StrAppendFormat(&code_, "      %s %s[kWidth];\n", CudaTypeName(concat.type().dtype), var);
    }
    absl::StrAppendFormat(&code_,
                          "%s"
                          "      {\n"
                          "      const Index %s = (%s / %d) %% %d;  // coordinate along dim %d\n"
                          "      const Index %s = %s / %d;\n"
                          "      const Index %s = %s %% %d;\n",
                          whole_runs ? "" : absl::StrCat("      ", CudaTypeName(concat.type().dtype), " ", var, ";\n"), c,
                          index, inner, out_dims[dim], dim, o, index, inner * out_dims[dim], r, index, inner);
    int64_t offset = 0;
    bool first = true;
    for (const Node* operand : concat.operands()) {
      const int64_t run = operand->type().dims[dim];
      if (run == 0) continue;  // an empty operand contributes nothing
      const std::string j = absl::StrCat("i", next_var_++);
      absl::StrAppendFormat(&code_, "      %sif (%s < %d) {\n      const Index %s = (%s * %d + (%s - %d)) * %d + %s;\n",
                            first ? "" : "} else ", c, offset + run, j, o, run, c, offset, inner, r);
      first = false;
      const auto saved = memo_;
      if (whole_runs) {
        runs_.push_back(j);
        const int operand_run = static_cast<int>(runs_.size()) - 1;
        for (int l = 0; l < width_; ++l) {
          std::string lane_index = j;
          if (l > 0) {
            lane_index = absl::StrCat("i", next_var_++);
            absl::StrAppendFormat(&code_, "      const Index %s = %s + %d;\n", lane_index, j, l);
          }
          lanes_[lane_index] = {l, operand_run};
          ASSIGN_OR_RETURN(std::string v, Value(operand, lane_index));
          absl::StrAppend(&code_, "      ", var, "[", l, "] = ", v, ";\n");
        }
      } else {
        ASSIGN_OR_RETURN(std::string v, Value(operand, j));
        absl::StrAppend(&code_, "      ", var, " = ", v, ";\n");
      }
      memo_ = saved;
      offset += run;
    }
    absl::StrAppend(&code_, first ? "" : "      }\n", "      }\n");
    return whole_runs ? absl::StrCat(var, "[0]") : var;
  }

  const KernelGroup& group_;
  absl::flat_hash_set<const Node*> members_;
  absl::flat_hash_map<const Node*, int> input_index_;
  std::map<std::pair<const Node*, std::string>, std::string> memo_;
  struct Lane {
    int lane = 0;
    int run = 0;  // runs_[run] is the run's first index (run 0: the element's own)
  };
  std::map<std::string, Lane> lanes_;
  int width_ = 1;
  std::vector<std::string> runs_;
  std::map<std::pair<const Node*, int>, int> derived_runs_;          // (node, run) -> its operand's run
  std::map<std::pair<int, int>, std::string> run_vectors_;           // (input, run) -> vector variable
  std::map<std::pair<const Node*, int>, std::string> concat_runs_;   // (concatenate, run) -> its lanes' array
  std::set<int> vector_inputs_;
  std::set<int> run_inputs_;
  std::string code_;
  int next_var_ = 0;
};

// The type a group's kernel indexes in: unsigned, and 32-bit while `bound` (how far the
// kernel's own loops reach) and every member's and input's element count (but `apart`'s, which
// the kernel indexes in 64 bits itself) stay below 2^32. Every index a group's emitter computes
// is an element's linear index into one of those values, and none is negative: a slice's,
// broadcast's or transpose's map only divides, takes remainders and adds; a concatenate's `c -
// offset` follows its guard. Unsigned, a division or remainder by a power of two is one shift
// or mask, and by another constant one multiply-high; in signed 64 bits each element's dozens
// of them made fused kernels instruction-bound (ncu, llama-M's 8 x 512 @fresh_prefill cache
// writes on an H100: 246 us, 93% of the SMs' issue, 17% of DRAM's bandwidth; bench/RESULTS.md,
// session 34).
const char* GroupIndexType(const KernelGroup& group, int64_t bound, const std::set<const Node*>& apart = {}) {
  for (const Node* m : group.members) bound = std::max(bound, m->type().num_elements());
  for (const Node* in : group.inputs) {
    if (!apart.contains(in)) bound = std::max(bound, in->type().num_elements());
  }
  return bound < (int64_t{1} << 32) ? "unsigned" : "unsigned long long";
}

// A GroupInput: a pointer-like functor computing element i of `value` from the group's inputs
// (inK), as a loop kernel computes it: `in + d` moves it, `in[j]` reads element base + j.
struct GroupInputSource {
  std::string definition;   // the struct, at module scope
  std::string params;       // the kernel's input parameters, ", const T* __restrict__ in0, ..."
  std::string initializer;  // "{in0, in1, 0}": a GroupInput at element 0
};
absl::StatusOr<GroupInputSource> GroupInputFor(const KernelGroup& group, const Node& value, absl::string_view what) {
  GroupEmitter emitter(group);
  ASSIGN_OR_RETURN(const std::string element, emitter.Value(&value, "i"));
  GroupInputSource source;
  std::string fields, names;
  for (size_t i = 0; i < group.inputs.size(); ++i) {
    const char* type = CudaTypeName(group.inputs[i]->type().dtype);
    absl::StrAppend(&source.params, ", const ", type, "* __restrict__ in", i);
    absl::StrAppend(&fields, "  const ", type, "* __restrict__ in", i, ";\n");
    absl::StrAppend(&names, "in", i, ", ");
  }
  source.definition = absl::StrCat(
      "// ", what, ", computed element by element from the group's inputs.\n"
      "struct GroupInput {\n"
      "  typedef ", GroupIndexType(group, value.type().num_elements()), " Index;\n",
      fields,
      "  Index base;\n"
      "  __device__ __forceinline__ GroupInput operator+(Index d) const {\n"
      "    GroupInput g = *this;\n"
      "    g.base += d;\n"
      "    return g;\n"
      "  }\n"
      "  __device__ __forceinline__ ", CudaTypeName(value.type().dtype), " operator[](Index j) const {\n"
      "    const Index i = base + j;\n",
      emitter.code(),
      "    return ", element, ";\n"
      "  }\n"
      "};\n\n");
  source.initializer = absl::StrCat("{", names, "0}");
  return source;
}

// The dtypes a group's kernel source needs headers and helpers for: `extra`, its inputs' and
// its members'.
std::vector<DType> GroupDTypes(const KernelGroup& group, std::vector<DType> extra) {
  for (const Node* in : group.inputs) extra.push_back(in->type().dtype);
  for (const Node* m : group.members) extra.push_back(m->type().dtype);
  return extra;
}

// A reduction fusion: the reduction's kernel (reduction_lowering.cc) reads its operand
// through a GroupInput that computes each element from the fusion's inputs.
absl::StatusOr<LoweredNode> LowerReductionFusion(const KernelGroup& group, const CodegenOptions& options) {
  const Node& root = *group.root;
  ASSIGN_OR_RETURN(GroupInputSource source, GroupInputFor(group, *root.operand(0), "The reduced operand"));
  FusedReduceInput fused;
  fused.kernel_name = absl::StrCat(KernelName(root), "_fusion");
  fused.params = source.params;
  fused.opening = FusionSourceOpening("fusion", group, root, GroupDTypes(group, {root.type().dtype}));
  fused.definition = source.definition;
  fused.construct = absl::StrCat("  const GroupInput in", source.initializer, ";\n");
  ASSIGN_OR_RETURN(LoweredNode lowered, LowerReduce(root, options, &fused));
  lowered.label = absl::StrCat("fused ", root.op_name());
  return lowered;
}

}  // namespace

// A cache_write fusion (ir/fusion.h): one kernel computing each of its body's outputs element
// by element over one index space, output after output. A kv_cache_write's rows are stored at
// their slots of the paged pool as kernels/paged_kv.cuh's KvCacheWrite stores them (a slot
// outside the pool, padding's -1, writes nothing), the pool updated in place like
// kv_cache_write's: before the kernel, a kernel copying the pool into the result, left out
// where the plan gives the result the pool's buffer (its in-place operand). A loop output is
// stored as a loop fusion stores it.
absl::StatusOr<LoweredNode> LowerCacheWriteFusion(const Node& fusion, const CodegenOptions& options) {
  const Function* body = fusion.body();
  if (body == nullptr || body->outputs().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cache_write fusion %", fusion.name(), " has no body outputs"));
  }
  const std::vector<Node*> params = body->parameters();
  const std::vector<Node*>& outputs = body->outputs();
  const bool several = outputs.size() > 1;
  KernelGroup group;
  group.roots.assign(outputs.begin(), outputs.end());
  group.root = group.roots[0];
  for (const Node* p : params) group.inputs.push_back(p);
  for (const auto& n : body->nodes()) {
    if (n->opcode() != Opcode::kParameter && n->opcode() != Opcode::kKvCacheWrite) group.members.push_back(n.get());
  }
  std::vector<DType> dtypes;
  for (const Node* m : group.members) dtypes.push_back(m->type().dtype);
  std::string params_text;
  std::vector<std::string> copy_outputs;
  for (size_t r = 0; r < outputs.size(); ++r) {
    const DType t = outputs[r]->type().dtype;
    dtypes.push_back(t);
    absl::StrAppend(&params_text, r == 0 ? "" : ", ", CudaTypeName(t), "* out", r);
    copy_outputs.push_back(absl::StrCat(CudaTypeName(t), "* out", r));
  }
  std::vector<std::string> copy_params;
  for (size_t i = 0; i < params.size(); ++i) {
    dtypes.push_back(params[i]->type().dtype);
    absl::StrAppend(&params_text, ", const ", CudaTypeName(params[i]->type().dtype), "* __restrict__ in", i);
    copy_params.push_back(composite::Param(params[i]->type().dtype, absl::StrCat("in", i)));
  }

  LoweredNode lowered{LoweringKind::kKernels, {}, several ? "fused cache writes" : "fused cache write"};
  const int threads = options.threads_per_block;
  const std::string name = absl::StrCat(KernelName(fusion), "_fusion");
  std::string sections;
  int64_t end = 0;
  for (size_t r = 0; r < outputs.size(); ++r) {
    const Node& out = *outputs[r];
    const bool write = out.opcode() == Opcode::kKvCacheWrite;
    const Node* value = write ? out.operand(1) : &out;
    const int64_t count = value->type().num_elements();
    GroupEmitter emitter(group);
    std::string element;
    if (value->opcode() == Opcode::kParameter) {
      element = absl::StrCat("in", std::find(params.begin(), params.end(), value) - params.begin(), "[i]");
    } else {
      ASSIGN_OR_RETURN(element, emitter.Value(value, "i"));
    }
    std::string store;
    if (write) {
      const int pool_input = static_cast<int>(out.operand(0)->attrs().GetInt("index").value_or(-1));
      const int slots_input = static_cast<int>(out.operand(2)->attrs().GetInt("index").value_or(-1));
      const TensorType& pool = out.type();
      if (value->type().dtype != pool.dtype || pool_input < 0 || slots_input < 0 || value->type().dims.size() != 3 ||
          pool.dims.size() != 5 || value->type().dims[1] != pool.dims[2] || value->type().dims[2] != pool.dims[4]) {
        return absl::InvalidArgumentError(absl::StrCat("cache_write fusion %", fusion.name(), ": rows ",
                                                       value->type().ToString(), " into pool ", pool.ToString()));
      }
      ASSIGN_OR_RETURN(const int64_t layer, out.attrs().GetInt("layer"));
      const int64_t heads = pool.dims[2], block_size = pool.dims[3], head_dim = pool.dims[4], blocks = pool.dims[1];
      // The pool's element index in 64 bits (a pool may pass 2^31 elements), from the slot
      // unsigned once it is known to be in the pool.
      store = absl::StrFormat(
          "      const Index row = i / %d, h = i / %d %% %d, d = i %% %d;\n"
          "      const long long slot = in%d[row];\n"
          "      if (slot < 0 || slot >= %dLL) continue;  // padding, or outside the pool\n"
          "      const unsigned long long s = slot;\n"
          "      out%d[(((%dULL + s / %d) * %d + h) * %d + s %% %d) * %d + d] = %s;\n",
          heads * head_dim, head_dim, heads, head_dim, slots_input, blocks * block_size, r, layer * blocks,
          block_size, heads, block_size, block_size, head_dim, element);
      // The pool copy, a kernel of its own ahead of the rows' kernel.
      composite::Wrapper copy;
      copy.header = "paged_kv";
      copy.comment = absl::StrCat("copies the pool (", composite::Count(pool.num_elements(), "element"),
                                  ") into the result unless it is the pool's own buffer; grid-stride");
      copy.params = copy_params;
      if (several) copy.outputs = copy_outputs;
      copy.call = absl::StrCat("PoolCopy<", CudaTypeName(pool.dtype), ", ", pool.num_elements(), "LL>(",
                               several ? absl::StrCat("out", r) : std::string("out"), ", in", pool_input, ")");
      const int64_t copy_blocks = std::min<int64_t>(composite::CeilDiv(pool.num_elements(), threads),
                                                    int64_t{8} * std::max(1, options.target.sm_count));
      lowered.kernels.push_back(composite::Emit(fusion, absl::StrCat(name, "_copy", several ? absl::StrCat(r) : ""),
                                                copy, copy_blocks, threads));
      lowered.copy_kernel_results.push_back(static_cast<int>(r));
      if (several) {
        lowered.in_place_operand_of_results.resize(outputs.size(), -1);
        lowered.in_place_operand_of_results[r] = pool_input;
      } else {
        lowered.in_place_operand = pool_input;
      }
    } else {
      store = absl::StrFormat("      out%d[i] = %s;\n", r, element);
    }
    if (count == 0) continue;  // no section; a pool it writes still has its copy, above
    absl::StrAppendFormat(&sections,
                          "    %sif (t < %dLL) {  // %s%%%s\n"
                          "      if (out%d == nullptr) continue;  // a result nothing reads\n"
                          "      const Index i = t - %dLL;\n"
                          "%s%s"
                          "    }",
                          sections.empty() ? "" : " else ", end + count, write ? "the rows of " : "",
                          fusion.has_multiple_results() ? fusion.result(static_cast<int>(r))->name() : fusion.name(), r,
                          end, emitter.code(), store);
    end += count;
  }
  if (end == 0) return lowered;
  std::string source = FusionSourceOpening(several ? "cache_write fusion (several results)" : "cache_write fusion",
                                           group, *outputs[0], dtypes);
  const std::array<uint32_t, 3> grid = GridFor(end, threads, options.target);
  // The pools' element indices are computed apart, in 64 bits (a section's `t - start`
  // follows its guard, so it is never negative either).
  std::set<const Node*> pools;
  for (const Node* out : outputs) {
    if (out->opcode() == Opcode::kKvCacheWrite) pools.insert(out->operand(0));
  }
  const char* index_type = GroupIndexType(group, end + 2 * int64_t{threads} * grid[0], pools);
  absl::StrAppendFormat(&source,
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n"
                        "  using namespace kiln;\n"
                        "  typedef %s Index;\n"
                        "  constexpr Index kCount = %d;\n"
                        "  const Index first = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;\n"
                        "  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;\n"
                        "  for (Index t = first; t < kCount; t += stride) {\n"
                        "%s\n"
                        "  }\n"
                        "}\n",
                        threads, name, params_text, index_type, end, sections);
  lowered.kernels.push_back(MakeKernel(name, std::move(source), grid, {static_cast<uint32_t>(threads), 1, 1}));
  return lowered;
}

absl::StatusOr<LoweredNode> LowerFusion(const Node& fusion, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(const FusionKind kind, FusionKindOf(fusion));
  if (kind == FusionKind::kCacheWrite) return LowerCacheWriteFusion(fusion, options);
  if (kind == FusionKind::kGemvGlu) return LowerGemvGluFusion(fusion, options);
  if (kind == FusionKind::kGemvNormGemv) return LowerGemvNormGemvFusion(fusion, options);
  ASSIGN_OR_RETURN(const KernelGroup group, GroupOf(fusion, kind));
  const Node& root = *group.root;
  if (kind == FusionKind::kReduction) return LowerReductionFusion(group, options);
  const size_t num_roots = group.roots.size();
  const int64_t count = root.type().num_elements();
  LoweredNode lowered{LoweringKind::kKernels, {}, "fused loop"};
  if (count == 0) return lowered;

  // Each thread computes kWidth consecutive elements: the output and every input read at the
  // element's own index move as one vector (16 bytes for the narrowest of them), the other
  // inputs (broadcast, transposed, sliced) element by element. Scalar 2-byte accesses left
  // these memory-bound kernels at ~60% of the H200's bandwidth.
  int narrowest = DTypeBytes(root.type().dtype);
  for (const Node* r : group.roots) narrowest = std::min(narrowest, static_cast<int>(DTypeBytes(r->type().dtype)));
  for (const Node* in : group.inputs) narrowest = std::min(narrowest, static_cast<int>(DTypeBytes(in->type().dtype)));
  const int width = std::clamp(16 / std::max(narrowest, 1), 1, kMaxVectorLanes);

  GroupEmitter vector_emitter(group);
  std::vector<std::vector<std::string>> lane_results(num_roots);  // [root][lane]
  std::string lane_indices;
  for (int lane = 0; lane < width; ++lane) {
    const std::string index = absl::StrCat("e", lane);
    absl::StrAppendFormat(&lane_indices, "    const Index %s = base + %d;\n", index, lane);
    vector_emitter.SetLane(index, lane, width);
    for (size_t r = 0; r < num_roots; ++r) {
      ASSIGN_OR_RETURN(std::string v, vector_emitter.Value(group.roots[r], index));
      lane_results[r].push_back(std::move(v));
    }
  }
  GroupEmitter scalar_emitter(group);
  std::vector<std::string> scalar_results;
  for (const Node* r : group.roots) {
    ASSIGN_OR_RETURN(std::string v, scalar_emitter.Value(r, "i"));
    scalar_results.push_back(std::move(v));
  }

  std::vector<DType> dtypes;
  for (const Node* m : group.members) dtypes.push_back(m->type().dtype);
  // Results are out0, out1, ... (the kernel's outputs come first, one per result).
  std::string params;
  for (size_t r = 0; r < num_roots; ++r) {
    absl::StrAppend(&params, r == 0 ? "" : ", ", CudaTypeName(group.roots[r]->type().dtype), "* out", r);
  }
  for (size_t i = 0; i < group.inputs.size(); ++i) {
    dtypes.push_back(group.inputs[i]->type().dtype);
    absl::StrAppend(&params, ", const ", CudaTypeName(group.inputs[i]->type().dtype), "* __restrict__ in", i);
  }
  // Vector accesses need every vector pointer aligned to its vector (the arena's buffers
  // are, at 256 bytes; a caller's device pointer may not be): else the scalar loop runs all.
  std::string aligned;
  for (size_t r = 0; r < num_roots; ++r) {
    absl::StrAppendFormat(&aligned, "%s(reinterpret_cast<unsigned long long>(out%d) %% sizeof(Vec<%s, kWidth>) == 0)",
                          r == 0 ? "" : " &&\n      ", r, CudaTypeName(group.roots[r]->type().dtype));
  }
  std::string loads;
  std::set<int> vector_read = vector_emitter.run_inputs();
  for (int input : vector_emitter.vector_inputs()) {
    const std::string type = CudaTypeName(group.inputs[input]->type().dtype);
    absl::StrAppendFormat(&loads, "    const Vec<%s, kWidth> a%d = LoadVec<kWidth>(in%d, vec);\n", type, input, input);
    vector_read.insert(input);
  }
  for (int input : vector_read) {
    const std::string type = CudaTypeName(group.inputs[input]->type().dtype);
    absl::StrAppendFormat(&aligned, " &&\n      (reinterpret_cast<unsigned long long>(in%d) %% sizeof(Vec<%s, kWidth>) == 0)",
                          input, type);
  }
  std::string stores, scalar_stores;
  for (size_t r = 0; r < num_roots; ++r) {
    absl::StrAppendFormat(&stores, "    {\n    Vec<%s, kWidth> result;\n", CudaTypeName(group.roots[r]->type().dtype));
    for (int lane = 0; lane < width; ++lane) {
      absl::StrAppendFormat(&stores, "    result.v[%d] = %s;\n", lane, lane_results[r][lane]);
    }
    absl::StrAppendFormat(&stores, "    StoreVec<kWidth>(out%d, vec, result);\n    }\n", r);
    absl::StrAppendFormat(&scalar_stores, "    out%d[i] = %s;\n", r, scalar_results[r]);
  }

  const int threads = options.threads_per_block;
  const int64_t vectors = count / width;
  const std::array<uint32_t, 3> grid = GridFor(std::max<int64_t>(vectors, 1), threads, options.target);
  const int64_t stride = int64_t{threads} * grid[0];
  const std::string name = absl::StrCat(KernelName(root), "_fusion");
  std::string source = FusionSourceOpening("fusion", group, root, dtypes);
  absl::StrAppendFormat(&source,
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n"
                        "  using namespace kiln;\n"
                        "  typedef %s Index;\n"
                        "  constexpr Index kCount = %d;\n"
                        "  constexpr int kWidth = %d;\n"
                        "  constexpr Index kVectors = kCount / kWidth;\n"
                        "  const Index first = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;\n"
                        "  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;\n"
                        "  const bool aligned = %s;\n"
                        "  if (aligned) {\n"
                        "  for (Index vec = first; vec < kVectors; vec += stride) {\n"
                        "    const Index base = vec * kWidth;\n"
                        "%s%s%s%s"
                        "  }\n"
                        "  }\n"
                        "  // The elements past the last whole vector (all of them when unaligned).\n"
                        "  for (Index i = (aligned ? kVectors * kWidth : 0) + first; i < kCount; i += stride) {\n"
                        "%s%s"
                        "  }\n"
                        "}\n",
                        threads, name, params, GroupIndexType(group, count + 2 * stride + width), count, width, aligned,
                        lane_indices, loads, vector_emitter.code(), stores, scalar_emitter.code(), scalar_stores);
  lowered.kernels.push_back(MakeKernel(name, std::move(source), grid, {static_cast<uint32_t>(threads), 1, 1}));
  return lowered;
}

}  // namespace kiln::codegen
