// Rounding to kiln's dtypes (ir/numerics.h): hand-computed ties, subnormals,
// overflow and saturation, then exhaustive encode/decode round trips and midpoint checks
// over every bf16, f16 and fp8 bit pattern.
#include "ir/numerics.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace kiln {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Bit-exact equality that tells -0.0 from 0.0.
void ExpectSameDouble(double expected, double got, const char* what) {
  EXPECT_EQ(std::bit_cast<uint64_t>(expected), std::bit_cast<uint64_t>(got))
      << what << ": expected " << expected << ", got " << got;
}

TEST(Numerics, F32RoundsTiesToEvenAndOverflowsToInf) {
  EXPECT_EQ(RoundToDType(1 + 0x1p-24, DType::kF32), 1.0);                 // tie, 1 is even
  EXPECT_EQ(RoundToDType(1 + 3 * 0x1p-24, DType::kF32), 1 + 0x1p-22);     // tie, up to even
  EXPECT_EQ(RoundToDType(1 + 0x1p-24 + 0x1p-40, DType::kF32), 1 + 0x1p-23);
  EXPECT_EQ(RoundToDType(1e39, DType::kF32), kInf);
  ExpectSameDouble(-0.0, RoundToDType(-0.0, DType::kF32), "-0");
}

TEST(Numerics, BF16RoundsTiesToEven) {
  // bf16 keeps 7 fraction bits: the ulp of 1 is 2^-7, so 2^-8 is half an ulp.
  EXPECT_EQ(RoundToDType(1 + 0x1p-8, DType::kBF16), 1.0);
  EXPECT_EQ(RoundToDType(1 + 3 * 0x1p-8, DType::kBF16), 1 + 0x1p-6);
  EXPECT_EQ(RoundToDType(1 + 0x1p-8 + 0x1p-30, DType::kBF16), 1 + 0x1p-7);
  EXPECT_EQ(RoundToDType(-(1 + 0x1p-8), DType::kBF16), -1.0);
  EXPECT_EQ(RoundToDType(3.14159265, DType::kBF16), 3.140625);  // 0x4049
  // Rounded once from the double: 1 + 2^-8 + 2^-40 is above the tie even though a first
  // rounding to f32 would land exactly on it (and then round to 1).
  EXPECT_EQ(RoundToDType(1 + 0x1p-8 + 0x1p-40, DType::kBF16), 1 + 0x1p-7);
}

TEST(Numerics, BF16SubnormalsOverflowNaNAndSignedZero) {
  EXPECT_EQ(RoundToDType(0x1p-133, DType::kBF16), 0x1p-133);         // smallest subnormal
  EXPECT_EQ(RoundToDType(0x1p-134, DType::kBF16), 0.0);              // tie to even (0)
  EXPECT_EQ(RoundToDType(3 * 0x1p-134, DType::kBF16), 0x1p-132);     // tie to even (2 quanta)
  const double max_bf16 = 0x1.fep127;
  EXPECT_EQ(RoundToDType(max_bf16, DType::kBF16), max_bf16);
  EXPECT_EQ(RoundToDType(0x1.fefp127, DType::kBF16), max_bf16);      // below the tie
  EXPECT_EQ(RoundToDType(0x1.ffp127, DType::kBF16), kInf);           // tie rounds to 2^128
  EXPECT_EQ(RoundToDType(-1e300, DType::kBF16), -kInf);
  EXPECT_TRUE(std::isnan(RoundToDType(kNaN, DType::kBF16)));
  ExpectSameDouble(-0.0, RoundToDType(-0.0, DType::kBF16), "-0");
  ExpectSameDouble(-0.0, RoundToDType(-0x1p-140, DType::kBF16), "underflow keeps the sign");
}

TEST(Numerics, F16SubnormalsAndOverflow) {
  EXPECT_EQ(RoundToDType(0x1p-24, DType::kF16), 0x1p-24);            // smallest subnormal
  EXPECT_EQ(RoundToDType(0x1p-25, DType::kF16), 0.0);                // tie to even
  EXPECT_EQ(RoundToDType(0x1p-25 + 0x1p-40, DType::kF16), 0x1p-24);
  EXPECT_EQ(RoundToDType(3 * 0x1p-26, DType::kF16), 0x1p-24);        // 0.75 quantum
  EXPECT_EQ(RoundToDType(5 * 0x1p-24, DType::kF16), 5 * 0x1p-24);    // exact subnormal
  EXPECT_EQ(RoundToDType(0x1.ffcp-15, DType::kF16), 0x1p-14);  // tie above the largest subnormal
  EXPECT_EQ(RoundToDType(65504.0, DType::kF16), 65504.0);
  EXPECT_EQ(RoundToDType(65519.0, DType::kF16), 65504.0);
  EXPECT_EQ(RoundToDType(65520.0, DType::kF16), kInf);               // tie to even: 2^16
  EXPECT_EQ(RoundToDType(-1e6, DType::kF16), -kInf);
  EXPECT_TRUE(std::isnan(RoundToDType(kNaN, DType::kF16)));
  ExpectSameDouble(-0.0, RoundToDType(-0.0, DType::kF16), "-0");
}

TEST(Numerics, F8E4M3SaturatesAt448) {
  EXPECT_EQ(RoundToDType(448.0, DType::kF8E4M3), 448.0);
  EXPECT_EQ(RoundToDType(460.0, DType::kF8E4M3), 448.0);
  EXPECT_EQ(RoundToDType(464.0, DType::kF8E4M3), 448.0);   // tie: 448 has the even fraction
  EXPECT_EQ(RoundToDType(500.0, DType::kF8E4M3), 448.0);   // would be 480: saturates
  EXPECT_EQ(RoundToDType(1e9, DType::kF8E4M3), 448.0);
  EXPECT_EQ(RoundToDType(-1e9, DType::kF8E4M3), -448.0);
  EXPECT_EQ(RoundToDType(kInf, DType::kF8E4M3), 448.0);
  EXPECT_EQ(RoundToDType(-kInf, DType::kF8E4M3), -448.0);
  EXPECT_EQ(RoundToDType(0.3, DType::kF8E4M3), 0.3125);    // quantum 2^-5 in [0.25, 0.5)
  EXPECT_EQ(RoundToDType(0x1p-9, DType::kF8E4M3), 0x1p-9); // smallest subnormal
  EXPECT_EQ(RoundToDType(0x1p-10, DType::kF8E4M3), 0.0);   // tie to even
  EXPECT_TRUE(std::isnan(RoundToDType(kNaN, DType::kF8E4M3)));
  ExpectSameDouble(-0.0, RoundToDType(-0.0, DType::kF8E4M3), "-0");
}

TEST(Numerics, F8E5M2SaturatesAt57344) {
  EXPECT_EQ(RoundToDType(57344.0, DType::kF8E5M2), 57344.0);
  EXPECT_EQ(RoundToDType(60000.0, DType::kF8E5M2), 57344.0);  // IEEE would give inf
  EXPECT_EQ(RoundToDType(1e6, DType::kF8E5M2), 57344.0);
  EXPECT_EQ(RoundToDType(-kInf, DType::kF8E5M2), -57344.0);
  EXPECT_EQ(RoundToDType(1.125, DType::kF8E5M2), 1.0);        // tie between 1 and 1.25
  EXPECT_EQ(RoundToDType(1.375, DType::kF8E5M2), 1.5);        // tie between 1.25 and 1.5
  EXPECT_EQ(RoundToDType(0x1p-16, DType::kF8E5M2), 0x1p-16);  // smallest subnormal
  EXPECT_TRUE(std::isnan(RoundToDType(kNaN, DType::kF8E5M2)));
  ExpectSameDouble(-0.0, RoundToDType(-0.0, DType::kF8E5M2), "-0");
}

TEST(Numerics, IntegersTruncateTowardZeroThenSaturate) {
  EXPECT_EQ(RoundToDType(2.7, DType::kI32), 2.0);
  EXPECT_EQ(RoundToDType(-2.7, DType::kI32), -2.0);
  EXPECT_EQ(RoundToDType(3e9, DType::kI32), 2147483647.0);
  EXPECT_EQ(RoundToDType(-3e9, DType::kI32), -2147483648.0);
  EXPECT_EQ(RoundToDType(kNaN, DType::kI32), 0.0);
  EXPECT_EQ(RoundToDType(1e19, DType::kI64), 0x1.fffffffffffffp62);
  EXPECT_EQ(RoundToDType(-1e19, DType::kI64), -0x1p63);
  EXPECT_EQ(RoundToDType(-7.9, DType::kI64), -7.0);
}

TEST(Numerics, PredIsNonZero) {
  EXPECT_EQ(RoundToDType(0.5, DType::kPred), 1.0);
  EXPECT_EQ(RoundToDType(-3, DType::kPred), 1.0);
  EXPECT_EQ(RoundToDType(0.0, DType::kPred), 0.0);
  EXPECT_EQ(RoundToDType(-0.0, DType::kPred), 0.0);
  EXPECT_EQ(RoundToDType(kNaN, DType::kPred), 1.0);
}

TEST(Numerics, RoundValuesKeepsF32OnlyWhenAsked) {
  double v[2] = {1 + 0x1p-30, 1 + 0x1p-30};
  RoundValuesToDType(v, 1, DType::kF32, /*keep_f32_in_f64=*/true);
  EXPECT_EQ(v[0], 1 + 0x1p-30);
  RoundValuesToDType(v + 1, 1, DType::kF32);
  EXPECT_EQ(v[1], 1.0);
  double w = 1 + 0x1p-30;
  RoundValuesToDType(&w, 1, DType::kBF16, /*keep_f32_in_f64=*/true);
  EXPECT_EQ(w, 1.0);
}

TEST(Numerics, KnownBitPatterns) {
  EXPECT_EQ(FloatToBF16Bits(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBF16Bits(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBF16Bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToF16Bits(1.0f), 0x3C00);
  EXPECT_EQ(FloatToF16Bits(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToF16Bits(1e6f), 0x7C00);
  EXPECT_EQ(FloatToF16Bits(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToF8E4M3Bits(1.0f), 0x38);
  EXPECT_EQ(FloatToF8E4M3Bits(448.0f), 0x7E);
  EXPECT_EQ(FloatToF8E4M3Bits(-1e9f), 0xFE);
  EXPECT_EQ(FloatToF8E4M3Bits(0x1p-9f), 0x01);
  EXPECT_EQ(FloatToF8E4M3Bits(-0.0f), 0x80);
  EXPECT_EQ(FloatToF8E5M2Bits(1.0f), 0x3C);
  EXPECT_EQ(FloatToF8E5M2Bits(57344.0f), 0x7B);
  EXPECT_EQ(FloatToF8E5M2Bits(0x1p-16f), 0x01);
  EXPECT_EQ(F8E4M3BitsToFloat(0x08), 0x1p-6f);  // smallest normal
  EXPECT_TRUE(std::isnan(F8E4M3BitsToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(F8E4M3BitsToFloat(0xFF)));
  EXPECT_EQ(F8E4M3BitsToFloat(0x78), 256.0f);  // exponent field 15 is finite in E4M3FN
  EXPECT_EQ(F8E5M2BitsToFloat(0x7C), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F8E5M2BitsToFloat(0x7D)));
}

// For every bit pattern of a format: decoding is exact, re-encoding gives the pattern back,
// and the decoded value is a fixed point of RoundToDType. NaN patterns decode to NaN and
// re-encode to some NaN; E5M2's ±inf saturate.
template <typename Bits>
void ExpectRoundTrips(DType t, int num_patterns, float (*decode)(Bits), Bits (*encode)(float)) {
  for (int i = 0; i < num_patterns; ++i) {
    const Bits bits = static_cast<Bits>(i);
    const float v = decode(bits);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(decode(encode(v)))) << DTypeName(t) << " pattern " << i;
      continue;
    }
    if (std::isinf(v) && t == DType::kF8E5M2) {
      // E5M2 has inf patterns, but kiln converts with satfinite: inf encodes as ±max.
      EXPECT_EQ(decode(encode(v)), std::copysign(57344.0f, v)) << "pattern " << i;
      continue;
    }
    EXPECT_EQ(encode(v), bits) << DTypeName(t) << " pattern " << i << " value " << v;
    ExpectSameDouble(v, RoundToDType(v, t), "decoded value is representable");
  }
}

TEST(Numerics, RoundTripsEveryBitPattern) {
  ExpectRoundTrips<uint16_t>(DType::kBF16, 1 << 16, BF16BitsToFloat, FloatToBF16Bits);
  ExpectRoundTrips<uint16_t>(DType::kF16, 1 << 16, F16BitsToFloat, FloatToF16Bits);
  ExpectRoundTrips<uint8_t>(DType::kF8E4M3, 256, F8E4M3BitsToFloat, FloatToF8E4M3Bits);
  ExpectRoundTrips<uint8_t>(DType::kF8E5M2, 256, F8E5M2BitsToFloat, FloatToF8E5M2Bits);
}

// Between each pair of adjacent positive finite values a < b of a format: the midpoint
// goes to the one with the even pattern, and anything off the midpoint to the nearer one.
template <typename Bits>
void ExpectMidpointsRoundToNearestEven(DType t, int num_patterns, float (*decode)(Bits)) {
  for (int i = 0; i + 1 < num_patterns / 2; ++i) {
    const double a = decode(static_cast<Bits>(i));
    const double b = decode(static_cast<Bits>(i + 1));
    if (!std::isfinite(a) || !std::isfinite(b)) break;
    const double mid = a + (b - a) / 2;
    const double even = (i % 2 == 0) ? a : b;
    EXPECT_EQ(RoundToDType(mid, t), even) << DTypeName(t) << " between " << a << " and " << b;
    EXPECT_EQ(RoundToDType(mid - (b - a) / 1024, t), a) << DTypeName(t) << " below " << mid;
    EXPECT_EQ(RoundToDType(mid + (b - a) / 1024, t), b) << DTypeName(t) << " above " << mid;
    EXPECT_EQ(RoundToDType(-mid, t), -even) << DTypeName(t) << " negative midpoint " << -mid;
  }
}

TEST(Numerics, MidpointsOfEveryAdjacentPairRoundToEven) {
  ExpectMidpointsRoundToNearestEven<uint16_t>(DType::kBF16, 1 << 16, BF16BitsToFloat);
  ExpectMidpointsRoundToNearestEven<uint16_t>(DType::kF16, 1 << 16, F16BitsToFloat);
  ExpectMidpointsRoundToNearestEven<uint8_t>(DType::kF8E4M3, 256, F8E4M3BitsToFloat);
  ExpectMidpointsRoundToNearestEven<uint8_t>(DType::kF8E5M2, 256, F8E5M2BitsToFloat);
}

// Independent oracles: bf16 is the top half of an f32 (the classic integer RNE), and
// GCC's _Float16 conversions are IEEE round-to-nearest-even.
TEST(Numerics, MatchesIndependentConversionsOnRandomValues) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t f32_bits = any_bits(rng);
    const float f = std::bit_cast<float>(f32_bits);
    if (std::isnan(f)) continue;
    const uint16_t expected_bf16 =
        static_cast<uint16_t>((f32_bits + 0x7FFF + ((f32_bits >> 16) & 1)) >> 16);
    ASSERT_EQ(FloatToBF16Bits(f), expected_bf16) << "f32 bits " << f32_bits;
    ASSERT_EQ(BF16BitsToFloat(expected_bf16), std::bit_cast<float>(uint32_t{expected_bf16} << 16));
#ifdef __FLT16_MAX__
    const _Float16 h = static_cast<_Float16>(f);
    ASSERT_EQ(FloatToF16Bits(f), std::bit_cast<uint16_t>(h)) << "f32 bits " << f32_bits;
    const double d = static_cast<double>(f) * (1 + 0x1p-40);  // bits beyond f32 matter too
    ASSERT_EQ(RoundToDType(d, DType::kF16), static_cast<double>(static_cast<_Float16>(d))) << d;
#endif
  }
}

}  // namespace
}  // namespace kiln
