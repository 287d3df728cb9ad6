// HostTensor values <-> the bytes that hold them in memory: each element in its dtype's
// storage format (f32, bf16, f16, OCP f8 bits; i32/i64 two's complement; pred one byte 0/1),
// little-endian, row-major. This is what GPU kernels and cuBLASLt read and write, and what
// safetensors files hold.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/host_tensor.h"

namespace kiln {

// `out` holds t.type().num_bytes() bytes. Exact: HostTensor values are already
// representable in their dtype.
void EncodeTensorBytes(const HostTensor& t, char* out);
std::string EncodeTensorBytes(const HostTensor& t);

// `count` elements stored as `dtype`, decoded exactly into doubles (i64 beyond 2^53 rounds).
std::vector<double> DecodeElements(DType dtype, const char* data, int64_t count);

// Fails unless `bytes` holds exactly type.num_bytes() bytes. The result keeps HostTensor's
// invariant: a pred byte other than 0 reads as true, an f8e5m2 infinity saturates to
// ±57344 (ir/numerics.h), everything else is exact.
absl::StatusOr<HostTensor> DecodeTensorBytes(const TensorType& type, absl::string_view bytes);

}  // namespace kiln
