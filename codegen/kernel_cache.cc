// Entry file "<dir>/<key>.kc":
//   8 bytes  magic "KILNKC1\n"
//   8 bytes  payload length, little-endian
//   8 bytes  FNV-1a 64 of the payload, little-endian
//   payload  the cubin
// Written to a temp file unique to the process, thread and call, then renamed over the
// entry: rename is atomic, so a reader sees no entry, an old one or a whole new one. A torn
// or corrupted entry (a crash, a full disk, a bit flip) fails the length or checksum check
// and is removed.
#include "codegen/kernel_cache.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'K', 'C', '1', '\n'};
constexpr size_t kHeaderBytes = 24;

uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// FNV-1a with 128-bit state. Not cryptographic: two different kernels share a key with
// probability about 2^-128 per pair by accident; an adversary who can write sources could
// forge one, but such a user can write the cache directory anyway.
class Fnv1a128 {
 public:
  // Each field is framed by its length so ("ab", "c") and ("a", "bc") differ.
  void Field(absl::string_view bytes) {
    const uint64_t n = bytes.size();
    for (int i = 0; i < 8; ++i) Byte(static_cast<unsigned char>(n >> (8 * i)));
    for (unsigned char c : bytes) Byte(c);
  }
  std::string Hex() const {
    return absl::StrFormat("%016x%016x", static_cast<uint64_t>(h_ >> 64), static_cast<uint64_t>(h_));
  }

 private:
  void Byte(unsigned char c) { h_ = (h_ ^ c) * kPrime; }
  static constexpr unsigned __int128 kPrime = (static_cast<unsigned __int128>(1) << 88) + 0x13b;
  unsigned __int128 h_ = (static_cast<unsigned __int128>(0x6c62272e07bb0142ull) << 64) | 0x62b821756295c58dull;
};

void PutLittleEndian(uint64_t v, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t GetLittleEndian(absl::string_view bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

bool IsKey(absl::string_view key) {
  if (key.empty() || key.size() > 64) return false;
  for (char c : key) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The payload of a well-formed entry, or nullopt.
std::optional<std::string> Decode(const std::string& file) {
  if (file.size() < kHeaderBytes || file.compare(0, 8, kMagic, 8) != 0) return std::nullopt;
  const absl::string_view view(file);
  const uint64_t length = GetLittleEndian(view.substr(8, 8));
  const uint64_t checksum = GetLittleEndian(view.substr(16, 8));
  if (length != file.size() - kHeaderBytes) return std::nullopt;
  const absl::string_view payload = view.substr(kHeaderBytes);
  if (Fnv1a64(payload) != checksum) return std::nullopt;
  return std::string(payload);
}

}  // namespace

absl::StatusOr<KernelCache> KernelCache::Open(std::string dir) {
  if (dir.empty()) {
    const char* env = std::getenv("KILN_CACHE_DIR");
    const char* home = std::getenv("HOME");
    if (env != nullptr && *env != '\0') {
      dir = env;
    } else if (home != nullptr && *home != '\0') {
      dir = absl::StrCat(home, "/.cache/kiln");
    } else {
      return absl::FailedPreconditionError("kernel cache: neither $KILN_CACHE_DIR nor $HOME is set");
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return absl::FailedPreconditionError(
        absl::StrCat("kernel cache: cannot create directory ", dir, (ec ? ": " + ec.message() : "")));
  }
  return KernelCache(std::move(dir));
}

std::string KernelCache::Key(absl::string_view source, absl::string_view options, absl::string_view arch,
                             absl::string_view nvrtc_version) {
  Fnv1a128 h;
  h.Field("kiln kernel cache v1");
  h.Field(source);
  h.Field(options);
  h.Field(arch);
  h.Field(nvrtc_version);
  return h.Hex();
}

std::optional<std::string> KernelCache::Lookup(absl::string_view key) const {
  if (!IsKey(key)) return std::nullopt;
  const std::string path = absl::StrCat(dir_, "/", key, ".kc");
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream contents;
  contents << in.rdbuf();
  std::optional<std::string> payload = in.bad() ? std::nullopt : Decode(contents.str());
  if (!payload.has_value()) {
    std::error_code ignored;  // a concurrent remover may have won; either way it is gone
    std::filesystem::remove(path, ignored);
  }
  return payload;
}

absl::Status KernelCache::Store(absl::string_view key, absl::string_view bytes) const {
  if (!IsKey(key)) return absl::InvalidArgumentError(absl::StrCat("kernel cache: malformed key '", key, "'"));
  static std::atomic<uint64_t> counter{0};
  const std::string path = absl::StrCat(dir_, "/", key, ".kc");
  const std::string temp =
      absl::StrCat(dir_, "/.tmp-", key, "-", getpid(), "-", std::hash<std::thread::id>()(std::this_thread::get_id()),
                   "-", counter.fetch_add(1));
  std::string header(kMagic, sizeof(kMagic));
  PutLittleEndian(bytes.size(), &header);
  PutLittleEndian(Fnv1a64(bytes), &header);
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(temp, ignored);
      return absl::UnavailableError(absl::StrCat("kernel cache: cannot write ", temp));
    }
  }
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    return absl::UnavailableError(absl::StrCat("kernel cache: cannot rename ", temp, " to ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace kiln
