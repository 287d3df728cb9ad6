// The pattern matcher (ir/pattern_match.h) and the node predicates under it
// (ir/node_predicates.h): what matches, what is captured (and what is not when a match or a
// branch of it fails), and what a failed match says.
#include "ir/pattern_match.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "ir/node_predicates.h"
#include "ir/text_format.h"

namespace kiln {
namespace {

namespace m = match;

// One function holding every node the tests below look at, by name.
constexpr absl::string_view kGraph = R"(module @m
func @main {
  %x = parameter() {index=0} : f32[2,4]
  %q = parameter() {index=1} : bf16[2,4]
  %two = constant() {value=2.0} : f32[]
  %twos = broadcast(%two) {dims=[]} : f32[2,4]
  %dense_twos = constant() {values=[2.0,2.0,2.0,2.0]} : f32[4]
  %dense_mixed = constant() {values=[2.0,3.0,2.0,2.0]} : f32[4]
  %zero = constant() {value=0.0} : f32[2,4]
  %neg_zero = constant() {value=-0.0} : f32[2,4]
  %twice = broadcast(%dense_twos) {dims=[1]} : f32[2,4]
  %xt = mul(%twos, %x) : f32[2,4]
  %e = exp(%xt) : f32[2,4]
  %s = add(%e, %zero) : f32[2,4]
  %p = convert(%s) : bf16[2,4]
  %i0 = iota() {dim=0} : i32[2,4]
  %i1 = iota() {dim=1} : i32[2,4]
  %mask = compare(%i0, %i1) {direction=ge} : pred[2,4]
  %sel = select(%mask, %x, %neg_zero) : f32[2,4]
  %cat = concatenate(%x, %twos, %twice) {dim=0} : f32[6,4]
  return %p, %sel, %cat, %q
}
)";

class PatternMatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(kGraph);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    module_ = *std::move(parsed);
  }
  Node* N(absl::string_view name) const {
    Node* n = module_->functions()[0]->FindNode(name);
    EXPECT_NE(n, nullptr) << name;
    return n;
  }
  // The explanation of a match that must fail.
  std::string WhyNot(absl::string_view name, const m::Pattern& pattern) const {
    std::string why;
    EXPECT_FALSE(m::Match(N(name), pattern, &why)) << name;
    return why;
  }
  std::unique_ptr<Module> module_;
};

TEST_F(PatternMatchTest, MatchesOpsAndOperandsRecursivelyAndCaptures) {
  Node* input = nullptr;
  Node* product = nullptr;
  double factor = 0;
  const m::Pattern pattern =
      m::Op(Opcode::kConvert,
            {m::Op(Opcode::kAdd, {m::Op(Opcode::kExp, {m::Op(Opcode::kMul, {m::Splat(&factor), m::Any(&input)})
                                                           .Capture(&product)}),
                                  m::SplatOf(0.0)})})
          .WithDType(DType::kBF16)
          .WithShape({2, 4});
  ASSERT_TRUE(m::Match(N("p"), pattern));
  EXPECT_EQ(input, N("x"));
  EXPECT_EQ(product, N("xt"));
  EXPECT_EQ(factor, 2.0);
}

TEST_F(PatternMatchTest, AnyOrderMatchesACommutativeOpEitherWayRound) {
  Node* x = nullptr;
  // %xt is mul(%twos, %x): the splat is written first.
  ASSERT_TRUE(m::Match(N("xt"), m::AnyOrder(Opcode::kMul, m::Any(&x), m::SplatOf(2.0))));
  EXPECT_EQ(x, N("x"));
  x = nullptr;
  ASSERT_TRUE(m::Match(N("xt"), m::AnyOrder(Opcode::kMul, m::SplatOf(2.0), m::Any(&x))));
  EXPECT_EQ(x, N("x"));
  // A fixed order does not.
  EXPECT_FALSE(m::Match(N("xt"), m::Op(Opcode::kMul, {m::Any(), m::SplatOf(2.0)})));
}

TEST_F(PatternMatchTest, AFailedMatchOrBranchWritesNoCapture) {
  Node* first = nullptr;
  Node* second = nullptr;
  // The order as written captures %twos, then fails on %x (not a splat); the swapped order
  // fails on %twos (a splat of 2.0). Nothing is written.
  EXPECT_FALSE(m::Match(N("xt"), m::AnyOrder(Opcode::kMul, m::Any(&first), m::SplatOf(3.0))));
  EXPECT_EQ(first, nullptr);
  // The first alternative captures and then fails; the second's capture alone is written.
  ASSERT_TRUE(m::Match(N("s"), m::AnyOf({m::Op(Opcode::kAdd, {m::Any(&first), m::SplatOf(1.0)}),
                                         m::Op(Opcode::kAdd, {m::Any(&second), m::SplatOf(0.0)})})));
  EXPECT_EQ(first, nullptr);
  EXPECT_EQ(second, N("e"));
}

TEST_F(PatternMatchTest, AFailureNamesTheSubPatternAndTheNode) {
  EXPECT_EQ(WhyNot("p", m::Op(Opcode::kConvert, {m::Op(Opcode::kSoftmax)})),
            "operand 0 of %p (convert): %s is add, not softmax");
  EXPECT_EQ(WhyNot("p", m::Op(Opcode::kConvert, {m::Op(Opcode::kAdd, {m::Op(Opcode::kExp, {m::Op(Opcode::kDiv)}),
                                                                      m::Any()})})),
            "operand 0 of %p (convert): operand 0 of %s (add): operand 0 of %e (exp): %xt is mul, not div");
  EXPECT_EQ(WhyNot("p", m::Op(Opcode::kConvert).WithDType(DType::kF16)), "%p (convert) is bf16[2,4], not dtype f16");
  EXPECT_EQ(WhyNot("p", m::Any().WithShape({4, 2})), "%p (convert) is bf16[2,4], not shape [4,2]");
  EXPECT_EQ(WhyNot("p", m::Any().WithRank(4)), "%p (convert) is bf16[2,4], not rank 4");
  EXPECT_EQ(WhyNot("p", m::Any().WithType({DType::kF32, {2, 4}})), "%p (convert) is bf16[2,4], not f32[2,4]");
  EXPECT_EQ(WhyNot("s", m::Any().WithNumOperands(3)), "%s (add) has 2 operands, not 3");
  EXPECT_EQ(WhyNot("e", m::Any().WithOperand(1, m::Any())), "%e (exp) has no operand 1");
  EXPECT_EQ(WhyNot("s", m::Any().Where("a function output", [](const Node&) { return false; })),
            "%s (add) is not a function output");
}

// A multi-result node has no one type: the type checks fail and say why, and never reach
// Node::type()'s check (a gemm with FP8 slots, which has an amax result, once crashed
// narrow-activations-bf16's gemm pattern this way).
TEST(PatternMatchMultiResultTest, TypeChecksFailOnAMultiResultNode) {
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(R"(module @m
func @main {
  %q = parameter() {index=0} : bf16[1,2,128,64]
  %k = parameter() {index=1} : bf16[1,1,128,64]
  %v = parameter() {index=2} : bf16[1,1,128,64]
  %a.o, %a.lse = attention(%q, %k, %v) {scale=0.125} : (f32[1,2,128,64], f32[1,2,128])
  return %a.o
}
)");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const Function& f = *(*parsed)->functions()[0];
  const Node* attention = nullptr;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kAttention) attention = n.get();
  }
  ASSERT_NE(attention, nullptr);
  for (const m::Pattern& p : {m::Any().WithDType(DType::kF32), m::Any().WithShape({1, 2, 128, 64}),
                              m::Any().WithRank(4), m::Any().WithType({DType::kF32, {1, 2, 128, 64}})}) {
    std::string why;
    EXPECT_FALSE(m::Match(attention, p, &why));
    EXPECT_THAT(why, ::testing::HasSubstr("(attention) has 2 results, not one type"));
  }
  EXPECT_TRUE(m::Match(attention, m::Op(Opcode::kAttention)));
}

TEST_F(PatternMatchTest, AttributesMatchByValueAndKind) {
  EXPECT_TRUE(m::Match(N("mask"), m::Op(Opcode::kCompare, {m::Op(Opcode::kIota).WithInt("dim", 0),
                                                           m::Op(Opcode::kIota).WithInt("dim", 1)})
                                      .WithSymbol("direction", "ge")));
  EXPECT_TRUE(m::Match(N("twice"), m::Op(Opcode::kBroadcast).WithInts("dims", {1})));
  EXPECT_EQ(WhyNot("mask", m::Any().WithSymbol("direction", "lt")), "%mask (compare) has direction=ge, not direction=lt");
  EXPECT_EQ(WhyNot("twice", m::Any().WithInts("dims", {2, 3})), "%twice (broadcast) has dims=[1], not dims=[2,3]");
  EXPECT_EQ(WhyNot("i0", m::Any().WithInt("dim", 1)), "%i0 (iota) has dim=0, not dim=1");
  // An int attribute is not a float one, even of the same value.
  EXPECT_EQ(WhyNot("i0", m::Any().WithAttr("dim", 0.0)), "%i0 (iota) has dim=0, not dim=0.0");
  EXPECT_EQ(WhyNot("e", m::Any().WithInts("perm", {1, 0})), "%e (exp) has no attribute perm (wanted perm=[1,0])");
}

TEST_F(PatternMatchTest, SplatsSeeThroughBroadcastsAndDenseEqualValues) {
  double value = 0;
  EXPECT_TRUE(m::Match(N("twos"), m::Splat(&value)));  // a broadcast of a splat
  EXPECT_EQ(value, 2.0);
  value = 0;
  EXPECT_TRUE(m::Match(N("twice"), m::Splat(&value)));  // a broadcast of dense equal values
  EXPECT_EQ(value, 2.0);
  EXPECT_TRUE(m::Match(N("dense_twos"), m::SplatOf(2.0)));
  EXPECT_EQ(WhyNot("dense_mixed", m::Splat()), "%dense_mixed (constant) is not a splat constant");
  EXPECT_EQ(WhyNot("x", m::SplatOf(2.0)), "%x (parameter) is not a splat constant (wanted 2.0)");
  // The sign of zero is part of the value.
  EXPECT_TRUE(m::Match(N("zero"), m::SplatOf(0.0)));
  EXPECT_EQ(WhyNot("zero", m::SplatOf(-0.0)), "%zero (constant) is a splat of 0.0, not -0.0");
  EXPECT_EQ(WhyNot("neg_zero", m::SplatOf(0.0)), "%neg_zero (constant) is a splat of -0.0, not 0.0");
}

TEST_F(PatternMatchTest, ChoicesExplainEveryWayTheyFailed) {
  EXPECT_EQ(WhyNot("xt", m::AnyOrder(Opcode::kMul, m::Any(), m::SplatOf(3.0))),
            "%xt (mul) matches in neither operand order: as written, operand 1 of %xt (mul): %x (parameter) is not "
            "a splat constant (wanted 3.0); swapped, operand 0 of %xt (mul): %twos (broadcast) is a splat of 2.0, "
            "not 3.0");
  EXPECT_EQ(WhyNot("p", m::AnyOf({m::Op(Opcode::kExp), m::Any().WithDType(DType::kF32)})),
            "%p (convert) matches none of 2 alternatives: 1: %p is convert, not exp; 2: %p (convert) is bf16[2,4], "
            "not dtype f32");
}

TEST_F(PatternMatchTest, EveryOperandAppliesToVariadicOps) {
  EXPECT_TRUE(m::Match(N("cat"), m::Op(Opcode::kConcatenate).WithEveryOperand(m::Any().WithDType(DType::kF32))));
  EXPECT_EQ(WhyNot("cat", m::Any().WithEveryOperand(m::Op(Opcode::kBroadcast))),
            "operand 0 of %cat (concatenate): %x is parameter, not broadcast");
  EXPECT_TRUE(m::Match(N("x"), m::Any().WithEveryOperand(m::Op(Opcode::kExp))));  // none to check
}

TEST_F(PatternMatchTest, APatternIsAValueMatchedManyTimes) {
  Node* x = nullptr;
  const m::Pattern times_two = m::AnyOrder(Opcode::kMul, m::Any(&x), m::SplatOf(2.0));
  int matches = 0;
  for (const auto& n : module_->functions()[0]->nodes()) matches += m::Match(n.get(), times_two);
  EXPECT_EQ(matches, 1);
  EXPECT_EQ(x, N("x"));
}

// The one definition of each splat question (ir/node_predicates.h).
TEST_F(PatternMatchTest, SplatPredicates) {
  EXPECT_TRUE(IsSplatConstant(*N("two")));
  EXPECT_FALSE(IsSplatConstant(*N("dense_twos")));  // stored as a buffer, whatever its values
  EXPECT_FALSE(IsSplatConstant(*N("twos")));        // a broadcast, not a constant
  EXPECT_EQ(SplatValue(*N("dense_twos")), 2.0);
  EXPECT_EQ(SplatValue(*N("twice")), 2.0);
  EXPECT_EQ(SplatValue(*N("dense_mixed")), std::nullopt);
  EXPECT_EQ(SplatValue(*N("x")), std::nullopt);
  EXPECT_TRUE(IsSplatOf(*N("neg_zero"), -0.0));
  EXPECT_FALSE(IsSplatOf(*N("neg_zero"), 0.0));
}

}  // namespace
}  // namespace kiln
