// kiln dump: print a model's or a file's IR as text, protobuf, JSON or Graphviz.
#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "frontends/cli/commands.h"
#include "frontends/cli/model_source.h"
#include "ir/file_util.h"
#include "ir/module_io.h"
#include "ir/status_macros.h"

namespace kiln::cli {
namespace {

absl::Status RunDump(const ParsedArgs& args) {
  ASSIGN_OR_RETURN(ModuleFormat format, ParseModuleFormat(args.Get("format", "text")));
  if (args.Has("output")) RETURN_IF_ERROR(CheckOutputPath(args.Get("output"), "-o"));
  ASSIGN_OR_RETURN(std::unique_ptr<Module> module, LoadOrBuildModule(args.positionals()[0], args));
  ASSIGN_OR_RETURN(std::string out, WriteModule(*module, format));
  if (args.Has("output")) return WriteFileAtomically(args.Get("output"), out);
  if (format == ModuleFormat::kProtoBinary && ::isatty(STDOUT_FILENO)) {
    return absl::InvalidArgumentError("refusing to write binary protobuf to a terminal: use -o FILE or a pipe");
  }
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0) {
    return absl::UnavailableError("cannot write to standard output");
  }
  return absl::OkStatus();
}

}  // namespace

Command DumpCommand() {
  CommandSpec spec{
      .name = "dump",
      .usage = "MODEL_OR_FILE [options]",
      .summary = "print a model's IR (or convert a module file) as text, protobuf, JSON or Graphviz",
      .details = "MODEL_OR_FILE is a preset (see 'kiln models'), a Hugging Face config.json or a folder\n"
                 "holding one, or a file kiln wrote (.kir text, .pb binary protobuf, .json), told\n"
                 "apart by content.",
      .min_positionals = 1,
      .max_positionals = 1,
      .flags = {{.name = "format", .value_name = "FMT", .help = "text, proto, json or dot", .default_value = "text"},
                {.name = "output", .value_name = "FILE", .help = "write here (atomically) instead of stdout",
                 .short_name = 'o'}},
  };
  for (FlagSpec f : ModelBuildFlags()) spec.flags.push_back(std::move(f));
  return {std::move(spec), RunDump};
}

}  // namespace kiln::cli
