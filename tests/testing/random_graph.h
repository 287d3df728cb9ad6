// Seeded random graphs for differential tests of passes (tests/pass_meaning_test.cc): every
// op family of ir/op_table.h is reachable, and the graphs carry the redundancy passes live
// on: duplicated subexpressions, x*1, x+(-0), reshape/transpose/broadcast/convert chains,
// all-constant subgraphs and values nothing uses.
//
// Function @main takes fixed-role parameters (float tensors with dims in 2..4, i32 index
// vectors whose values a test should draw from [0, 2), which every indexed dim allows) and
// returns a few of the values built. Every graph passes the verifier.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "ir/graph.h"

namespace kiln::testing {

struct RandomGraphOptions {
  int num_steps = 40;  // each step adds one small pattern (1 to ~6 nodes)
  int num_outputs = 4;
};

// The same seed gives the same module, on every machine.
absl::StatusOr<std::unique_ptr<Module>> BuildRandomGraph(uint64_t seed, const RandomGraphOptions& options = {});

}  // namespace kiln::testing
