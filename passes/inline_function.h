// Copies the body of one function into another, with its parameters bound to given
// nodes. The training step uses it to place one forward pass per micro-batch.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ir/graph.h"

namespace kiln {

// Appends to `dst` a copy of every non-parameter node of `src`; parameter i of `src` is
// replaced by args[i] (same type required). Copied names get `name_prefix` (made unique);
// scopes are kept. Returns the copies of `src`'s outputs.
absl::StatusOr<std::vector<Node*>> InlineFunction(Function& dst, const Function& src, absl::Span<Node* const> args,
                                                  absl::string_view name_prefix);

}  // namespace kiln
