// The processes of a data-parallel run (runtime/distributed/rank_launcher.h) and how they
// find rank 0 (runtime/distributed/rendezvous.h), on the CPU with /bin/sh as the ranks: what
// every rank is told, a failing rank stopping the others, and a rendezvous that never comes
// ending in an error rather than a hang. The NCCL runner these serve needs several GPUs.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ir/file_util.h"
#include "runtime/distributed/rank_launcher.h"
#include "runtime/distributed/rendezvous.h"

namespace kiln {
namespace {

class RankLauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("kiln_ranks_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  RankProcess Shell(const std::string& script, int rank) const {
    return {.argv = {"/bin/sh", "-c", script}, .log_path = Path(absl::StrCat("rank", rank, ".log"))};
  }
  std::filesystem::path dir_;
};

TEST_F(RankLauncherTest, EveryRankIsToldItsRankTheWorldAndTheRunWithMulticastOff) {
  std::vector<RankProcess> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(Shell("echo $KILN_RANK $KILN_WORLD_SIZE $KILN_RUN_ID $NCCL_NVLS_ENABLE $EXTRA", r));
    ranks.back().env = {{"EXTRA", absl::StrCat("x", r)}};
  }
  ASSERT_TRUE(RunRanks(ranks, {.run_id = "run7"}).ok());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(*ReadFileToString(Path(absl::StrCat("rank", r, ".log"))), absl::StrCat(r, " 3 run7 0 x", r, "\n"));
  }
}

TEST_F(RankLauncherTest, AFailingRankStopsTheOthersAndIsNamedWithItsLog) {
  // Rank 0 would wait a minute (a peer stuck in a collective); rank 1 fails at once. (The
  // scripts exec their sleep, so that stopping the rank stops the sleep too.)
  std::vector<RankProcess> ranks = {Shell("exec sleep 60", 0), Shell("echo 'ncclAllReduce (rank 1): boom'; exit 3", 1)};
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = RunRanks(ranks, {.run_id = "r", .grace = absl::Seconds(2)});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1 of 2 exited with status 3")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "ncclAllReduce (rank 1): boom")) << s;
  EXPECT_LT(seconds, 10) << "rank 0 was not stopped";
}

TEST_F(RankLauncherTest, ARankThatIgnoresSigtermIsKilledAfterTheGrace) {
  std::vector<RankProcess> ranks = {Shell("trap '' TERM; exec sleep 60", 0), Shell("exit 1", 1)};
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = RunRanks(ranks, {.run_id = "r", .grace = absl::Milliseconds(300)});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1 of 2 exited with status 1")) << s;
  EXPECT_LT(seconds, 10);
}

TEST_F(RankLauncherTest, AKilledRankIsNamedWithItsSignal) {
  absl::Status s = RunRanks({Shell("kill -9 $$", 0)}, {.run_id = "r"});
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 0 of 1 was killed by signal 9")) << s;
}

TEST_F(RankLauncherTest, TheRunsLimitStopsEveryRank) {
  absl::Status s = RunRanks({Shell("exec sleep 60", 0), Shell("exec sleep 60", 1)},
                            {.run_id = "r", .grace = absl::Seconds(1), .timeout = absl::Milliseconds(300)});
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

TEST_F(RankLauncherTest, AProgramThatCannotStartOrALogThatCannotBeWrittenIsAClearError) {
  absl::Status missing = RunRanks({{.argv = {"/nonexistent/kiln"}, .log_path = Path("l")}}, {.run_id = "r"});
  EXPECT_TRUE(absl::StrContains(missing.message(), "rank 0 of 1: cannot start /nonexistent/kiln")) << missing;
  absl::Status log = RunRanks({{.argv = {"/bin/true"}, .log_path = "/nonexistent-dir/rank0.log"}}, {.run_id = "r"});
  EXPECT_FALSE(log.ok());
  EXPECT_TRUE(absl::StrContains(log.message(), "rank 0's log")) << log;
  EXPECT_FALSE(RunRanks({}, {.run_id = "r"}).ok());
}

TEST_F(RankLauncherTest, RendezvousHandsRankZerosPayloadToTheOthers) {
  const Rendezvous r{.path = Path("rendezvous"), .run_id = "run1", .world_size = 2, .timeout = absl::Seconds(20)};
  const std::string id(128, '\x7f');
  std::thread publisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 1 is waiting already
    ASSERT_TRUE(PublishRendezvous(r, id).ok());
  });
  absl::StatusOr<std::string> got = AwaitRendezvous(r, 1, 128);
  publisher.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, id);
}

TEST_F(RankLauncherTest, ARendezvousThatNeverComesIsADeadlineNamingTheRankAndAStaleFile) {
  Rendezvous r{.path = Path("rendezvous"), .run_id = "now", .world_size = 2, .timeout = absl::Milliseconds(200)};
  absl::StatusOr<std::string> none = AwaitRendezvous(r, 1, 128);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "rank 1 of 2: rank 0 did not publish run now")) << none.status();
  EXPECT_TRUE(absl::StrContains(none.status().message(), "no file there")) << none.status();
  // An earlier run's file is not this run's: still a deadline, saying whose file it is.
  Rendezvous earlier = r;
  earlier.run_id = "before";
  ASSERT_TRUE(PublishRendezvous(earlier, std::string(128, 'a')).ok());
  absl::StatusOr<std::string> stale = AwaitRendezvous(r, 1, 128);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(stale.status().message(), "run before's, an earlier run's")) << stale.status();
}

TEST_F(RankLauncherTest, ARendezvousOfAnotherWorldOrSizeOrFormatIsRefused) {
  const Rendezvous r{.path = Path("rendezvous"), .run_id = "run", .world_size = 4};
  Rendezvous two = r;
  two.world_size = 2;
  ASSERT_TRUE(PublishRendezvous(two, std::string(128, 'b')).ok());
  absl::StatusOr<std::string> world = AwaitRendezvous(r, 3, 128);
  EXPECT_EQ(world.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(world.status().message(), "is for a world of 2")) << world.status();
  ASSERT_TRUE(PublishRendezvous(r, std::string(16, 'c')).ok());
  EXPECT_EQ(AwaitRendezvous(r, 1, 128).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(WriteFileAtomically(r.path, "something else\n").ok());
  EXPECT_EQ(AwaitRendezvous(r, 1, 128).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PublishRendezvous({.path = r.path, .run_id = "has space"}, "x").ok());
}

}  // namespace
}  // namespace kiln
