#include "ir/op_attributes.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace kiln {
namespace {

using Names = std::vector<absl::string_view>;

// The table's attribute column, split once per op.
const std::vector<Names>& Table() {
  static const std::vector<Names> table = [] {
    std::vector<Names> t;
    for (int i = 0; i < kNumOpcodes; ++i) {
      const absl::string_view column = GetOpInfo(static_cast<Opcode>(i)).attributes;
      t.push_back(column.empty() ? Names{} : Names(absl::StrSplit(column, ',')));
    }
    return t;
  }();
  return table;
}

}  // namespace

absl::Span<const absl::string_view> KnownAttributes(Opcode op) { return Table()[static_cast<int>(op)]; }

absl::Status CheckKnownAttributes(Opcode op, const AttrMap& attrs) {
  const absl::Span<const absl::string_view> known = KnownAttributes(op);
  for (const auto& [name, value] : attrs.entries()) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    if (absl::StartsWith(name, kNoteAttributePrefix)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown attribute '", absl::CHexEscape(name.substr(0, 64)), "' (", OpName(op),
        known.empty() ? " takes no attributes" : absl::StrCat(" takes ", absl::StrJoin(known, ", ")),
        "; free-form notes are named ", kNoteAttributePrefix, "...)"));
  }
  return absl::OkStatus();
}

}  // namespace kiln
