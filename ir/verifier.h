// Verifier: checks that a module is well formed. It runs on everything the parser or the
// protobuf reader produces, and after every pass that changed something.
//   - every node's type is what shape inference gives for its operands and attributes,
//     and within the tensor size limit every reader shares (ir/types.h)
//   - every attribute is one its op takes (ir/op_attributes.h)
//   - operands are nodes of the same function, defined before use
//   - names are unique, non-empty and printable; ids are unique
//   - parameter indices are 0..n-1, each once
//   - outputs exist; output aliases name parameters of the same type, each at most once
// Errors name the function, the node and the reason.
#pragma once

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "ir/graph.h"

namespace kiln {

absl::Status VerifyModule(const Module& module);
absl::Status VerifyFunction(const Function& function);

// Names and scopes print bare in the text form: [A-Za-z0-9_.-]+ (scope may be empty).
bool IsValidName(absl::string_view name);

}  // namespace kiln
