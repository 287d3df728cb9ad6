#include "tests/testing/forward_logits.h"

#include <gtest/gtest.h>

#include "frontends/llama.h"
#include "ir/reference_backend.h"

namespace kiln::testing {

std::vector<std::vector<double>> ForwardLogits(const ModelConfig& config, const std::vector<HostTensor>& weights,
                                               const std::vector<inference::TokenId>& tokens, Precision precision) {
  const int64_t t = static_cast<int64_t>(tokens.size());
  auto module = BuildLlamaModule(config, {.batch = 1, .seq_len = t, .precision = precision, .return_logits = true});
  EXPECT_TRUE(module.ok()) << module.status();
  if (!module.ok()) return {};
  std::vector<HostTensor> args;
  args.push_back(HostTensor::FromValues({DType::kI32, {1, t}}, std::vector<double>(tokens.begin(), tokens.end())));
  args.push_back(HostTensor({DType::kI32, {1, t}}));  // targets: the loss is not looked at
  args.insert(args.end(), weights.begin(), weights.end());
  auto out = EvaluateFunction(*(*module)->FindFunction("forward"), args);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  const int64_t v = config.vocab_size;
  std::vector<std::vector<double>> rows(t);
  for (int64_t i = 0; i < t; ++i) {
    rows[i].assign((*out)[1].values().begin() + i * v, (*out)[1].values().begin() + (i + 1) * v);
  }
  return rows;
}

}  // namespace kiln::testing
