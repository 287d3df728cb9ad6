#include "runtime/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "ir/file_util.h"
#include "runtime/memory_estimate.h"
#include "ir/numerics.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Bit-exact, so -0 and 0 differ; any NaN equals any NaN (encoders canonicalize payloads).
bool SameValue(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);
}

void ExpectSameTensors(const Safetensors& expected, const Safetensors& actual) {
  ASSERT_EQ(expected.tensors.size(), actual.tensors.size());
  for (size_t i = 0; i < expected.tensors.size(); ++i) {
    const NamedTensor& e = expected.tensors[i];
    const NamedTensor& a = actual.tensors[i];
    EXPECT_EQ(e.name, a.name);
    ASSERT_EQ(e.tensor.type(), a.tensor.type()) << e.name;
    for (int64_t j = 0; j < e.tensor.num_elements(); ++j) {
      ASSERT_TRUE(SameValue(e.tensor[j], a.tensor[j]))
          << e.name << "[" << j << "]: " << e.tensor[j] << " became " << a.tensor[j];
    }
  }
  EXPECT_EQ(expected.metadata, actual.metadata);
}

Safetensors RoundTrip(const Safetensors& st) {
  absl::StatusOr<std::string> bytes = EncodeSafetensors(st);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<Safetensors> back = DecodeSafetensors(bytes.value_or(""), "roundtrip");
  EXPECT_TRUE(back.ok()) << back.status();
  return back.value_or(Safetensors{});
}

// A file from its raw parts: the header text as given (no padding) and the data bytes.
std::string RawFile(absl::string_view header, absl::string_view data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return absl::StrCat(out, header, data);
}

std::string FreshDir(absl::string_view name) {
  const fs::path dir = fs::path(::testing::TempDir()) / absl::StrCat("safetensors_test_", name, "_", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::vector<std::string> DirEntries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(SafetensorsTest, EveryDTypeRoundTripsExactly) {
  const std::vector<double> float_specials = {0.0, -0.0, 1.0, -2.5, 0.1, 1e-40, -3e38, kInf, -kInf, kNaN, 448.0, 1e6};
  Safetensors st;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2}) {
    std::vector<double> values = float_specials;
    const HostTensor random = HostTensor::Random(TensorType{dtype, {2, 5}}, /*seed=*/7, -100.0, 100.0);
    values.insert(values.end(), random.values().begin(), random.values().end());
    st.tensors.push_back({absl::StrCat("w.", DTypeName(dtype)),
                          HostTensor::FromValues(TensorType{dtype, {2, 11}}, std::move(values))});
  }
  st.tensors.push_back({"ids32", HostTensor::FromValues(TensorType{DType::kI32, {4}},
                                                        {0, -1, 2147483647.0, -2147483648.0})});
  st.tensors.push_back({"ids64", HostTensor::FromValues(TensorType{DType::kI64, {4}},
                                                        {0, -1, 9007199254740992.0, -9007199254740992.0})});
  st.tensors.push_back({"mask", HostTensor::FromValues(TensorType{DType::kPred, {2, 2}}, {1, 0, 0, 1})});
  st.tensors.push_back({"scalar", HostTensor::FromValues(TensorType{DType::kF32, {}}, {3.5})});
  st.tensors.push_back({"empty", HostTensor(TensorType{DType::kBF16, {0, 3}})});
  ExpectSameTensors(st, RoundTrip(st));
}

TEST(SafetensorsTest, EmptyFileRoundTrips) { ExpectSameTensors(Safetensors{}, RoundTrip(Safetensors{})); }

// The data buffer of a one-tensor file holds exactly the format's bit patterns.
template <typename Bits>
void ExpectBitPatternsSurvive(DType dtype, float (*decode)(Bits), bool (*skip)(Bits)) {
  std::vector<Bits> patterns;
  std::vector<double> values;
  for (uint32_t b = 0; b <= std::numeric_limits<Bits>::max(); ++b) {
    if (skip(static_cast<Bits>(b))) continue;
    patterns.push_back(static_cast<Bits>(b));
    values.push_back(decode(static_cast<Bits>(b)));
  }
  Safetensors st;
  const int64_t n = static_cast<int64_t>(values.size());
  st.tensors.push_back({"bits", HostTensor::FromValues(TensorType{dtype, {n}}, values)});
  absl::StatusOr<std::string> bytes = EncodeSafetensors(st);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string data = bytes->substr(bytes->size() - n * sizeof(Bits));
  ASSERT_EQ(std::memcmp(data.data(), patterns.data(), data.size()), 0) << DTypeName(dtype);
  ExpectSameTensors(st, RoundTrip(st));
}

TEST(SafetensorsTest, NarrowFloatBitPatternsSurvive) {
  // NaN payloads are canonicalized and E5M2 infinities saturate (numerics.h); all else is kept.
  ExpectBitPatternsSurvive<uint16_t>(DType::kBF16, BF16BitsToFloat,
                                     [](uint16_t b) { return std::isnan(BF16BitsToFloat(b)); });
  ExpectBitPatternsSurvive<uint16_t>(DType::kF16, F16BitsToFloat,
                                     [](uint16_t b) { return std::isnan(F16BitsToFloat(b)); });
  ExpectBitPatternsSurvive<uint8_t>(DType::kF8E4M3, F8E4M3BitsToFloat,
                                    [](uint8_t b) { return std::isnan(F8E4M3BitsToFloat(b)); });
  ExpectBitPatternsSurvive<uint8_t>(DType::kF8E5M2, F8E5M2BitsToFloat,
                                    [](uint8_t b) { return !std::isfinite(F8E5M2BitsToFloat(b)); });
}

TEST(SafetensorsTest, ReadsE5M2InfinityAsSaturatedAndF64AsF32) {
  const uint8_t e5m2[2] = {0x7C, 0xFC};  // +inf, -inf
  const double f64[2] = {0.1, -1e300};
  const std::string data = absl::StrCat(absl::string_view(reinterpret_cast<const char*>(e5m2), 2),
                                        absl::string_view(reinterpret_cast<const char*>(f64), 16));
  absl::StatusOr<Safetensors> st = DecodeSafetensors(
      RawFile(R"({"e":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]},)"
              R"("d":{"dtype":"F64","shape":[2],"data_offsets":[2,18]}})",
              data),
      "hand.safetensors");
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->tensors.size(), 2u);
  EXPECT_EQ(st->tensors[0].tensor.values(), (std::vector<double>{57344.0, -57344.0}));
  EXPECT_EQ(st->tensors[1].tensor.type(), (TensorType{DType::kF32, {2}}));
  EXPECT_EQ(st->tensors[1].tensor.values(), (std::vector<double>{static_cast<float>(0.1), -kInf}));
}

// Written by Python's safetensors 0.8.0 from torch 2.11 tensors: save_file({...},
// metadata={"format": "pt"}). Its writer orders data by dtype size, then name.
TEST(SafetensorsTest, ReadsFileWrittenByThePythonLibrary) {
  const std::string header = absl::StrCat(
      R"({"__metadata__":{"format":"pt"},"i64":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)",
      R"("f64":{"dtype":"F64","shape":[1],"data_offsets":[16,24]},)",
      R"("empty":{"dtype":"F32","shape":[0,3],"data_offsets":[24,24]},)",
      R"("f32":{"dtype":"F32","shape":[4],"data_offsets":[24,40]},)",
      R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[40,44]},)",
      R"("i32":{"dtype":"I32","shape":[2],"data_offsets":[44,52]},)",
      R"("bf16":{"dtype":"BF16","shape":[2],"data_offsets":[52,56]},)",
      R"("f16":{"dtype":"F16","shape":[2],"data_offsets":[56,60]},)",
      R"("e4m3":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[60,62]},)",
      R"("e5m2":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[62,64]},)",
      R"("b":{"dtype":"BOOL","shape":[2],"data_offsets":[64,66]}}     )");
  ASSERT_EQ(header.size(), 680u);
  const std::string data(
      "\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\x00\x00\x00\x00\x00\x01\x00\x00"  // i64
      "\x9A\x99\x99\x99\x99\x99\xB9\x3F"                                  // f64
      "\x00\x00\x80\x3F\x00\x00\x00\x80\x00\x00\x80\x7F\xC2\x09\x00\x00"  // f32
      "\x00\x00\x00\x40"                                                  // scalar
      "\xF9\xFF\xFF\xFF\xFF\xFF\xFF\x7F"                                  // i32
      "\xC0\x3F\x00\xC0\xFF\x7B\x01\x00"                                  // bf16, f16
      "\x7E\x88\x7B\x3E\x01\x00",                                         // e4m3, e5m2, bool
      66);
  absl::StatusOr<Safetensors> st = DecodeSafetensors(RawFile(header, data), "python.safetensors");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->metadata, (std::map<std::string, std::string>{{"format", "pt"}}));

  const std::vector<std::pair<std::string, HostTensor>> expected = {
      {"i64", HostTensor::FromValues(TensorType{DType::kI64, {2}}, {-1.0, 1099511627776.0})},
      {"f64", HostTensor::FromValues(TensorType{DType::kF32, {1}}, {0.1})},
      {"empty", HostTensor(TensorType{DType::kF32, {0, 3}})},
      {"f32", HostTensor::FromValues(TensorType{DType::kF32, {4}}, {1.0, -0.0, kInf, 3.5e-42})},
      {"scalar", HostTensor::FromValues(TensorType{DType::kF32, {}}, {2.0})},
      {"i32", HostTensor::FromValues(TensorType{DType::kI32, {2}}, {-7.0, 2147483647.0})},
      {"bf16", HostTensor::FromValues(TensorType{DType::kBF16, {2}}, {1.5, -2.0})},
      {"f16", HostTensor::FromValues(TensorType{DType::kF16, {2}}, {65504.0, 0x1p-24})},
      {"e4m3", HostTensor::FromValues(TensorType{DType::kF8E4M3, {2}}, {448.0, -0.015625})},
      {"e5m2", HostTensor::FromValues(TensorType{DType::kF8E5M2, {2}}, {57344.0, 1.5})},
      {"b", HostTensor::FromValues(TensorType{DType::kPred, {2}}, {1.0, 0.0})},
  };
  Safetensors want;
  want.metadata = st->metadata;
  for (const auto& [name, tensor] : expected) want.tensors.push_back({name, tensor});
  ExpectSameTensors(want, *st);
}

TEST(SafetensorsTest, MetadataRoundTrips) {
  Safetensors st;
  st.metadata = {{"format", "pt"}, {"note", "quotes \" and\nnewlines, ünïcode"}, {"empty", ""}};
  st.tensors.push_back({"x", HostTensor::FromValues(TensorType{DType::kF32, {1}}, {1.0})});
  ExpectSameTensors(st, RoundTrip(st));
}

TEST(SafetensorsTest, ByteLayoutMatchesHandBuiltFile) {
  Safetensors st;
  st.metadata = {{"format", "pt"}};
  st.tensors.push_back({"b", HostTensor::FromValues(TensorType{DType::kF32, {2}}, {1.0, -2.0})});
  st.tensors.push_back({"a", HostTensor::FromValues(TensorType{DType::kBF16, {1}}, {1.0})});
  st.tensors.push_back({"m", HostTensor::FromValues(TensorType{DType::kPred, {}}, {1.0})});
  absl::StatusOr<std::string> bytes = EncodeSafetensors(st);
  ASSERT_TRUE(bytes.ok()) << bytes.status();

  std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]},)"
      R"("m":{"dtype":"BOOL","shape":[],"data_offsets":[10,11]}})";
  ASSERT_NE(header.size() % 8, 0) << "the test should exercise padding";
  header.append(8 - header.size() % 8, ' ');
  // f32 1.0 = 0x3F800000, f32 -2.0 = 0xC0000000, bf16 1.0 = 0x3F80, all little-endian; true = 1.
  const std::string data("\x00\x00\x80\x3F\x00\x00\x00\xC0\x80\x3F\x01", 11);
  EXPECT_EQ(*bytes, RawFile(header, data));
  EXPECT_EQ((bytes->size() - data.size()) % 8, 0);
}

TEST(SafetensorsTest, FileOrderIsDataOrderNotHeaderOrder) {
  const float values[2] = {5.0f, 6.0f};
  absl::StatusOr<Safetensors> st = DecodeSafetensors(
      RawFile(R"({"first_in_header":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
              R"("first_in_data":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
              absl::string_view(reinterpret_cast<const char*>(values), 8)),
      "order.safetensors");
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->tensors.size(), 2u);
  EXPECT_EQ(st->tensors[0].name, "first_in_data");
  EXPECT_EQ(st->tensors[0].tensor[0], 5.0);
  EXPECT_EQ(st->tensors[1].name, "first_in_header");
}

TEST(SafetensorsTest, EncoderRejectsDuplicateAndReservedNames) {
  Safetensors st;
  st.tensors.push_back({"w", HostTensor(TensorType{DType::kF32, {1}})});
  st.tensors.push_back({"w", HostTensor(TensorType{DType::kF32, {1}})});
  EXPECT_NE(EncodeSafetensors(st).status().message().find("'w' is used twice"), std::string::npos);
  st.tensors[1].name = "__metadata__";
  EXPECT_NE(EncodeSafetensors(st).status().message().find("reserved"), std::string::npos);
}

struct CorruptFile {
  const char* what;
  std::string bytes;
  const char* key_phrase;
};

std::vector<CorruptFile> CorruptFiles() {
  const std::string eight_bytes(8, '\x01');
  auto one = [](absl::string_view entry, absl::string_view data = std::string(8, '\0')) {
    return RawFile(absl::StrCat(R"({"a":)", entry, "}"), data);
  };
  std::string huge_length(8, '\0');
  huge_length[5] = 1;  // 2^40
  std::string too_long = RawFile("{}", "");
  too_long[0] = 100;
  Safetensors valid;
  valid.tensors.push_back({"a", HostTensor(TensorType{DType::kF32, {4}})});
  std::string truncated = EncodeSafetensors(valid).value();
  truncated.resize(truncated.size() - 3);
  return {
      {"empty file", "", "too short for the 8-byte header length"},
      {"absurd header length", huge_length + "{}", "is absurd"},
      {"header length past the end", too_long, "larger than the file"},
      {"not JSON", RawFile(R"({"a": x})", ""), "not valid JSON (at byte 7 "},
      {"invalid UTF-8", RawFile("{\"\xff\": 1}", ""), "not valid JSON"},
      {"header not an object", RawFile("[1, 2]", ""), "must be a JSON object"},
      {"entry not an object", one("3"), "tensor 'a': expected an object"},
      {"missing dtype", one(R"({"shape":[2],"data_offsets":[0,8]})"), "tensor 'a': missing \"dtype\""},
      {"missing shape", one(R"({"dtype":"F32","data_offsets":[0,8]})"), "tensor 'a': missing \"shape\""},
      {"missing offsets", one(R"({"dtype":"F32","shape":[2]})"), "tensor 'a': missing \"data_offsets\""},
      {"unknown dtype", one(R"({"dtype":"U8","shape":[8],"data_offsets":[0,8]})"),
       "tensor 'a': unknown or unsupported dtype \"U8\""},
      {"dtype not a string", one(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})"), "unsupported dtype 4"},
      {"negative dim", one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), "non-negative integers"},
      {"fractional dim", one(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})"), "non-negative integers"},
      {"shape overflow", one(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})"),
       "overflows 64-bit element counts"},
      {"byte count overflow", one(R"({"dtype":"I64","shape":[2305843009213693952],"data_offsets":[0,8]})"),
       "more than 2^40 elements"},
      // Within 64-bit counts, but beyond the limit every reader shares (ir/types.h).
      {"beyond the size limit", one(R"({"dtype":"F32","shape":[2097152,1048576],"data_offsets":[0,8]})"),
       "more than 2^40 elements"},
      {"offsets not a pair", one(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"), "must be [begin, end]"},
      {"offsets reversed", one(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"), "end before they begin"},
      {"offsets out of range", one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"),
       "run past the end of the data (8 bytes)"},
      {"size not matching shape", one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
       "hold 8 bytes, but shape [3] of F32 needs 12"},
      {"offsets not covering the data", one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"),
       "data bytes [0, 4) belong to no tensor"},
      {"trailing bytes", one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})"),
       "data bytes [4, 8) belong to no tensor"},
      {"overlapping tensors",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               eight_bytes),
       "tensor 'b': data_offsets [4, 8] overlap tensor 'a'"},
      {"duplicate names",
       RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
               R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               eight_bytes),
       "name 'a' appears twice"},
      {"metadata not strings", RawFile(R"({"__metadata__":{"step":3}})", ""), "value for 'step' must be a string"},
      {"truncated file", truncated, "tensor 'a': data_offsets [0,16] run past the end of the data (13 bytes)"},
  };
}

TEST(SafetensorsTest, CorruptFilesAreRejectedAndLeftUntouched) {
  const std::string dir = FreshDir("corrupt");
  for (const CorruptFile& c : CorruptFiles()) {
    SCOPED_TRACE(c.what);
    absl::StatusOr<Safetensors> decoded = DecodeSafetensors(c.bytes, "corrupt.safetensors");
    ASSERT_FALSE(decoded.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(decoded.status())) << decoded.status();
    EXPECT_NE(decoded.status().message().find("corrupt.safetensors: "), std::string::npos) << decoded.status();
    EXPECT_NE(decoded.status().message().find(c.key_phrase), std::string::npos) << decoded.status();

    const std::string path = absl::StrCat(dir, "/bad.safetensors");
    ASSERT_TRUE(WriteFileAtomically(path, c.bytes).ok());
    absl::StatusOr<Safetensors> read = ReadSafetensorsFile(path);
    ASSERT_FALSE(read.ok());
    EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status();
    EXPECT_EQ(ReadFileToString(path).value(), c.bytes);
  }
}

// Every proper prefix of a valid file is an error, and random byte corruptions decode to
// an error or to some tensors, never to a crash (run under a sanitizer to see more).
TEST(SafetensorsTest, SurvivesTruncationAndByteCorruption) {
  Safetensors st;
  st.metadata = {{"format", "pt"}};
  st.tensors.push_back({"w", HostTensor::Random(TensorType{DType::kBF16, {3, 4}}, /*seed=*/3)});
  st.tensors.push_back({"ids", HostTensor::Random(TensorType{DType::kI64, {5}}, /*seed=*/4, 0, 100)});
  const std::string valid = EncodeSafetensors(st).value();
  for (size_t n = 0; n < valid.size(); ++n) {
    EXPECT_FALSE(DecodeSafetensors(absl::string_view(valid).substr(0, n), "prefix").ok()) << n << " bytes";
  }
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string corrupt = valid;
    for (int flips = 1 + trial % 3; flips > 0; --flips) {
      corrupt[rng() % corrupt.size()] = static_cast<char>(rng());
    }
    (void)DecodeSafetensors(corrupt, "fuzzed");
  }
}

TEST(SafetensorsTest, FileRoundTrip) {
  const std::string path = FreshDir("file") + "/w.safetensors";
  Safetensors st;
  st.metadata = {{"format", "pt"}};
  st.tensors.push_back({"w", HostTensor::Random(TensorType{DType::kBF16, {3, 4}}, /*seed=*/1)});
  ASSERT_TRUE(WriteSafetensorsFile(path, st).ok());
  absl::StatusOr<Safetensors> back = ReadSafetensorsFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTensors(st, *back);
  EXPECT_EQ(ReadSafetensorsFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

// Issue 11: a weights file whose decoded values cannot fit in memory ended in bad_alloc.
// The file is mapped, not read, and refused before decoding. (A sparse file: the 32 GiB of
// zeros take no disk.)
TEST(SafetensorsTest, ValuesThatCannotFitAreRefusedBeforeDecoding) {
  absl::StatusOr<HostMemory> memory = AvailableHostMemory();
  const int64_t elements = int64_t{16} << 30;  // bf16: 32 GiB on disk, 128 GiB as doubles
  if (!memory.ok() || memory->available_bytes > elements * 8) GTEST_SKIP() << "this machine could decode it";
  const std::string path = FreshDir("sparse") + "/big.safetensors";
  std::string header = absl::StrCat(R"({"w":{"dtype":"BF16","shape":[)", elements, R"(],"data_offsets":[0,)",
                                    elements * 2, "]}}");
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  const uint64_t length = header.size();
  std::memcpy(prefix.data(), &length, 8);
  ASSERT_TRUE(WriteFileAtomically(path, prefix + header).ok());
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(8 + header.size() + elements * 2)), 0);
  absl::StatusOr<Safetensors> st = ReadSafetensorsFile(path);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kResourceExhausted) << st.status();
  EXPECT_NE(st.status().message().find("decoding " + path + " needs about 128.0 GiB of host memory"),
            std::string::npos)
      << st.status();
  std::filesystem::remove(path);
}

Safetensors OneTensor(double value) {
  Safetensors st;
  st.tensors.push_back({"w", HostTensor::FromValues(TensorType{DType::kF32, {1}}, {value})});
  return st;
}

TEST(SafetensorsTest, FailedEncodeKeepsOldFile) {
  const std::string dir = FreshDir("bad_encode");
  const std::string path = dir + "/w.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(path, OneTensor(1.0)).ok());
  const std::string before = ReadFileToString(path).value();
  Safetensors duplicate = OneTensor(2.0);
  duplicate.tensors.push_back(duplicate.tensors[0]);
  absl::Status status = WriteSafetensorsFile(path, duplicate);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find(path), std::string::npos) << status;
  EXPECT_EQ(ReadFileToString(path).value(), before);
  EXPECT_EQ(DirEntries(dir), std::vector<std::string>{"w.safetensors"});
}

// Renaming over a directory fails after the temporary file is written: the one failure
// that reaches the last step, and it is possible even as root.
TEST(SafetensorsTest, FailedRenameLeavesNoTempFile) {
  const std::string dir = FreshDir("rename");
  const std::string path = dir + "/w.safetensors";
  fs::create_directory(path);
  EXPECT_FALSE(WriteSafetensorsFile(path, OneTensor(1.0)).ok());
  EXPECT_EQ(DirEntries(dir), std::vector<std::string>{"w.safetensors"});
  EXPECT_TRUE(fs::is_directory(path));
}

TEST(SafetensorsTest, WriteIntoReadOnlyDirectoryKeepsOldFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  const std::string dir = FreshDir("read_only");
  const std::string path = dir + "/w.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(path, OneTensor(1.0)).ok());
  const std::string before = ReadFileToString(path).value();
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  absl::Status status = WriteSafetensorsFile(path, OneTensor(2.0));
  ::chmod(dir.c_str(), 0755);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(ReadFileToString(path).value(), before);
  EXPECT_EQ(DirEntries(dir), std::vector<std::string>{"w.safetensors"});
}

}  // namespace
}  // namespace kiln
