// Reading and writing modules in any form kiln writes, told apart by content:
//   text  starts (after blank lines and // comments) with "module"
//   JSON  starts with '{'
//   dot   starts with "digraph" (written, never read back: reading it is a clear error)
//   otherwise binary protobuf
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace kiln {

enum class ModuleFormat { kText, kProtoBinary, kProtoJson, kDot };

absl::StatusOr<ModuleFormat> ParseModuleFormat(absl::string_view name);  // text|proto|json|dot
ModuleFormat DetectModuleFormat(absl::string_view content);
absl::StatusOr<std::unique_ptr<Module>> ReadModule(absl::string_view content);
absl::StatusOr<std::unique_ptr<Module>> ReadModuleFile(const std::string& path);
absl::StatusOr<std::string> WriteModule(const Module& module, ModuleFormat format);

}  // namespace kiln
