#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
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

// adamw_update's errors say which operand or attribute is wrong, and why.
TEST(Builder, AdamWUpdateErrorsNameTheOperand) {
  Module m("m");
  Builder b(m.AddFunction("f"));
  const TensorType state{DType::kF32, {4, 8}}, scalar{DType::kF32, {}};
  std::vector<Node*> in;
  for (const char* name : {"p", "g", "m", "v"}) in.push_back(*b.Parameter(name, state));
  for (const char* name : {"step_size", "decay", "sqrt_bc2", "grad_scale"}) in.push_back(*b.Parameter(name, scalar));
  Node* wide_v = *b.Parameter("wide_v", {DType::kF32, {4, 9}});
  Node* bf16_p = *b.Parameter("bf16_p", {DType::kBF16, {4, 8}});
  Node* vector_decay = *b.Parameter("vector_decay", {DType::kF32, {1}});
  const AttrMap attrs{{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}};
  auto error = [&](std::vector<Node*> operands, AttrMap a) {
    absl::StatusOr<std::vector<Node*>> n = b.MultiResultOp(Opcode::kAdamWUpdate, std::move(operands), std::move(a));
    return n.ok() ? std::string("ok") : std::string(n.status().message());
  };
  auto with = [&](int i, Node* x) {
    std::vector<Node*> operands = in;
    operands[i] = x;
    return operands;
  };
  auto attr = [&](const char* name, AttrValue value) {
    AttrMap a = attrs;
    a.Set(name, std::move(value));
    return a;
  };
  EXPECT_EQ(error(in, attrs), "ok");
  EXPECT_THAT(error(with(3, wide_v), attrs), ::testing::HasSubstr("v f32[4,9] must have p's type f32[4,8]"));
  EXPECT_THAT(error(with(0, bf16_p), attrs), ::testing::HasSubstr("p must be f32 (master weights), got bf16[4,8]"));
  EXPECT_THAT(error(with(5, vector_decay), attrs), ::testing::HasSubstr("decay must be an f32[] scalar, got f32[1]"));
  EXPECT_THAT(error(in, attr("beta2", 1.0)), ::testing::HasSubstr("beta2=1 must be in [0, 1)"));
  absl::StatusOr<Node*> single = b.Op(Opcode::kAdamWUpdate, in, attrs);
  ASSERT_FALSE(single.ok());
  EXPECT_THAT(single.status().message(), ::testing::HasSubstr("has 3 results here: build it with Builder::MultiResultOp"));
  EXPECT_THAT(error(in, attr("eps", -1.0)), ::testing::HasSubstr("eps=-1 must be finite and >= 0"));
}

// attention's out_dtype makes O bf16 (the LSE stays f32) and takes nothing else: the kernels
// store f32 or bf16, and f32 is the default, written without it. attention_delta reads O in
// either dtype.
TEST(Builder, AttentionOutDtypeIsBf16Only) {
  Module m("m");
  Builder b(m.AddFunction("f"));
  const DType bf16 = DType::kBF16;
  Node* q = *b.Parameter("q", {bf16, {1, 4, 64, 64}});
  Node* kv = *b.Parameter("kv", {bf16, {1, 2, 64, 64}});
  Node* dout = *b.Parameter("dout", {bf16, {1, 4, 64, 64}});
  auto attention = [&](const char* out_dtype) {
    AttrMap attrs{{"scale", 0.125}};
    if (out_dtype != nullptr) attrs.Set("out_dtype", Symbol{out_dtype});
    return b.MultiResultOp(Opcode::kAttention, {q, kv, kv}, std::move(attrs));
  };
  absl::StatusOr<std::vector<Node*>> narrow = attention("bf16");
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_EQ((*narrow)[0]->type().ToString(), "bf16[1,4,64,64]");
  EXPECT_EQ((*narrow)[1]->type().ToString(), "f32[1,4,64]");
  absl::StatusOr<Node*> delta = b.Op(Opcode::kAttentionDelta, {(*narrow)[0], dout});
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ((*delta)->type().ToString(), "f32[1,4,64]");
  for (const char* bad : {"f16", "f32", "f8e4m3", "i32"}) {
    absl::StatusOr<std::vector<Node*>> refused = attention(bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_THAT(refused.status().message(),
                ::testing::HasSubstr(absl::StrCat("attention out_dtype ", bad, " is not supported: only bf16")));
  }
  Node* f16_o = *b.Parameter("f16_o", {DType::kF16, {1, 4, 64, 64}});
  absl::StatusOr<Node*> f16_delta = b.Op(Opcode::kAttentionDelta, {f16_o, dout});
  ASSERT_FALSE(f16_delta.ok());
  EXPECT_THAT(f16_delta.status().message(), ::testing::HasSubstr("must be f32 or bf16 [B,H,T,D]"));
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
