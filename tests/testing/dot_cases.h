// dot_general layouts for GEMM tests: the ones a transformer step produces, and the awkward
// ones that need an operand transposed first.
#pragma once

#include <string>
#include <vector>

#include "ir/builder.h"
#include "ir/graph.h"

namespace kiln::testing {

struct DotCase {
  std::string name;
  std::vector<int64_t> a_dims, b_dims;
  DotDims dims;
};

std::vector<DotCase> DotCases();

// One dot_general node named %dot over fresh parameters %a and %b, returned by `f`.
Node* BuildDot(Function& f, const DotCase& c, DType in, DType out);

}  // namespace kiln::testing
