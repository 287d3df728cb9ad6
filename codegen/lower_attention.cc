// Lowering of attention, attention_grad and attention_delta to the flash kernels of
// kernels/flash_attention.cuh, and of attention and attention_grad on a target with wgmma
// (sm_90a) to kernels/flash_attention_wgmma.cuh. Both forwards compute the op's one
// definition (ir/op_table.h) and store the same LSE; both backwards read it and compute the
// same products with the same roundings (they differ only in fp32 accumulation order).
#include "codegen/composite_lowerings.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"
#include "kernels/flash_attention.cuh"  // launch geometry only: plain C++ outside a CUDA compiler
#include "kernels/flash_attention_wgmma.cuh"

namespace kiln::codegen::composite {
namespace {

using kernels::FlashAttentionBackwardDeltaLaunch;
using kernels::FlashAttentionBackwardDkDvLaunch;
using kernels::FlashAttentionBackwardDqLaunch;
using kernels::FlashAttentionForwardLaunch;
using kernels::FlashAttentionLaunch;
using kernels::FlashAttentionUnsupportedReason;
using kernels::FlashAttentionWgmmaBackwardDkDvLaunch;
using kernels::FlashAttentionWgmmaBackwardDqLaunch;
using kernels::FlashAttentionWgmmaBackwardLaunch;
using kernels::FlashAttentionWgmmaFusesDq;
using kernels::FlashAttentionZeroLaunch;
using kernels::FlashAttentionWgmmaForwardLaunch;
using kernels::FlashAttentionWgmmaUnsupportedReason;

// The flash kernels' geometry for this node's shapes (kernels/flash_attention.cuh).
absl::Status CheckAttentionShape(const Node& node, const TensorType& q, const TensorType& kv) {
  if (const char* why = FlashAttentionUnsupportedReason(q.dims[0], q.dims[1], kv.dims[1], q.dims[2], q.dims[3])) {
    return absl::UnimplementedError(absl::StrCat(Where(node), ": the flash attention kernels cannot take q ",
                                                 q.ToString(), ", k/v ", kv.ToString(), ": ", why));
  }
  return absl::OkStatus();
}

KernelSpec EmitFlash(const Node& node, const std::string& name, const Wrapper& w, const FlashAttentionLaunch& launch) {
  KernelSpec spec = Emit(node, name, w, launch.grid_x, static_cast<int>(launch.block_threads));
  spec.shared_bytes = launch.shared_bytes;
  return spec;
}

}  // namespace

namespace {

// The shapes and scale an attention or attention_grad node instantiates its kernels with,
// checked against what the kernels take.
struct AttentionCall {
  int64_t b, h, hkv, t, d;
  double scale;
};
absl::StatusOr<AttentionCall> AttentionCallOf(const Node& node) {
  const TensorType& q = node.operand(0)->type();
  const TensorType& kv = node.operand(1)->type();
  RETURN_IF_ERROR(CheckAttentionShape(node, q, kv));
  ASSIGN_OR_RETURN(double scale, FiniteFloatAttr(node, "scale"));
  return AttentionCall{q.dims[0], q.dims[1], kv.dims[1], q.dims[2], q.dims[3], scale};
}

}  // namespace

namespace {
// Whether attention (and attention_grad) runs on the wgmma kernels: the target has warpgroup
// MMA and the shape fits their 128-row tiles; otherwise the mma.sync kernels.
bool UsesWgmma(const AttentionCall& a, const Target& target) {
  return target.has_wgmma && FlashAttentionWgmmaUnsupportedReason(a.b, a.h, a.hkv, a.t, a.d) == nullptr;
}
}  // namespace

// attention -> (O, LSE): the forward kernel, storing the LSE it computes anyway (null when
// no backward reads it), and O as the node's first result type: f32, or bf16 with
// {out_dtype=bf16} (both forwards round their f32 O once on store, the op's definition).
absl::StatusOr<LoweredNode> LowerAttention(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(const AttentionCall a, AttentionCallOf(node));
  const bool wgmma = UsesWgmma(a, options.target);
  const FlashAttentionLaunch launch =
      wgmma ? FlashAttentionWgmmaForwardLaunch(a.b, a.h, a.t, a.d, options.target.sm_count) : FlashAttentionForwardLaunch(a.b, a.h, a.t, a.d);
  Wrapper w;
  w.header = wgmma ? "flash_attention_wgmma" : "flash_attention";
  w.comment = absl::StrCat(wgmma ? "causal flash attention on wgmma (a producer and two consumer warpgroups)"
                                 : "causal flash attention on mma.sync",
                           " and its LSE, ", launch.block_m, " queries per block of ", launch.block_threads,
                           " threads, key tiles of ", launch.block_n);
  const char* out_type = CudaTypeName(node.result_type(0).dtype);
  w.outputs = {absl::StrCat(out_type, "* out"), "float* lse"};
  w.params = {Param(DType::kBF16, "q"), Param(DType::kBF16, "k"), Param(DType::kBF16, "v")};
  w.call = absl::StrCat(wgmma ? "FlashAttentionWgmmaForward" : "FlashAttentionForward", "<", out_type, ", ", a.b,
                        ", ", a.h, ", ", a.hkv, ", ", a.t, ", ", a.d, ">(out, lse, q, k, v, ", FloatLiteral(a.scale),
                        ")");
  return Kernels({EmitFlash(node, codegen::KernelName(node), w, launch)});
}

// attention_grad -> (dq, dk, dv): the dq kernel, then the kernel writing dk and dv, on wgmma
// where the forward is (UsesWgmma); on wgmma at head dim 128, one kernel writing all three
// after a kernel zeroing dq (FlashAttentionWgmmaFusesDq), unless
// CodegenOptions::fused_attention_backward is off.
absl::StatusOr<LoweredNode> LowerAttentionGrad(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(const AttentionCall a, AttentionCallOf(node));
  const int64_t b = a.b, h = a.h, hkv = a.hkv, t = a.t, d = a.d;
  const bool wgmma = UsesWgmma(a, options.target);
  const std::string shape = absl::StrCat(b, ", ", h, ", ", hkv, ", ", t, ", ", d);
  const std::string arguments = absl::StrCat("q, k, v, dout, lse, delta, ", FloatLiteral(a.scale), ")");
  const char* on = wgmma ? " on wgmma (a producer and two consumer warpgroups)" : " on mma.sync";
  Wrapper w;
  w.header = wgmma ? "flash_attention_wgmma" : "flash_attention";
  w.outputs = {"float* dq", "float* dk", "float* dv"};
  w.params = {Param(DType::kBF16, "q"),    Param(DType::kBF16, "k"),   Param(DType::kBF16, "v"),
              Param(DType::kBF16, "dout"), Param(DType::kF32, "lse"), Param(DType::kF32, "delta")};

  if (wgmma && options.fused_attention_backward && FlashAttentionWgmmaFusesDq(d)) {
    // One walk over the key blocks adds dq into a zeroed buffer (the order of the additions
    // is not fixed: dq's rounding varies between runs in the last bits; dk and dv do not).
    const FlashAttentionLaunch zero_launch = FlashAttentionZeroLaunch(b * h * t * d, options.target.sm_count);
    w.comment = "dq = 0, for the fused backward to add into";
    w.call = absl::StrCat("FlashAttentionZero<", b * h * t * d, "LL>(dq)");
    KernelSpec zero = EmitFlash(node, codegen::KernelName(node) + "_dq_zero", w, zero_launch);
    const FlashAttentionLaunch launch = FlashAttentionWgmmaBackwardLaunch(b, hkv, t, d, options.target.sm_count);
    w.comment = absl::StrCat("flash attention dq, dk and dv", on, ", ", launch.block_n,
                             " keys per block, query tiles of ", launch.block_m, ", dq added into");
    w.call = absl::StrCat("FlashAttentionWgmmaBackward<", shape, ">(dq, dk, dv, ", arguments);
    KernelSpec fused = EmitFlash(node, codegen::KernelName(node) + "_dqdkdv", w, launch);
    return Kernels({std::move(zero), std::move(fused)});
  }
  const FlashAttentionLaunch dq_launch =
      wgmma ? FlashAttentionWgmmaBackwardDqLaunch(b, h, t, d, options.target.sm_count) : FlashAttentionBackwardDqLaunch(b, h, t, d);
  w.comment = absl::StrCat("flash attention dq", on, ", ", dq_launch.block_m, " queries per block, key tiles of ",
                           dq_launch.block_n);
  w.call = absl::StrCat(wgmma ? "FlashAttentionWgmmaBackwardDq<float, " : "FlashAttentionBackwardDq<__nv_bfloat16, float, ",
                        shape, ">(dq, ", arguments);
  KernelSpec dq = EmitFlash(node, codegen::KernelName(node) + "_dq", w, dq_launch);

  const FlashAttentionLaunch dkdv_launch =
      wgmma ? FlashAttentionWgmmaBackwardDkDvLaunch(b, hkv, t, d, options.target.sm_count) : FlashAttentionBackwardDkDvLaunch(b, hkv, t, d);
  w.comment = absl::StrCat("flash attention dk and dv", on, ", ", dkdv_launch.block_n,
                           " keys per block, query tiles of ", dkdv_launch.block_m);
  w.call = absl::StrCat(
      wgmma ? "FlashAttentionWgmmaBackwardDkDv<float, " : "FlashAttentionBackwardDkDv<__nv_bfloat16, float, ", shape,
      ">(dk, dv, ", arguments);
  KernelSpec dkdv = EmitFlash(node, codegen::KernelName(node) + "_dkdv", w, dkdv_launch);
  return Kernels({std::move(dq), std::move(dkdv)});
}

absl::StatusOr<LoweredNode> LowerAttentionDelta(const Node& node, const CodegenOptions& options) {
  const TensorType& o = node.operand(0)->type();
  const TensorType& dout = node.operand(1)->type();
  const int64_t rows = o.dims[0] * o.dims[1] * o.dims[2], d = o.dims[3];
  if (d != 64 && d != 128) {
    return absl::UnimplementedError(absl::StrCat(Where(node), ": the flash delta kernel takes head dim 64 or 128, not ", d));
  }
  const FlashAttentionLaunch launch = FlashAttentionBackwardDeltaLaunch(rows, d);
  // O is f32, or bf16 where the forward stores it so (attention {out_dtype=bf16}).
  Wrapper w{"flash_attention", absl::StrCat("rowsum(bf16(dO) * bf16(O)) over ", rows, " rows of ", d), "",
            {Param(o.dtype, "o"), Param(dout.dtype, "dout")},
            absl::StrCat("FlashAttentionBackwardDelta<", CudaTypeName(dout.dtype), ", ", CudaTypeName(o.dtype), ", ",
                         rows, "LL, ", d, ">(out, dout, o)")};
  return Kernels({EmitFlash(node, codegen::KernelName(node), w, launch)});
}

}  // namespace kiln::codegen::composite
