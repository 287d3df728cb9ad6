// Why bytes do not parse as a protobuf message, and where: protobuf's own parser says only
// "failed". This walks the wire format with the message's descriptor and reports the first
// fault as "at byte 1234 (ModuleProto.functions[0].nodes[5].type): length 999 runs past the
// end of its enclosing message (200 bytes left)".
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"

namespace kiln {

// The first wire-format fault of `bytes` read as `type`, or an empty string when the
// structure is sound (the fault is then in a value: a string that is not UTF-8, say).
std::string DiagnoseProtoWireFault(absl::string_view bytes, const google::protobuf::Descriptor& type);

// Protobuf prints "[libprotobuf ERROR ...]" lines to stderr on a failed parse; kiln reports
// the failure itself, so those lines are dropped (once per process, idempotent).
void SilenceProtobufLogging();

}  // namespace kiln
