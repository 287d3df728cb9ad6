// Result-type inference, one case per op of ir/op_table.h. The builder calls it to type
// new nodes; the verifier calls it to re-check every node of a parsed or loaded module.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ir/attributes.h"
#include "ir/op_table.h"
#include "ir/types.h"

namespace kiln {

// `declared` is the node's written type; it must be given for ops whose ResultRule is
// kDeclared and is ignored otherwise. Errors say what is wrong with the operands or
// attributes; the caller adds the op name, operand types and location.
absl::StatusOr<TensorType> InferResultType(Opcode op, absl::Span<const TensorType> operands,
                                           const AttrMap& attrs, const TensorType* declared);

// The comparison directions accepted by `compare`.
bool IsCompareDirection(absl::string_view dir);

// adamw_update's `result` attribute: which of p', m', v' a node is (param, m or v).
enum class AdamWResult { kParam, kM, kV };
absl::StatusOr<AdamWResult> GetAdamWResult(const AttrMap& attrs);

}  // namespace kiln
