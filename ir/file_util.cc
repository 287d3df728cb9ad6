#include "ir/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

constexpr int kMaxSymlinkDepth = 40;  // Linux's own limit (ELOOP)
constexpr absl::string_view kTempInfix = ".tmp.";

std::string ErrnoText(int err) { return std::strerror(err); }

// "dir/name" -> "dir", "name" -> ".".
std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool ProcessIsRunning(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// Removes DIR/BASE.tmp.<pid> for every <pid> that no longer runs: what a save killed
// mid-write left behind. Only this target's temp files, only by that exact name pattern,
// and never a live process's (it may be writing right now). Best effort: a temp file that
// cannot be removed is left for the next save to try.
void RemoveStaleTempFiles(const std::string& target) {
  const std::string dir = DirName(target);
  const std::string prefix = absl::StrCat(BaseName(target), kTempInfix);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* entry = ::readdir(d)) {
    absl::string_view name = entry->d_name;
    if (!absl::ConsumePrefix(&name, prefix) || name.empty()) continue;
    int64_t pid = 0;
    const bool all_digits = name.find_first_not_of("0123456789") == absl::string_view::npos;
    if (!all_digits || !absl::SimpleAtoi(name, &pid) || pid <= 0 || pid > INT_MAX) continue;
    if (pid == ::getpid() || ProcessIsRunning(static_cast<pid_t>(pid))) continue;
    const std::string stale = absl::StrCat(dir, "/", entry->d_name);
    struct stat st;
    if (::lstat(stale.c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(stale.c_str());
  }
  ::closedir(d);
}

absl::Status WriteAll(int fd, absl::string_view contents, const std::string& shown_path) {
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("cannot write ", shown_path, ": ", ErrnoText(errno)));
    }
    if (n == 0) {
      return absl::UnavailableError(absl::StrCat("cannot write ", shown_path, ": the write made no progress after ",
                                                 done, " of ", contents.size(), " bytes"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// A character device or FIFO: opened as it is and written from the start.
absl::Status WriteInPlace(const std::string& target, absl::string_view contents) {
  int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot open ", target, " for writing: ", ErrnoText(errno)));
  absl::Status written = WriteAll(fd, contents, target);
  // fsync on a pipe or a terminal fails with EINVAL: nothing to flush there.
  if (written.ok() && ::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
    written = absl::UnavailableError(absl::StrCat("cannot flush ", target, ": ", ErrnoText(errno)));
  }
  if (::close(fd) != 0 && written.ok()) {
    written = absl::UnavailableError(absl::StrCat("cannot close ", target, ": ", ErrnoText(errno)));
  }
  return written;
}

absl::Status ReplaceAtomically(const std::string& target, const struct stat* existing, absl::string_view contents) {
  RemoveStaleTempFiles(target);
  const std::string tmp = absl::StrCat(target, kTempInfix, ::getpid());
  const mode_t mode = existing ? (existing->st_mode & 07777) : 0644;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot create ", tmp, ": ", ErrnoText(errno)));
  absl::Status status = WriteAll(fd, contents, tmp);
  // open() applies the umask; an existing file keeps the exact bits it had.
  if (status.ok() && existing && ::fchmod(fd, mode) != 0) {
    status = absl::UnavailableError(absl::StrCat("cannot set the mode of ", tmp, ": ", ErrnoText(errno)));
  }
  if (status.ok() && ::fsync(fd) != 0) {
    status = absl::UnavailableError(absl::StrCat("cannot flush ", tmp, ": ", ErrnoText(errno)));
  }
  if (::close(fd) != 0 && status.ok()) {
    status = absl::UnavailableError(absl::StrCat("cannot close ", tmp, ": ", ErrnoText(errno)));
  }
  if (status.ok() && ::rename(tmp.c_str(), target.c_str()) != 0) {
    status = absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", target, ": ", ErrnoText(errno)));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  // The rename is durable once the folder's entry is on disk (best effort: some file
  // systems cannot fsync a folder, and the data itself is already flushed).
  int dir_fd = ::open(DirName(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return absl::OkStatus();
}

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

absl::StatusOr<int> OpenForReading(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("the file name is empty");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no such file: ", path));
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory, not a file"));
  }
  return fd;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  ASSIGN_OR_RETURN(const int fd, OpenForReading(path));
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::StatusOr<std::string> ResolveWriteTarget(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("the output file name is empty");
  std::string current = path;
  for (int depth = 0; depth < kMaxSymlinkDepth; ++depth) {
    struct stat st;
    if (::lstat(current.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return current;
    char buf[PATH_MAX];
    ssize_t n = ::readlink(current.c_str(), buf, sizeof(buf) - 1);
    if (n < 0) return absl::UnavailableError(absl::StrCat("cannot read the symlink ", current, ": ", ErrnoText(errno)));
    std::string link(buf, static_cast<size_t>(n));
    current = link.front() == '/' ? link : absl::StrCat(DirName(current), "/", link);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cannot write ", path, ": more than ", kMaxSymlinkDepth, " levels of symlinks (a loop?)"));
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  absl::StatusOr<std::string> target = ResolveWriteTarget(path);
  if (!target.ok()) return target.status();
  struct stat st;
  if (::stat(target->c_str(), &st) != 0) {
    if (errno != ENOENT) return absl::UnavailableError(absl::StrCat("cannot inspect ", *target, ": ", ErrnoText(errno)));
    return ReplaceAtomically(*target, nullptr, contents);
  }
  if (S_ISREG(st.st_mode)) return ReplaceAtomically(*target, &st, contents);
  if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return WriteInPlace(*target, contents);
  return absl::InvalidArgumentError(absl::StrCat("cannot write ", path, ": it is ", KindOf(st.st_mode),
                                                 (*target != path ? absl::StrCat(" (", *target, ")") : "")));
}

absl::Status CheckOutputPath(const std::string& path, absl::string_view flag) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": the file name is empty"));
  absl::StatusOr<std::string> target = ResolveWriteTarget(path);
  if (!target.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", target.status().message()));
  struct stat st;
  if (::stat(target->c_str(), &st) == 0) {
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
      if (::access(target->c_str(), W_OK) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot write it: ", ErrnoText(errno)));
      }
      return absl::OkStatus();
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": it is ", KindOf(st.st_mode)));
    }
  }
  // A regular file is replaced through a temp file beside it: its folder must take new files.
  const std::string dir = DirName(*target);
  struct stat dir_st;
  if (::stat(dir.c_str(), &dir_st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": the folder ", dir, " does not exist (",
                                                   ErrnoText(errno), "); create it first"));
  }
  if (!S_ISDIR(dir_st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": ", dir, " is not a folder"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot create files in ", dir, ": ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

}  // namespace kiln
