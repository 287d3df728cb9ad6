// The IR text form (ir/text_format.h): exact printing, byte-for-byte round trips, and
// positioned errors for malformed input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "ir/builder.h"
#include "ir/text_format.h"
#include "tests/testing/all_ops.h"

namespace kiln {
namespace {

std::string MessageOf(const absl::Status& s) { return std::string(s.message()); }

uint64_t Bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof(u));
  return u;
}

// The example of the header comment, built through the Builder.
std::unique_ptr<Module> BuildTinyModule() {
  auto m = std::make_unique<Module>("tiny");
  Builder b(m->AddFunction("forward"));
  Node* x = *b.Parameter("x", {DType::kF32, {2, 8}});
  Node* w = *b.Parameter("w", {DType::kF32, {8}});
  b.set_scope("layers.0.attn_norm");
  Node* y = *b.RmsNorm(x, w, 1e-5);
  b.set_scope("");
  Node* s = *b.ReduceSum(y, {0, 1});
  EXPECT_TRUE(b.Return({s, x}, {-1, 0}).ok());
  return m;
}

constexpr char kTinyText[] =
    "module @tiny\n"
    "\n"
    "func @forward {\n"
    "  %x = parameter() {index=0} : f32[2,8]\n"
    "  %w = parameter() {index=1} : f32[8]\n"
    "  %PLACEHOLDER_Y = rms_norm(%x, %w) {eps=1e-05} : f32[2,8] @layers.0.attn_norm\n"
    "  %PLACEHOLDER_S = reduce_sum(%PLACEHOLDER_Y) {dims=[0,1]} : f32[]\n"
    "  return %PLACEHOLDER_S, %x {aliases=[-1,0]}\n"
    "}\n";

// The tiny module's text with the builder's generated names filled in.
std::string TinyText(const Module& m) {
  const auto& nodes = m.functions()[0]->nodes();
  std::string text = kTinyText;
  for (auto [placeholder, index] : {std::pair{"PLACEHOLDER_Y", 2}, std::pair{"PLACEHOLDER_S", 3}}) {
    for (size_t at; (at = text.find(placeholder)) != std::string::npos;) {
      text.replace(at, std::strlen(placeholder), nodes[index]->name());
    }
  }
  return text;
}

TEST(IrText, PrintsTheDocumentedLayout) {
  std::unique_ptr<Module> m = BuildTinyModule();
  EXPECT_EQ(PrintModule(*m), TinyText(*m));
  EXPECT_EQ(PrintNode(*m->functions()[0]->nodes()[0]), "%x = parameter() {index=0} : f32[2,8]");
}

TEST(IrText, ModuleWithoutFunctionsIsItsHeaderLine) {
  Module m("empty");
  EXPECT_EQ(PrintModule(m), "module @empty\n");
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule("module @empty\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)->name(), "empty");
  EXPECT_TRUE((*parsed)->functions().empty());
}

TEST(IrText, AllOpsModuleRoundTripsByteForByte) {
  ASSERT_TRUE(testing::OpsMissingFromAllOpsModule().empty()) << "all_ops.cc must use every op";
  std::unique_ptr<Module> original = testing::BuildAllOpsModule();
  const std::string text = PrintModule(*original);
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(PrintModule(**parsed), text);

  // Not just the same text: the same graph, node for node.
  const Function& a = *original->functions()[0];
  const Function& b = *(*parsed)->functions()[0];
  ASSERT_EQ(a.num_nodes(), b.num_nodes());
  for (int64_t i = 0; i < a.num_nodes(); ++i) {
    const Node& na = *a.nodes()[i];
    const Node& nb = *b.nodes()[i];
    EXPECT_EQ(na.name(), nb.name());
    EXPECT_EQ(na.opcode(), nb.opcode());
    EXPECT_EQ(na.result_types(), nb.result_types());
    EXPECT_TRUE(na.attrs() == nb.attrs()) << na.name();
    EXPECT_EQ(na.scope(), nb.scope());
    ASSERT_EQ(na.num_operands(), nb.num_operands());
    for (int j = 0; j < na.num_operands(); ++j) EXPECT_EQ(na.operand(j)->name(), nb.operand(j)->name());
  }
  ASSERT_EQ(a.outputs().size(), b.outputs().size());
  for (size_t i = 0; i < a.outputs().size(); ++i) EXPECT_EQ(a.outputs()[i]->name(), b.outputs()[i]->name());
}

// Each node of the all-ops module, alone in a function whose parameters stand in for its
// operands, parses back to the same line: every op kind round-trips on its own.
TEST(IrText, EveryOpLineRoundTripsAlone) {
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  std::set<Opcode> covered;
  for (const auto& function : m->functions()) {  // @main, then @attention
    const Function& f = *function;
    std::string parameters;
    for (const Node* p : f.parameters()) absl::StrAppend(&parameters, "  ", PrintNode(*p), "\n");
    const int64_t num_parameters = static_cast<int64_t>(f.parameters().size());
    for (const auto& node : f.nodes()) {
      if (node->opcode() == Opcode::kGetResult) {  // written on its multi-result node's line
        covered.insert(node->opcode());
        continue;
      }
      // A multi-result node is found, and returned, by its first result.
      const Node& named = node->has_multiple_results() ? *node->result(0) : *node;
      std::string body = parameters;
      std::set<std::string> stubbed;
      int64_t next_index = num_parameters;
      for (const Node* o : node->operands()) {
        if (o->opcode() == Opcode::kParameter || !stubbed.insert(o->name()).second) continue;
        absl::StrAppend(&body, "  %", o->name(), " = parameter() {index=", next_index++, "} : ",
                        o->type().ToString(), "\n");
      }
      const std::string line = PrintNode(*node);
      if (node->opcode() != Opcode::kParameter) absl::StrAppend(&body, "  ", PrintNodeWithBody(*node, "  "), "\n");
      const std::string text = absl::StrCat("module @one\n\nfunc @f {\n", body, "  return %", named.name(), "\n}\n");
      absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
      ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
      const Node* reparsed = (*parsed)->functions()[0]->FindNode(named.name());
      ASSERT_NE(reparsed, nullptr);
      if (node->has_multiple_results()) reparsed = reparsed->operand(0);
      EXPECT_EQ(PrintNode(*reparsed), line);
      EXPECT_EQ(PrintModule(**parsed), text);
      covered.insert(node->opcode());
    }
  }
  EXPECT_EQ(covered.size(), static_cast<size_t>(kNumOpcodes));
}

TEST(IrText, HandWrittenTextWithCommentsAndSpacingParses) {
  const char* text =
      "// a hand-written module\n"
      "module   @tiny // trailing comment\n"
      "func @forward{\n"
      "\t%x=parameter(){index=0}:f32[2,8]\r\n"
      "   %w = parameter ( ) { index = 1 } : f32 [ 8 ]   // weights\n"
      "\n"
      "  %y = rms_norm( %x ,%w ){eps=1e-05}:f32[2,8]@layers.0.attn_norm\n"
      "  %s = reduce_sum(%y) {dims=[ 0 , 1 ]} : f32[]\n"
      "  return %s ,%x { aliases = [ -1 , 0 ] }\n"
      "}";
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(PrintModule(**parsed),
            "module @tiny\n"
            "\n"
            "func @forward {\n"
            "  %x = parameter() {index=0} : f32[2,8]\n"
            "  %w = parameter() {index=1} : f32[8]\n"
            "  %y = rms_norm(%x, %w) {eps=1e-05} : f32[2,8] @layers.0.attn_norm\n"
            "  %s = reduce_sum(%y) {dims=[0,1]} : f32[]\n"
            "  return %s, %x {aliases=[-1,0]}\n"
            "}\n");
  const Function& f = *(*parsed)->functions()[0];
  EXPECT_EQ(f.output_aliases(), (std::vector<int64_t>{-1, 0}));
  EXPECT_EQ(f.FindNode("y")->scope(), "layers.0.attn_norm");
  EXPECT_EQ(f.FindNode("s")->scope(), "");
}

TEST(IrText, SeveralFunctionsKeepTheirOrder) {
  const std::string text =
      "module @two\n"
      "\n"
      "func @b {\n"
      "  %x = parameter() {index=0} : i32[3]\n"
      "  return %x\n"
      "}\n"
      "\n"
      "func @a {\n"
      "  %x = parameter() {index=0} : pred[]\n"
      "  return %x, %x\n"
      "}\n";
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(PrintModule(**parsed), text);
}

TEST(IrText, AttributeKindsFollowTheGrammar) {
  const char* text =
      "module @m\n"
      "func @f {\n"
      "  %x = parameter() {note_a=1, note_b=1.0, note_c=[], note_d=[1,2.5], "
      "note_e=\"q\\\"b\\\\n\\n\\t\\x01\\xff\", note_f=lt, note_g=-7, note_h=2e3, note_i=[3,-4], note_j=-inf} : f32[]\n"
      "  return %x\n"
      "}\n";
  // `index` is missing on purpose: the error must come from inference, not the grammar.
  absl::StatusOr<std::unique_ptr<Module>> missing_index = ParseModule(text);
  ASSERT_FALSE(missing_index.ok());
  EXPECT_NE(MessageOf(missing_index.status()).find("missing attribute 'index'"), std::string::npos);

  std::string with_index = text;
  with_index.replace(with_index.find("{note_a=1"), 9, "{index=0, note_a=1");
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(with_index);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const AttrMap& attrs = (*parsed)->functions()[0]->FindNode("x")->attrs();
  EXPECT_EQ(*attrs.GetInt("note_a"), 1);
  EXPECT_FALSE(attrs.GetInt("note_b").ok()) << "1.0 is a float";
  EXPECT_EQ(*attrs.GetFloat("note_b"), 1.0);
  EXPECT_EQ(*attrs.GetInts("note_c"), std::vector<int64_t>{});
  EXPECT_FALSE(attrs.GetInts("note_d").ok()) << "a list holding a float is a float list";
  EXPECT_EQ(*attrs.GetFloats("note_d"), (std::vector<double>{1.0, 2.5}));
  EXPECT_EQ(*attrs.GetString("note_e"), std::string("q\"b\\n\n\t\x01\xff"));
  EXPECT_EQ(*attrs.GetSymbol("note_f"), "lt");
  EXPECT_EQ(*attrs.GetInt("note_g"), -7);
  EXPECT_EQ(*attrs.GetFloat("note_h"), 2000.0);
  EXPECT_FALSE(attrs.GetInt("note_h").ok());
  EXPECT_EQ(*attrs.GetInts("note_i"), (std::vector<int64_t>{3, -4}));
  EXPECT_EQ(*attrs.GetFloat("note_j"), -std::numeric_limits<double>::infinity());
  const std::string printed = PrintModule(**parsed);
  EXPECT_NE(printed.find("note_d=[1.0,2.5]"), std::string::npos) << printed;
  absl::StatusOr<std::unique_ptr<Module>> again = ParseModule(printed);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(PrintModule(**again), printed);
}

TEST(IrText, EveryByteOfAStringRoundTrips) {
  std::string all_bytes;
  for (int c = 0; c < 256; ++c) all_bytes += static_cast<char>(c);
  Module m("m");
  Function* f = m.AddFunction("note_f");
  Node* x = f->AppendNode(Opcode::kParameter, {}, AttrMap{{"index", int64_t{0}}, {"note_s", all_bytes}},
                          {DType::kF32, {}}, "x");
  f->SetOutputs({x});
  const std::string text = PrintModule(m);
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*(*parsed)->functions()[0]->FindNode("x")->attrs().GetString("note_s"), all_bytes);
  EXPECT_EQ(PrintModule(**parsed), text);
}

TEST(IrText, DoublesRoundTripBitExactly) {
  const std::vector<double> values = {
      0.1 + 0.2,  // 0.30000000000000004: needs all 17 significant digits
      1.0 / 3.0,
      -0.0,
      std::numeric_limits<double>::infinity(),
      -std::numeric_limits<double>::infinity(),
      1e-30,
      std::numeric_limits<double>::denorm_min(),
      std::numeric_limits<double>::max(),
      std::numeric_limits<double>::lowest(),
      123456789.0,
  };
  Module m("m");
  Builder b(m.AddFunction("f"));
  std::vector<Node*> outputs;
  outputs.push_back(*b.ConstantValues(values, {DType::kF32, {static_cast<int64_t>(values.size())}}));
  for (double v : values) outputs.push_back(*b.Constant(v, {DType::kF32, {}}));
  outputs.push_back(*b.Constant(std::numeric_limits<double>::quiet_NaN(), {DType::kF32, {}}));
  ASSERT_TRUE(b.Return(outputs).ok());

  const std::string text = PrintModule(m);
  EXPECT_NE(text.find("0.30000000000000004"), std::string::npos) << text;
  EXPECT_NE(text.find("-0.0"), std::string::npos) << text;
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(PrintModule(**parsed), text);

  const Function& g = *(*parsed)->functions()[0];
  std::vector<double> dense = *g.outputs()[0]->attrs().GetFloats("values");
  ASSERT_EQ(dense.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(Bits(dense[i]), Bits(values[i])) << "values[" << i << "]";
    EXPECT_EQ(Bits(*g.outputs()[i + 1]->attrs().GetFloat("value")), Bits(values[i])) << "value #" << i;
  }
  EXPECT_TRUE(std::isnan(*g.outputs().back()->attrs().GetFloat("value")));
}

// A function around one line under test; the line is line 4 of the text.
std::string WithLine(absl::string_view line) {
  return absl::StrCat("module @m\nfunc @f {\n  %x = parameter() {index=0} : f32[2]\n", line,
                      "\n  return %x\n}\n");
}

struct Malformed {
  const char* what;
  std::string text;
  int line;
  int column;
  const char* phrase;
};

TEST(IrText, MalformedInputsGivePositionedErrors) {
  const std::string good = WithLine("  %y = neg(%x) : f32[2]");
  ASSERT_TRUE(ParseModule(good).ok()) << ParseModule(good).status();
  const std::vector<Malformed> cases = {
      {"empty input", "", 1, 1, "expected 'module', got end of input"},
      {"no module name", "module tiny\n", 1, 8, "expected '@', got 'tiny'"},
      {"unknown op", WithLine("  %y = frobnicate(%x) : f32[2]"), 4, 8, "unknown op 'frobnicate'"},
      {"missing ':'", WithLine("  %y = neg(%x) f32[2]"), 4, 16, "expected ':', got 'f32'"},
      {"undefined operand", WithLine("  %y = neg(%q) : f32[2]"), 4, 12, "undefined operand %q"},
      {"duplicate name", WithLine("  %x = neg(%x) : f32[2]"), 4, 3, "duplicate name %x (first defined on line 3)"},
      {"bad dtype", WithLine("  %y = neg(%x) : f33[2]"), 4, 18, "unknown element type 'f33'"},
      {"written type", WithLine("  %y = neg(%x) : f32[3]"), 4, 3,
       "%y = neg: written type f32[3] but operands give f32[2]"},
      {"inference", WithLine("  %y = add(%x) : f32[2]"), 4, 3, "%y = add: operands (f32[2]): expects 2 operand(s)"},
      {"unterminated string", WithLine("  %y = neg(%x) {note=\"abc} : f32[2]"), 4, 22, "unterminated string"},
      {"bad escape", WithLine("  %y = neg(%x) {note=\"a\\qb\"} : f32[2]"), 4, 24, "invalid escape"},
      {"unbalanced attribute brace", WithLine("  %y = neg(%x) {a=1 : f32[2]"), 4, 21, "expected '}', got ':'"},
      {"unclosed function", "module @m\nfunc @f {\n  %x = parameter() {index=0} : f32[2]\n  return %x\n", 5, 1,
       "expected '}', got end of input"},
      {"extra closing brace", WithLine("  %y = neg(%x) : f32[2]") + "}\n", 7, 1,
       "expected 'func' or end of input, got '}'"},
      {"missing return", "module @m\nfunc @f {\n  %x = parameter() {index=0} : f32[2]\n}\n", 4, 1,
       "expected '%' or 'return', got '}'"},
      {"trailing garbage", WithLine("  %y = neg(%x) : f32[2]") + "extra\n", 7, 1, "got 'extra'"},
      {"stray character", WithLine("  %y = neg(%x) ; f32[2]"), 4, 16, "expected ':', got ';'"},
      {"integer overflow", WithLine("  %y = neg(%x) : f32[99999999999999999999]"), 4, 22, "integer overflow"},
      {"negative dimension", WithLine("  %y = neg(%x) : f32[-1]"), 4, 22, "negative dimension -1"},
      {"absurd element count", WithLine("  %y = neg(%x) : f32[1048576,1048576,2]"), 4, 38, "more than 2^40 elements"},
      {"float dimension", WithLine("  %y = neg(%x) : f32[2.0]"), 4, 22, "expected dimension, got '2.0'"},
      {"bad number", WithLine("  %y = neg(%x) {a=1.2.3} : f32[2]"), 4, 19, "bad number '1.2.3'"},
      {"huge double", WithLine("  %y = neg(%x) {a=1e999} : f32[2]"), 4, 19, "out of range for a double"},
      {"duplicate attribute", WithLine("  %y = neg(%x) {a=1, a=2} : f32[2]"), 4, 22, "duplicate attribute 'a'"},
      {"empty attributes", WithLine("  %y = neg(%x) {} : f32[2]"), 4, 17, "expected attribute name, got '}'"},
      {"nested list", WithLine("  %y = neg(%x) {a=[[1]]} : f32[2]"), 4, 20, "expected number, got '['"},
      {"name with '+'", WithLine("  %y+ = neg(%x) : f32[2]"), 4, 4, "expected node name, got 'y+'"},
      {"duplicate parameter index", WithLine("  %y = parameter() {index=0} : f32[2]"), 4, 3,
       "parameter index 0 is already used on line 3"},
      {"missing parameter index (verifier)", WithLine("  %y = parameter() {index=2} : f32[2]"), 5, 3,
       "index 1 is missing"},
      {"alias of another type (verifier)",
       "module @m\nfunc @f {\n  %x = parameter() {index=0} : f32[2]\n  %y = convert(%x) : bf16[2]\n"
       "  return %y {aliases=[0]}\n}\n",
       5, 3, "aliases parameter 0 of another type"},
      {"duplicate function",
       "module @m\nfunc @f {\n  %x = parameter() {index=0} : f32[2]\n  return %x\n}\nfunc @f {\n", 6, 7,
       "duplicate function @f"},
  };
  for (const Malformed& c : cases) {
    absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(c.text);
    ASSERT_FALSE(parsed.ok()) << c.what << " parsed:\n" << c.text;
    const std::string message = MessageOf(parsed.status());
    const std::string position = absl::StrCat(c.line, ":", c.column, ": ");
    EXPECT_EQ(message.substr(0, position.size()), position) << c.what << ": " << message;
    EXPECT_NE(message.find(c.phrase), std::string::npos) << c.what << ": " << message;
  }
}

TEST(IrText, LongTokensAreShortenedInErrors) {
  const std::string text = "module " + std::string(10000, 'a');
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
  ASSERT_FALSE(parsed.ok());
  EXPECT_LT(parsed.status().message().size(), 120u) << parsed.status();
  EXPECT_NE(MessageOf(parsed.status()).find("...'"), std::string::npos) << parsed.status();
}

}  // namespace
}  // namespace kiln
