// The printing half of ir/text_format.h. Every choice here (separators, spacing, which
// parts are omitted when empty) is mirrored by ir/text_parser.cc, so printed text parses
// back to a module that prints identically.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/text_format.h"

namespace kiln {

std::string PrintNode(const Node& node) {
  // A multi-result node is written as its results, `%a, %b = op(...) : (ta, tb)`; its
  // get_result nodes print nothing of their own.
  std::string line;
  if (node.has_multiple_results()) {
    for (int i = 0; i < node.num_results(); ++i) {
      const Node* result = node.result(i);
      absl::StrAppend(&line, i ? ", %" : "%", result != nullptr ? result->name() : absl::StrCat(node.name(), ".", i));
    }
  } else {
    absl::StrAppend(&line, "%", node.name());
  }
  absl::StrAppend(&line, " = ", node.op_name(), "(");
  for (int i = 0; i < node.num_operands(); ++i) {
    absl::StrAppend(&line, i ? ", %" : "%", node.operand(i)->name());
  }
  line += ")";
  if (!node.attrs().empty()) absl::StrAppend(&line, " ", node.attrs().ToString());
  if (node.has_multiple_results()) {
    std::vector<std::string> types;
    for (const TensorType& t : node.result_types()) types.push_back(t.ToString());
    absl::StrAppend(&line, " : (", absl::StrJoin(types, ", "), ")");
  } else {
    absl::StrAppend(&line, " : ", node.type().ToString());
  }
  if (!node.scope().empty()) absl::StrAppend(&line, " @", node.scope());
  return line;
}

namespace {
void AppendBody(const Function& function, absl::string_view indent, std::string& out);
}  // namespace

std::string PrintNodeWithBody(const Node& node, absl::string_view indent) {
  std::string out = PrintNode(node);
  if (node.body() == nullptr) return out;
  out += " {\n";
  AppendBody(*node.body(), absl::StrCat(indent, "  "), out);
  absl::StrAppend(&out, indent, "}");
  return out;
}

namespace {

// The nodes and return line of `function`, each line indented by `indent`; a fusion's body
// follows its node's line, two spaces deeper, closed by a `}` at the node's indent.
void AppendBody(const Function& function, absl::string_view indent, std::string& out) {
  for (const auto& node : function.nodes()) {
    if (node->opcode() == Opcode::kGetResult) continue;  // part of its node's line
    absl::StrAppend(&out, indent, PrintNodeWithBody(*node, indent), "\n");
  }
  absl::StrAppend(&out, indent, "return");
  for (size_t i = 0; i < function.outputs().size(); ++i) {
    absl::StrAppend(&out, i ? ", %" : " %", function.outputs()[i]->name());
  }
  if (!function.output_aliases().empty()) {
    absl::StrAppend(&out, " {aliases=[", absl::StrJoin(function.output_aliases(), ","), "]}");
  }
  out += "\n";
}

}  // namespace

std::string PrintFunction(const Function& function) {
  std::string out = absl::StrCat("func @", function.name(), " {\n");
  AppendBody(function, "  ", out);
  return out + "}\n";
}

std::string PrintModule(const Module& module) {
  std::string out = absl::StrCat("module @", module.name(), "\n");
  for (const auto& function : module.functions()) absl::StrAppend(&out, "\n", PrintFunction(*function));
  return out;
}

}  // namespace kiln
