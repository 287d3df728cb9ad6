// Training and evaluation data: a flat sequence of token ids, and batches drawn from it
// as a deterministic function of (seed, step), so a resumed run sees the same data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln {

class TokenDataset {
 public:
  // The corpus kiln ships (runtime/data/default_corpus.txt), as byte tokens.
  static TokenDataset Default();
  // `path` ending in ".bin": little-endian uint16 tokens (nanoGPT / llm.c); an llm.c header
  // (256 int32: magic 20240520, version 1, token count) is checked against the file's size
  // and skipped. Any other file: raw bytes, one token per byte (vocab 256). The file is
  // mapped, not read: a dataset of many gigabytes costs address space, not memory.
  static absl::StatusOr<TokenDataset> FromFile(const std::string& path);
  static TokenDataset FromTokens(std::string name, std::vector<uint16_t> tokens);

  const std::string& name() const { return name_; }
  int64_t size() const { return size_; }
  uint16_t token(int64_t i) const {
    return width_ == 1 ? data_[i] : static_cast<uint16_t>(data_[2 * i] | (data_[2 * i + 1] << 8));
  }
  // A copy of every token (for tests and small datasets).
  std::vector<uint16_t> ToVector() const;
  int max_token() const { return max_token_; }
  // Tokens [begin, end) as a dataset of their own, sharing this one's storage.
  TokenDataset Slice(std::string name, int64_t begin, int64_t end) const;

  // Fails if a token is >= vocab_size or the data holds fewer than seq_len + 1 tokens.
  absl::Status CheckFits(int64_t vocab_size, int64_t seq_len) const;

 private:
  void ScanMaxToken();
  std::string name_;
  std::shared_ptr<const void> storage_;  // keeps the tokens' bytes alive: a vector or a mapping
  const unsigned char* data_ = nullptr;  // little-endian tokens of width_ bytes
  int width_ = 1;
  int64_t size_ = 0;
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

// Data-parallel training's share of SampleBatch: with `world_size` ranks, rank r gets rows
// [r B/W, (r+1) B/W) of the very batch SampleBatch(data, seed, step, B, seq_len) draws, so W
// GPUs together train on the global batch one GPU would (the rows are drawn independently,
// so a rank draws only its own). Fails unless 0 <= rank < world_size and W divides B.
absl::StatusOr<TokenBatch> SampleRankBatch(const TokenDataset& data, uint64_t seed, int64_t step, int64_t batch,
                                           int64_t seq_len, int64_t rank, int64_t world_size);

// Evaluation windows: window w covers tokens [w*T, w*T + T] (stride T, T + 1 tokens);
// all full windows, grouped into batches of up to `batch` rows (the last may be smaller).
int64_t NumEvalWindows(const TokenDataset& data, int64_t seq_len);
TokenBatch EvalBatch(const TokenDataset& data, int64_t first_window, int64_t rows, int64_t seq_len);

}  // namespace kiln
