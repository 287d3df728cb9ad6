#include "codegen/nvrtc_compiler.h"

#include <nvrtc.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ir/embedded_file.h"
#include "ir/status_macros.h"

// Generated from kernels/*.cuh by codegen/CMakeLists.txt.
extern const kiln::EmbeddedFile kEmbeddedKernelTemplates[];
extern const size_t kEmbeddedKernelTemplates_count;

namespace kiln {
namespace {

// The kernel templates as NVRTC in-memory headers, and a digest of their bytes: a cached
// cubin depends on the templates its source includes, not only on the source text.
struct TemplateHeaders {
  std::vector<const char*> names;
  std::vector<const char*> contents;  // NUL-terminated: the embedder appends a 0 byte
  std::string digest;
};

TemplateHeaders BuildTemplateHeaders() {
  TemplateHeaders h;
  std::string all;
  for (size_t i = 0; i < kEmbeddedKernelTemplates_count; ++i) {
    const EmbeddedFile& f = kEmbeddedKernelTemplates[i];
    h.names.push_back(f.path);
    h.contents.push_back(reinterpret_cast<const char*>(f.data));
    absl::StrAppend(&all, f.path, "\n", f.size, "\n", f.contents());
  }
  h.digest = KernelCache::Key(all, "", "", "");
  return h;
}

const TemplateHeaders& Templates() {
  static const TemplateHeaders headers = BuildTemplateHeaders();
  return headers;
}

// "sm_90", "sm_90a", "sm_100f": NVRTC emits a cubin only for real architectures.
absl::Status CheckArch(const std::string& arch) {
  const bool ok = arch.size() > 3 && arch.rfind("sm_", 0) == 0 && std::isdigit(static_cast<unsigned char>(arch[3])) &&
                  std::all_of(arch.begin() + 3, arch.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("target architecture '", arch, "' is not a real GPU architecture (expected e.g. sm_90a)"));
  }
  return absl::OkStatus();
}

std::vector<std::string> NvrtcFlags(const NvrtcOptions& options) {
  std::vector<std::string> flags = {"--gpu-architecture=" + options.arch, "-std=c++17"};
  if (options.line_info) flags.push_back("-lineinfo");
  if (options.ptxas_info) flags.push_back("--ptxas-options=-v");
  for (absl::string_view dir : absl::StrSplit(KILN_CUDA_INCLUDE_DIRS, ':', absl::SkipEmpty())) {
    flags.push_back(absl::StrCat("--include-path=", dir));
  }
  return flags;
}

// Lines `line - 3` to `line + 3` of `source`, numbered, the reported one marked.
std::string SourceExcerpt(const std::string& source, int line) {
  const std::vector<std::string> lines = absl::StrSplit(source, '\n');
  std::string out;
  for (int i = std::max(1, line - 3); i <= std::min<int>(lines.size(), line + 3); ++i) {
    absl::StrAppend(&out, i == line ? ">" : " ", i, " | ", lines[i - 1], "\n");
  }
  return out;
}

// The line of the first "<file>(<line>): error" in NVRTC's log, or 0.
int FirstErrorLine(const std::string& log, const std::string& file) {
  const std::string prefix = file + "(";
  for (absl::string_view l : absl::StrSplit(log, '\n')) {
    if (l.rfind(prefix, 0) != 0 || l.find("error") == absl::string_view::npos) continue;
    const size_t close = l.find(')');
    int line = 0;
    if (close != absl::string_view::npos && absl::SimpleAtoi(l.substr(prefix.size(), close - prefix.size()), &line)) {
      return line;
    }
  }
  return 0;
}

struct ProgramDeleter {
  void operator()(nvrtcProgram* p) const {
    nvrtcDestroyProgram(p);
    delete p;
  }
};

// `log`, when given, receives NVRTC's log of a successful compile.
absl::StatusOr<std::string> RunNvrtc(const KernelSpec& kernel, const std::vector<std::string>& flags,
                                     std::string* log = nullptr) {
  const TemplateHeaders& headers = Templates();
  const std::string file = kernel.name + ".cu";
  std::unique_ptr<nvrtcProgram, ProgramDeleter> program(new nvrtcProgram(nullptr));
  nvrtcResult r = nvrtcCreateProgram(program.get(), kernel.source.c_str(), file.c_str(),
                                     static_cast<int>(headers.names.size()), headers.contents.data(),
                                     headers.names.data());
  if (r != NVRTC_SUCCESS) {
    return absl::InternalError(absl::StrCat("kernel ", kernel.name, ": nvrtcCreateProgram: ", nvrtcGetErrorString(r)));
  }
  std::vector<const char*> argv;
  for (const std::string& f : flags) argv.push_back(f.c_str());
  r = nvrtcCompileProgram(*program, static_cast<int>(argv.size()), argv.data());
  if (r != NVRTC_SUCCESS) {
    size_t size = 0;
    nvrtcGetProgramLogSize(*program, &size);
    std::string log(size, '\0');
    if (size > 0) nvrtcGetProgramLog(*program, log.data());
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    const int line = FirstErrorLine(log, file);
    return absl::InvalidArgumentError(absl::StrCat(
        "kernel ", kernel.name, " failed to compile (", nvrtcGetErrorString(r), ", ", absl::StrJoin(flags, " "),
        "):\n", log, "\n", line > 0 ? SourceExcerpt(kernel.source, line) : SourceExcerpt(kernel.source, 4)));
  }
  if (log != nullptr) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(*program, &log_size);
    log->assign(log_size, '\0');
    if (log_size > 0) nvrtcGetProgramLog(*program, log->data());
  }
  size_t size = 0;
  r = nvrtcGetCUBINSize(*program, &size);
  std::string cubin(size, '\0');
  if (r == NVRTC_SUCCESS && size > 0) r = nvrtcGetCUBIN(*program, cubin.data());
  if (r != NVRTC_SUCCESS || size == 0) {
    return absl::InternalError(absl::StrCat("kernel ", kernel.name, ": no cubin from NVRTC (",
                                            nvrtcGetErrorString(r), "); is the architecture real?"));
  }
  return cubin;
}

}  // namespace

std::string NvrtcVersion() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return absl::StrCat(major, ".", minor);
}

absl::StatusOr<CompiledKernel> CompileKernel(const KernelSpec& kernel, const NvrtcOptions& options,
                                             KernelCache* cache) {
  RETURN_IF_ERROR(CheckArch(options.arch));
  const std::vector<std::string> flags = NvrtcFlags(options);
  std::string key;
  if (options.ptxas_info) {  // a report is wanted: compile, never from the cache
    std::string log;
    ASSIGN_OR_RETURN(std::string cubin, RunNvrtc(kernel, flags, &log));
    return CompiledKernel{kernel.name, std::move(cubin), /*from_cache=*/false, std::move(log)};
  }
  if (cache != nullptr) {
    static const std::string version = NvrtcVersion();
    key = KernelCache::Key(kernel.source, absl::StrCat(absl::StrJoin(flags, " "), "\ntemplates ", Templates().digest),
                           options.arch, version);
    if (std::optional<std::string> cubin = cache->Lookup(key)) {
      return CompiledKernel{kernel.name, *std::move(cubin), /*from_cache=*/true};
    }
  }
  ASSIGN_OR_RETURN(std::string cubin, RunNvrtc(kernel, flags));
  // A cache that cannot be written costs only the next compile: not an error.
  if (cache != nullptr) cache->Store(key, cubin).IgnoreError();
  return CompiledKernel{kernel.name, std::move(cubin), /*from_cache=*/false};
}

}  // namespace kiln
