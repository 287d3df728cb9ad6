#include <gtest/gtest.h>

#include "ir/builder.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

TEST(Builder, InfersTypesAndVerifies) {
  Module m("m");
  Builder b(m.AddFunction("f"));
  auto x = b.Parameter("x", {DType::kF32, {2, 3}});
  ASSERT_TRUE(x.ok());
  auto w = b.Parameter("w", {DType::kF32, {3, 4}});
  auto y = b.DotGeneral(*x, *w, {{}, {}, {1}, {0}});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ((*y)->type().ToString(), "f32[2,4]");
  ASSERT_TRUE(b.Return({*y}).ok());
  EXPECT_TRUE(VerifyModule(m).ok()) << VerifyModule(m);
}

TEST(Builder, ErrorNamesOpShapesAndCaller) {
  Module m("m");
  Builder b(m.AddFunction("f"));
  Node* x = *b.Parameter("x", {DType::kF32, {2, 3}});
  Node* y = *b.Parameter("y", {DType::kF32, {3, 2}});
  auto z = b.Add(x, y);
  ASSERT_FALSE(z.ok());
  std::string msg(z.status().message());
  EXPECT_NE(msg.find("add(f32[2,3], f32[3,2])"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ir_builder_test.cc:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("differ"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kiln

#include "tests/testing/all_ops.h"

namespace kiln {
namespace {

TEST(AllOpsModule, CoversEveryOpAndVerifies) {
  std::vector<Opcode> missing = testing::OpsMissingFromAllOpsModule();
  for (Opcode op : missing) ADD_FAILURE() << "tests/testing/all_ops.cc does not use " << OpName(op);
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  absl::Status st = VerifyModule(*m);
  EXPECT_TRUE(st.ok()) << st;
}

TEST(Verifier, RejectsWrongWrittenType) {
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  Function* f = m->functions()[0].get();
  Node* add = nullptr;
  for (const auto& n : f->nodes()) {
    if (n->opcode() == Opcode::kAdd) add = n.get();
  }
  ASSERT_NE(add, nullptr);
  add->set_type({DType::kF32, {2, 3, 5}});
  absl::Status st = VerifyModule(*m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("written type f32[2,3,5] but operands give f32[2,3,4]"), absl::string_view::npos) << st;
}

}  // namespace
}  // namespace kiln
