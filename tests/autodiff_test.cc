// The structure autodiff builds (passes/autodiff.h): which nodes a backward pass appends,
// their types, scopes and names, and the errors it reports. Numbers are checked by
// tests/autodiff_fd_test.cc.
#include <gtest/gtest.h>

#include <map>

#include "ir/text_format.h"
#include "ir/verifier.h"
#include "passes/autodiff.h"

namespace kiln {
namespace {

std::unique_ptr<Module> Parse(absl::string_view text) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : std::make_unique<Module>();
}

Node* Find(const Function& f, absl::string_view name) {
  Node* n = f.FindNode(name);
  EXPECT_NE(n, nullptr) << "no node %" << name;
  return n;
}

// The nodes of `f` from position `from` on: what a backward pass appended.
std::vector<const Node*> NodesFrom(const Function& f, size_t from) {
  std::vector<const Node*> out;
  for (size_t i = from; i < f.nodes().size(); ++i) out.push_back(f.nodes()[i].get());
  return out;
}

constexpr char kMulModule[] = R"(module @m

func @f {
  %x = parameter() {index=0} : f32[4]
  %w = parameter() {index=1} : f32[4]
  %y = mul(%x, %w) : f32[4] @layers.0
  %l = reduce_sum(%y) {dims=[0]} : f32[] @head
  return %l
}
)";

// The example of the header comment of passes/autodiff.h, exactly.
TEST(AutodiffTest, MulBackwardPrintsAsDocumented) {
  std::unique_ptr<Module> m = Parse(kMulModule);
  Function& f = *m->functions()[0];
  absl::StatusOr<std::vector<Node*>> grads = AppendBackward(f, Find(f, "l"), {Find(f, "x"), Find(f, "w")});
  ASSERT_TRUE(grads.ok()) << grads.status();
  ASSERT_TRUE(VerifyModule(*m).ok());
  EXPECT_EQ(PrintModule(*m), R"(module @m

func @f {
  %x = parameter() {index=0} : f32[4]
  %w = parameter() {index=1} : f32[4]
  %y = mul(%x, %w) : f32[4] @layers.0
  %l = reduce_sum(%y) {dims=[0]} : f32[] @head
  %l.grad = constant() {value=1.0} : f32[] @head
  %5 = broadcast(%l.grad) {dims=[]} : f32[4] @head
  %6 = mul(%5, %w) : f32[4] @layers.0
  %7 = mul(%5, %x) : f32[4] @layers.0
  return %l
}
)");
  EXPECT_EQ((*grads)[0]->name(), "6");
  EXPECT_EQ((*grads)[1]->name(), "7");
}

TEST(AutodiffTest, AddPassesTheCotangentThrough) {
  std::unique_ptr<Module> m = Parse(R"(module @m
func @f {
  %x = parameter() {index=0} : f32[2,3]
  %y = parameter() {index=1} : f32[2,3]
  %s = add(%x, %y) : f32[2,3]
  %l = reduce_sum(%s) {dims=[0,1]} : f32[]
  return %l
}
)");
  Function& f = *m->functions()[0];
  absl::StatusOr<std::vector<Node*>> grads = AppendBackward(f, Find(f, "l"), {Find(f, "x"), Find(f, "y")});
  ASSERT_TRUE(grads.ok()) << grads.status();
  ASSERT_EQ(grads->size(), 2u);
  // Both gradients are the cotangent of %s itself: no node was built for the add.
  EXPECT_EQ((*grads)[0], (*grads)[1]);
  EXPECT_EQ((*grads)[0]->opcode(), Opcode::kBroadcast);
  EXPECT_EQ((*grads)[0]->operand(0)->opcode(), Opcode::kConstant);
}

TEST(AutodiffTest, MultipleUsesAccumulateByAdding) {
  std::unique_ptr<Module> m = Parse(R"(module @m
func @f {
  %x = parameter() {index=0} : f32[3]
  %sq = mul(%x, %x) : f32[3] @block
  %e = exp(%x) : f32[3]
  %s = add(%sq, %e) : f32[3]
  %l = reduce_sum(%s) {dims=[0]} : f32[]
  return %l
}
)");
  Function& f = *m->functions()[0];
  absl::StatusOr<std::vector<Node*>> grads = AppendBackward(f, Find(f, "l"), {Find(f, "x")});
  ASSERT_TRUE(grads.ok()) << grads.status();
  // Three contributions (two from the mul, one from exp) make two adds; the last is the result.
  const Node* g = (*grads)[0];
  EXPECT_EQ(g->opcode(), Opcode::kAdd);
  EXPECT_EQ(g->type(), (TensorType{DType::kF32, {3}}));
  EXPECT_EQ(g->operand(0)->opcode(), Opcode::kAdd);
  EXPECT_EQ(g->operand(0)->name(), "x.grad");
  EXPECT_EQ(g->name(), "x.grad.1");
  EXPECT_TRUE(VerifyModule(*m).ok());
}

TEST(AutodiffTest, IntegerOperandsGetNoCotangent) {
  std::unique_ptr<Module> m = Parse(R"(module @m
func @f {
  %table = parameter() {index=0} : f32[5,4]
  %ids = parameter() {index=1} : i32[2,3]
  %labels = parameter() {index=2} : i32[6]
  %rows = gather(%table, %ids) : f32[2,3,4]
  %flat = reshape(%rows) : f32[6,4]
  %idf = convert(%labels) : f32[6]
  %ce, %ce.lse = cross_entropy(%flat, %labels) : (f32[6], f32[6])
  %weighted = mul(%ce, %idf) : f32[6]
  %l = reduce_sum(%weighted) {dims=[0]} : f32[]
  return %l
}
)");
  Function& f = *m->functions()[0];
  const size_t forward_size = f.nodes().size();
  absl::StatusOr<std::vector<Node*>> grads = AppendBackward(f, Find(f, "l"), {Find(f, "table")});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ((*grads)[0]->opcode(), Opcode::kScatterAdd);
  EXPECT_EQ((*grads)[0]->operand(0), Find(f, "ids"));
  for (const Node* n : NodesFrom(f, forward_size)) {
    EXPECT_TRUE(IsFloat(n->type().dtype) || n->type().dtype == DType::kPred) << PrintNode(*n);
  }
  // Asking for the gradient of an integer value is an error, not a silent zero.
  absl::StatusOr<std::vector<Node*>> bad = AppendBackward(f, Find(f, "l"), {Find(f, "ids")});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("%ids is i32[2,3]"), absl::string_view::npos) << bad.status();
}

// Autocast: bf16 GEMM operands with f32 accumulation. The backward GEMMs take bf16 operands
// (the f32 cotangent rounded, and the other forward operand) and accumulate in f32, and the
// weight's gradient stays f32 all the way (never rounded to bf16 and back).
TEST(AutodiffTest, AutocastDotGradientsRoundOperandsAndAccumulateInF32) {
  std::unique_ptr<Module> m = Parse(R"(module @m
func @f {
  %x = parameter() {index=0} : f32[2,3]
  %w = parameter() {index=1} : f32[4,3]
  %xb = convert(%x) : bf16[2,3]
  %wb = convert(%w) : bf16[4,3]
  %y = dot_general(%xb, %wb) {lhs_batch=[], lhs_contract=[1], out_dtype=f32, rhs_batch=[], rhs_contract=[1]} : f32[2,4]
  %l = reduce_sum(%y) {dims=[0,1]} : f32[]
  return %l
}
)");
  Function& f = *m->functions()[0];
  const size_t forward_size = f.nodes().size();
  absl::StatusOr<std::vector<Node*>> grads = AppendBackward(f, Find(f, "l"), {Find(f, "x"), Find(f, "w")});
  ASSERT_TRUE(grads.ok()) << grads.status();
  ASSERT_TRUE(VerifyModule(*m).ok());
  for (int i = 0; i < 2; ++i) {
    const Node* g = (*grads)[i];
    EXPECT_EQ(g->type().dtype, DType::kF32);
    ASSERT_EQ(g->opcode(), Opcode::kDotGeneral) << PrintNode(*g);  // no transpose, no convert after it
    EXPECT_EQ(g->operand(0)->type().dtype, DType::kBF16);
    EXPECT_EQ(g->operand(1)->type().dtype, DType::kBF16);
  }
  EXPECT_EQ((*grads)[0]->type().dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*grads)[1]->type().dims, (std::vector<int64_t>{4, 3}));
  int narrowing = 0;
  for (const Node* n : NodesFrom(f, forward_size)) {
    if (n->opcode() != Opcode::kConvert) continue;
    EXPECT_EQ(n->type().dtype, DType::kBF16) << "only the cotangent is rounded: " << PrintNode(*n);
    EXPECT_EQ(n->operand(0)->type().dtype, DType::kF32);
    ++narrowing;
  }
  EXPECT_EQ(narrowing, 1);  // one rounding of the cotangent, shared by both GEMMs
}

// The bf16 storage policy (frontends/nn.h): a dot_general writing a bf16 activation, a
// sigmoid of it, and a second dot_general reading that. The backward product into the
// activation (an operand that is no convert) rounds to bf16, autocast's gradient of a bf16
// tensor; the products into the weights (converts of f32 parameters) stay f32; the sigmoid's
// VJP computes in f32 and rounds once to bf16.
TEST(AutodiffTest, CotangentsTakeTheDtypeTheirOperandWasStoredOrRoundedFrom) {
  std::unique_ptr<Module> m = Parse(R"(module @m
func @f {
  %x = parameter() {index=0} : bf16[2,3]
  %w = parameter() {index=1} : f32[4,3]
  %w2 = parameter() {index=2} : f32[5,4]
  %wb = convert(%w) : bf16[4,3]
  %y = dot_general(%x, %wb) {lhs_batch=[], lhs_contract=[1], out_dtype=bf16, rhs_batch=[], rhs_contract=[1]} : bf16[2,4]
  %s = sigmoid(%y) : bf16[2,4]
  %w2b = convert(%w2) : bf16[5,4]
  %z = dot_general(%s, %w2b) {lhs_batch=[], lhs_contract=[1], out_dtype=f32, rhs_batch=[], rhs_contract=[1]} : f32[2,5]
  %l = reduce_sum(%z) {dims=[0,1]} : f32[]
  return %l
}
)");
  Function& f = *m->functions()[0];
  const size_t forward_size = f.nodes().size();
  absl::StatusOr<std::vector<Node*>> grads =
      AppendBackward(f, Find(f, "l"), {Find(f, "x"), Find(f, "w"), Find(f, "w2")});
  ASSERT_TRUE(grads.ok()) << grads.status();
  ASSERT_TRUE(VerifyModule(*m).ok());
  EXPECT_EQ((*grads)[0]->type().dtype, DType::kBF16);  // x is a bf16 input: its own dtype
  EXPECT_EQ((*grads)[1]->type().dtype, DType::kF32);
  EXPECT_EQ((*grads)[2]->type().dtype, DType::kF32);
  // Each backward product by the shape of the operand it is the cotangent of.
  std::map<std::vector<int64_t>, DType> product_dtype;
  for (const Node* n : NodesFrom(f, forward_size)) {
    if (n->opcode() == Opcode::kDotGeneral) product_dtype[n->type().dims] = n->type().dtype;
    if (n->opcode() == Opcode::kSigmoid || n->opcode() == Opcode::kMul) {
      // The sigmoid's slope y (1 - y) and its product with the cotangent run in f32.
      if (n->type().rank() == 2 && n->type().dims == std::vector<int64_t>{2, 4}) {
        EXPECT_EQ(n->type().dtype, DType::kF32) << PrintNode(*n);
      }
    }
  }
  // d(s) from %z's VJP (s is no convert) and d(x) from %y's are bf16; d(w2) and d(w) f32.
  ASSERT_EQ(product_dtype.size(), 4u);
  EXPECT_EQ((product_dtype[{2, 4}]), DType::kBF16);  // d(s)
  EXPECT_EQ((product_dtype[{2, 3}]), DType::kBF16);  // d(x)
  EXPECT_EQ((product_dtype[{4, 3}]), DType::kF32);   // d(w)
  EXPECT_EQ((product_dtype[{5, 4}]), DType::kF32);   // d(w2)
}

TEST(AutodiffTest, BackwardNodesTakeTheirForwardNodesScope) {
  std::unique_ptr<Module> m = Parse(R"(module @m
func @f {
  %x = parameter() {index=0} : f32[2,4]
  %w = parameter() {index=1} : f32[4]
  %n = rms_norm(%x, %w) {eps=1e-05} : f32[2,4] @layers.0.norm
  %t = tanh(%n) : f32[2,4] @layers.0.mlp
  %s = reduce_sum(%t) {dims=[0,1]} : f32[] @loss
  return %s
}
)");
  Function& f = *m->functions()[0];
  const size_t forward_size = f.nodes().size();
  ASSERT_TRUE(AppendBackward(f, Find(f, "s"), {Find(f, "x"), Find(f, "w")}).ok());
  for (const Node* n : NodesFrom(f, forward_size)) {
    if (n->opcode() == Opcode::kRmsNormGradInput || n->opcode() == Opcode::kRmsNormGradWeight) {
      EXPECT_EQ(n->scope(), "layers.0.norm");
    } else if (n->opcode() == Opcode::kMul || n->opcode() == Opcode::kSub) {
      EXPECT_EQ(n->scope(), "layers.0.mlp") << PrintNode(*n);
    }
  }
}

TEST(AutodiffTest, UnreachedValuesGetZeroGradients) {
  std::unique_ptr<Module> m = Parse(R"(module @m
func @f {
  %x = parameter() {index=0} : f32[3]
  %unused = parameter() {index=1} : bf16[2,2]
  %l = reduce_sum(%x) {dims=[0]} : f32[]
  return %l
}
)");
  Function& f = *m->functions()[0];
  absl::StatusOr<std::vector<Node*>> grads = AppendBackward(f, Find(f, "l"), {Find(f, "unused"), Find(f, "l")});
  ASSERT_TRUE(grads.ok()) << grads.status();
  const Node* zero = (*grads)[0];
  EXPECT_EQ(zero->opcode(), Opcode::kConstant);
  EXPECT_EQ(zero->type(), (TensorType{DType::kBF16, {2, 2}}));
  EXPECT_EQ(zero->name(), "unused.grad");
  EXPECT_EQ(*zero->attrs().GetFloat("value"), 0.0);
  // The loss's own gradient is the seed, 1.
  EXPECT_EQ((*grads)[1]->opcode(), Opcode::kConstant);
  EXPECT_EQ(*(*grads)[1]->attrs().GetFloat("value"), 1.0);
}

TEST(AutodiffTest, ReportsBadRequestsAndLeavesTheFunctionAlone) {
  std::unique_ptr<Module> m = Parse(R"(module @m
func @f {
  %x = parameter() {index=0} : f32[3]
  %e = exp(%x) : f32[3]
  %l = reduce_sum(%e) {dims=[0]} : f32[]
  return %l
}
func @g {
  %z = parameter() {index=0} : f32[]
  return %z
}
)");
  Function& f = *m->FindFunction("f");
  Function& g = *m->FindFunction("g");
  const std::string before = PrintModule(*m);

  absl::StatusOr<std::vector<Node*>> non_scalar = AppendBackward(f, Find(f, "e"), {Find(f, "x")});
  ASSERT_FALSE(non_scalar.ok());
  EXPECT_EQ(non_scalar.status().message(), "AppendBackward in @f: loss %e must be f32[], got f32[3]");

  absl::StatusOr<std::vector<Node*>> foreign_loss = AppendBackward(f, Find(g, "z"), {Find(f, "x")});
  ASSERT_FALSE(foreign_loss.ok());
  EXPECT_EQ(foreign_loss.status().message(), "AppendBackward in @f: loss %z belongs to @g");

  absl::StatusOr<std::vector<Node*>> foreign_wrt = AppendBackward(f, Find(f, "l"), {Find(g, "z")});
  ASSERT_FALSE(foreign_wrt.ok());
  EXPECT_EQ(foreign_wrt.status().message(), "AppendBackward in @f: wrt[0] %z belongs to @g");

  EXPECT_EQ(PrintModule(*m), before);
}

TEST(AutodiffTest, GradientFunctionReturnsLossThenGradients) {
  std::unique_ptr<Module> m = Parse(kMulModule);
  const Function& forward = *m->FindFunction("f");
  absl::StatusOr<Function*> grad = BuildGradientFunction(*m, forward, 0, {1}, "f_grad");
  ASSERT_TRUE(grad.ok()) << grad.status();
  ASSERT_TRUE(VerifyModule(*m).ok());
  const Function& g = **grad;
  EXPECT_EQ(g.name(), "f_grad");
  ASSERT_EQ(g.outputs().size(), 2u);
  EXPECT_EQ(g.outputs()[0]->name(), "l");
  EXPECT_EQ(g.outputs()[1]->type(), (TensorType{DType::kF32, {4}}));
  EXPECT_EQ(g.parameters().size(), 2u);
  EXPECT_EQ(forward.num_nodes(), 4);  // the forward function itself is untouched

  const std::string before = PrintModule(*m);
  EXPECT_EQ(BuildGradientFunction(*m, forward, 0, {0}, "f_grad").status().code(),
            absl::StatusCode::kAlreadyExists);
  absl::Status bad_output = BuildGradientFunction(*m, forward, 1, {0}, "other").status();
  EXPECT_EQ(bad_output.message(), "BuildGradientFunction(@f -> @other): loss output 1 out of range; @f has 1 outputs");
  absl::Status bad_param = BuildGradientFunction(*m, forward, 0, {2}, "other").status();
  EXPECT_EQ(bad_param.message(), "BuildGradientFunction(@f -> @other): parameter 2 out of range; @f has 2 parameters");
  EXPECT_EQ(PrintModule(*m), before);
}

}  // namespace
}  // namespace kiln
