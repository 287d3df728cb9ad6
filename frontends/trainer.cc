#include "frontends/trainer.h"

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

absl::Status CheckTensors(const std::vector<Node*>& params, int64_t first, const std::vector<HostTensor>& tensors,
                          absl::string_view what) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorType& want = params[first + i]->type();
    if (tensors[i].type() != want) {
      return absl::InvalidArgumentError(absl::StrCat(what, " %", params[first + i]->name(), " must be ",
                                                     want.ToString(), ", got ", tensors[i].type().ToString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(std::unique_ptr<Module> module,
                                                                          const Function* step_function,
                                                                          TrainingStepLayout layout,
                                                                          std::vector<HostTensor> initial_params,
                                                                          ReferenceOptions options) {
  if (static_cast<int64_t>(initial_params.size()) != layout.num_params) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: ", initial_params.size(), " initial parameters for a step over ",
                                                   layout.num_params));
  }
  auto trainer = std::unique_ptr<ReferenceTrainer>(new ReferenceTrainer());
  trainer->module_ = std::move(module);
  trainer->step_ = step_function;
  trainer->layout_ = layout;
  trainer->options_ = options;
  RETURN_IF_ERROR(trainer->SetState(InitialTrainingState(std::move(initial_params))));
  return trainer;
}

TrainingState InitialTrainingState(std::vector<HostTensor> params) {
  TrainingState state;
  for (const HostTensor& p : params) {
    state.m.emplace_back(p.type());
    state.v.emplace_back(p.type());
  }
  state.params = std::move(params);
  state.t = HostTensor(TensorType{DType::kF32, {}});
  return state;
}

absl::Status CheckTrainingState(const Function& step_function, const TrainingStepLayout& layout,
                                const TrainingState& state) {
  std::vector<Node*> params = step_function.parameters();
  const int64_t n = layout.num_params;
  if (static_cast<int64_t>(state.params.size()) != n || static_cast<int64_t>(state.m.size()) != n ||
      static_cast<int64_t>(state.v.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("trainer state holds ", state.params.size(), " parameters, ",
                                                   state.m.size(), " first and ", state.v.size(),
                                                   " second moments; the model has ", n));
  }
  RETURN_IF_ERROR(CheckTensors(params, layout.first_param(), state.params, "parameter"));
  RETURN_IF_ERROR(CheckTensors(params, layout.first_m(), state.m, "AdamW first moment"));
  RETURN_IF_ERROR(CheckTensors(params, layout.first_v(), state.v, "AdamW second moment"));
  if (!state.fp8.empty()) {
    if (static_cast<int64_t>(state.fp8.size()) != layout.num_fp8_states()) {
      return absl::InvalidArgumentError(absl::StrCat("trainer state holds ", state.fp8.size(),
                                                     " FP8 scaling states; the step has ", layout.num_fp8_states()));
    }
    RETURN_IF_ERROR(CheckTensors(params, layout.first_fp8_state(), state.fp8, "FP8 scaling state"));
  }
  return CheckTensors(params, layout.t_index(), {state.t}, "AdamW step count");
}

absl::Status ReferenceTrainer::SetState(TrainingState state) {
  RETURN_IF_ERROR(CheckTrainingState(*step_, layout_, state));
  if (state.fp8.empty()) {  // the initial scaling states: all zero (scale 1, no history)
    const std::vector<Node*> params = step_->parameters();
    for (int64_t i = 0; i < layout_.num_fp8_states(); ++i) {
      state.fp8.emplace_back(params[layout_.first_fp8_state() + i]->type());
    }
  }
  state_ = std::move(state);
  return absl::OkStatus();
}

absl::StatusOr<std::pair<HostTensor, HostTensor>> BatchTensors(const Function& step_function,
                                                               const TrainingStepLayout& layout,
                                                               const std::vector<TokenBatch>& micro_batches) {
  std::vector<Node*> params = step_function.parameters();
  const TensorType& tokens_type = params[layout.first_batch_input()]->type();  // i32[k, B, T]
  if (layout.num_batch_inputs != 2 || static_cast<int64_t>(micro_batches.size()) != tokens_type.dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: the step takes ", tokens_type.dims[0],
                                                   " micro-batches of (tokens, targets), got ", micro_batches.size()));
  }
  HostTensor tokens(tokens_type), targets(tokens_type);
  int64_t offset = 0;
  for (const TokenBatch& mb : micro_batches) {
    if (mb.batch != tokens_type.dims[1] || mb.seq_len != tokens_type.dims[2]) {
      return absl::InvalidArgumentError(absl::StrCat("trainer: micro-batch is ", mb.batch, "x", mb.seq_len,
                                                     ", the step expects ", tokens_type.dims[1], "x", tokens_type.dims[2]));
    }
    for (size_t i = 0; i < mb.inputs.size(); ++i) {
      tokens.mutable_values()[offset + i] = mb.inputs[i];
      targets.mutable_values()[offset + i] = mb.targets[i];
    }
    offset += static_cast<int64_t>(mb.inputs.size());
  }
  return std::make_pair(std::move(tokens), std::move(targets));
}

absl::StatusOr<double> RunReferenceStep(const Function& step, const TrainingStepLayout& layout,
                                        const ReferenceOptions& options, std::vector<HostTensor> batch, double lr,
                                        TrainingState& state) {
  std::vector<HostTensor> args;
  args.reserve(step.parameters().size());
  for (auto* group : {&state.params, &state.m, &state.v}) {
    for (HostTensor& t : *group) args.push_back(std::move(t));
  }
  args.push_back(std::move(state.t));
  for (HostTensor& b : batch) args.push_back(std::move(b));
  args.push_back(HostTensor::FromValues({DType::kF32, {}}, {lr}));
  for (HostTensor& t : state.fp8) args.push_back(std::move(t));
  absl::StatusOr<std::vector<HostTensor>> outs = EvaluateFunction(step, args, options);
  if (!outs.ok()) {
    int64_t i = 0;
    for (auto* group : {&state.params, &state.m, &state.v}) {
      for (HostTensor& t : *group) t = std::move(args[i++]);
    }
    state.t = std::move(args[i]);
    for (size_t j = 0; j < state.fp8.size(); ++j) state.fp8[j] = std::move(args[layout.first_fp8_state() + j]);
    return outs.status();
  }
  const int64_t n = layout.num_params;
  for (int64_t i = 0; i < n; ++i) {
    state.params[i] = std::move((*outs)[1 + i]);
    state.m[i] = std::move((*outs)[1 + n + i]);
    state.v[i] = std::move((*outs)[1 + 2 * n + i]);
  }
  state.t = std::move((*outs)[1 + 3 * n]);
  for (size_t j = 0; j < state.fp8.size(); ++j) state.fp8[j] = std::move((*outs)[2 + 3 * n + j]);
  ++state.step;
  return (*outs)[0][0];
}

absl::StatusOr<double> ReferenceTrainer::Step(const std::vector<TokenBatch>& micro_batches, double lr) {
  ASSIGN_OR_RETURN(auto batch, BatchTensors(*step_, layout_, micro_batches));
  auto& [tokens, targets] = batch;
  std::vector<HostTensor> data;
  data.push_back(std::move(tokens));
  data.push_back(std::move(targets));
  return StepTensors(std::move(data), lr);
}

absl::StatusOr<double> ReferenceTrainer::StepTensors(std::vector<HostTensor> batch, double lr) {
  // EvaluateFunction checks each tensor's type against its parameter.
  return RunReferenceStep(*step_, layout_, options_, std::move(batch), lr, state_);
}

}  // namespace kiln
