#include "ir/op_attributes.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln {
namespace {

using Names = std::vector<absl::string_view>;

// By op; ops not listed take none. Kept in the order of ir/op_table.h's comment.
Names KnownFor(Opcode op) {
  switch (op) {
    case Opcode::kParameter: return {"index"};
    case Opcode::kConstant: return {"value", "values"};
    case Opcode::kIota: return {"dim"};
    case Opcode::kCompare: return {"direction"};
    case Opcode::kBroadcast: return {"dims"};
    case Opcode::kTranspose: return {"perm"};
    case Opcode::kSlice: return {"start", "limit", "stride"};
    case Opcode::kConcatenate: return {"dim"};
    case Opcode::kReduceSum:
    case Opcode::kReduceMax: return {"dims"};
    case Opcode::kDotGeneral: return {"lhs_batch", "rhs_batch", "lhs_contract", "rhs_contract", "out_dtype"};
    case Opcode::kGemm: return {"batch", "m", "n", "k", "a_layout", "b_layout", "alpha", "beta", "epilogue"};
    case Opcode::kRmsNorm:
    case Opcode::kRmsNormGradInput:
    case Opcode::kRmsNormGradWeight: return {"eps"};
    case Opcode::kRope: return {"theta", "inverse"};
    case Opcode::kAdamWUpdate: return {"beta1", "beta2", "eps"};
    case Opcode::kAttention:
    case Opcode::kAttentionGrad: return {"scale"};
    case Opcode::kGetResult: return {"index"};
    default: return {};
  }
}

const std::vector<Names>& Table() {
  static const std::vector<Names> table = [] {
    std::vector<Names> t;
    for (int i = 0; i < kNumOpcodes; ++i) t.push_back(KnownFor(static_cast<Opcode>(i)));
    return t;
  }();
  return table;
}

constexpr absl::string_view kAnnotations[] = {"kernel_group"};

}  // namespace

absl::Span<const absl::string_view> KnownAttributes(Opcode op) { return Table()[static_cast<int>(op)]; }

absl::Span<const absl::string_view> AnnotationAttributes() { return kAnnotations; }

absl::Status CheckKnownAttributes(Opcode op, const AttrMap& attrs) {
  const absl::Span<const absl::string_view> known = KnownAttributes(op);
  for (const auto& [name, value] : attrs.entries()) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    if (std::find(std::begin(kAnnotations), std::end(kAnnotations), name) != std::end(kAnnotations)) continue;
    if (absl::StartsWith(name, kNoteAttributePrefix)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown attribute '", absl::CHexEscape(name.substr(0, 64)), "' (", OpName(op),
        known.empty() ? " takes no attributes" : absl::StrCat(" takes ", absl::StrJoin(known, ", ")),
        "; free-form notes are named ", kNoteAttributePrefix, "...)"));
  }
  return absl::OkStatus();
}

}  // namespace kiln
