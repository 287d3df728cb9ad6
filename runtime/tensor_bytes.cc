#include "runtime/tensor_bytes.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ir/numerics.h"
#include "ir/thread_pool.h"

namespace kiln {
namespace {

// Elements are copied with memcpy, which is only little-endian storage on a little-endian
// host (every machine kiln targets, and every GPU).
static_assert(std::endian::native == std::endian::little, "tensor bytes are little-endian");

// On all cores for large tensors (a model's weights go through here on their way to the
// GPU); each element is encoded alone, so the bytes do not depend on the split.
template <typename Bits, typename Encode>
void EncodeEach(const std::vector<double>& values, char* out, Encode encode) {
  ThreadPool::Shared(0).ParallelFor(static_cast<int64_t>(values.size()), int64_t{1} << 18,
                                    [&](int64_t begin, int64_t end) {
                                      for (int64_t i = begin; i < end; ++i) {
                                        const Bits bits = encode(values[i]);
                                        std::memcpy(out + i * sizeof(Bits), &bits, sizeof(Bits));
                                      }
                                    });
}

template <typename Bits, typename Decode>
void DecodeEach(const char* data, std::vector<double>& values, Decode decode) {
  for (size_t i = 0; i < values.size(); ++i) {
    Bits bits;
    std::memcpy(&bits, data + i * sizeof(Bits), sizeof(Bits));
    values[i] = decode(bits);
  }
}

}  // namespace

void EncodeTensorBytes(const HostTensor& t, char* out) {
  const std::vector<double>& v = t.values();
  switch (t.type().dtype) {
    case DType::kF32: return EncodeEach<float>(v, out, [](double x) { return static_cast<float>(x); });
    case DType::kBF16: return EncodeEach<uint16_t>(v, out, [](double x) { return FloatToBF16Bits(x); });
    case DType::kF16: return EncodeEach<uint16_t>(v, out, [](double x) { return FloatToF16Bits(x); });
    case DType::kF8E4M3: return EncodeEach<uint8_t>(v, out, [](double x) { return FloatToF8E4M3Bits(x); });
    case DType::kF8E5M2: return EncodeEach<uint8_t>(v, out, [](double x) { return FloatToF8E5M2Bits(x); });
    case DType::kI32: return EncodeEach<int32_t>(v, out, [](double x) { return static_cast<int32_t>(x); });
    case DType::kI64: return EncodeEach<int64_t>(v, out, [](double x) { return static_cast<int64_t>(x); });
    case DType::kPred: return EncodeEach<uint8_t>(v, out, [](double x) { return uint8_t{x != 0.0}; });
  }
}

std::string EncodeTensorBytes(const HostTensor& t) {
  std::string bytes(t.type().num_bytes(), '\0');
  EncodeTensorBytes(t, bytes.data());
  return bytes;
}

std::vector<double> DecodeElements(DType dtype, const char* data, int64_t count) {
  std::vector<double> v(count);
  switch (dtype) {
    case DType::kF32: DecodeEach<float>(data, v, [](float x) { return x; }); break;
    case DType::kBF16: DecodeEach<uint16_t>(data, v, BF16BitsToFloat); break;
    case DType::kF16: DecodeEach<uint16_t>(data, v, F16BitsToFloat); break;
    case DType::kF8E4M3: DecodeEach<uint8_t>(data, v, F8E4M3BitsToFloat); break;
    case DType::kF8E5M2: DecodeEach<uint8_t>(data, v, F8E5M2BitsToFloat); break;
    case DType::kI32: DecodeEach<int32_t>(data, v, [](int32_t x) { return x; }); break;
    case DType::kI64: DecodeEach<int64_t>(data, v, [](int64_t x) { return static_cast<double>(x); }); break;
    case DType::kPred: DecodeEach<uint8_t>(data, v, [](uint8_t x) { return x != 0 ? 1.0 : 0.0; }); break;
  }
  return v;
}

absl::StatusOr<HostTensor> DecodeTensorBytes(const TensorType& type, absl::string_view bytes) {
  if (static_cast<int64_t>(bytes.size()) != type.num_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("decoding ", type.ToString(), ": expected ", type.num_bytes(),
                                                   " bytes, got ", bytes.size()));
  }
  HostTensor t(type);
  t.mutable_values() = DecodeElements(type.dtype, bytes.data(), type.num_elements());
  RoundValuesToDType(t.mutable_values().data(), t.num_elements(), type.dtype);
  return t;
}

}  // namespace kiln
