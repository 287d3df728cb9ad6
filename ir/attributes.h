// Node attributes: a sorted name -> value map, printed and serialized generically so that
// the text form, the protobuf and the verifier need no per-op code for them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include "absl/strings/string_view.h"
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/types.h"

namespace kiln {

// A bare identifier such as `lt` or `bf16`; printed without quotes.
struct Symbol {
  std::string name;
  bool operator==(const Symbol& o) const { return name == o.name; }
};

// Kinds: int64, double, quoted string, symbol, int64 list, double list.
// An empty list is always an int64 list (the text `[]` cannot say more).
using AttrValue =
    std::variant<int64_t, double, std::string, Symbol, std::vector<int64_t>, std::vector<double>>;

std::string AttrValueToString(const AttrValue& v);
// Doubles print in the shortest form that reads back to the same bits, always with a '.',
// 'e', "inf" or "nan" so they never read back as integers.
std::string FormatDouble(double v);

class AttrMap {
 public:
  AttrMap() = default;
  AttrMap(std::initializer_list<std::pair<const std::string, AttrValue>> init) : map_(init) {}

  void Set(std::string name, AttrValue v) { map_[std::move(name)] = std::move(v); }
  bool Has(absl::string_view name) const { return map_.find(std::string(name)) != map_.end(); }
  const std::map<std::string, AttrValue>& entries() const { return map_; }
  bool empty() const { return map_.empty(); }
  size_t size() const { return map_.size(); }
  bool operator==(const AttrMap& o) const { return map_ == o.map_; }

  // Typed getters: an error names the attribute and what was expected.
  absl::StatusOr<int64_t> GetInt(absl::string_view name) const;
  absl::StatusOr<double> GetFloat(absl::string_view name) const;  // accepts an int too
  absl::StatusOr<std::string> GetString(absl::string_view name) const;
  absl::StatusOr<std::string> GetSymbol(absl::string_view name) const;
  absl::StatusOr<std::vector<int64_t>> GetInts(absl::string_view name) const;
  absl::StatusOr<std::vector<double>> GetFloats(absl::string_view name) const;  // ints too
  absl::StatusOr<DType> GetDType(absl::string_view name) const;  // a symbol naming a dtype

  // "{a=1, b=[0,1]}" or "" when empty.
  std::string ToString() const;

 private:
  const AttrValue* Find(absl::string_view name) const;
  std::map<std::string, AttrValue> map_;
};

}  // namespace kiln
