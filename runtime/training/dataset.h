// Training and evaluation data: a flat sequence of token ids, and batches drawn from it
// as a deterministic function of (seed, step), so a resumed run sees the same data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln {

class TokenDataset {
 public:
  // The corpus kiln ships (runtime/data/default_corpus.txt), as byte tokens.
  static TokenDataset Default();
  // `path` ending in ".bin": little-endian uint16 tokens (nanoGPT / llm.c); an llm.c header
  // (256 int32, magic 20240520) is recognised and skipped. Any other file: raw bytes, one
  // token per byte (vocab 256).
  static absl::StatusOr<TokenDataset> FromFile(const std::string& path);
  static TokenDataset FromTokens(std::string name, std::vector<uint16_t> tokens);

  const std::string& name() const { return name_; }
  const std::vector<uint16_t>& tokens() const { return tokens_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  int max_token() const { return max_token_; }

  // Fails if a token is >= vocab_size or the data holds fewer than seq_len + 1 tokens.
  absl::Status CheckFits(int64_t vocab_size, int64_t seq_len) const;

 private:
  std::string name_;
  std::vector<uint16_t> tokens_;
  int max_token_ = 0;
};

// inputs[b, t] = data[start_b + t], targets[b, t] = data[start_b + t + 1], row-major.
struct TokenBatch {
  int64_t batch = 0, seq_len = 0;
  std::vector<int32_t> inputs, targets;
};

// Training batch number `step`: each row starts at an offset drawn from a hash of
// (seed, step, row), uniform over the valid starts. Same arguments, same batch.
TokenBatch SampleBatch(const TokenDataset& data, uint64_t seed, int64_t step, int64_t batch, int64_t seq_len);

// Evaluation windows: window w covers tokens [w*T, w*T + T] (stride T, T + 1 tokens);
// all full windows, grouped into batches of up to `batch` rows (the last may be smaller).
int64_t NumEvalWindows(const TokenDataset& data, int64_t seq_len);
TokenBatch EvalBatch(const TokenDataset& data, int64_t first_window, int64_t rows, int64_t seq_len);

}  // namespace kiln
