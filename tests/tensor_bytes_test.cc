// runtime/tensor_bytes.h: every dtype's storage bytes, both ways, against hand-written bit
// patterns, and round trips of random tensors.
#include "runtime/tensor_bytes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace kiln {
namespace {

std::string Bytes(std::initializer_list<uint8_t> b) { return std::string(b.begin(), b.end()); }

TEST(TensorBytes, EncodesKnownBitPatterns) {
  EXPECT_EQ(EncodeTensorBytes(HostTensor::FromValues({DType::kF32, {2}}, {1.0, -2.0})),
            Bytes({0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0}));
  EXPECT_EQ(EncodeTensorBytes(HostTensor::FromValues({DType::kBF16, {2}}, {1.0, -0.0})),
            Bytes({0x80, 0x3f, 0x00, 0x80}));
  EXPECT_EQ(EncodeTensorBytes(HostTensor::FromValues({DType::kF16, {1}}, {65504.0})), Bytes({0xff, 0x7b}));
  EXPECT_EQ(EncodeTensorBytes(HostTensor::FromValues({DType::kF8E4M3, {2}}, {448.0, -1.0})), Bytes({0x7e, 0xb8}));
  EXPECT_EQ(EncodeTensorBytes(HostTensor::FromValues({DType::kF8E5M2, {1}}, {57344.0})), Bytes({0x7b}));
  EXPECT_EQ(EncodeTensorBytes(HostTensor::FromValues({DType::kI32, {2}}, {-1, 258})),
            Bytes({0xff, 0xff, 0xff, 0xff, 0x02, 0x01, 0x00, 0x00}));
  EXPECT_EQ(EncodeTensorBytes(HostTensor::FromValues({DType::kI64, {1}}, {-2})),
            Bytes({0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}));
  EXPECT_EQ(EncodeTensorBytes(HostTensor::FromValues({DType::kPred, {3}}, {1, 0, 1})), Bytes({1, 0, 1}));
}

TEST(TensorBytes, DecodesKnownBitPatterns) {
  absl::StatusOr<HostTensor> bf = DecodeTensorBytes({DType::kBF16, {2}}, Bytes({0x80, 0x3f, 0xc0, 0x7f}));
  ASSERT_TRUE(bf.ok()) << bf.status();
  EXPECT_EQ((*bf)[0], 1.0);
  EXPECT_TRUE(std::isnan((*bf)[1]));
  absl::StatusOr<HostTensor> pred = DecodeTensorBytes({DType::kPred, {3}}, Bytes({0, 7, 1}));
  ASSERT_TRUE(pred.ok());
  EXPECT_EQ(pred->values(), (std::vector<double>{0, 1, 1}));  // any nonzero byte is true
  // E5M2 infinity is outside kiln's saturating format: it reads as the largest finite value.
  absl::StatusOr<HostTensor> e5 = DecodeTensorBytes({DType::kF8E5M2, {2}}, Bytes({0x7c, 0xfc}));
  ASSERT_TRUE(e5.ok());
  EXPECT_EQ(e5->values(), (std::vector<double>{57344.0, -57344.0}));
  absl::StatusOr<HostTensor> i64 = DecodeTensorBytes({DType::kI64, {}}, Bytes({0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}));
  ASSERT_TRUE(i64.ok());
  EXPECT_EQ((*i64)[0], -2.0);
}

TEST(TensorBytes, RandomTensorsRoundTripInEveryDType) {
  for (int d = 0; d < kNumDTypes; ++d) {
    const TensorType type{static_cast<DType>(d), {3, 5, 7}};
    const HostTensor t = HostTensor::Random(type, 40 + d, -300.0, 300.0);
    const std::string bytes = EncodeTensorBytes(t);
    ASSERT_EQ(static_cast<int64_t>(bytes.size()), type.num_bytes());
    absl::StatusOr<HostTensor> back = DecodeTensorBytes(type, bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->type(), type);
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      // Bitwise on the double: -0.0 must stay -0.0.
      EXPECT_EQ(std::signbit(t[i]), std::signbit((*back)[i])) << DTypeName(type.dtype) << " " << i;
      EXPECT_EQ(t[i], (*back)[i]) << DTypeName(type.dtype) << " " << i;
    }
  }
}

TEST(TensorBytes, RejectsWrongByteCount) {
  absl::StatusOr<HostTensor> t = DecodeTensorBytes({DType::kF32, {2, 2}}, std::string(15, '\0'));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("expected 16 bytes, got 15"), absl::string_view::npos) << t.status();
}

}  // namespace
}  // namespace kiln
