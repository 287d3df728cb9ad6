// sample_tokens (ir/op_table.h): each row's token by SampleToken (ir/token_sampling.h), the
// one definition the host's sampler and the GPU kernel share.
#include <vector>

#include "ir/reference/kernels.h"
#include "ir/token_sampling.h"

namespace kiln::reference {

absl::StatusOr<HostTensor> EvalSampleTokens(const Node& node, Operands xs, const EvalContext& ctx) {
  (void)ctx;
  const int64_t vocab = xs[0]->type().dims.back();
  HostTensor out(node.type());
  const int64_t rows = node.type().num_elements();
  const double* logits = xs[0]->values().data();
  std::vector<float> row_logits(vocab);
  TokenSamplingScratch scratch;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t v = 0; v < vocab; ++v) row_logits[v] = static_cast<float>(logits[r * vocab + v]);
    float sampling[3];
    int32_t draws[3];
    for (int i = 0; i < 3; ++i) {
      sampling[i] = static_cast<float>(xs[1]->values()[3 * r + i]);
      draws[i] = static_cast<int32_t>(xs[2]->values()[3 * r + i]);
    }
    out.mutable_values()[r] = SampleToken(row_logits, FromOperands(sampling, draws), scratch);
  }
  return out;
}

}  // namespace kiln::reference
