#include "ir/node_predicates.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kiln {

bool IsSplatConstant(const Node& node) {
  return node.opcode() == Opcode::kConstant && !node.attrs().Has("values");
}

std::optional<double> SplatValue(const Node& node) {
  const Node* n = &node;
  while (n->opcode() == Opcode::kBroadcast) n = n->operand(0);
  if (n->opcode() != Opcode::kConstant) return std::nullopt;
  if (IsSplatConstant(*n)) {
    absl::StatusOr<double> v = n->attrs().GetFloat("value");
    return v.ok() ? std::optional<double>(*v) : std::nullopt;
  }
  absl::StatusOr<std::vector<double>> values = n->attrs().GetFloats("values");
  if (!values.ok() || values->empty()) return std::nullopt;
  for (double v : *values) {
    if (std::memcmp(&v, &values->front(), sizeof(double)) != 0) return std::nullopt;
  }
  return values->front();
}

bool IsSplatOf(const Node& node, double want) {
  std::optional<double> v = SplatValue(node);
  return v && *v == want && std::signbit(*v) == std::signbit(want);
}

bool IsFunctionOutput(const Node& node) {
  const std::vector<Node*>& outputs = node.parent()->outputs();
  return std::find(outputs.begin(), outputs.end(), &node) != outputs.end();
}

bool HasFp8Slots(const Node& gemm) {
  for (const char* slot : {"scaled", "amax"}) {
    absl::StatusOr<int64_t> v = gemm.attrs().GetInt(slot);
    if (v.ok() && *v != 0) return true;
  }
  return false;
}

int64_t CrossEntropyClasses(const Node& node) {
  if (absl::StatusOr<int64_t> classes = node.attrs().GetInt("classes"); classes.ok()) return *classes;
  return node.operand(0)->type().dims[1];
}

}  // namespace kiln
