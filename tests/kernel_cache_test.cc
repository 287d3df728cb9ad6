// The on-disk kernel cache: hits and misses, stable keys, concurrent writers (processes and
// threads), corrupted and truncated entries, and $KILN_CACHE_DIR.
#include <gtest/gtest.h>

#ifdef KILN_WITH_CUDA

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "codegen/kernel_cache.h"
#include "codegen/nvrtc_compiler.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class KernelCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("kiln_kernel_cache_", ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_",
                        ::getpid());
    fs::remove_all(dir_);
    absl::StatusOr<KernelCache> cache = KernelCache::Open(dir_.string());
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_.emplace(*std::move(cache));
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path EntryPath(const std::string& key) const { return dir_ / (key + ".kc"); }
  std::string ReadFile(const fs::path& p) const {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  void WriteFile(const fs::path& p, const std::string& bytes) const {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  // Files in the cache directory other than entries (leftover temp files).
  int StrayFiles() const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) n += e.path().extension() == ".kc" ? 0 : 1;
    return n;
  }

  fs::path dir_;
  std::optional<KernelCache> cache_;
};

TEST_F(KernelCacheTest, MissThenHit) {
  const std::string key = KernelCache::Key("source", "-std=c++17", "sm_90a", "13.0");
  EXPECT_FALSE(cache_->Lookup(key).has_value());
  const std::string bytes("\x7f" "ELF\0binary\xff", 12);
  ASSERT_TRUE(cache_->Store(key, bytes).ok());
  EXPECT_EQ(cache_->Lookup(key), bytes);
  EXPECT_FALSE(cache_->Lookup(KernelCache::Key("other source", "-std=c++17", "sm_90a", "13.0")).has_value());
  ASSERT_TRUE(cache_->Store(key, "").ok());  // an empty payload is a valid entry
  EXPECT_EQ(cache_->Lookup(key), "");
  EXPECT_EQ(StrayFiles(), 0);
}

TEST_F(KernelCacheTest, KeysAreStableAndSeparateEveryInput) {
  const std::string key = KernelCache::Key("source", "opts", "sm_90a", "13.0");
  // The same on every machine and run: FNV-1a 128 of the framed fields, computed
  // independently in Python. Changing the hash invalidates every user's cache: do it on
  // purpose (and bump the "v1" tag in kernel_cache.cc).
  EXPECT_EQ(key, "ffd2b351380c4fcfd1c6081c597e9331");
  EXPECT_EQ(key.size(), 32u);
  EXPECT_EQ(KernelCache::Key("source", "opts", "sm_90a", "13.0"), key);
  EXPECT_NE(KernelCache::Key("sourcf", "opts", "sm_90a", "13.0"), key);
  EXPECT_NE(KernelCache::Key("source", "opts -lineinfo", "sm_90a", "13.0"), key);
  EXPECT_NE(KernelCache::Key("source", "opts", "sm_90", "13.0"), key);
  EXPECT_NE(KernelCache::Key("source", "opts", "sm_90a", "13.1"), key);
  // Fields are framed: moving bytes from one field to the next changes the key.
  EXPECT_NE(KernelCache::Key("ab", "c", "", ""), KernelCache::Key("a", "bc", "", ""));
}

TEST_F(KernelCacheTest, CorruptedEntryIsAMissAndIsRemoved) {
  const std::string key = KernelCache::Key("corrupt", "", "sm_90a", "13.0");
  ASSERT_TRUE(cache_->Store(key, std::string(1000, 'x')).ok());
  std::string file = ReadFile(EntryPath(key));
  file[500] ^= 0x10;  // a bit flip in the payload
  WriteFile(EntryPath(key), file);
  EXPECT_FALSE(cache_->Lookup(key).has_value());
  EXPECT_FALSE(fs::exists(EntryPath(key)));
  // A damaged header (magic) too.
  ASSERT_TRUE(cache_->Store(key, "payload").ok());
  file = ReadFile(EntryPath(key));
  file[0] = 'X';
  WriteFile(EntryPath(key), file);
  EXPECT_FALSE(cache_->Lookup(key).has_value());
  EXPECT_FALSE(fs::exists(EntryPath(key)));
  // Rebuilt by the caller, it hits again.
  ASSERT_TRUE(cache_->Store(key, "payload").ok());
  EXPECT_EQ(cache_->Lookup(key), "payload");
}

TEST_F(KernelCacheTest, TruncatedEntryIsAMissAndIsRemoved) {
  const std::string key = KernelCache::Key("truncated", "", "sm_90a", "13.0");
  const std::string payload(4096, 'p');
  for (size_t keep : {size_t{0}, size_t{7}, size_t{23}, size_t{24}, size_t{24 + 4095}}) {
    SCOPED_TRACE(keep);
    ASSERT_TRUE(cache_->Store(key, payload).ok());
    fs::resize_file(EntryPath(key), keep);
    EXPECT_FALSE(cache_->Lookup(key).has_value());
    EXPECT_FALSE(fs::exists(EntryPath(key)));
  }
  // Extra bytes after the payload are damage too.
  ASSERT_TRUE(cache_->Store(key, payload).ok());
  WriteFile(EntryPath(key), ReadFile(EntryPath(key)) + "junk");
  EXPECT_FALSE(cache_->Lookup(key).has_value());
}

TEST_F(KernelCacheTest, MalformedKeysAreRejected) {
  EXPECT_FALSE(cache_->Store("../escape", "x").ok());
  EXPECT_FALSE(cache_->Store("", "x").ok());
  EXPECT_FALSE(cache_->Lookup("../escape").has_value());
  EXPECT_FALSE(fs::exists(dir_.parent_path() / "escape.kc"));
}

// Several processes and threads store the same key at once, with different payloads, while
// this process reads: every read is a miss or one whole payload, never a mix.
TEST_F(KernelCacheTest, ConcurrentWritersNeverExposeAPartialEntry) {
  const std::string key = KernelCache::Key("contended", "", "sm_90a", "13.0");
  auto payload = [](int writer) { return std::string(64 * 1024 + writer, static_cast<char>('a' + writer)); };
  constexpr int kProcesses = 3;
  constexpr int kThreads = 2;
  constexpr int kStores = 40;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Only async-signal-safe-ish work in the child: plain stores, then _exit.
      bool ok = true;
      for (int i = 0; i < kStores; ++i) ok = ok && cache_->Store(key, payload(p)).ok();
      _exit(ok ? 0 : 1);
    }
    children.push_back(pid);
  }
  std::atomic<bool> stores_ok{true};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kStores; ++i) {
        if (!cache_->Store(key, payload(kProcesses + t)).ok()) stores_ok = false;
      }
    });
  }
  int reads = 0, hits = 0;
  bool done = false;
  while (!done) {
    std::optional<std::string> got = cache_->Lookup(key);
    ++reads;
    if (got.has_value()) {
      ++hits;
      bool whole = false;
      for (int w = 0; w < kProcesses + kThreads; ++w) whole = whole || *got == payload(w);
      ASSERT_TRUE(whole) << "a read of " << got->size() << " bytes matches no writer";
    }
    done = true;
    for (pid_t c : children) done = done && waitpid(c, nullptr, WNOHANG) != 0;
    if (done) break;
  }
  for (std::thread& t : threads) t.join();
  for (pid_t c : children) {
    int status = 0;
    waitpid(c, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_TRUE(stores_ok);
  EXPECT_GT(reads, 0);
  ASSERT_TRUE(cache_->Lookup(key).has_value());
  EXPECT_EQ(StrayFiles(), 0);
}

TEST(KernelCacheDir, DefaultsToKilnCacheDir) {
  const fs::path dir = fs::path(::testing::TempDir()) / absl::StrCat("kiln_cache_env_", ::getpid()) / "nested";
  fs::remove_all(dir.parent_path());
  const char* previous = std::getenv("KILN_CACHE_DIR");
  const std::string saved = previous != nullptr ? previous : "";
  ASSERT_EQ(setenv("KILN_CACHE_DIR", dir.c_str(), 1), 0);
  absl::StatusOr<KernelCache> cache = KernelCache::Open();
  if (previous != nullptr) {
    setenv("KILN_CACHE_DIR", saved.c_str(), 1);
  } else {
    unsetenv("KILN_CACHE_DIR");
  }
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ(cache->dir(), dir.string());
  EXPECT_TRUE(fs::is_directory(dir));  // created, parents included
  const std::string key = KernelCache::Key("env", "", "sm_90a", "13.0");
  ASSERT_TRUE(cache->Store(key, "bytes").ok());
  EXPECT_TRUE(fs::exists(dir / (key + ".kc")));
  // An explicit directory wins over the variable.
  EXPECT_EQ(KernelCache::Open(dir.parent_path().string())->dir(), dir.parent_path().string());
  fs::remove_all(dir.parent_path());
}

TEST(KernelCacheDir, UnwritableDirectoryIsAnError) {
  EXPECT_FALSE(KernelCache::Open("/proc/kiln_cannot_create_this").ok());
}

// CompileKernel goes through the cache: a miss compiles and stores, the next call hits
// with the same bytes; another architecture is another entry.
TEST_F(KernelCacheTest, CompileKernelStoresAndReuses) {
  KernelSpec k;
  k.name = "k_cached";
  k.source = "extern \"C\" __global__ void k_cached(float* out) { out[threadIdx.x] = 1.0f; }\n";
  absl::StatusOr<CompiledKernel> first = CompileKernel(k, NvrtcOptions{}, &*cache_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->from_cache);
  absl::StatusOr<CompiledKernel> second = CompileKernel(k, NvrtcOptions{}, &*cache_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->from_cache);
  EXPECT_EQ(second->cubin, first->cubin);
  EXPECT_EQ(second->name, "k_cached");
  NvrtcOptions other;
  other.arch = "sm_80";
  absl::StatusOr<CompiledKernel> third = CompileKernel(k, other, &*cache_);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(third->from_cache);
  EXPECT_NE(third->cubin, first->cubin);
  // A corrupted entry is recompiled, not returned.
  for (const auto& e : fs::directory_iterator(dir_)) fs::resize_file(e.path(), 30);
  absl::StatusOr<CompiledKernel> rebuilt = CompileKernel(k, NvrtcOptions{}, &*cache_);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_FALSE(rebuilt->from_cache);
  EXPECT_EQ(rebuilt->cubin, first->cubin);
}

}  // namespace
}  // namespace kiln

#else

TEST(KernelCache, NeedsTheCudaToolkit) { GTEST_SKIP() << "built without the CUDA toolkit"; }

#endif  // KILN_WITH_CUDA
