#include "runtime/distributed/rank_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ir/file_util.h"

extern char** environ;

namespace kiln {
namespace {

// This process's environment with `extra` added, a name in both taking extra's value.
std::vector<std::string> Environment(const std::vector<std::pair<std::string, std::string>>& extra) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [name, value] : extra) env[name] = value;
  std::vector<std::string> out;
  for (const auto& [name, value] : env) out.push_back(absl::StrCat(name, "=", value));
  return out;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (std::string& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

std::string LogTail(const std::string& path, int lines) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return absl::StrCat("(its log ", path, " cannot be read: ", text.status().message(), ")");
  std::vector<absl::string_view> all = absl::StrSplit(*text, '\n');
  while (!all.empty() && all.back().empty()) all.pop_back();
  if (all.empty()) return absl::StrCat("(its log ", path, " is empty)");
  const size_t first = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  std::vector<absl::string_view> tail(all.begin() + static_cast<std::ptrdiff_t>(first), all.end());
  return absl::StrCat("its log ", path, " ends:\n  ", absl::StrJoin(tail, "\n  "));
}

std::string HowItEnded(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("ended with wait status ", status);
}

// Stops every still-running rank: SIGTERM, then SIGKILL for those alive after `grace`; reaps all.
void StopAll(std::vector<pid_t>& pids, absl::Duration grace, absl::Duration poll) {
  for (pid_t pid : pids) {
    if (pid > 0) kill(pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + grace;
  bool any = true;
  while (any) {
    any = false;
    for (pid_t& pid : pids) {
      if (pid <= 0) continue;
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
      } else {
        any = true;
      }
    }
    if (!any) break;
    if (absl::Now() >= deadline) {
      for (pid_t& pid : pids) {
        if (pid <= 0) continue;
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        pid = -1;
      }
      break;
    }
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(poll));
  }
}

}  // namespace

absl::Status RunRanks(absl::Span<const RankProcess> ranks, const RankLaunchOptions& options) {
  const int world = static_cast<int>(ranks.size());
  if (world < 1) return absl::InvalidArgumentError("a data-parallel run needs at least one rank");
  std::vector<pid_t> pids(world, -1);
  for (int r = 0; r < world; ++r) {
    const RankProcess& rank = ranks[r];
    if (rank.argv.empty()) {
      StopAll(pids, options.grace, options.poll);
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " has no program to run"));
    }
    if (absl::Status s = CheckOutputPath(rank.log_path, absl::StrCat("rank ", r, "'s log")); !s.ok()) {
      StopAll(pids, options.grace, options.poll);
      return s;
    }
    std::vector<std::pair<std::string, std::string>> extra = {{"KILN_RANK", absl::StrCat(r)},
                                                              {"KILN_WORLD_SIZE", absl::StrCat(world)},
                                                              {"KILN_RUN_ID", options.run_id},
                                                              {"NCCL_NVLS_ENABLE", "0"}};
    extra.insert(extra.end(), rank.env.begin(), rank.env.end());
    std::vector<std::string> env = Environment(extra);
    std::vector<std::string> argv = rank.argv;
    std::vector<char*> env_p = Pointers(env), argv_p = Pointers(argv);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, rank.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid = -1;
    const int error = posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, argv_p.data(), env_p.data());
    posix_spawn_file_actions_destroy(&actions);
    if (error != 0) {
      StopAll(pids, options.grace, options.poll);
      return absl::FailedPreconditionError(absl::StrCat("rank ", r, " of ", world, ": cannot start ", argv[0], ": ",
                                                        std::strerror(error)));
    }
    pids[r] = pid;
  }
  const absl::Time deadline = options.timeout > absl::ZeroDuration() ? absl::Now() + options.timeout
                                                                     : absl::InfiniteFuture();
  int running = world;
  while (running > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      const pid_t done = waitpid(pids[r], &status, WNOHANG);
      if (done == 0) continue;
      pids[r] = -1;
      --running;
      if (done < 0) {
        StopAll(pids, options.grace, options.poll);
        return absl::InternalError(absl::StrCat("rank ", r, ": waitpid: ", std::strerror(errno)));
      }
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        StopAll(pids, options.grace, options.poll);
        return absl::AbortedError(absl::StrCat("rank ", r, " of ", world, " ", HowItEnded(status),
                                               "; the other ranks were stopped; ",
                                               LogTail(ranks[r].log_path, options.log_tail_lines)));
      }
    }
    if (running == 0) break;
    if (absl::Now() >= deadline) {
      StopAll(pids, options.grace, options.poll);
      return absl::DeadlineExceededError(absl::StrCat("the run of ", world, " ranks passed its limit of ",
                                                      absl::FormatDuration(options.timeout),
                                                      "; every rank was stopped"));
    }
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(options.poll));
  }
  return absl::OkStatus();
}

}  // namespace kiln
