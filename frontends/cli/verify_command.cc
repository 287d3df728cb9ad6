// kiln verify: parse or deserialize a module file and run the verifier.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "frontends/cli/commands.h"
#include "ir/file_util.h"
#include "ir/module_io.h"
#include "ir/status_macros.h"

namespace kiln::cli {
namespace {

absl::string_view FormatName(ModuleFormat f) {
  switch (f) {
    case ModuleFormat::kText: return "text";
    case ModuleFormat::kProtoBinary: return "binary protobuf";
    case ModuleFormat::kProtoJson: return "JSON protobuf";
    case ModuleFormat::kDot: return "dot";
  }
  return "?";
}

absl::Status RunVerify(const ParsedArgs& args) {
  const std::string& path = args.positionals()[0];
  ASSIGN_OR_RETURN(std::string content, ReadFileToString(path));
  ModuleFormat format = DetectModuleFormat(content);
  absl::StatusOr<std::unique_ptr<Module>> module = ReadModule(content);
  if (!module.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " (", FormatName(format), "): ", module.status().message()));
  }
  int64_t nodes = 0;
  for (const auto& f : (*module)->functions()) nodes += f->num_nodes();
  std::printf("%s: ok: module @%s, %zu function(s), %lld nodes (%s)\n", path.c_str(), (*module)->name().c_str(),
              (*module)->functions().size(), static_cast<long long>(nodes), std::string(FormatName(format)).c_str());
  return absl::OkStatus();
}

}  // namespace

Command VerifyCommand() {
  return {{.name = "verify",
           .usage = "FILE",
           .summary = "check that a module file parses and verifies",
           .details = "Exit 0 with a one-line summary when FILE (text, binary protobuf or JSON) is a valid\n"
                      "module; otherwise exit 1 with the parser's or verifier's message (line:column for text).",
           .min_positionals = 1,
           .max_positionals = 1},
          RunVerify};
}

}  // namespace kiln::cli
