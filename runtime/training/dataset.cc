#include "runtime/training/dataset.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ir/embedded_file.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"

extern const kiln::EmbeddedFile kEmbeddedCorpus[];
extern const size_t kEmbeddedCorpus_count;

namespace kiln {
namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

TokenDataset TokenDataset::FromTokens(std::string name, std::vector<uint16_t> tokens) {
  TokenDataset d;
  d.name_ = std::move(name);
  d.tokens_ = std::move(tokens);
  for (uint16_t t : d.tokens_) d.max_token_ = std::max<int>(d.max_token_, t);
  return d;
}

TokenDataset TokenDataset::Default() {
  absl::string_view text = kEmbeddedCorpus[0].contents();
  return FromTokens("built-in corpus (runtime/data/default_corpus.txt)",
                    std::vector<uint16_t>(text.begin(), text.end()));
}

absl::StatusOr<TokenDataset> TokenDataset::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  if (!absl::EndsWith(path, ".bin")) {
    std::vector<uint16_t> tokens;
    tokens.reserve(bytes.size());
    for (char c : bytes) tokens.push_back(static_cast<unsigned char>(c));
    return FromTokens(path, std::move(tokens));
  }
  size_t offset = 0;
  if (bytes.size() >= kLlmcHeaderBytes) {
    int32_t magic;
    std::memcpy(&magic, bytes.data(), sizeof(magic));
    if (magic == kLlmcMagic) offset = kLlmcHeaderBytes;
  }
  if ((bytes.size() - offset) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a .bin token file holds little-endian uint16 tokens, but its ",
                                                   bytes.size() - offset, " data bytes are an odd count"));
  }
  std::vector<uint16_t> tokens((bytes.size() - offset) / 2);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data()) + offset + 2 * i;
    tokens[i] = static_cast<uint16_t>(p[0] | (p[1] << 8));
  }
  return FromTokens(path, std::move(tokens));
}

absl::Status TokenDataset::CheckFits(int64_t vocab_size, int64_t seq_len) const {
  if (size() < seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": holds ", size(), " tokens, fewer than one window of ",
                                                   seq_len + 1, " (seq + 1)"));
  }
  if (max_token_ >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": token id ", max_token_, " does not fit the model's vocab of ",
                                                   vocab_size));
  }
  return absl::OkStatus();
}

TokenBatch SampleBatch(const TokenDataset& data, uint64_t seed, int64_t step, int64_t batch, int64_t seq_len) {
  TokenBatch out{batch, seq_len, std::vector<int32_t>(batch * seq_len), std::vector<int32_t>(batch * seq_len)};
  const uint64_t num_starts = static_cast<uint64_t>(data.size() - seq_len);  // valid starts: [0, n - T - 1]
  for (int64_t b = 0; b < batch; ++b) {
    uint64_t h = SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(b));
    int64_t start = static_cast<int64_t>(h % num_starts);
    for (int64_t t = 0; t < seq_len; ++t) {
      out.inputs[b * seq_len + t] = data.tokens()[start + t];
      out.targets[b * seq_len + t] = data.tokens()[start + t + 1];
    }
  }
  return out;
}

int64_t NumEvalWindows(const TokenDataset& data, int64_t seq_len) {
  if (data.size() < seq_len + 1) return 0;
  return (data.size() - 1) / seq_len;
}

TokenBatch EvalBatch(const TokenDataset& data, int64_t first_window, int64_t rows, int64_t seq_len) {
  TokenBatch out{rows, seq_len, std::vector<int32_t>(rows * seq_len), std::vector<int32_t>(rows * seq_len)};
  for (int64_t r = 0; r < rows; ++r) {
    int64_t start = (first_window + r) * seq_len;
    for (int64_t t = 0; t < seq_len; ++t) {
      out.inputs[r * seq_len + t] = data.tokens()[start + t];
      out.targets[r * seq_len + t] = data.tokens()[start + t + 1];
    }
  }
  return out;
}

}  // namespace kiln
