#include "ir/reference_backend.h"

#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "ir/shape_inference.h"
#include "ir/status_macros.h"
#include "ir/numerics.h"
#include "ir/reference/kernels.h"

namespace kiln {
namespace {

using reference::MultiResultKernel;
using reference::OpKernel;

// What computes a node: a kernel of one result, one of several, or (get_result) picking a
// result its operand already computed.
struct Semantics {
  Semantics() = default;
  Semantics(OpKernel kernel) : single(kernel) {}  // NOLINT: every row of one result
  Semantics(MultiResultKernel kernel) : multi(kernel) {}  // NOLINT
  static Semantics PicksResult() {
    Semantics s;
    s.picks_result = true;
    return s;
  }
  OpKernel single = nullptr;
  MultiResultKernel multi = nullptr;
  bool picks_result = false;
  bool defined() const { return single != nullptr || multi != nullptr || picks_result; }
};

// A fusion computes its body: the same ops, so the same values as before fuse-loops made it.
absl::StatusOr<std::vector<HostTensor>> Evaluate(const Function& f, absl::Span<const HostTensor* const> args,
                                                 const ReferenceOptions& options);

// A fusion's body, on its operands where they lie (a cache-write fusion's operands hold the
// KV pools).
absl::StatusOr<std::vector<HostTensor>> EvalFusion(const Node& node, reference::Operands xs,
                                                   const reference::EvalContext& ctx) {
  // The hook sees the values of the function being evaluated, not a fusion's internals: the
  // fusion node's own results reach it in the caller's loop.
  if (ctx.options.after_node) {
    ReferenceOptions body_options = ctx.options;
    body_options.after_node = nullptr;
    return Evaluate(*node.body(), xs, body_options);
  }
  return Evaluate(*node.body(), xs, ctx.options);
}

// The one dispatch switch: no default, so -Wswitch flags an op added to the table without
// semantics here, and ReferenceSupports (hence tests/op_table_test.cc) reports it.
Semantics KernelFor(Opcode op) {
  using namespace reference;
  switch (op) {
    case Opcode::kParameter: return EvalParameter;
    case Opcode::kConstant: return EvalConstant;
    case Opcode::kIota: return EvalIota;
    case Opcode::kNeg:
    case Opcode::kAbs:
    case Opcode::kExp:
    case Opcode::kLog:
    case Opcode::kSqrt:
    case Opcode::kRsqrt:
    case Opcode::kTanh:
    case Opcode::kSigmoid:
    case Opcode::kGelu: return EvalUnary;
    case Opcode::kAdd:
    case Opcode::kSub:
    case Opcode::kMul:
    case Opcode::kDiv:
    case Opcode::kMax:
    case Opcode::kMin: return EvalBinary;
    case Opcode::kCompare: return EvalCompare;
    case Opcode::kSelect: return EvalSelect;
    case Opcode::kConvert: return EvalConvert;
    case Opcode::kBroadcast: return EvalBroadcast;
    case Opcode::kReshape: return EvalReshape;
    case Opcode::kTranspose: return EvalTranspose;
    case Opcode::kSlice: return EvalSlice;
    case Opcode::kConcatenate: return EvalConcatenate;
    case Opcode::kReduceSum: return EvalReduceSum;
    case Opcode::kReduceMax: return EvalReduceMax;
    case Opcode::kDotGeneral: return EvalDotGeneral;
    case Opcode::kGemm: return EvalGemm;
    case Opcode::kGather: return EvalGather;
    case Opcode::kScatterAdd: return EvalScatterAdd;
    case Opcode::kRmsNorm: return EvalRmsNorm;
    case Opcode::kRmsNormGradInput: return EvalRmsNormGradInput;
    case Opcode::kRmsNormGradWeight: return EvalRmsNormGradWeight;
    case Opcode::kLayerNorm: return EvalLayerNorm;
    case Opcode::kAddRmsNorm:
    case Opcode::kAddLayerNorm: return EvalAddNorm;
    case Opcode::kAddRmsNormGradInput: return EvalAddRmsNormGradInput;
    case Opcode::kLayerNormGradInput:
    case Opcode::kAddLayerNormGradInput: return EvalLayerNormGradInput;
    case Opcode::kSoftmax: return EvalSoftmax;
    case Opcode::kSoftmaxGrad: return EvalSoftmaxGrad;
    case Opcode::kCrossEntropy: return EvalCrossEntropy;
    case Opcode::kCrossEntropyGrad: return EvalCrossEntropyGrad;
    case Opcode::kRope: return EvalRope;
    case Opcode::kRopeTable: return EvalRopeTable;
    case Opcode::kAdamWUpdate: return EvalAdamWUpdate;
    case Opcode::kSumOfSquares: return EvalSumOfSquares;
    case Opcode::kFp8Quantize: return EvalFp8Quantize;
    case Opcode::kFp8Dequantize: return EvalFp8Dequantize;
    case Opcode::kFp8ScaleUpdate: return EvalFp8ScaleUpdate;
    case Opcode::kAttention: return EvalAttention;
    case Opcode::kAttentionDelta: return EvalAttentionDelta;
    case Opcode::kAttentionGrad: return EvalAttentionGrad;
    case Opcode::kKvCacheWrite: return EvalKvCacheWrite;
    case Opcode::kPagedAttention: return EvalPagedAttention;
    case Opcode::kSampleTokens: return EvalSampleTokens;
    case Opcode::kGetResult: return Semantics::PicksResult();
    case Opcode::kFusion: return EvalFusion;
  }
  return {};
}

// Ops that only move or pick existing values already hold representable results (and
// parameters must keep the caller's f32 values under f32_as_f64); the rest are rounded.
bool ResultNeedsRounding(Opcode op) {
  return op != Opcode::kParameter && op != Opcode::kSelect && op != Opcode::kGather && op != Opcode::kGetResult &&
         op != Opcode::kFusion && GetOpInfo(op).category != OpCategory::kDataMovement;
}

std::string NodeLabel(const Function& f, const Node& node) {
  return absl::StrCat("function ", f.name(), ", node %", node.name(), " (", node.op_name(), ")");
}

// Runs options.after_node on node's fresh results and checks that it kept their types: the
// users' kernels trust them.
absl::Status RunAfterNodeHook(const Function& f, const Node& node, std::vector<HostTensor>& results,
                              const ReferenceOptions& options) {
  absl::Status status = options.after_node(node, absl::MakeSpan(results));
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(NodeLabel(f, node), ": after_node hook: ", status.message()));
  }
  for (size_t r = 0; r < results.size(); ++r) {
    const TensorType& type = node.result_type(static_cast<int>(r));
    if (results[r].type() != type || results[r].num_elements() != type.num_elements()) {
      return absl::InvalidArgumentError(absl::StrCat(NodeLabel(f, node), ": the after_node hook changed result ", r,
                                              " from ", type.ToString(), " to ", results[r].type().ToString(),
                                              "; it may change values only, never the shape or dtype"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckArguments(const Function& f, absl::Span<const HostTensor* const> args) {
  const std::vector<Node*> params = f.parameters();
  if (args.size() != params.size()) {
    std::vector<std::string> names;
    for (const Node* p : params) names.push_back(absl::StrCat("%", p->name(), ": ", p->type().ToString()));
    return absl::InvalidArgumentError(absl::StrCat("function ", f.name(), " takes ", params.size(),
                                                   " argument(s) (", absl::StrJoin(names, ", "), "), got ",
                                                   args.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (args[i]->type() != params[i]->type() || args[i]->num_elements() != params[i]->type().num_elements()) {
      return absl::InvalidArgumentError(absl::StrCat("argument ", i, " for parameter %", params[i]->name(),
                                                     " of function ", f.name(), " must be ",
                                                     params[i]->type().ToString(), ", got ",
                                                     args[i]->type().ToString()));
    }
  }
  return absl::OkStatus();
}

// EvaluateFunction on arguments given by address.
absl::StatusOr<std::vector<HostTensor>> Evaluate(const Function& f, absl::Span<const HostTensor* const> args,
                                                 const ReferenceOptions& options) {
  RETURN_IF_ERROR(CheckArguments(f, args));
  const auto& nodes = f.nodes();
  const int64_t num_nodes = static_cast<int64_t>(nodes.size());
  absl::flat_hash_map<const Node*, int64_t> position;
  for (int64_t i = 0; i < num_nodes; ++i) position[nodes[i].get()] = i;

  // Liveness: only nodes that an output depends on run. remaining_uses counts the uses
  // by live nodes, so a value is freed right after its last user.
  std::vector<bool> live(num_nodes, false);
  std::vector<bool> is_output(num_nodes, false);
  for (const Node* out : f.outputs()) {
    auto it = position.find(out);
    if (it == position.end()) {
      return absl::InvalidArgumentError(absl::StrCat("function ", f.name(), ": an output is not one of its nodes"));
    }
    live[it->second] = is_output[it->second] = true;
  }
  std::vector<int64_t> remaining_uses(num_nodes, 0);
  for (int64_t i = num_nodes - 1; i >= 0; --i) {
    if (!live[i]) continue;
    for (const Node* operand : nodes[i]->operands()) {
      auto it = position.find(operand);
      if (it == position.end() || it->second >= i) {
        return absl::InvalidArgumentError(
            absl::StrCat(NodeLabel(f, *nodes[i]), ": an operand is not defined before it in the function"));
      }
      live[it->second] = true;
      ++remaining_uses[it->second];
    }
  }

  ThreadPool& pool = ThreadPool::Shared(options.num_threads);
  const reference::EvalContext ctx{options, pool, args};
  // One tensor per result of each computed node; a get_result moves its result out of its
  // multi-result node (it is that result's only reader).
  // Sized once and each entry assigned once: a value's tensors stay in place until freed (or,
  // a multi-result node's, moved out by its get_result), as AfterNodeHook promises
  // (ir/reference_backend.h).
  std::vector<std::vector<HostTensor>> values(num_nodes);
  // A parameter's value is its argument, read where it lies: an inference call's arguments
  // are mostly its weights and KV pools, which a copy per call made most of the CPU
  // backend's decode step. Copied as any other value where the function returns it or the
  // after-node hook wants it.
  std::vector<const HostTensor*> argument_of(num_nodes, nullptr);
  std::vector<const HostTensor*> operands;
  for (int64_t i = 0; i < num_nodes; ++i) {
    if (!live[i]) continue;
    const Node& node = *nodes[i];
    // Kernels trust shapes and attributes, so re-check them (the graph may be unverified).
    absl::StatusOr<std::vector<TensorType>> inferred = InferNodeResultTypes(node);
    if (!inferred.ok() || *inferred != node.result_types()) {
      return absl::InvalidArgumentError(
          absl::StrCat(NodeLabel(f, node), ": ill-typed node: ",
                       inferred.ok() ? "inferred types differ from the written ones"
                                     : std::string(inferred.status().message())));
    }
    const Semantics semantics = KernelFor(node.opcode());
    if (!semantics.defined()) {
      return absl::UnimplementedError(absl::StrCat(NodeLabel(f, node), ": no reference semantics"));
    }
    if (node.opcode() == Opcode::kParameter && !is_output[i] && !options.after_node) {
      absl::StatusOr<int64_t> index = node.attrs().GetInt("index");
      if (!index.ok() || *index < 0 || *index >= static_cast<int64_t>(args.size())) {
        return absl::InvalidArgumentError(absl::StrCat(NodeLabel(f, node), ": no argument for its index (",
                                                       args.size(), " given)"));
      }
      argument_of[i] = args[*index];
      continue;
    }
    if (semantics.picks_result) {
      std::vector<HostTensor>& from = values[position[node.operand(0)]];
      values[i].push_back(std::move(from[node.result_index()]));
    } else {
      operands.clear();
      for (const Node* operand : node.operands()) {
        const int64_t p = position[operand];
        operands.push_back(argument_of[p] != nullptr ? argument_of[p] : &values[p][0]);
      }
      absl::StatusOr<std::vector<HostTensor>> result;
      if (semantics.multi != nullptr) {
        result = semantics.multi(node, operands, ctx);
      } else {
        absl::StatusOr<HostTensor> one = semantics.single(node, operands, ctx);
        if (one.ok()) {
          result.emplace();
          result->push_back(*std::move(one));
        } else {
          result = one.status();
        }
      }
      if (!result.ok()) {
        return absl::Status(result.status().code(), absl::StrCat(NodeLabel(f, node), ": ", result.status().message()));
      }
      KILN_CHECK(result->size() == node.result_types().size());
      for (size_t r = 0; r < result->size(); ++r) {
        HostTensor& t = (*result)[r];
        const TensorType& type = node.result_type(static_cast<int>(r));
        KILN_CHECK(t.type() == type && t.num_elements() == type.num_elements());
        if (!ResultNeedsRounding(node.opcode())) continue;
        std::vector<double>& v = t.mutable_values();
        pool.ParallelFor(static_cast<int64_t>(v.size()), reference::kElementsPerChunk, [&](int64_t begin, int64_t end) {
          RoundValuesToDType(v.data() + begin, end - begin, type.dtype, options.f32_as_f64);
        });
      }
      values[i] = *std::move(result);
    }
    if (options.after_node) RETURN_IF_ERROR(RunAfterNodeHook(f, node, values[i], options));
    for (const Node* operand : node.operands()) {
      const int64_t p = position[operand];
      if (--remaining_uses[p] == 0 && !is_output[p]) values[p].clear();
    }
  }

  std::vector<HostTensor> results;
  const std::vector<Node*>& outs = f.outputs();
  for (size_t i = 0; i < outs.size(); ++i) {
    const int64_t p = position[outs[i]];
    const bool used_again = std::find(outs.begin() + i + 1, outs.end(), outs[i]) != outs.end();
    results.push_back(used_again ? values[p][0] : std::move(values[p][0]));
  }
  return results;
}

}  // namespace

bool ReferenceSupports(Opcode op) { return KernelFor(op).defined(); }

absl::StatusOr<std::vector<HostTensor>> EvaluateFunction(const Function& f, absl::Span<const HostTensor> args,
                                                         const ReferenceOptions& options) {
  std::vector<const HostTensor*> addresses;
  addresses.reserve(args.size());
  for (const HostTensor& a : args) addresses.push_back(&a);
  return Evaluate(f, addresses, options);
}

}  // namespace kiln
