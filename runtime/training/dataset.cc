#include "runtime/training/dataset.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ir/embedded_file.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"
#include "runtime/mapped_file.h"

extern const kiln::EmbeddedFile kEmbeddedCorpus[];
extern const size_t kEmbeddedCorpus_count;

namespace kiln {
namespace {

static_assert(std::endian::native == std::endian::little, "FromTokens keeps uint16 tokens as little-endian bytes");

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;  // uint16 tokens
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

TokenDataset TokenDataset::FromTokens(std::string name, std::vector<uint16_t> tokens) {
  auto owned = std::make_shared<std::vector<uint16_t>>(std::move(tokens));
  TokenDataset d;
  d.name_ = std::move(name);
  d.data_ = reinterpret_cast<const unsigned char*>(owned->data());  // little-endian host
  d.width_ = 2;
  d.size_ = static_cast<int64_t>(owned->size());
  d.storage_ = std::move(owned);
  d.ScanMaxToken();
  return d;
}

TokenDataset TokenDataset::Default() {
  absl::string_view text = kEmbeddedCorpus[0].contents();  // static: needs no storage
  TokenDataset d;
  d.name_ = "built-in corpus (runtime/data/default_corpus.txt)";
  d.data_ = reinterpret_cast<const unsigned char*>(text.data());
  d.width_ = 1;
  d.size_ = static_cast<int64_t>(text.size());
  d.ScanMaxToken();
  return d;
}

void TokenDataset::ScanMaxToken() {
  max_token_ = 0;
  for (int64_t i = 0; i < size_; ++i) max_token_ = std::max<int>(max_token_, token(i));
}

std::vector<uint16_t> TokenDataset::ToVector() const {
  std::vector<uint16_t> out(static_cast<size_t>(size_));
  for (int64_t i = 0; i < size_; ++i) out[i] = token(i);
  return out;
}

TokenDataset TokenDataset::Slice(std::string name, int64_t begin, int64_t end) const {
  TokenDataset d = *this;
  d.name_ = std::move(name);
  d.data_ = data_ + begin * width_;
  d.size_ = end - begin;
  d.ScanMaxToken();
  return d;
}

namespace {

int32_t LoadInt32(const unsigned char* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

absl::StatusOr<TokenDataset> TokenDataset::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mapping, MappedFile::Open(path));
  const auto* bytes = reinterpret_cast<const unsigned char*>(mapping->bytes().data());
  const size_t length = mapping->bytes().size();
  TokenDataset d;
  d.name_ = path;
  d.data_ = bytes;
  if (!absl::EndsWith(path, ".bin")) {
    d.width_ = 1;
    d.size_ = static_cast<int64_t>(length);
  } else {
    size_t offset = 0;
    if (length >= kLlmcHeaderBytes && LoadInt32(bytes) == kLlmcMagic) {
      const int32_t version = LoadInt32(bytes + 4);
      if (version != kLlmcVersion) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": llm.c header version ", version,
                                                       " is not supported (kiln reads version ", kLlmcVersion,
                                                       ": uint16 tokens)"));
      }
      const int64_t declared = LoadInt32(bytes + 8);
      const int64_t held = static_cast<int64_t>((length - kLlmcHeaderBytes) / 2);
      if (declared < 0 || declared != held || (length - kLlmcHeaderBytes) % 2 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": its llm.c header says ", declared, " tokens, but the ",
                                                       length - kLlmcHeaderBytes, " bytes after the header hold ",
                                                       (length - kLlmcHeaderBytes) / 2.0,
                                                       " (truncated, or not an llm.c file)"));
      }
      offset = kLlmcHeaderBytes;
    }
    if ((length - offset) % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": a .bin token file holds little-endian uint16 tokens, "
                                                     "but its ", length - offset, " data bytes are an odd count"));
    }
    d.data_ = bytes + offset;
    d.width_ = 2;
    d.size_ = static_cast<int64_t>((length - offset) / 2);
  }
  d.storage_ = std::move(mapping);
  d.ScanMaxToken();
  return d;
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

namespace {

// Rows [first_row, first_row + rows) of SampleBatch's batch `step`: row b starts at an
// offset drawn from a hash of (seed, step, b), independent of the batch size.
TokenBatch SampleRows(const TokenDataset& data, uint64_t seed, int64_t step, int64_t first_row, int64_t rows,
                      int64_t seq_len) {
  TokenBatch out{rows, seq_len, std::vector<int32_t>(rows * seq_len), std::vector<int32_t>(rows * seq_len)};
  const uint64_t num_starts = static_cast<uint64_t>(data.size() - seq_len);  // valid starts: [0, n - T - 1]
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t b = static_cast<uint64_t>(first_row + r);
    uint64_t h = SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(step)) ^ b);
    int64_t start = static_cast<int64_t>(h % num_starts);
    for (int64_t t = 0; t < seq_len; ++t) {
      out.inputs[r * seq_len + t] = data.token(start + t);
      out.targets[r * seq_len + t] = data.token(start + t + 1);
    }
  }
  return out;
}

}  // namespace

TokenBatch SampleBatch(const TokenDataset& data, uint64_t seed, int64_t step, int64_t batch, int64_t seq_len) {
  return SampleRows(data, seed, step, 0, batch, seq_len);
}

absl::StatusOr<TokenBatch> SampleRankBatch(const TokenDataset& data, uint64_t seed, int64_t step, int64_t batch,
                                           int64_t seq_len, int64_t rank, int64_t world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank batch: rank ", rank, " is not one of world size ", world_size, "'s ranks [0, ", world_size, ")"));
  }
  if (batch % world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("rank batch: the global batch of ", batch,
                                                   " sequences does not split evenly over ", world_size,
                                                   " ranks: pick a batch divisible by ", world_size));
  }
  const int64_t rows = batch / world_size;
  return SampleRows(data, seed, step, rank * rows, rows, seq_len);
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
      out.inputs[r * seq_len + t] = data.token(start + t);
      out.targets[r * seq_len + t] = data.token(start + t + 1);
    }
  }
  return out;
}

}  // namespace kiln
