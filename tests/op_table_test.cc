// DESIGN.md principle 1: every op of ir/op_table.h has shape inference, reference
// semantics, a VJP rule and a lowering. Each layer owns one column of this table: a TEST
// that walks every opcode and names the ops its layer lacks. Autodiff and codegen add
// theirs next to ReferenceSemantics.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "absl/strings/str_join.h"
#include "codegen/lower_node.h"
#include "ir/op_table.h"
#include "ir/reference_backend.h"
#include "tests/testing/all_ops.h"

namespace kiln {
namespace {

// The ops for which `has` is false, by name.
std::vector<std::string> OpsLacking(bool (*has)(Opcode)) {
  std::vector<std::string> missing;
  for (int i = 0; i < kNumOpcodes; ++i) {
    const Opcode op = static_cast<Opcode>(i);
    if (!has(op)) missing.emplace_back(OpName(op));
  }
  return missing;
}

TEST(OpTable, AllOpsModuleUsesEveryOp) {
  std::vector<std::string> missing;
  for (Opcode op : testing::OpsMissingFromAllOpsModule()) missing.emplace_back(OpName(op));
  EXPECT_TRUE(missing.empty()) << "tests/testing/all_ops.cc does not use: " << absl::StrJoin(missing, ", ");
}

// Column: the CPU reference backend (ir/reference_backend.cc) dispatches the op...
TEST(OpTable, ReferenceSemantics) {
  const std::vector<std::string> missing = OpsLacking(ReferenceSupports);
  EXPECT_TRUE(missing.empty()) << "no reference semantics for: " << absl::StrJoin(missing, ", ");
}

// ...and actually evaluates it: the all-ops module runs on random inputs and every output
// is finite.
TEST(OpTable, ReferenceEvaluatesAllOpsModule) {
  std::unique_ptr<Module> module = testing::BuildAllOpsModule();
  const Function& f = *module->functions()[0];
  for (uint64_t seed = 0; seed < 5; ++seed) {
    std::vector<HostTensor> args;
    for (const Node* p : f.parameters()) {
      // Index-like parameters must stay in range of what they index.
      const double hi = p->name() == "ids" ? 5 : p->name() == "labels" ? 4 : p->name() == "pos" ? 64 : 1;
      const double lo = IsInteger(p->type().dtype) ? 0 : -1;
      args.push_back(HostTensor::Random(p->type(), seed * 100 + args.size(), lo, hi));
    }
    auto outputs = EvaluateFunction(f, args);
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    ASSERT_EQ(outputs->size(), f.outputs().size());
    for (size_t i = 0; i < outputs->size(); ++i) {
      EXPECT_EQ((*outputs)[i].type(), f.outputs()[i]->type());
      for (double v : (*outputs)[i].values()) {
        ASSERT_TRUE(std::isfinite(v)) << "output " << i << " (%" << f.outputs()[i]->name() << ") = "
                                      << (*outputs)[i].ToString() << " with seed " << seed;
      }
    }
  }
}

#ifdef KILN_WITH_CUDA
// Column: codegen (codegen/lower_node.cc) lowers the op to kernels, an alias, an input or a
// GEMM; tests/codegen_test.cc compiles what it makes.
TEST(OpTable, Lowering) {
  const std::vector<std::string> missing = OpsLacking(CodegenSupports);
  EXPECT_TRUE(missing.empty()) << "no codegen lowering for: " << absl::StrJoin(missing, ", ");
}
#endif

}  // namespace
}  // namespace kiln
