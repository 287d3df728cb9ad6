// Where a gemm's optional operands sit (ir/op_table.h): a, b, then c iff beta != 0, then the
// bias iff epilogue=bias, then a_scale, b_scale, d_scale iff scaled=1. Shape inference, the
// reference backend, codegen and the passes all read positions from here, so that adding
// a slot cannot leave one of them counting the old way.
#pragma once

#include "absl/status/statusor.h"
#include "ir/attributes.h"

namespace kiln {

struct GemmSlots {
  int num_operands = 2;
  int c = -1;     // beta != 0
  int bias = -1;  // epilogue=bias: a vector [n] added to every row of D
  int a_scale = -1, b_scale = -1, d_scale = -1;  // scaled=1
  bool amax = false;  // amax=1: a second result
};

// The gemm epilogues kiln lowers: "none" and "bias".
absl::StatusOr<GemmSlots> GemmSlotsOf(const AttrMap& attrs);

}  // namespace kiln
