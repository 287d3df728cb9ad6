// What the passes that take a fusion's body into a new, larger fusion share
// (fuse-cache-write, merge-cache-write-siblings, fuse-gemv-glu): copying a body's ops into
// the new body, and putting the new fusion node in place of the node it replaces.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/fusion.h"
#include "ir/graph.h"

namespace kiln {

// A parameter of `into` at `index` of `like`'s type, named after it (made unique).
absl::StatusOr<Node*> AppendBodyParameter(Function& into, int64_t index, const Node& like, absl::string_view pass);

// `from`'s parameters copied into `into` at the same indices (its first ones), each entered
// in `copy_of`.
absl::Status CopyBodyParameters(const Function& from, Function& into, absl::flat_hash_map<const Node*, Node*>& copy_of,
                                absl::string_view pass);

// Copies `from`'s nodes but its parameters into `into`, in order, each operand mapped through
// `copy_of` (which must hold every parameter of `from` that a node reads; it gains each copy),
// and returns the copy of `from`'s first output. Errors name `pass`.
absl::StatusOr<Node*> CopyBodyOps(const Function& from, Function& into,
                                  absl::flat_hash_map<const Node*, Node*>& copy_of, absl::string_view pass);

// Puts a fusion node of `kind` (`operands`, `body`) in `replaced`'s place: its name, scope
// and position, and its uses; then removes `replaced` and `absorbed`, the node whose body (or
// op) the new body took in and which only `replaced` read. Errors name `pass`.
absl::Status ReplaceWithFusion(Function& f, Node* replaced, Node* absorbed, FusionKind kind,
                               std::vector<Node*> operands, std::unique_ptr<Function> body, absl::string_view pass);

}  // namespace kiln
