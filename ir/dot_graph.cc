#include "ir/dot_graph.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace kiln {
namespace {

// The body of a double-quoted DOT string. Backslash must be escaped too: Graphviz reads
// "\l", "\N" and friends in labels as layout codes.
std::string DotEscape(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out.push_back(static_cast<unsigned char>(c) < 0x20 ? '?' : c);
    }
  }
  return out;
}

std::string Quoted(absl::string_view s) { return absl::StrCat("\"", DotEscape(s), "\""); }

// The clusters a scope sits in, outermost first. A numeric part stays with the part before
// it, so "model.layers.3.attn" gives "model", "model.layers.3", "model.layers.3.attn": a
// layer index names one box, not a box holding a box.
std::vector<std::string> ScopeLevels(absl::string_view scope) {
  std::vector<std::string> levels;
  if (scope.empty()) return levels;
  std::string prefix;
  for (absl::string_view part : absl::StrSplit(scope, '.')) {
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), absl::ascii_isdigit);
    bool joins_previous = numeric && !levels.empty();
    prefix = levels.empty() ? std::string(part) : absl::StrCat(prefix, ".", part);
    if (joins_previous) {
      levels.back() = prefix;
    } else {
      levels.push_back(prefix);
    }
  }
  return levels;
}

// One box of the drawing: a scope level, holding nodes and nested scopes in the order
// they first appear in the function.
struct Cluster {
  std::string scope;  // the full prefix, e.g. "layers.3"
  std::string label;  // what it adds to its parent's prefix, e.g. "attn"
  std::vector<const Node*> nodes;
  std::vector<std::unique_ptr<Cluster>> children;
};

class DotWriter {
 public:
  explicit DotWriter(const DotOptions& options) : options_(options) {}

  std::string Write(const Module& module) {
    // newrank: rank the nodes of all clusters together; dot's per-cluster ranking (2.43, on
    // Debian 12) fails with "trouble in init_rank" on some nestings of scope clusters, the
    // module of all ops among them.
    absl::StrAppend(&out_, "digraph ", Quoted(module.name()), " {\n",
                    "  graph [fontname=\"Helvetica\", fontsize=11, newrank=true];\n",
                    "  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"Helvetica\", "
                    "fontsize=10];\n",
                    "  edge [fontname=\"Helvetica\", fontsize=8, color=gray40, fontcolor=gray30];\n");
    for (size_t i = 0; i < module.functions().size(); ++i) WriteFunction(*module.functions()[i], i);
    out_ += edges_;
    out_ += "}\n";
    return std::move(out_);
  }

 private:
  // Constants and iotas with one user are detail: the user's label already says what it
  // computes, and in a real model they outnumber everything else.
  bool Hidden(const Node& n) const {
    if (!options_.hide_small_constants) return false;
    if (n.opcode() != Opcode::kConstant && n.opcode() != Opcode::kIota) return false;
    return n.users().size() == 1 && !IsOutput(n);
  }

  bool IsOutput(const Node& n) const { return output_index_.contains(&n); }

  std::string DotId(const Node& n) const { return absl::StrCat("\"f", function_index_, "n", n.id(), "\""); }

  void WriteFunction(const Function& f, size_t index) {
    function_index_ = index;
    output_index_.clear();
    for (size_t i = 0; i < f.outputs().size(); ++i) output_index_.emplace(f.outputs()[i], i);

    Cluster root;
    absl::flat_hash_map<std::string, Cluster*> by_scope;
    for (const auto& node : f.nodes()) {
      if (Hidden(*node)) continue;
      Cluster* at = &root;
      for (const std::string& level : ScopeLevels(node->scope())) {
        Cluster*& child = by_scope[level];
        if (child == nullptr) {
          auto made = std::make_unique<Cluster>();
          made->scope = level;
          made->label = at == &root ? level : level.substr(at->scope.size() + 1);
          child = made.get();
          at->children.push_back(std::move(made));
        }
        at = child;
      }
      at->nodes.push_back(node.get());
    }

    absl::StrAppend(&out_, "  subgraph \"cluster_f", index, "\" {\n", "    label=", Quoted(absl::StrCat("@", f.name())),
                    ";\n    style=solid; color=gray60;\n");
    WriteClusterBody(root, "    ");
    out_ += "  }\n";

    for (const auto& node : f.nodes()) {
      if (Hidden(*node)) continue;
      for (const Node* operand : node->operands()) {
        if (Hidden(*operand)) continue;
        const std::string label = operand->has_multiple_results()
                                      ? absl::StrCat("result ", node->result_index())
                                      : operand->type().ToString();
        absl::StrAppend(&edges_, "  ", DotId(*operand), " -> ", DotId(*node), " [label=", Quoted(label), "];\n");
      }
    }
  }

  void WriteClusterBody(const Cluster& cluster, const std::string& indent) {
    for (const Node* n : cluster.nodes) WriteNode(*n, indent);
    for (const auto& child : cluster.children) {
      absl::StrAppend(&out_, indent, "subgraph \"cluster_f", function_index_, "_", cluster_count_++, "\" {\n",
                      indent, "  label=", Quoted(child->label), "; tooltip=", Quoted(child->scope),
                      ";\n", indent, "  style=\"rounded,filled\"; fillcolor=\"#f4f4f4\"; color=gray70;\n");
      WriteClusterBody(*child, indent + "  ");
      absl::StrAppend(&out_, indent, "}\n");
    }
  }

  void WriteNode(const Node& n, const std::string& indent) {
    std::vector<std::string> types;
    for (const TensorType& t : n.result_types()) types.push_back(t.ToString());
    std::string op(n.op_name());
    if (n.body() != nullptr) {
      // A fusion is one kernel: its kind and the ops it computes, in order, stand for the body.
      std::vector<std::string> ops;
      for (const auto& m : n.body()->nodes()) {
        if (m->opcode() != Opcode::kParameter) ops.push_back(std::string(m->op_name()));
      }
      const absl::StatusOr<std::string> kind = n.attrs().GetSymbol("kind");
      op = absl::StrCat("fusion (", kind.ok() ? *kind : "?", "): ", absl::StrJoin(ops, ", "));
    }
    std::string label = absl::StrCat(n.name(), "\n", op, "\n", absl::StrJoin(types, "\n"));
    std::string style;
    if (n.body() != nullptr) style = ", style=\"rounded,filled\", fillcolor=\"#e1d5e7\"";
    if (n.opcode() == Opcode::kParameter) style = ", shape=ellipse, fillcolor=\"#dae8fc\"";
    auto output = output_index_.find(&n);
    if (output != output_index_.end()) {
      absl::StrAppend(&label, "\noutput ", output->second);
      absl::StrAppend(&style, ", fillcolor=\"#fff2cc\", color=\"#b85450\", penwidth=2");
    }
    absl::StrAppend(&out_, indent, DotId(n), " [label=", Quoted(label), style, "];\n");
  }

  const DotOptions& options_;
  std::string out_;
  std::string edges_;  // after all nodes, so that no edge pulls a node into a cluster
  size_t function_index_ = 0;
  int cluster_count_ = 0;
  absl::flat_hash_map<const Node*, size_t> output_index_;  // first output index per node
};

}  // namespace

std::string ModuleToDot(const Module& module, const DotOptions& options) {
  return DotWriter(options).Write(module);
}

}  // namespace kiln
