#include "runtime/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"

namespace kiln {

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(const int fd, OpenForReading(path));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // mapping needs a regular file's length
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->length_ = static_cast<size_t>(st.st_size);
  if (file->length_ > 0) {
    void* addr = ::mmap(nullptr, file->length_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("cannot map ", path, ": ", std::strerror(err)));
    }
    file->addr_ = addr;
  }
  ::close(fd);
  return std::shared_ptr<const MappedFile>(std::move(file));
}

MappedFile::~MappedFile() {
  if (addr_ != nullptr) ::munmap(addr_, length_);
}

}  // namespace kiln
