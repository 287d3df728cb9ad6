// WriteFileAtomically and CheckOutputPath: what a write does to what is already at the
// path (issue 11: symlinks and devices were replaced by regular files, failed writes
// reported success, and killed saves left temp files forever).
#include "ir/file_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class FileUtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("kiln_file_util_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> Entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  fs::path dir_;
};

// A pid that ran and no longer does: a child that has exited and been reaped.
pid_t DeadPid() {
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

TEST_F(FileUtilTest, ReplacesARegularFileAndKeepsItsMode) {
  ASSERT_TRUE(WriteFileAtomically(Path("a.txt"), "old").ok());
  ASSERT_EQ(::chmod(Path("a.txt").c_str(), 0600), 0);
  ASSERT_TRUE(WriteFileAtomically(Path("a.txt"), "new contents").ok());
  EXPECT_EQ(*ReadFileToString(Path("a.txt")), "new contents");
  struct stat st;
  ASSERT_EQ(::stat(Path("a.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(Entries(), std::vector<std::string>{"a.txt"});  // no temp file left
}

TEST_F(FileUtilTest, WritesThroughASymlinkAndKeepsTheLink) {
  ASSERT_TRUE(WriteFileAtomically(Path("real.kir"), "old").ok());
  fs::create_directories(dir_ / "links");
  fs::create_symlink("../real.kir", dir_ / "links" / "link.kir");
  ASSERT_TRUE(WriteFileAtomically(Path("links/link.kir"), "through the link").ok());
  EXPECT_TRUE(fs::is_symlink(dir_ / "links" / "link.kir"));
  EXPECT_EQ(*ReadFileToString(Path("real.kir")), "through the link");
  EXPECT_EQ(Entries(), (std::vector<std::string>{"links", "real.kir"}));
}

TEST_F(FileUtilTest, ADanglingSymlinkCreatesTheFileItNames) {
  fs::create_symlink("target.txt", dir_ / "link.txt");
  ASSERT_TRUE(WriteFileAtomically(Path("link.txt"), "created").ok());
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.txt"));
  EXPECT_EQ(*ReadFileToString(Path("target.txt")), "created");
}

TEST_F(FileUtilTest, ASymlinkLoopIsAnError) {
  fs::create_symlink("b", dir_ / "a");
  fs::create_symlink("a", dir_ / "b");
  absl::Status st = WriteFileAtomically(Path("a"), "x");
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(absl::StrContains(st.message(), "symlinks")) << st;
}

TEST_F(FileUtilTest, DevicesAreWrittenInPlaceAndAFullOneIsAnError) {
  EXPECT_TRUE(WriteFileAtomically("/dev/null", "discarded").ok());
  struct stat st;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  if (::access("/dev/full", W_OK) == 0) {
    absl::Status full = WriteFileAtomically("/dev/full", "bytes that cannot be written");
    EXPECT_FALSE(full.ok());
    EXPECT_TRUE(absl::StrContains(full.message(), "/dev/full")) << full;
    EXPECT_TRUE(absl::StrContains(full.message(), "No space left")) << full;
    ASSERT_EQ(::stat("/dev/full", &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
  }
}

TEST_F(FileUtilTest, AFifoIsWrittenInPlace) {
  ASSERT_EQ(::mkfifo(Path("pipe").c_str(), 0600), 0);
  std::string received;
  std::thread reader([&] { received = *ReadFileToString(Path("pipe")); });
  ASSERT_TRUE(WriteFileAtomically(Path("pipe"), "through the pipe").ok());
  reader.join();
  EXPECT_EQ(received, "through the pipe");
  struct stat st;
  ASSERT_EQ(::lstat(Path("pipe").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST_F(FileUtilTest, ADirectoryIsRefused) {
  fs::create_directories(dir_ / "folder");
  absl::Status st = WriteFileAtomically(Path("folder"), "x");
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(absl::StrContains(st.message(), "is a directory")) << st;
  EXPECT_TRUE(fs::is_directory(dir_ / "folder"));
  EXPECT_EQ(Entries(), std::vector<std::string>{"folder"});
}

TEST_F(FileUtilTest, AMissingFolderIsAnErrorAndLeavesNothing) {
  absl::Status st = WriteFileAtomically(Path("missing/out.txt"), "x");
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(absl::StrContains(st.message(), "missing")) << st;
  EXPECT_TRUE(Entries().empty());
}

TEST_F(FileUtilTest, RemovesTempFilesOfDeadProcessesOnlyForThisTarget) {
  const pid_t dead = DeadPid();
  const std::string stale = absl::StrCat("ck.st.tmp.", dead);
  const std::string live = absl::StrCat("ck.st.tmp.", ::getppid());  // a process that runs
  const std::string other_target = absl::StrCat("other.st.tmp.", dead);
  const std::string not_a_pid = "ck.st.tmp.1x";
  for (const std::string& name : {stale, live, other_target, not_a_pid}) {
    ASSERT_TRUE(WriteFileAtomically(Path(name), "partial").ok());
  }
  ASSERT_TRUE(WriteFileAtomically(Path("ck.st"), "checkpoint").ok());
  std::vector<std::string> want = {"ck.st", live, not_a_pid, other_target};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Entries(), want);
}

TEST_F(FileUtilTest, CheckOutputPathReportsWhatWouldFailLater) {
  EXPECT_TRUE(CheckOutputPath(Path("new.st"), "--save").ok());
  EXPECT_TRUE(CheckOutputPath("/dev/null", "--save").ok());
  absl::Status missing = CheckOutputPath(Path("no/such/dir/ck.st"), "--save");
  EXPECT_FALSE(missing.ok());
  EXPECT_TRUE(absl::StrContains(missing.message(), "--save")) << missing;
  EXPECT_TRUE(absl::StrContains(missing.message(), "does not exist")) << missing;
  fs::create_directories(dir_ / "folder");
  absl::Status folder = CheckOutputPath(Path("folder"), "-o");
  EXPECT_FALSE(folder.ok());
  EXPECT_TRUE(absl::StrContains(folder.message(), "is a directory")) << folder;
  absl::Status empty = CheckOutputPath("", "--trace");
  EXPECT_FALSE(empty.ok());
  EXPECT_TRUE(absl::StrContains(empty.message(), "--trace: the file name is empty")) << empty;
  EXPECT_TRUE(Entries() == std::vector<std::string>{"folder"});  // checking changed nothing
}

}  // namespace
}  // namespace kiln
