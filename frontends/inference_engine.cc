#include "frontends/inference_engine.h"

#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"
#include "ir/reference_backend.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// The reference backend: the pools and weights are host tensors passed as parameters
// kInferenceKPoolParameter and up, and the pools are taken back from the outputs donated to
// them.
class ReferenceInferenceEngine : public InferenceEngine {
 public:
  ReferenceInferenceEngine(const ModelConfig& config, const PagedKvLayout& layout, std::vector<HostTensor> args)
      : config_(config), layout_(layout), args_(std::move(args)) {}

  absl::string_view backend() const override { return "cpu"; }
  absl::Status Load(const Function&) override { return absl::OkStatus(); }

  absl::Status Start(const Function& f, Inputs inputs, absl::Span<const int64_t> rows, bool with_logits,
                     int64_t feed_rows) override {
    if (finished_.size() >= kMaxCallsInFlight) {
      return absl::FailedPreconditionError(
          absl::StrCat("@", f.name(), ": ", kMaxCallsInFlight, " calls are in flight already (Finish one first)"));
    }
    if (feed_rows > 0) {
      std::vector<double>& tokens = inputs.tokens.mutable_values();
      if (feed_rows > static_cast<int64_t>(last_tokens_.size()) || feed_rows > static_cast<int64_t>(tokens.size())) {
        return absl::InvalidArgumentError(absl::StrCat("@", f.name(), ": feeding ", feed_rows,
                                                       " tokens of a call that had ", last_tokens_.size(),
                                                       " into ", tokens.size(), " token rows"));
      }
      for (int64_t i = 0; i < feed_rows; ++i) {
        const double t = last_tokens_[i];
        tokens[i] = t >= 0 && t < static_cast<double>(config_.vocab_size) ? t : 0.0;
      }
    }
    args_[0] = std::move(inputs.tokens);
    args_[1] = std::move(inputs.positions);
    args_[2] = std::move(inputs.slots);
    args_[3] = std::move(inputs.block_tables);
    args_[kInferenceSamplingParameter] = std::move(inputs.sampling);
    args_[kInferenceDrawsParameter] = std::move(inputs.draws);
    ASSIGN_OR_RETURN(std::vector<HostTensor> outputs, EvaluateFunction(f, args_));
    args_[kInferenceKPoolParameter] = std::move(outputs[1]);
    args_[kInferenceVPoolParameter] = std::move(outputs[2]);
    const int64_t vocab = config_.vocab_size;
    const std::vector<double>& logits = outputs[0].values();
    last_tokens_ = outputs[kInferenceTokenOutput].values();
    Rows picked;
    for (int64_t row : rows) {
      if (row < 0 || row >= static_cast<int64_t>(last_tokens_.size())) {
        return absl::InvalidArgumentError(absl::StrCat("logits row ", row, " of @", f.name(), "'s ",
                                                       outputs[0].type().ToString()));
      }
      picked.tokens.push_back(static_cast<int32_t>(last_tokens_[row]));
      if (with_logits) picked.logits.insert(picked.logits.end(), logits.begin() + row * vocab, logits.begin() + (row + 1) * vocab);
    }
    finished_.push_back(std::move(picked));
    return absl::OkStatus();
  }

  absl::StatusOr<Rows> Finish() override {
    if (finished_.empty()) return absl::FailedPreconditionError("no inference call is in flight");
    Rows rows = std::move(finished_.front());
    finished_.pop_front();
    return rows;
  }

  int64_t calls_in_flight() const override { return static_cast<int64_t>(finished_.size()); }

  absl::StatusOr<Rows> Run(const Function& f, Inputs inputs, absl::Span<const int64_t> rows, bool with_logits,
                           std::vector<StepTiming>* profile) override {
    if (profile != nullptr) profile->clear();
    if (!finished_.empty()) return absl::FailedPreconditionError("Run with an inference call in flight");
    RETURN_IF_ERROR(Start(f, std::move(inputs), rows, with_logits, /*feed_rows=*/0));
    return Finish();
  }

  absl::Status CopyBlocks(absl::Span<const inference::BlockCopy> copies) override {
    const int64_t bs = layout_.block_size, d = config_.head_dim, kv = config_.n_kv_heads, nb = layout_.num_blocks;
    for (int p : {kInferenceKPoolParameter, kInferenceVPoolParameter}) {
      std::vector<double>& pool = args_[p].mutable_values();
      for (const inference::BlockCopy& c : copies) {
        for (int64_t layer = 0; layer < config_.n_layers; ++layer) {
          for (int64_t h = 0; h < kv; ++h) {
            const int64_t src = ((layer * nb + c.src) * kv + h) * bs * d;
            const int64_t dst = ((layer * nb + c.dst) * kv + h) * bs * d;
            std::copy(pool.begin() + src, pool.begin() + src + c.num_tokens * d, pool.begin() + dst);
          }
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  ModelConfig config_;
  PagedKvLayout layout_;
  // tokens, positions, slots, block_tables, sampling, draws, k_pool, v_pool, weights...: the
  // weights stay.
  std::vector<HostTensor> args_;
  std::vector<double> last_tokens_;  // every row's next token of the last call started
  std::deque<Rows> finished_;        // computed at Start, handed back by Finish
};

}  // namespace

absl::StatusOr<std::unique_ptr<InferenceEngine>> CreateReferenceInferenceEngine(const ModelConfig& config,
                                                                                const PagedKvLayout& layout,
                                                                                Precision precision,
                                                                                std::vector<HostTensor> weights) {
  std::vector<HostTensor> args(kInferenceFirstWeightParameter);
  const TensorType pool = KvPoolType(config, layout, precision);
  args[kInferenceKPoolParameter] = HostTensor(pool);
  args[kInferenceVPoolParameter] = HostTensor(pool);
  for (HostTensor& w : weights) args.push_back(std::move(w));
  return std::make_unique<ReferenceInferenceEngine>(config, layout, std::move(args));
}

}  // namespace kiln
