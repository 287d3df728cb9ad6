#include "runtime/inference/prefix_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ir/mix_bits.h"

namespace kiln::inference {
namespace {

// An arbitrary nonzero start, so that the root is not the key of an all-zero block.
constexpr uint64_t kRootKey = 0x6b696c6e2d6b7631ULL;  // "kiln-kv1"

}  // namespace

uint64_t DefaultBlockHash(uint64_t parent_key, absl::Span<const TokenId> tokens) {
  uint64_t h = MixBits(parent_key + 0x9e3779b97f4a7c15ULL);
  for (TokenId t : tokens) h = MixBits(h ^ static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ULL;
  return MixBits(h ^ tokens.size());
}

PrefixCache::PrefixCache(int64_t num_blocks, int64_t block_size, BlockHashFn hash)
    : block_size_(block_size), hash_(hash ? std::move(hash) : BlockHashFn(DefaultBlockHash)),
      entries_(num_blocks) {}

ChainLink PrefixCache::Root() { return ChainLink{kRootKey, 0}; }

uint64_t PrefixCache::KeyOf(const ChainLink& parent, absl::Span<const TokenId> tokens) const {
  return hash_(parent.key, tokens);
}

std::optional<PrefixCache::Hit> PrefixCache::Find(const ChainLink& parent, absl::Span<const TokenId> tokens) const {
  const uint64_t key = KeyOf(parent, tokens);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  const Entry& e = *entries_[it->second];
  // The key only says where to look; the parent and the tokens say whether it is a hit.
  if (e.parent_serial != parent.serial || !std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end())) {
    return std::nullopt;
  }
  return Hit{it->second, ChainLink{e.key, e.serial}};
}

PrefixCache::InsertResult PrefixCache::Insert(BlockId block, const ChainLink& parent,
                                              absl::Span<const TokenId> tokens) {
  if (entries_[block].has_value()) {
    return {InsertOutcome::kAlreadyCached, ChainLink{entries_[block]->key, entries_[block]->serial}};
  }
  const uint64_t key = KeyOf(parent, tokens);
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    if (std::optional<Hit> hit = Find(parent, tokens)) return {InsertOutcome::kDuplicate, hit->link};
    return {InsertOutcome::kCollision, ChainLink{}};
  }
  Entry e{key, next_serial_++, parent.serial, std::vector<TokenId>(tokens.begin(), tokens.end())};
  const ChainLink link{e.key, e.serial};
  entries_[block] = std::move(e);
  by_key_.emplace(key, block);
  return {InsertOutcome::kInserted, link};
}

void PrefixCache::Evict(BlockId block) {
  if (!entries_[block].has_value()) return;
  by_key_.erase(entries_[block]->key);
  entries_[block].reset();
}

absl::Span<const TokenId> PrefixCache::TokensOf(BlockId block) const {
  if (!entries_[block].has_value()) return {};
  return entries_[block]->tokens;
}

absl::Status PrefixCache::CheckConsistent() const {
  int64_t cached = 0;
  for (BlockId b = 0; b < static_cast<BlockId>(entries_.size()); ++b) {
    if (!entries_[b].has_value()) continue;
    ++cached;
    auto it = by_key_.find(entries_[b]->key);
    if (it == by_key_.end() || it->second != b) {
      return absl::InternalError(absl::StrCat("prefix cache: block ", b, " is cached but not indexed under its key"));
    }
    if (static_cast<int64_t>(entries_[b]->tokens.size()) != block_size_) {
      return absl::InternalError(absl::StrCat("prefix cache: block ", b, " holds ", entries_[b]->tokens.size(),
                                              " tokens, not a full block of ", block_size_));
    }
  }
  if (cached != static_cast<int64_t>(by_key_.size())) {
    return absl::InternalError(
        absl::StrCat("prefix cache: ", by_key_.size(), " keys indexed but ", cached, " blocks cached"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::inference
