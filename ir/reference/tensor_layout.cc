// Index arithmetic shared by the reference kernels.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (int d = static_cast<int>(dims.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * dims[d + 1];
  return strides;
}

void StridedCopy(const double* src, int64_t base, const std::vector<int64_t>& dims,
                 const std::vector<int64_t>& src_strides, double* dst, ThreadPool& pool) {
  const int rank = static_cast<int>(dims.size());
  if (rank == 0) {
    dst[0] = src[base];
    return;
  }
  const int64_t inner = dims[rank - 1];
  const int64_t inner_stride = src_strides[rank - 1];
  int64_t outer = 1;
  for (int d = 0; d + 1 < rank; ++d) outer *= dims[d];
  if (inner == 0 || outer == 0) return;
  // Each chunk of outer rows starts its own odometer over dims[0..rank-2].
  pool.ParallelFor(outer, std::max<int64_t>(1, kElementsPerChunk / inner), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> index(rank - 1);
    int64_t offset = base;
    int64_t remaining = begin;
    for (int d = rank - 2; d >= 0; --d) {
      index[d] = remaining % dims[d];
      remaining /= dims[d];
      offset += index[d] * src_strides[d];
    }
    double* out = dst + begin * inner;
    for (int64_t row = begin; row < end; ++row) {
      const double* in = src + offset;
      if (inner_stride == 1) {
        std::copy(in, in + inner, out);
      } else {
        for (int64_t i = 0; i < inner; ++i) out[i] = in[i * inner_stride];
      }
      out += inner;
      for (int d = rank - 2; d >= 0; --d) {
        if (++index[d] < dims[d]) {
          offset += src_strides[d];
          break;
        }
        offset -= (dims[d] - 1) * src_strides[d];
        index[d] = 0;
      }
    }
  });
}

std::vector<int64_t> GroupOffsets(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  std::vector<int64_t> offsets = {0};
  for (size_t d = 0; d < sizes.size(); ++d) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * sizes[d]);
    for (int64_t outer : offsets) {
      for (int64_t j = 0; j < sizes[d]; ++j) next.push_back(outer + j * strides[d]);
    }
    offsets = std::move(next);
  }
  return offsets;
}

std::string MultiIndexString(int64_t flat, const std::vector<int64_t>& dims) {
  std::vector<int64_t> index(dims.size());
  for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
    index[d] = flat % dims[d];
    flat /= dims[d];
  }
  return absl::StrCat("[", absl::StrJoin(index, ","), "]");
}

Rows RowsOf(const TensorType& t) {
  const int64_t length = t.dims.back();
  return {length == 0 ? 0 : t.num_elements() / length, length};
}

}  // namespace kiln::reference
