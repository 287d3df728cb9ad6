// Shape inference of the paged-KV ops, kv_cache_write and paged_attention (their semantics
// are in ir/op_table.h). Internal to ir/shape_inference.cc, which dispatches here; a file of
// their own so that the checks of the pool layout live in one place.
#pragma once

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ir/attributes.h"
#include "ir/types.h"

namespace kiln {

// pool [L, NB, Hkv, BS, D] of f32 or bf16, x float [N, Hkv, D], slots i32 [N] -> pool's type.
absl::StatusOr<TensorType> InferKvCacheWrite(absl::Span<const TensorType> xs, const AttrMap& attrs);

// q float [B, T, H, D], pools [L, NB, Hkv, BS, D] of q's dtype, block_tables i32 [B, M],
// positions i32 [B, T] -> f32 [B, T, H, D].
absl::StatusOr<TensorType> InferPagedAttention(absl::Span<const TensorType> xs, const AttrMap& attrs);

}  // namespace kiln
