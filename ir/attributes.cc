#include "ir/attributes.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln {

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

namespace {
std::string QuoteString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
          char hex[8];
          std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned char>(c));
          out += hex;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}
}  // namespace

std::string AttrValueToString(const AttrValue& v) {
  struct Visitor {
    std::string operator()(int64_t i) const { return absl::StrCat(i); }
    std::string operator()(double d) const { return FormatDouble(d); }
    std::string operator()(const std::string& s) const { return QuoteString(s); }
    std::string operator()(const Symbol& s) const { return s.name; }
    std::string operator()(const std::vector<int64_t>& l) const {
      return absl::StrCat("[", absl::StrJoin(l, ","), "]");
    }
    std::string operator()(const std::vector<double>& l) const {
      std::string out = "[";
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += ",";
        out += FormatDouble(l[i]);
      }
      return out + "]";
    }
  };
  return std::visit(Visitor{}, v);
}

const AttrValue* AttrMap::Find(absl::string_view name) const {
  auto it = map_.find(std::string(name));
  return it == map_.end() ? nullptr : &it->second;
}

namespace {
absl::Status Missing(absl::string_view name, absl::string_view kind) {
  return absl::InvalidArgumentError(
      absl::StrCat("missing attribute '", name, "' (", kind, ")"));
}
absl::Status WrongKind(absl::string_view name, absl::string_view kind, const AttrValue& v) {
  return absl::InvalidArgumentError(absl::StrCat("attribute '", name, "' must be ", kind,
                                                 ", got ", AttrValueToString(v)));
}
}  // namespace

absl::StatusOr<int64_t> AttrMap::GetInt(absl::string_view name) const {
  const AttrValue* v = Find(name);
  if (!v) return Missing(name, "an integer");
  if (auto* i = std::get_if<int64_t>(v)) return *i;
  return WrongKind(name, "an integer", *v);
}

absl::StatusOr<double> AttrMap::GetFloat(absl::string_view name) const {
  const AttrValue* v = Find(name);
  if (!v) return Missing(name, "a number");
  if (auto* d = std::get_if<double>(v)) return *d;
  if (auto* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  return WrongKind(name, "a number", *v);
}

absl::StatusOr<std::string> AttrMap::GetString(absl::string_view name) const {
  const AttrValue* v = Find(name);
  if (!v) return Missing(name, "a quoted string");
  if (auto* s = std::get_if<std::string>(v)) return *s;
  return WrongKind(name, "a quoted string", *v);
}

absl::StatusOr<std::string> AttrMap::GetSymbol(absl::string_view name) const {
  const AttrValue* v = Find(name);
  if (!v) return Missing(name, "an identifier");
  if (auto* s = std::get_if<Symbol>(v)) return s->name;
  return WrongKind(name, "an identifier", *v);
}

absl::StatusOr<std::vector<int64_t>> AttrMap::GetInts(absl::string_view name) const {
  const AttrValue* v = Find(name);
  if (!v) return Missing(name, "a list of integers");
  if (auto* l = std::get_if<std::vector<int64_t>>(v)) return *l;
  return WrongKind(name, "a list of integers", *v);
}

absl::StatusOr<std::vector<double>> AttrMap::GetFloats(absl::string_view name) const {
  const AttrValue* v = Find(name);
  if (!v) return Missing(name, "a list of numbers");
  if (auto* l = std::get_if<std::vector<double>>(v)) return *l;
  if (auto* l = std::get_if<std::vector<int64_t>>(v)) return std::vector<double>(l->begin(), l->end());
  return WrongKind(name, "a list of numbers", *v);
}

absl::StatusOr<DType> AttrMap::GetDType(absl::string_view name) const {
  absl::StatusOr<std::string> s = GetSymbol(name);
  if (!s.ok()) return s.status();
  absl::StatusOr<DType> t = ParseDType(*s);
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("attribute '", name, "': ", t.status().message()));
  }
  return *t;
}

std::string AttrMap::ToString() const {
  if (map_.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : map_) {
    if (!first) out += ", ";
    first = false;
    absl::StrAppend(&out, k, "=", AttrValueToString(v));
  }
  return out + "}";
}

}  // namespace kiln
