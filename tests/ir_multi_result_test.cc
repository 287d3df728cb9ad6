// Multi-result nodes (ir/graph.h): one node, several typed results read through get_result
// nodes. The text form writes the group as one line; the verifier holds the group's shape;
// the protobuf and JSON forms keep it; passes treat the group as a whole.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ir/builder.h"
#include "ir/proto_io.h"
#include "ir/text_format.h"
#include "ir/verifier.h"
#include "passes/cse.h"
#include "passes/dce.h"
#include "ir/reference_backend.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

constexpr char kAdamW[] = R"(module @opt

func @step {
  %p = parameter() {index=0} : f32[4]
  %g = parameter() {index=1} : f32[4]
  %m = parameter() {index=2} : f32[4]
  %v = parameter() {index=3} : f32[4]
  %lr = parameter() {index=4} : f32[]
  %decay = parameter() {index=5} : f32[]
  %bc2 = parameter() {index=6} : f32[]
  %p2, %m2, %v2 = adamw_update(%p, %g, %m, %v, %lr, %decay, %bc2, %bc2) {beta1=0.9, beta2=0.95, eps=1e-08} : (f32[4], f32[4], f32[4]) @adamw
  return %p2, %m2, %v2 {aliases=[0,2,3]}
}
)";

std::unique_ptr<Module> Parse(absl::string_view text) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

std::string ParseError(absl::string_view text) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
  return m.ok() ? "parsed" : std::string(m.status().message());
}

TEST(MultiResult, TextLineIsOneNodeWithItsResultsAndRoundTrips) {
  std::unique_ptr<Module> m = Parse(kAdamW);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(PrintModule(*m), kAdamW);
  const Function& f = *m->functions()[0];
  ASSERT_EQ(f.num_nodes(), 7 + 1 + 3);
  const Node& update = *f.nodes()[7];
  EXPECT_EQ(update.opcode(), Opcode::kAdamWUpdate);
  EXPECT_EQ(update.num_results(), 3);
  EXPECT_EQ(update.scope(), "adamw");
  for (int i = 0; i < 3; ++i) {
    const Node* r = update.result(i);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r, f.nodes()[8 + i].get());
    EXPECT_EQ(r->result_index(), i);
    EXPECT_EQ(r->type(), (TensorType{DType::kF32, {4}}));
    EXPECT_EQ(r->scope(), "adamw");
  }
  EXPECT_EQ(f.outputs()[1]->name(), "m2");
}

TEST(MultiResult, ProtobufAndJsonKeepTheGroup) {
  std::unique_ptr<Module> m = Parse(kAdamW);
  ASSERT_NE(m, nullptr);
  absl::StatusOr<std::string> bytes = ModuleToProtoBinary(*m);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<std::unique_ptr<Module>> from_proto = ModuleFromProtoBinary(*bytes);
  ASSERT_TRUE(from_proto.ok()) << from_proto.status();
  EXPECT_EQ(PrintModule(**from_proto), kAdamW);
  absl::StatusOr<std::string> json = ModuleToProtoJson(*m);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\"result_types\""));
  absl::StatusOr<std::unique_ptr<Module>> from_json = ModuleFromProtoJson(*json);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ(PrintModule(**from_json), kAdamW);
}

TEST(MultiResult, ParserSaysWhatIsWrongWithALine) {
  auto with_line = [](absl::string_view line) {
    std::string text = kAdamW;
    const std::string original =
        "  %p2, %m2, %v2 = adamw_update(%p, %g, %m, %v, %lr, %decay, %bc2, %bc2) {beta1=0.9, beta2=0.95, eps=1e-08} : "
        "(f32[4], f32[4], f32[4]) @adamw";
    text.replace(text.find(original), original.size(), std::string(line));
    return text;
  };
  EXPECT_THAT(ParseError(with_line("  %p2, %m2 = adamw_update(%p, %g, %m, %v, %lr, %decay, %bc2, %bc2) "
                                   "{beta1=0.9, beta2=0.95, eps=1e-08} : (f32[4], f32[4])")),
              HasSubstr("written type (f32[4], f32[4]) but operands give (f32[4], f32[4], f32[4])"));
  EXPECT_THAT(ParseError(with_line("  %p2, %p2, %v2 = adamw_update(%p, %g, %m, %v, %lr, %decay, %bc2, %bc2) "
                                   "{beta1=0.9, beta2=0.95, eps=1e-08} : (f32[4], f32[4], f32[4])")),
              HasSubstr("duplicate name %p2 on one line"));
  EXPECT_THAT(ParseError(with_line("  %p2, %m2, %v2 = adamw_update(%p, %g, %m, %v, %lr, %decay, %bc2, %bc2) "
                                   "{beta1=0.9, beta2=0.95, eps=1e-08} : (f32[4], f32[5], f32[4])")),
              HasSubstr("written type (f32[4], f32[5], f32[4]) but operands give (f32[4], f32[4], f32[4])"));
  EXPECT_THAT(ParseError("module @m\n\nfunc @f {\n  %x = parameter() {index=0} : f32[2]\n"
                         "  %y = get_result(%x) {index=0} : f32[2]\n  return %y\n}\n"),
              HasSubstr("get_result is written as the results of its node"));
  EXPECT_THAT(ParseError("module @m\n\nfunc @f {\n  %x, %y = neg(%x) : (f32[2], f32[2])\n  return %y\n}\n"),
              HasSubstr("neg has 1 result(s), but 2 name(s) are written"));
  // An op of variable results (layer_norm_grad_input: 1 or 3): names and types one for one,
  // checked before the node is made (a random edit once reached an invariant there).
  EXPECT_THAT(ParseError("module @m\n\nfunc @f {\n  %x = parameter() {index=0} : f32[2,4]\n"
                         "  %w = parameter() {index=1} : f32[4]\n"
                         "  %dx, %dw = layer_norm_grad_input(%x, %w, %x) {eps=1e-05, weight_grad=1} : "
                         "(f32[2,4], f32[4], f32[4])\n  return %dx\n}\n"),
              HasSubstr("2 result name(s) are written, but 3 result type(s)"));
}

// The norms' input gradients with {weight_grad=1} (fuse-residual-norm's): dw is the last
// result, of w's type; the text and protobuf forms keep it; a flag other than 0/1, or the
// result count written without the flag, is an error that says so.
TEST(MultiResult, InputGradientsWithTheWeightGradient) {
  constexpr char kText[] = R"(module @m

func @f {
  %x = parameter() {index=0} : f32[4,8]
  %w = parameter() {index=1} : bf16[8]
  %dy = parameter() {index=2} : f32[4,8]
  %dx, %dw = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05, weight_grad=1} : (f32[4,8], bf16[8])
  %rx, %rc, %rw = add_rms_norm_grad_input(%dx, %x, %w, %dy) {copy_dtype=bf16, eps=1e-05, weight_grad=1} : (f32[4,8], bf16[4,8], bf16[8])
  return %rx, %rc, %rw, %dw
}
)";
  std::unique_ptr<Module> m = Parse(kText);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(PrintModule(*m), kText);
  absl::StatusOr<std::string> bytes = ModuleToProtoBinary(*m);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<std::unique_ptr<Module>> from_proto = ModuleFromProtoBinary(*bytes);
  ASSERT_TRUE(from_proto.ok()) << from_proto.status();
  EXPECT_EQ(PrintModule(**from_proto), kText);
  auto with = [&](absl::string_view from, absl::string_view to) {
    std::string text = kText;
    text.replace(text.find(std::string(from)), from.size(), std::string(to));
    return ParseError(text);
  };
  EXPECT_THAT(with("{eps=1e-05, weight_grad=1} : (f32[4,8], bf16[8])", "{eps=1e-05, weight_grad=2} : (f32[4,8], bf16[8])"),
              HasSubstr("weight_grad=2 must be 0 or 1"));
  EXPECT_THAT(with("{eps=1e-05, weight_grad=1} : (f32[4,8], bf16[8])", "{eps=1e-05} : (f32[4,8], bf16[8])"),
              HasSubstr("written type (f32[4,8], bf16[8]) but operands give (f32[4,8])"));
}

// Graphs built by hand (as a pass might) that break the group's shape.
TEST(MultiResult, VerifierRejectsABrokenGroup) {
  {  // a result read by something other than a get_result
    std::unique_ptr<Module> m = Parse(kAdamW);
    Function& f = *m->functions()[0];
    Node* update = f.nodes()[7].get();
    Node* neg = f.AppendNode(Opcode::kNeg, {f.nodes()[0].get()}, {}, {DType::kF32, {4}}, "neg");
    neg->ReplaceOperand(0, update);
    f.SetOutputs({neg});
    EXPECT_THAT(VerifyFunction(f).ToString(), HasSubstr("exactly 3 get_result users, not 4"));
  }
  {  // the node itself returned
    std::unique_ptr<Module> m = Parse(kAdamW);
    Function& f = *m->functions()[0];
    f.SetOutputs({f.nodes()[7].get()});
    EXPECT_THAT(VerifyFunction(f).ToString(), HasSubstr("has several results: return them, not the node"));
  }
  {  // a result missing
    std::unique_ptr<Module> m = Parse(kAdamW);
    Function& f = *m->functions()[0];
    f.SetOutputs({f.nodes()[8].get(), f.nodes()[9].get()});
    f.RemoveNode(f.nodes()[10].get());
    EXPECT_THAT(VerifyFunction(f).ToString(), HasSubstr("has 3 results, so exactly 3 get_result users, not 2"));
  }
  {  // a result that does not follow its node
    std::unique_ptr<Module> m = Parse(kAdamW);
    Function& f = *m->functions()[0];
    Node* early = f.InsertNodeBefore(f.nodes()[0].get(), Opcode::kParameter, {}, {{"index", int64_t{7}}},
                                     {DType::kF32, {4}}, "early");
    Node* late = f.AppendNode(Opcode::kGetResult, {f.nodes()[8].get()}, {{"index", int64_t{0}}}, {DType::kF32, {4}},
                              "late");
    f.SetOutputs({late, early});
    EXPECT_THAT(VerifyFunction(f).ToString(), HasSubstr("exactly 3 get_result users, not 4"));
  }
}

TEST(MultiResult, BuilderTypesAndNamesTheResults) {
  Module m("m");
  Builder b(m.AddFunction("f"));
  Node* q = *b.Parameter("q", {DType::kBF16, {1, 2, 64, 64}});
  Node* k = *b.Parameter("k", {DType::kBF16, {1, 1, 64, 64}});
  b.set_scope("attn");
  absl::StatusOr<std::vector<Node*>> r = b.MultiResultOp(Opcode::kAttention, {q, k, k}, {{"scale", 0.125}}, {"o", "q"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0]->name(), "o");
  EXPECT_EQ((*r)[1]->name(), "q.1");  // "q" is taken: made unique
  EXPECT_EQ((*r)[0]->type(), (TensorType{DType::kF32, {1, 2, 64, 64}}));
  EXPECT_EQ((*r)[1]->type(), (TensorType{DType::kF32, {1, 2, 64}}));
  EXPECT_EQ((*r)[1]->scope(), "attn");
  // A multi-result node is not an operand; the error names the caller's line.
  absl::StatusOr<Node*> bad = b.Unary(Opcode::kNeg, (*r)[0]->operand(0));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("is a multi-result attention: use one of its results"));
  EXPECT_THAT(bad.status().message(), HasSubstr("ir_multi_result_test.cc:"));
  ASSERT_TRUE(b.Return({(*r)[0]}).ok());
  EXPECT_TRUE(VerifyFunction(*m.functions()[0]).ok());
}

// DCE keeps every result of a live node and removes a dead group whole; CSE merges a
// duplicate group whole. Both leave a verified function of the same meaning.
TEST(MultiResult, DceAndCseTreatTheGroupAsAWhole) {
  std::string text = kAdamW;
  text.replace(text.find("  return %p2, %m2, %v2 {aliases=[0,2,3]}"), 40,
               "  %q2, %n2, %w2 = adamw_update(%p, %g, %m, %v, %lr, %decay, %bc2, %bc2) {beta1=0.9, beta2=0.95, "
               "eps=1e-08} : (f32[4], f32[4], f32[4]) @adamw\n  %s = add(%p2, %w2) : f32[4]\n  return %s");
  std::unique_ptr<Module> m = Parse(text);
  ASSERT_NE(m, nullptr);
  Function& f = *m->functions()[0];
  EXPECT_TRUE(EliminateCommonSubexpressions(f));
  ASSERT_TRUE(VerifyFunction(f).ok()) << VerifyFunction(f);
  EXPECT_THAT(PrintFunction(f), HasSubstr("%s = add(%p2, %v2)"));
  EXPECT_EQ(f.num_nodes(), 7 + 4 + 1);
  EXPECT_FALSE(RemoveDeadNodes(f));  // %m2 is unused but its node is live: it stays

  std::unique_ptr<Module> dead = Parse(kAdamW);
  Function& g = *dead->functions()[0];
  g.SetOutputs({g.nodes()[0].get()});
  EXPECT_TRUE(RemoveDeadNodes(g));
  EXPECT_EQ(g.num_nodes(), 7);
  EXPECT_TRUE(VerifyFunction(g).ok());
}

TEST(MultiResult, ReferenceBackendComputesEveryResultOnce) {
  std::unique_ptr<Module> m = Parse(kAdamW);
  const Function& f = *m->functions()[0];
  std::vector<HostTensor> args;
  for (const Node* p : f.parameters()) args.push_back(HostTensor::Random(p->type(), args.size() + 1, 0.1, 1.0));
  absl::StatusOr<std::vector<HostTensor>> out = EvaluateFunction(f, args);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  // m' = 0.9 m + 0.1 g s, rounded to f32 once, with g s the gradient scaled by grad_scale
  // (here %bc2, parameter 6) and rounded to f32.
  const double scale = args[6].values()[0];
  for (int64_t i = 0; i < 4; ++i) {
    const double scaled = static_cast<float>(args[1].values()[i] * scale);
    const double want = static_cast<float>(0.9 * args[2].values()[i] + 0.1 * scaled);
    EXPECT_EQ((*out)[1].values()[i], want) << i;
  }
}

}  // namespace
}  // namespace kiln
