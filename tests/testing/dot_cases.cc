#include "tests/testing/dot_cases.h"

#include <gtest/gtest.h>

namespace kiln::testing {

// The layouts a transformer step produces, and the awkward ones.
std::vector<DotCase> DotCases() {
  return {
      {"x_times_w_transposed", {2, 3, 16}, {24, 16}, {{}, {}, {2}, {1}}},
      {"weight_gradient", {2, 3, 24}, {2, 3, 16}, {{}, {}, {0, 1}, {0, 1}}},
      {"attention_scores", {2, 3, 5, 8}, {2, 3, 5, 8}, {{0, 1}, {0, 1}, {3}, {3}}},
      {"attention_times_values", {2, 3, 5, 5}, {2, 3, 5, 8}, {{0, 1}, {0, 1}, {3}, {2}}},
      {"batch_dims_apart", {2, 5, 3, 8}, {2, 5, 3, 8}, {{0, 2}, {0, 2}, {3}, {3}}},
      {"contracting_orders_differ", {4, 3, 5}, {5, 3, 6}, {{}, {}, {1, 2}, {1, 0}}},
      {"both_transposed", {16, 4}, {6, 16}, {{}, {}, {0}, {1}}},
      {"lhs_batch_not_leading", {3, 2, 4}, {2, 4, 5}, {{1}, {0}, {2}, {1}}},
      {"batch_listed_in_reverse", {2, 3, 4, 5}, {3, 2, 5, 6}, {{1, 0}, {0, 1}, {3}, {2}}},
      {"unit_dims", {1, 4, 1, 8}, {8, 1, 3}, {{}, {}, {3}, {0}}},
      {"vector_dot", {16}, {16}, {{}, {}, {0}, {0}}},
      {"outer_product", {5}, {7}, {{}, {}, {}, {}}},
      {"large", {4, 128, 256}, {384, 256}, {{}, {}, {2}, {1}}},
      {"large_weight_gradient", {4, 128, 384}, {4, 128, 256}, {{}, {}, {0, 1}, {0, 1}}},
  };
}

// One dot_general node over fresh parameters, in `f`.
Node* BuildDot(Function& f, const DotCase& c, DType in, DType out) {
  Builder b(&f);
  Node* a = *b.Parameter("a", {in, c.a_dims});
  Node* x = *b.Parameter("b", {in, c.b_dims});
  absl::StatusOr<Node*> dot = b.Named("dot").DotGeneral(a, x, c.dims, out);
  EXPECT_TRUE(dot.ok()) << c.name << ": " << dot.status();
  EXPECT_TRUE(b.Return({*dot}).ok());
  return *dot;
}

}  // namespace kiln::testing
