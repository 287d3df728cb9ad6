// The protobuf form of a module (ir/ir.proto): flat, XLA-style: nodes by id, operands by
// id, a format version. Binary and JSON (protobuf's canonical JSON mapping).
// Readers reject malformed bytes, unknown versions, dangling ids and anything the
// verifier rejects, with a Status that says what and where (function, node id).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace kiln {

// 2: multi-result nodes (NodeProto.result_types, get_result); version 1 wrote AdamW and
// attention gradients as one node per result and an attention_lse op.
inline constexpr int kIrFormatVersion = 3;

absl::StatusOr<std::string> ModuleToProtoBinary(const Module& module);
absl::StatusOr<std::string> ModuleToProtoJson(const Module& module);
absl::StatusOr<std::unique_ptr<Module>> ModuleFromProtoBinary(absl::string_view bytes);
absl::StatusOr<std::unique_ptr<Module>> ModuleFromProtoJson(absl::string_view json);

}  // namespace kiln
