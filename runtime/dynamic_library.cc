#include "runtime/dynamic_library.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<DynamicLibrary>> DynamicLibrary::Open(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::NotFoundError(
        absl::StrCat("dlopen(\"", path, "\") failed: ", why != nullptr ? why : "no reason given"));
  }
  return std::unique_ptr<DynamicLibrary>(new DynamicLibrary(path, handle));
}

DynamicLibrary::~DynamicLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

absl::StatusOr<void*> DynamicLibrary::Symbol(const char* symbol) const {
  dlerror();  // clear a stale error
  void* p = dlsym(handle_, symbol);
  if (p == nullptr) {
    const char* why = dlerror();
    return absl::NotFoundError(absl::StrCat(path_, " has no ", symbol, " (", why != nullptr ? why : "null symbol", ")"));
  }
  return p;
}

}  // namespace kiln
