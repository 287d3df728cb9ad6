#include "frontends/training_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"
#include "ir/verifier.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<TrainingSession>> TrainingSession::Create(std::unique_ptr<Module> module,
                                                                         std::vector<HostTensor> initial_params,
                                                                         TrainingSessionOptions options) {
  if (module == nullptr) return absl::InvalidArgumentError("training session: no module");
  const Function* forward = module->FindFunction("forward");
  if (forward == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("training session: module @", module->name(), " has no @forward"));
  }
  RETURN_IF_ERROR(VerifyModule(*module));
  TrainingStepLayout layout;
  ASSIGN_OR_RETURN(Function * step, BuildTrainingStep(*module, *forward, options.step, &layout));
  RETURN_IF_ERROR(VerifyFunction(*step));
  if (static_cast<int64_t>(initial_params.size()) != layout.num_params) {
    return absl::InvalidArgumentError(absl::StrCat("training session: ", initial_params.size(),
                                                   " initial weights for a @forward with ", layout.num_params,
                                                   " trainable parameters (after ", layout.num_batch_inputs,
                                                   " data inputs)"));
  }
  TrainingState state = InitialTrainingState(std::move(initial_params));
  RETURN_IF_ERROR(CheckTrainingState(*step, layout, state));
  auto session = std::unique_ptr<TrainingSession>(new TrainingSession());
  session->module_ = std::move(module);
  session->forward_ = forward;
  session->step_ = step;
  session->layout_ = layout;
  session->options_ = std::move(options);
  session->state_ = std::move(state);
  return session;
}

absl::StatusOr<double> TrainingSession::Step(const std::vector<std::vector<HostTensor>>& micro_batches, double lr) {
  const int64_t k = options_.step.accum_steps;
  if (static_cast<int64_t>(micro_batches.size()) != k) {
    return absl::InvalidArgumentError(
        absl::StrCat("training session: a step takes ", k, " micro-batches (accum_steps), got ", micro_batches.size()));
  }
  // The step takes each data input with a leading dim k: the micro-batches, stacked.
  std::vector<Node*> step_params = step_->parameters();
  std::vector<Node*> forward_params = forward_->parameters();
  std::vector<HostTensor> stacked;
  for (int64_t i = 0; i < layout_.num_batch_inputs; ++i) {
    HostTensor s(step_params[layout_.first_batch_input() + i]->type());
    const TensorType& want = forward_params[i]->type();
    for (int64_t j = 0; j < k; ++j) {
      const std::vector<HostTensor>& mb = micro_batches[j];
      if (static_cast<int64_t>(mb.size()) != layout_.num_batch_inputs) {
        return absl::InvalidArgumentError(absl::StrCat("training session: micro-batch ", j, " has ", mb.size(),
                                                       " tensors; @forward takes ", layout_.num_batch_inputs,
                                                       " data inputs"));
      }
      if (mb[i].type() != want) {
        return absl::InvalidArgumentError(absl::StrCat("training session: data input %", forward_params[i]->name(),
                                                       " must be ", want.ToString(), ", got ", mb[i].type().ToString()));
      }
      std::copy(mb[i].values().begin(), mb[i].values().end(), s.mutable_values().begin() + j * mb[i].num_elements());
    }
    stacked.push_back(std::move(s));
  }

  return RunReferenceStep(*step_, layout_, options_.reference, std::move(stacked), lr, state_);
}

absl::StatusOr<std::vector<HostTensor>> TrainingSession::Forward(const std::vector<HostTensor>& batch) const {
  if (static_cast<int64_t>(batch.size()) != layout_.num_batch_inputs) {
    return absl::InvalidArgumentError(absl::StrCat("training session: @forward takes ", layout_.num_batch_inputs,
                                                   " data inputs, got ", batch.size()));
  }
  std::vector<HostTensor> args = batch;
  args.insert(args.end(), state_.params.begin(), state_.params.end());
  return EvaluateFunction(*forward_, args, options_.reference);
}

}  // namespace kiln
