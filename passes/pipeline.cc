#include "passes/pipeline.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"
#include "ir/text_format.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

void CollectNames(const Pass& pass, std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), pass.name()) == names.end()) names.emplace_back(pass.name());
  for (const Pass* member : pass.members()) CollectNames(*member, names);
}

// A pass's error keeps its code and gains the pass's name, so a failure deep in a pipeline
// still says which pass it came from.
absl::Status InPass(const Pass& pass, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(pass.name(), ": ", status.message()));
}

size_t HashPrinted(const Module& module) { return std::hash<std::string>()(PrintModule(module)); }

// A pass as Pipeline::Describe lists it: its name, whether it is off by default, its members.
std::string DescribePass(const Pass& pass) {
  std::string out(pass.name());
  if (pass.off_by_default()) absl::StrAppend(&out, " [off by default]");
  const std::vector<Pass*> members = pass.members();
  if (members.empty()) return out;
  absl::StrAppend(&out, "(");
  for (size_t i = 0; i < members.size(); ++i) absl::StrAppend(&out, i ? ", " : "", DescribePass(*members[i]));
  absl::StrAppend(&out, ")");
  return out;
}

}  // namespace

absl::string_view OutcomeName(PassRecord::Outcome outcome) {
  switch (outcome) {
    case PassRecord::Outcome::kChanged: return "changed";
    case PassRecord::Outcome::kUnchanged: return "unchanged";
    case PassRecord::Outcome::kDisabled: return "disabled";
    case PassRecord::Outcome::kOff: return "off";
  }
  return "?";
}

int64_t CountNodes(const Module& module) {
  int64_t n = 0;
  for (const auto& f : module.functions()) n += f->num_nodes();
  return n;
}

std::string PipelineReport::ToString() const {
  std::string out = absl::StrFormat("pipeline %s: %.2f ms\n", pipeline, total_ms);
  absl::StrAppendFormat(&out, "%-36s %5s  %-9s %9s  %s\n", "pass", "round", "result", "ms", "nodes");
  for (const PassRecord& r : passes) {
    const std::string name = absl::StrCat(std::string(2 * r.depth, ' '), r.name);
    const std::string round = r.round > 0 ? absl::StrCat(r.round) : "";
    if (r.outcome == PassRecord::Outcome::kDisabled || r.outcome == PassRecord::Outcome::kOff) {
      absl::StrAppendFormat(&out, "%-36s %5s  %-9s %9s  %d\n", name, round, OutcomeName(r.outcome), "-", r.nodes_before);
      continue;
    }
    absl::StrAppendFormat(&out, "%-36s %5s  %-9s %9.2f  %d -> %d\n", name, round, OutcomeName(r.outcome),
                          r.wall_ms, r.nodes_before, r.nodes_after);
  }
  for (const std::string& note : notes) absl::StrAppend(&out, "note: ", note, "\n");
  return out;
}

namespace {
std::string RegexErrorInWords(std::regex_constants::error_type code) {
  namespace rc = std::regex_constants;
  if (code == rc::error_paren) return "a '(' is not closed, or a ')' has no '('";
  if (code == rc::error_brack) return "a '[' is not closed";
  if (code == rc::error_brace) return "a '{' is not closed";
  if (code == rc::error_badbrace) return "a {n,m} repeat count is not valid";
  if (code == rc::error_badrepeat) return "a repeat (*, +, ? or {n}) follows nothing it can repeat";
  if (code == rc::error_escape) return "a '\\' escape is not valid (or the pattern ends with '\\')";
  if (code == rc::error_range) return "a character range is not valid (like z-a)";
  if (code == rc::error_ctype || code == rc::error_collate) return "a [[:class:]] name is not known";
  if (code == rc::error_backref) return "a back reference names a group that does not exist";
  if (code == rc::error_complexity || code == rc::error_stack) return "it is too complex to match";
  return "it does not parse";
}
}  // namespace

absl::Status CheckDumpRegex(const std::string& pattern) {
  try {
    std::regex compiled(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("dump regex '", pattern, "' is not a valid regular expression: ", RegexErrorInWords(e.code())));
  }
  return absl::OkStatus();
}

PassRunner::PassRunner(const CompileOptions& options) : options_(options) {
  disabled_.insert(options.disabled_passes.begin(), options.disabled_passes.end());
  enabled_.insert(options.enabled_passes.begin(), options.enabled_passes.end());
}

absl::StatusOr<std::unique_ptr<PassRunner>> PassRunner::Create(const CompileOptions& options) {
  std::unique_ptr<PassRunner> runner(new PassRunner(options));
  // A bad pattern is an error whether or not dumping is on, so a typo is caught before any work.
  RETURN_IF_ERROR(CheckDumpRegex(options.dump_regex));
  if (options.dump_dir.empty()) return runner;
  runner->dump_regex_.emplace(options.dump_regex, std::regex::ECMAScript);
  std::error_code ec;
  std::filesystem::create_directories(options.dump_dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create dump folder '", options.dump_dir, "': ", ec.message()));
  }
  return runner;
}

absl::Status PassRunner::Dump(const Module& module, absl::string_view label) {
  const std::string path =
      (std::filesystem::path(options_.dump_dir) / absl::StrFormat("%03d-%s.kir", steps_finished_, label)).string();
  return WriteFileAtomically(path, PrintModule(module));
}

absl::Status PassRunner::DumpInput(const Module& module) {
  if (!dump_regex_) return absl::OkStatus();
  return Dump(module, "input");
}

absl::Status PassRunner::DumpAfterStep(const Module& module, absl::string_view step) {
  ++steps_finished_;
  if (!dump_regex_) return absl::OkStatus();
  return Dump(module, absl::StrCat("after-", step));
}

absl::StatusOr<bool> PassRunner::RunPass(Pass& pass, Module& module, int round) {
  PassRecord record;
  record.name = std::string(pass.name());
  record.depth = depth_;
  record.round = round;
  record.nodes_before = CountNodes(module);
  // A group's row goes before its members' rows, so reserve it now and fill it in after.
  const size_t row = report_.passes.size();
  report_.passes.push_back(record);

  const bool off = pass.off_by_default() && !enabled_.contains(pass.name());
  if (disabled_.contains(pass.name()) || off) {
    report_.passes[row].outcome = off ? PassRecord::Outcome::kOff : PassRecord::Outcome::kDisabled;
    report_.passes[row].nodes_after = record.nodes_before;
    return false;
  }

  const bool check_reporting = options_.check_change_reporting;
  const size_t hash_before = check_reporting ? HashPrinted(module) : 0;
  const auto start = std::chrono::steady_clock::now();
  ++depth_;
  absl::StatusOr<bool> changed = pass.RunWith(*this, module);
  --depth_;
  const auto stop = std::chrono::steady_clock::now();
  if (!changed.ok()) {
    // A group's error already names the member that failed.
    return pass.members().empty() ? InPass(pass, changed.status()) : changed.status();
  }

  record.wall_ms = std::chrono::duration<double, std::milli>(stop - start).count();
  record.nodes_after = CountNodes(module);
  record.outcome = *changed ? PassRecord::Outcome::kChanged : PassRecord::Outcome::kUnchanged;
  report_.passes[row] = record;
  ++steps_finished_;

  if (check_reporting && !*changed && HashPrinted(module) != hash_before) {
    return absl::InternalError(absl::StrCat(pass.name(), " changed the module but reported no change"));
  }
  if (*changed && options_.verify_each) {
    absl::Status verified = VerifyModule(module);
    if (!verified.ok()) {
      return absl::Status(verified.code(), absl::StrCat("after ", pass.name(), ": ", verified.message()));
    }
  }
  if (dump_regex_ && std::regex_search(record.name, *dump_regex_)) {
    RETURN_IF_ERROR(Dump(module, absl::StrCat("after-", pass.name())));
  }
  return *changed;
}

FixpointPass::FixpointPass(std::string name, std::vector<std::unique_ptr<Pass>> members)
    : name_(std::move(name)), members_(std::move(members)) {}

std::vector<Pass*> FixpointPass::members() const {
  std::vector<Pass*> out;
  for (const auto& m : members_) out.push_back(m.get());
  return out;
}

absl::StatusOr<bool> FixpointPass::Run(Module& module) {
  const CompileOptions defaults;
  ASSIGN_OR_RETURN(std::unique_ptr<PassRunner> runner, PassRunner::Create(defaults));
  return RunWith(*runner, module);
}

absl::StatusOr<bool> FixpointPass::RunWith(PassRunner& runner, Module& module) {
  const int cap = runner.options().fixpoint_max_rounds;
  bool changed = false;
  for (int round = 1; round <= cap; ++round) {
    bool round_changed = false;
    for (const auto& member : members_) {
      ASSIGN_OR_RETURN(bool member_changed, runner.RunPass(*member, module, round));
      round_changed |= member_changed;
    }
    if (!round_changed) return changed;
    changed = true;
  }
  const std::string what =
      absl::StrCat(name_, " still changed the module after ", cap, " rounds (fixpoint_max_rounds)");
  if (runner.options().fixpoint_cap_is_error) return absl::ResourceExhaustedError(what);
  runner.report().notes.push_back(absl::StrCat(what, "; stopped there"));
  return changed;
}

Pipeline& Pipeline::Add(std::unique_ptr<Pass> pass) {
  passes_.push_back(std::move(pass));
  return *this;
}

std::vector<std::string> Pipeline::PassNames() const {
  std::vector<std::string> names;
  for (const auto& pass : passes_) CollectNames(*pass, names);
  return names;
}

namespace {
const Pass* FindIn(const Pass& pass, absl::string_view name) {
  if (pass.name() == name) return &pass;
  for (const Pass* member : pass.members()) {
    if (const Pass* found = FindIn(*member, name)) return found;
  }
  return nullptr;
}
}  // namespace

const Pass* Pipeline::FindPass(absl::string_view name) const {
  for (const auto& pass : passes_) {
    if (const Pass* found = FindIn(*pass, name)) return found;
  }
  return nullptr;
}

std::string Pipeline::Describe() const {
  std::vector<std::string> parts;
  for (const auto& pass : passes_) parts.push_back(DescribePass(*pass));
  return absl::StrJoin(parts, ", ");
}

absl::Status CheckDisabledPasses(const CompileOptions& options, const std::vector<const Pipeline*>& pipelines) {
  auto check = [&](const std::string& name, absl::string_view verb) -> absl::Status {
    const Pass* found = nullptr;
    std::vector<std::string> listing;
    for (const Pipeline* pipeline : pipelines) {
      if (found == nullptr) found = pipeline->FindPass(name);
      listing.push_back(absl::StrCat("pipeline ", pipeline->name(), " has: ", absl::StrJoin(pipeline->PassNames(), ", ")));
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot ", verb, " unknown pass '", name, "'; ", absl::StrJoin(listing, "; ")));
    }
    if (verb == "enable" && !found->off_by_default()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot enable pass '", name,
                                                     "': it is not off by default (it runs unless disabled)"));
    }
    return absl::OkStatus();
  };
  for (const std::string& name : options.disabled_passes) RETURN_IF_ERROR(check(name, "disable"));
  for (const std::string& name : options.enabled_passes) RETURN_IF_ERROR(check(name, "enable"));
  return absl::OkStatus();
}

absl::StatusOr<PipelineReport> Pipeline::Run(Module& module, const CompileOptions& options) const {
  RETURN_IF_ERROR(CheckDisabledPasses(options, {this}));
  ASSIGN_OR_RETURN(std::unique_ptr<PassRunner> runner, PassRunner::Create(options));
  RETURN_IF_ERROR(runner->DumpInput(module));
  return Run(module, *runner);
}

absl::StatusOr<PipelineReport> Pipeline::Run(Module& module, PassRunner& runner) const {
  runner.report() = PipelineReport{.pipeline = name_};
  if (runner.options().verify_each) {
    absl::Status verified = VerifyModule(module);
    if (!verified.ok()) return absl::Status(verified.code(), absl::StrCat("input: ", verified.message()));
  }
  const auto start = std::chrono::steady_clock::now();
  for (const auto& pass : passes_) RETURN_IF_ERROR(runner.RunPass(*pass, module).status());
  runner.report().total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return std::exchange(runner.report(), PipelineReport{});
}

}  // namespace kiln
