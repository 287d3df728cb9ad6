#include "ir/module_io.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ir/dot_graph.h"
#include "ir/file_util.h"
#include "ir/proto_io.h"
#include "ir/status_macros.h"
#include "ir/text_format.h"

namespace kiln {
namespace {

// What follows leading whitespace and `//` comment lines: where the format shows itself.
absl::string_view SkipBlanksAndComments(absl::string_view content) {
  size_t i = 0;
  while (i < content.size()) {
    char c = content[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
    } else if (content.substr(i, 2) == "//") {
      size_t eol = content.find('\n', i);
      i = eol == absl::string_view::npos ? content.size() : eol + 1;
    } else {
      break;
    }
  }
  return content.substr(i);
}

}  // namespace

absl::StatusOr<ModuleFormat> ParseModuleFormat(absl::string_view name) {
  if (name == "text") return ModuleFormat::kText;
  if (name == "proto") return ModuleFormat::kProtoBinary;
  if (name == "json") return ModuleFormat::kProtoJson;
  if (name == "dot") return ModuleFormat::kDot;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown module format '", name, "' (expected text, proto, json or dot)"));
}

ModuleFormat DetectModuleFormat(absl::string_view content) {
  absl::string_view start = SkipBlanksAndComments(content);
  if (absl::StartsWith(start, "module")) return ModuleFormat::kText;
  if (absl::StartsWith(start, "{")) return ModuleFormat::kProtoJson;
  // Recognised only so that reading our own Graphviz output fails with a clear message
  // (a binary ModuleProto starts with a field tag byte, never with 'd').
  if (absl::StartsWith(start, "digraph")) return ModuleFormat::kDot;
  return ModuleFormat::kProtoBinary;
}

absl::StatusOr<std::unique_ptr<Module>> ReadModule(absl::string_view content) {
  if (SkipBlanksAndComments(content).empty()) {
    return absl::InvalidArgumentError("empty input: expected a kiln module (text, JSON or binary protobuf)");
  }
  switch (DetectModuleFormat(content)) {
    case ModuleFormat::kText:
      return ParseModule(content);
    case ModuleFormat::kProtoJson:
      return ModuleFromProtoJson(content);
    case ModuleFormat::kDot:
      return absl::InvalidArgumentError(
          "this is Graphviz output, which cannot be read back; save the module as text, proto or json");
    case ModuleFormat::kProtoBinary:
      break;
  }
  absl::StatusOr<std::unique_ptr<Module>> module = ModuleFromProtoBinary(content);
  if (!module.ok()) {
    // Binary is the fallback, so say why the input was taken for it.
    return absl::Status(module.status().code(),
                        absl::StrCat("read as binary protobuf (the input starts with neither 'module' nor '{'): ",
                                     module.status().message()));
  }
  return module;
}

absl::StatusOr<std::unique_ptr<Module>> ReadModuleFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string content, ReadFileToString(path));
  absl::StatusOr<std::unique_ptr<Module>> module = ReadModule(content);
  if (!module.ok()) {
    return absl::Status(module.status().code(), absl::StrCat(path, ": ", module.status().message()));
  }
  return module;
}

absl::StatusOr<std::string> WriteModule(const Module& module, ModuleFormat format) {
  switch (format) {
    case ModuleFormat::kText:
      return PrintModule(module);
    case ModuleFormat::kProtoBinary:
      return ModuleToProtoBinary(module);
    case ModuleFormat::kProtoJson:
      return ModuleToProtoJson(module);
    case ModuleFormat::kDot:
      return ModuleToDot(module);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown module format ", static_cast<int>(format)));
}

}  // namespace kiln
