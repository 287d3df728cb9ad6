#include "frontends/llama_inference.h"

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "frontends/llama.h"
#include "frontends/nn.h"
#include "frontends/tensor.h"
#include "ir/status_macros.h"
#include "ir/verifier.h"
#include "passes/default_pipeline.h"
#include "passes/pipeline.h"

namespace kiln {
namespace {

DType GemmDType(Precision precision) { return GemmOperandDType(precision); }

absl::Status CheckLayout(const PagedKvLayout& layout, int64_t batch, int64_t tokens) {
  if (layout.num_blocks < 1 || layout.block_size < 1 || layout.max_blocks_per_sequence < 1) {
    return absl::InvalidArgumentError(absl::StrCat("paged KV layout: num_blocks (", layout.num_blocks,
                                                   "), block_size (", layout.block_size,
                                                   ") and max_blocks_per_sequence (", layout.max_blocks_per_sequence,
                                                   ") must be >= 1"));
  }
  if (batch < 1 || tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("an inference function of ", batch, " sequences of ", tokens, " tokens: both must be >= 1"));
  }
  return absl::OkStatus();
}

// Each row's last token: hidden [B,T,D] -> [B,1,D], row b's token at its largest position
// (positions rise along a row, padding is -1 after them). A select of that row and zeros,
// summed over T: exactly the row (x + 0 is x), one pass over the hidden state. A row of
// padding alone sums all its rows: nobody reads its logits.
Tensor LastTokenRows(Graph& g, Tensor hidden, Tensor positions) {
  const std::vector<int64_t> dims = hidden.type().dims;  // [B, T, D]
  const int64_t b = dims[0], d = dims[2];
  Tensor at = Convert(positions, DType::kF32);  // exact below 2^24
  Tensor last = Compare(at, Broadcast(ReduceMax(at, {1}), {0}, {b, dims[1]}), "eq");
  Tensor zeros = g.Constant(0.0, TensorType{hidden.type().dtype, dims});
  Tensor row = ReduceSum(Select(Broadcast(last, {0, 1}, dims), hidden, zeros), {1});
  return Reshape(row, {b, 1, d});
}

}  // namespace

TensorType KvPoolType(const ModelConfig& config, const PagedKvLayout& layout, Precision precision) {
  return TensorType{GemmDType(precision),
                    {config.n_layers, layout.num_blocks, config.n_kv_heads, layout.block_size, config.head_dim}};
}

TensorType InferenceWeightType(const WeightSpec& spec, Precision precision) {
  return TensorType{spec.gemm_operand ? GemmDType(precision) : DType::kF32, spec.shape};
}

std::vector<InferenceWeight> LlamaInferenceWeights(const ModelConfig& config) {
  const std::vector<WeightSpec> model = LlamaWeights(config);
  std::vector<InferenceWeight> weights;
  // The joint weight of model[first..first+count): their rows one after another.
  auto join = [&](int first, int count, const std::string& name) {
    InferenceWeight w{model[first], {}};
    w.spec.name = name;
    w.spec.shape[0] = 0;
    for (int i = first; i < first + count; ++i) {
      w.spec.shape[0] += model[i].shape[0];
      w.sources.push_back(i);
    }
    weights.push_back(std::move(w));
  };
  for (int i = 0; i < static_cast<int>(model.size());) {
    const std::string& name = model[i].name;
    if (absl::EndsWith(name, ".self_attn.q_proj.weight")) {
      join(i, 3, absl::StrCat(name.substr(0, name.size() - std::string("q_proj.weight").size()), "qkv_proj.weight"));
      i += 3;
    } else if (absl::EndsWith(name, ".mlp.gate_proj.weight")) {
      join(i, 2, absl::StrCat(name.substr(0, name.size() - std::string("gate_proj.weight").size()), "gate_up_proj.weight"));
      i += 2;
    } else {
      weights.push_back({model[i], {i}});
      ++i;
    }
  }
  return weights;
}

absl::StatusOr<std::vector<HostTensor>> InferenceWeightsFromModel(const ModelConfig& config,
                                                                  std::vector<HostTensor> model_weights,
                                                                  Precision precision) {
  const std::vector<WeightSpec> model = LlamaWeights(config);
  if (model_weights.size() != model.size()) {
    return absl::InvalidArgumentError(absl::StrCat("model '", config.name, "' takes ", model.size(), " weights, got ",
                                                   model_weights.size()));
  }
  std::vector<HostTensor> weights;
  for (const InferenceWeight& w : LlamaInferenceWeights(config)) {
    const TensorType type = InferenceWeightType(w.spec, precision);
    if (w.sources.size() == 1 && model_weights[w.sources[0]].type() == type) {
      weights.push_back(std::move(model_weights[w.sources[0]]));
      continue;
    }
    std::vector<double> values;
    values.reserve(static_cast<size_t>(type.num_elements()));
    for (int source : w.sources) {
      const HostTensor& piece = model_weights[source];
      if (piece.type().dims != model[source].shape) {
        return absl::InvalidArgumentError(absl::StrCat("weight ", model[source].name, " must be of shape ",
                                                       TensorType{DType::kF32, model[source].shape}.ToString(),
                                                       ", got ", piece.type().ToString()));
      }
      const std::vector<double>& v = piece.values();
      values.insert(values.end(), v.begin(), v.end());
      model_weights[source] = HostTensor();  // each model weight is read once
    }
    weights.push_back(HostTensor::FromValues(type, std::move(values)));
  }
  return weights;
}

const char* InferenceFunctionName(InferencePhase phase) {
  switch (phase) {
    case InferencePhase::kPrefill:
      return "prefill";
    case InferencePhase::kDecode:
      return "decode";
    case InferencePhase::kFreshPrefill:
      return "fresh_prefill";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Module>> BuildLlamaInferenceModule(const ModelConfig& config,
                                                                  const PagedKvLayout& layout, Precision precision,
                                                                  InferencePhase phase, int64_t size) {
  return BuildLlamaInferenceModule(config, layout, precision,
                                   phase == InferencePhase::kDecode ? InferenceShape{phase, size, 1}
                                                                    : InferenceShape{phase, 1, size});
}

absl::StatusOr<std::unique_ptr<Module>> BuildLlamaInferenceModule(const ModelConfig& config,
                                                                  const PagedKvLayout& layout, Precision precision,
                                                                  const InferenceShape& shape) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(CheckLayout(layout, shape.batch, shape.tokens));
  if (shape.phase == InferencePhase::kDecode && shape.tokens != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("@decode takes one token a sequence, not ", shape.tokens, " (prefill takes several)"));
  }
  const int64_t batch = shape.batch, seq = shape.tokens;
  const DType gemm_dtype = GemmDType(precision);
  const AttentionShape attention_shape{config.n_heads, config.n_kv_heads, config.head_dim, config.rope_theta};

  auto module = std::make_unique<Module>(IsValidName(config.name) ? config.name : "llama");
  Graph g(module->AddFunction(InferenceFunctionName(shape.phase)));
  const TensorType per_token{DType::kI32, {batch, seq}};
  Tensor tokens = g.Parameter("tokens", per_token);
  PagedKv kv;
  kv.fresh_prompts = shape.phase == InferencePhase::kFreshPrefill;
  kv.positions = g.Parameter("positions", per_token);
  kv.slots = g.Parameter("slots", per_token);
  kv.block_tables = g.Parameter("block_tables", TensorType{DType::kI32, {batch, layout.max_blocks_per_sequence}});
  Tensor sampling = g.Parameter("sampling", TensorType{DType::kF32, {batch, 1, 3}});
  Tensor draws = g.Parameter("draws", TensorType{DType::kI32, {batch, 1, 3}});
  const TensorType pool = KvPoolType(config, layout, precision);
  kv.k_pool = g.Parameter("k_pool", pool);
  kv.v_pool = g.Parameter("v_pool", pool);
  std::vector<Tensor> weights;
  for (const InferenceWeight& w : LlamaInferenceWeights(config)) {
    weights.push_back(g.Parameter(w.spec.name, InferenceWeightType(w.spec, precision)));
  }
  // A prefill's logits are sampled at each sequence's last token only: the final norm and
  // the LM head compute that row alone (decode's one row is its last).
  const Tensor positions = kv.positions;
  const HeadRows last_tokens = [&](Tensor hidden) { return LastTokenRows(g, hidden, positions); };
  Tensor logits = LlamaLogits(
      g, config, weights, tokens, gemm_dtype,
      [&](int64_t layer, Tensor x, const AttentionWeights& w) {
        return PagedSelfAttention(x, w, attention_shape, gemm_dtype, layer, kv);
      },
      ProjectionLayout::kJoined, seq > 1 ? last_tokens : HeadRows());
  Tensor next_tokens = InScope(g, "sampling", [&] { return SampleTokens(logits, sampling, draws); });
  RETURN_IF_ERROR(g.Finish({logits, kv.k_pool, kv.v_pool, next_tokens},
                           {-1, kInferenceKPoolParameter, kInferenceVPoolParameter, -1}));
  RETURN_IF_ERROR(VerifyModule(*module));
  return module;
}

absl::StatusOr<PipelineReport> CompileInferenceModule(Module& module, const CompileOptions& options) {
  CompileOptions all = options;
  // The weights are parameters in the GEMM dtype here, with no convert kernel for fuse-loops
  // to join merge-sibling-gemms' concatenate into: it would copy the q/k and gate/up weights
  // every call (0.62 of llama-M's 2.9 ms decode step on the H200) to save two launches.
  all.disabled_passes.push_back("merge-sibling-gemms");
  const Pipeline forward_pipeline = BuildForwardPipeline(all), rest_pipeline = BuildDefaultPipeline(all);
  // One compile of two pipelines, as the training compile is: a disabled pass need be in one
  // of them, and the dumps are numbered through both.
  RETURN_IF_ERROR(CheckDisabledPasses(all, {&forward_pipeline, &rest_pipeline}));
  ASSIGN_OR_RETURN(std::unique_ptr<PassRunner> runner, PassRunner::Create(all));
  RETURN_IF_ERROR(runner->DumpInput(module));
  ASSIGN_OR_RETURN(PipelineReport forward, forward_pipeline.Run(module, *runner));
  ASSIGN_OR_RETURN(PipelineReport rest, rest_pipeline.Run(module, *runner));
  forward.passes.insert(forward.passes.end(), rest.passes.begin(), rest.passes.end());
  forward.notes.insert(forward.notes.end(), rest.notes.begin(), rest.notes.end());
  forward.total_ms += rest.total_ms;
  forward.pipeline = absl::StrCat(forward.pipeline, ", ", rest.pipeline);
  return forward;
}

}  // namespace kiln
