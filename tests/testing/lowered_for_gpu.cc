#include "tests/testing/lowered_for_gpu.h"

#include <cstdio>
#include <cstdlib>

#include "absl/container/flat_hash_map.h"
#include "passes/lower_gemm.h"

namespace kiln::testing {

std::unique_ptr<Module> LoweredForGpu(const Function& f) {
  auto module = std::make_unique<Module>("lowered");
  Function* copy = module->AddFunction(f.name());
  absl::flat_hash_map<const Node*, Node*> copy_of;
  for (const auto& n : f.nodes()) {
    std::vector<Node*> operands;
    for (const Node* o : n->operands()) operands.push_back(copy_of.at(o));
    copy_of[n.get()] = copy->AppendNodeWithTypes(n->id(), n->opcode(), std::move(operands), n->attrs(),
                                                 n->result_types(), n->name(), n->scope());
    if (n->body() != nullptr) copy_of[n.get()]->set_body(CloneFunction(*n->body(), n->body()->name()));
  }
  std::vector<Node*> outputs;
  for (const Node* o : f.outputs()) outputs.push_back(copy_of.at(o));
  copy->SetOutputs(std::move(outputs), f.output_aliases());
  absl::StatusOr<bool> lowered = LowerGemmPass().RunOnFunction(*copy);
  if (!lowered.ok()) {
    std::fprintf(stderr, "LoweredForGpu(@%s): %s\n", f.name().c_str(), std::string(lowered.status().message()).c_str());
    std::abort();
  }
  return module;
}

}  // namespace kiln::testing
