// A shared library opened at run time (dlopen) and its entry points looked up by name: how
// kiln reaches what it must never link, so that its binaries start where the library is
// absent and say what is missing only when it is needed (NCCL: runtime/distributed/nccl.h;
// CUPTI: runtime/cuda/activity_trace.h). Errors carry dlerror()'s words.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln {

class DynamicLibrary {
 public:
  // dlopen(path, RTLD_NOW | RTLD_LOCAL) (a bare name goes through the loader's search path);
  // NotFound: 'dlopen("PATH") failed: WHY'.
  static absl::StatusOr<std::unique_ptr<DynamicLibrary>> Open(const std::string& path);
  ~DynamicLibrary();
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;

  const std::string& path() const { return path_; }

  // The address of `symbol`; NotFound: "PATH has no SYMBOL (WHY)".
  absl::StatusOr<void*> Symbol(const char* symbol) const;
  // `symbol` into `out`, a pointer of the entry point's type (decltype(&fn) of its header).
  template <typename Fn>
  absl::Status Resolve(const char* symbol, Fn& out) const {
    absl::StatusOr<void*> p = Symbol(symbol);
    if (!p.ok()) return p.status();
    out = reinterpret_cast<Fn>(*p);
    return absl::OkStatus();
  }

 private:
  DynamicLibrary(std::string path, void* handle) : path_(std::move(path)), handle_(handle) {}
  std::string path_;
  void* handle_ = nullptr;
};

}  // namespace kiln
