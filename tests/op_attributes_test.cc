// ir/op_attributes.h: the attributes each op takes, in one place, and the verifier's use of
// it (issue 11: the verifier accepted attributes no op reads).
#include "ir/op_attributes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ir/text_format.h"
#include "ir/verifier.h"
#include "tests/testing/all_ops.h"

namespace kiln {
namespace {

bool Known(Opcode op, absl::string_view name) {
  absl::Span<const absl::string_view> known = KnownAttributes(op);
  return std::find(known.begin(), known.end(), name) != known.end();
}

// Every attribute the module of all ops writes is one the table knows, and every name the
// table lists is written there for some op: the table and the ops' readers agree.
TEST(OpAttributes, TheTableMatchesTheAttributesEveryOpIsBuiltWith) {
  std::unique_ptr<Module> module = testing::BuildAllOpsModule();
  std::set<std::pair<int, std::string>> used;
  for (const auto& f : module->functions()) {
    for (const auto& node : f->nodes()) {
      for (const auto& [name, value] : node->attrs().entries()) {
        EXPECT_TRUE(Known(node->opcode(), name)) << node->op_name() << " {" << name << "}";
        used.insert({static_cast<int>(node->opcode()), name});
      }
    }
  }
  EXPECT_TRUE(VerifyModule(*module).ok());
  // Optional attributes the module of all ops may leave out.
  const std::set<std::string> optional = {"out_dtype", "value", "values"};
  for (int i = 0; i < kNumOpcodes; ++i) {
    for (absl::string_view name : KnownAttributes(static_cast<Opcode>(i))) {
      if (optional.count(std::string(name))) continue;
      EXPECT_TRUE(used.count({i, std::string(name)})) << OpName(static_cast<Opcode>(i)) << " {" << name << "}";
    }
  }
}

// The names come from the op table's attribute column, split per op; no op takes an
// attribute of another's, and the old kernel-group mark of fusion is no attribute at all
// (fusion is a node now).
TEST(OpAttributes, TheNamesAreTheOpTablesColumn) {
  EXPECT_EQ(std::vector<absl::string_view>(KnownAttributes(Opcode::kRmsNorm).begin(), KnownAttributes(Opcode::kRmsNorm).end()),
            (std::vector<absl::string_view>{"eps", "out_dtype"}));
  EXPECT_EQ(std::vector<absl::string_view>(KnownAttributes(Opcode::kSlice).begin(), KnownAttributes(Opcode::kSlice).end()),
            (std::vector<absl::string_view>{"start", "limit", "stride"}));
  EXPECT_EQ(std::vector<absl::string_view>(KnownAttributes(Opcode::kFusion).begin(), KnownAttributes(Opcode::kFusion).end()),
            std::vector<absl::string_view>{"kind"});
  EXPECT_TRUE(KnownAttributes(Opcode::kAdd).empty());
  EXPECT_FALSE(CheckKnownAttributes(Opcode::kAdd, AttrMap{{"kernel_group", std::string("g")}}).ok());
  EXPECT_TRUE(CheckKnownAttributes(Opcode::kAdd, AttrMap{{"note_why", std::string("g")}}).ok());
}

TEST(OpAttributes, TheVerifierRejectsUnknownAttributes) {
  absl::StatusOr<std::unique_ptr<Module>> misspelt = ParseModule(
      "module @m\n\nfunc @main {\n  %x = parameter() {index=0} : f32[2,4]\n  %w = parameter() {index=1} : f32[4]\n"
      "  %y = rms_norm(%x, %w) {eps=1e-05, esp=1e-05} : f32[2,4]\n  return %y\n}\n");
  ASSERT_FALSE(misspelt.ok());
  EXPECT_TRUE(absl::StrContains(misspelt.status().message(), "unknown attribute 'esp' (rms_norm takes eps, out_dtype;"))
      << misspelt.status();
}

// A node with 100k operands whose types do not fit: the verifier names a few and counts the
// rest (issue 11: a 1.5 MB one-line error).
TEST(OpAttributes, ErrorsAboutManyOperandsStayShort) {
  Module m("m");
  Function* f = m.AddFunction("main");
  Node* x = f->AppendNode(Opcode::kParameter, {}, AttrMap{{"index", int64_t{0}}}, {DType::kF32, {2}}, "x");
  Node* z = f->AppendNode(Opcode::kParameter, {}, AttrMap{{"index", int64_t{1}}}, {DType::kI32, {2}}, "z");
  std::vector<Node*> operands(100000, x);
  operands.push_back(z);
  Node* y = f->AppendNode(Opcode::kConcatenate, operands, AttrMap{{"dim", int64_t{0}}}, {DType::kF32, {200002}}, "y");
  f->SetOutputs({y});
  absl::Status st = VerifyModule(m);
  ASSERT_FALSE(st.ok());
  EXPECT_LT(st.message().size(), 1000u) << st.message().substr(0, 300);
  EXPECT_TRUE(absl::StrContains(st.message(), "99993 more, 100001 in all")) << st.message();

  // The text parser checks each node as it reads it, with the same shortened list.
  std::string text_operands;
  for (int i = 0; i < 100000; ++i) absl::StrAppend(&text_operands, "%x, ");
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(absl::StrCat(
      "module @m\n\nfunc @main {\n  %x = parameter() {index=0} : f32[2]\n  %z = parameter() {index=1} : i32[2]\n"
      "  %y = concatenate(", text_operands, "%z) {dim=0} : f32[200002]\n  return %y\n}\n"));
  ASSERT_FALSE(parsed.ok());
  EXPECT_LT(parsed.status().message().size(), 1000u) << parsed.status().message().substr(0, 300);
  EXPECT_TRUE(absl::StrContains(parsed.status().message(), "99993 more, 100001 in all")) << parsed.status();
}

}  // namespace
}  // namespace kiln
