// The attributes each op takes, from the op table's attribute column (ir/op_table.h, which
// documents their meaning): the names that shape inference, the reference backend and
// codegen read. The verifier rejects any other attribute, so that a misspelt or stray one (`{esp=1e-5}` on
// rms_norm) is an error where it is written, not silently ignored.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ir/attributes.h"
#include "ir/op_table.h"

namespace kiln {

// What `op` may carry, required and optional alike.
absl::Span<const absl::string_view> KnownAttributes(Opcode op);

// Attributes named "note_..." are free-form notes for people and tools (kept, printed and
// serialized, never read by kiln), allowed on any op: a misspelt real attribute never starts
// with the prefix, so the check still catches it.
inline constexpr absl::string_view kNoteAttributePrefix = "note_";

// Ok, or "unknown attribute 'esp' (rms_norm takes eps)".
absl::Status CheckKnownAttributes(Opcode op, const AttrMap& attrs);

}  // namespace kiln
