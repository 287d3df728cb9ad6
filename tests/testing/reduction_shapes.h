// Reductions that exercise every scheme of codegen/reduction_lowering.cc: a thread per
// output, a warp or a block per row, several blocks per row, and column tiles in one or two
// stages (and a reduction over non-adjacent dims).
#pragma once

#include <string>
#include <vector>

namespace kiln::testing {

struct ReductionShape {
  std::string operand;  // "[64,1000]"
  std::string dims;     // "[1]"
  std::string result;   // "[64]"
};

inline std::vector<ReductionShape> ReductionShapesOfEveryScheme() {
  return {{"[8,16]", "[1]", "[8]"},
          {"[64,1000]", "[1]", "[64]"},
          {"[2,1048576]", "[1]", "[2]"},
          {"[1000,64]", "[0]", "[64]"},
          {"[4,100,8]", "[0,2]", "[100]"},
          // A gradient over 16 x 1024 tokens: the column reduction's two stages.
          {"[16,1024,768]", "[0,1]", "[768]"}};
}

}  // namespace kiln::testing
