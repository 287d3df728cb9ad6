#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ir/builder.h"
#include "ir/dot_graph.h"
#include "tests/testing/all_ops.h"

namespace kiln {
namespace {

// What the test reads back from the DOT text: each cluster's full scope (its tooltip),
// the cluster it sits in, and the node statements directly inside it.
struct DotCluster {
  std::string parent;  // "" for a top-level scope of the function
  std::vector<std::string> nodes;
};

struct ParsedDot {
  std::map<std::string, DotCluster> clusters;  // by scope
  std::set<std::string> node_ids;
  std::vector<std::pair<std::string, std::string>> edges;
  std::vector<std::string> node_lines;
};

std::string Between(absl::string_view line, absl::string_view open, absl::string_view close) {
  size_t start = line.find(open);
  if (start == absl::string_view::npos) return "";
  start += open.size();
  return std::string(line.substr(start, line.find(close, start) - start));
}

// Relies on the writer's layout (one statement per line); the `dot` test below checks
// that the same text is also valid Graphviz.
ParsedDot ParseDot(const std::string& dot) {
  ParsedDot parsed;
  std::vector<std::string> stack;  // scopes of the open clusters; "" for the function box
  std::vector<std::string> lines = absl::StrSplit(dot, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::string_view line = absl::StripLeadingAsciiWhitespace(lines[i]);
    if (absl::StartsWith(line, "subgraph \"cluster_")) {
      std::string scope = Between(lines[i + 1], "tooltip=\"", "\"");  // "" for a function
      if (!scope.empty()) parsed.clusters[scope].parent = stack.back();
      stack.push_back(scope);
    } else if (line == "}" && !stack.empty()) {
      stack.pop_back();
    } else if (absl::StartsWith(line, "\"f") && absl::StrContains(line, " -> ")) {
      std::vector<std::string> ends = absl::StrSplit(Between(line, "", " ["), " -> ");
      parsed.edges.push_back({ends[0], ends[1]});
    } else if (absl::StartsWith(line, "\"f")) {
      std::string id = Between(line, "", " [");
      parsed.node_ids.insert(id);
      parsed.node_lines.push_back(std::string(line));
      if (!stack.empty() && !stack.back().empty()) parsed.clusters[stack.back()].nodes.push_back(std::string(line));
    }
  }
  return parsed;
}

std::unique_ptr<Module> LayeredModule(int layers) {
  auto m = std::make_unique<Module>("layered");
  Builder b(m->AddFunction("forward"));
  Node* x = *b.Parameter("x", {DType::kF32, {2, 8}});
  for (int l = 0; l < layers; ++l) {
    b.set_scope(absl::StrCat("layers.", l, ".attn"));
    x = *b.Unary(Opcode::kTanh, x);
    b.set_scope(absl::StrCat("layers.", l, ".mlp"));
    x = *b.Unary(Opcode::kSigmoid, x);
  }
  b.set_scope("head");
  Node* loss = *b.ReduceSum(x, {0, 1});
  if (!b.Return({loss}).ok()) std::abort();
  return m;
}

TEST(Dot, SixteenLayersGiveSixteenLayerBoxes) {
  ParsedDot dot = ParseDot(ModuleToDot(*LayeredModule(16)));
  std::set<std::string> top;
  for (const auto& [scope, cluster] : dot.clusters) {
    if (cluster.parent.empty()) top.insert(scope);
  }
  std::set<std::string> expected = {"head"};
  for (int l = 0; l < 16; ++l) expected.insert(absl::StrCat("layers.", l));
  EXPECT_EQ(top, expected);
  for (int l = 0; l < 16; ++l) {
    for (const char* part : {"attn", "mlp"}) {
      std::string scope = absl::StrCat("layers.", l, ".", part);
      ASSERT_TRUE(dot.clusters.count(scope)) << scope;
      EXPECT_EQ(dot.clusters[scope].parent, absl::StrCat("layers.", l));
      ASSERT_EQ(dot.clusters[scope].nodes.size(), 1u) << scope;
      EXPECT_TRUE(absl::StrContains(dot.clusters[scope].nodes[0], part[0] == 'a' ? "\\ntanh\\n" : "\\nsigmoid\\n"));
    }
  }
}

TEST(Dot, AllOpsNodesSitInTheirScopes) {
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  ParsedDot dot = ParseDot(ModuleToDot(*m));
  EXPECT_EQ(dot.clusters["layers.0.unary"].parent, "layers.0");
  EXPECT_EQ(dot.clusters["layers.1.composite"].parent, "layers.1");
  auto has_op = [&](const std::string& scope, const std::string& op) {
    for (const std::string& line : dot.clusters[scope].nodes) {
      if (absl::StrContains(line, absl::StrCat("\\n", op, "\\n"))) return true;
    }
    return false;
  };
  EXPECT_TRUE(has_op("layers.0.unary", "rsqrt"));
  EXPECT_TRUE(has_op("layers.1.shape", "dot_general"));
  EXPECT_TRUE(has_op("layers.1.composite", "rope"));
  EXPECT_FALSE(has_op("layers.1.composite", "dot_general"));
  // Every edge joins two drawn nodes, one per operand use.
  for (const auto& [from, to] : dot.edges) {
    EXPECT_TRUE(dot.node_ids.count(from)) << from;
    EXPECT_TRUE(dot.node_ids.count(to)) << to;
  }
}

TEST(Dot, ParametersAreEllipsesOutputsHighlightedEdgesTyped) {
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  std::string text = ModuleToDot(*m);
  ParsedDot dot = ParseDot(text);
  int ellipses = 0, outputs = 0;
  for (const std::string& line : dot.node_lines) {
    bool is_param = absl::StrContains(line, "\\nparameter\\n");
    EXPECT_EQ(absl::StrContains(line, "shape=ellipse"), is_param) << line;
    ellipses += is_param;
    if (absl::StrContains(line, "\\noutput ")) {
      ++outputs;
      EXPECT_TRUE(absl::StrContains(line, "penwidth=2")) << line;
    }
  }
  // Every function's parameters (the fusion bodies' own are not drawn) and outputs.
  size_t all_parameters = 0, all_outputs = 0;
  for (const auto& f : m->functions()) {
    all_parameters += f->parameters().size();
    all_outputs += f->outputs().size();
  }
  EXPECT_EQ(ellipses, static_cast<int>(all_parameters));
  EXPECT_EQ(outputs, static_cast<int>(all_outputs));
  EXPECT_TRUE(absl::StrContains(text, "fusion (loop): broadcast, mul, tanh, convert")) << text;
  EXPECT_TRUE(absl::StrContains(text, "fusion (reduction): mul, reduce_sum")) << text;
  EXPECT_TRUE(absl::StrContains(text, "[label=\"x\\nparameter\\nf32[2,3,4]\", shape=ellipse"));
  EXPECT_TRUE(absl::StrContains(text, "\"f0n0\" -> \"f0n6\" [label=\"f32[2,3,4]\"]")) << "x feeds neg";
}

TEST(Dot, HidesSingleUseConstantsOnlyWhenAsked) {
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  auto count_leaves = [&](const DotOptions& options) {
    ParsedDot dot = ParseDot(ModuleToDot(*m, options));
    int leaves = 0;
    for (const std::string& line : dot.node_lines) {
      leaves += absl::StrContains(line, "\\nconstant\\n") || absl::StrContains(line, "\\niota\\n");
    }
    for (const auto& [from, to] : dot.edges) EXPECT_TRUE(dot.node_ids.count(from)) << "edge from hidden " << from;
    return leaves;
  };
  EXPECT_EQ(count_leaves(DotOptions{.hide_small_constants = true}), 0);
  // @main's two constants and one iota, @paged_kv's slots, tables and positions twice,
  // @sampling's sampling and draws.
  EXPECT_EQ(count_leaves(DotOptions{.hide_small_constants = false}), 3 + 6 + 2);
}

// Names outside the verifier's alphabet still make valid DOT: the writer escapes.
std::unique_ptr<Module> AwkwardlyNamedModule() {
  auto m = std::make_unique<Module>("quote\" back\\slash \\l newline\n");
  Function* f = m->AddFunction("f");
  Node* x = f->AppendNode(Opcode::kParameter, {}, AttrMap{{"index", int64_t{0}}}, {DType::kF32, {2}}, "x\"y", "a.b");
  f->SetOutputs({f->AppendNode(Opcode::kNeg, {x}, {}, {DType::kF32, {2}}, "n\\l", ".3..b")});
  return m;
}

TEST(Dot, EscapesLabels) {
  std::string text = ModuleToDot(*AwkwardlyNamedModule());
  EXPECT_TRUE(absl::StrContains(text, "digraph \"quote\\\" back\\\\slash \\\\l newline\\n\" {")) << text;
  EXPECT_TRUE(absl::StrContains(text, "[label=\"x\\\"y\\nparameter\\nf32[2]\"")) << text;
}

bool HaveDot() { return std::system("command -v dot >/dev/null 2>&1") == 0; }

TEST(Dot, GraphvizRendersIt) {
  if (!HaveDot()) GTEST_SKIP() << "Graphviz `dot` is not installed";
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> modules;
  modules.emplace_back("all_ops", testing::BuildAllOpsModule());
  modules.emplace_back("layered", LayeredModule(16));
  modules.emplace_back("awkward", AwkwardlyNamedModule());
  for (const auto& [name, module] : modules) {
    std::string base = absl::StrCat(::testing::TempDir(), "kiln_dot_test_", name);
    std::ofstream(base + ".dot") << ModuleToDot(*module);
    std::string command = absl::StrCat("dot -Tsvg '", base, ".dot' -o '", base, ".svg'");
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    std::ifstream svg(base + ".svg");
    std::string head(5, '\0');
    svg.read(head.data(), head.size());
    EXPECT_TRUE(head == "<?xml" || head == "<svg ") << name << ": " << head;
  }
}

}  // namespace
}  // namespace kiln
