#include "ir/op_table.h"

#include <array>

namespace kiln {

namespace {
constexpr std::array<OpInfo, kNumOpcodes> kOpInfos = {{
#define KILN_OP_INFO(e, name, arity, cat, rule, results, attrs) \
  {Opcode::e, name, arity, OpCategory::cat, ResultRule::rule, results, attrs},
    KILN_OPS(KILN_OP_INFO)
#undef KILN_OP_INFO
}};
}  // namespace

const OpInfo& GetOpInfo(Opcode op) { return kOpInfos[static_cast<int>(op)]; }

const OpInfo* FindOpByName(absl::string_view name) {
  for (const OpInfo& info : kOpInfos) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

bool IsElementwise(Opcode op) {
  switch (GetOpInfo(op).category) {
    case OpCategory::kUnary:
    case OpCategory::kBinary:
    case OpCategory::kCompare:
    case OpCategory::kSelect:
    case OpCategory::kConvert:
      return true;
    default:
      return false;
  }
}

}  // namespace kiln
