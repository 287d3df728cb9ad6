// attention_bench: times kiln's causal flash attention on the GPU, the kernels exactly as
// codegen emits them (codegen/lower_attention.cc, compiled by NVRTC for the device):
//   fwd wgmma     the Hopper forward (kernels/flash_attention_wgmma.cuh), lowered for sm_90a
//   fwd mma.sync  the mma.sync forward (kernels/flash_attention.cuh), lowered for a target
//                 without wgmma, compiled for the device all the same
//   fwd+bwd       the wgmma forward, then attention_delta and attention_grad's kernels on
//                 wgmma (what a training step on the H200 runs: at D 128 dq's zeroing and
//                 the fused backward, at D 64 the dq and dk/dv kernels)
//   fwd+bwd (split bwd)  at D 128, the same with the fused backward off (CodegenOptions::
//                 fused_attention_backward): the dq and dk/dv kernels
//   fwd+bwd mma.sync   the same with the mma.sync backward (codegen's choice for a target
//                 without wgmma), so the two backwards compare in one run
// on the shapes of DESIGN.md's attention bar (causal, GQA):
//   S  B16 H12 KV4 T1024 D64     M  B4 H16 KV8 T2048 D128     L  B2 H16 KV8 T4096 D128
// The attention op is {out_dtype=bf16}, so both forwards store O bf16 and attention_delta
// reads it as bf16: what a training step runs since narrow-activations-bf16 narrows its O
// (read only by the o projection, as bf16, and by attention_delta), and what cuDNN and
// PyTorch's SDPA produce, so the comparison with bench/attention_torch.py is like for like.
// Each row: median, min and max ms over the timed launches (CUDA events around each launch,
// after warm-up), TFLOP/s of the median (causal forward 4·B·H·T²·D / 2, fwd+bwd 3.5 times
// that), and the max |error| of the bf16 O: against a double-precision evaluation of the
// attention op's definition (ir/op_table.h, the f32 O before its bf16 rounding) on sampled
// query rows, and against the other forward on every element; for the backwards, the
// largest |dq, dk, dv (wgmma) - (mma.sync)| over the largest |gradient| (the same products
// and roundings, in another fp32 accumulation order, so about 1e-6). One JSON object a line on stdout (bench/run_attention_h200.sh merges them
// with bench/attention_torch.py's), a readable table on stderr.
//
//   attention_bench [--shapes S,M,L] [--iters 20] [--warmup 3] [--rows 64] [--max-error 5e-3]
//
// Self-checking: it exits 1 when a forward's O is further than --max-error from the reference
// on a sampled row, or the two forwards differ by more than that anywhere (or give NaN). The
// bound is loose on purpose: correct kernels differ from the reference by fp32 accumulation
// order and the odd bf16 P̃ at a rounding boundary (about 1e-4 at these shapes on the H200
// with an f32 O), plus O's own bf16 rounding, half a bf16 ulp (at most 2^-9 for |O| < 1;
// two forwards rounding f32 values a hair apart may land a whole ulp, 2^-8, apart); a wrong
// tile, mask or swizzle by O's own magnitude (0.1-1).
//
// Linked like the GPU tests (Abseil and protobuf statically, the CUDA runtime statically,
// never libcuda); it needs an sm_90a GPU to do anything but say why it cannot run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "codegen/lower_node.h"
#include "codegen/nvrtc_compiler.h"
#include "ir/builder.h"
#include "ir/graph.h"
#include "ir/numerics.h"
#include "passes/target.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/kernel_launch.h"

namespace kiln {
namespace {

struct Shape {
  std::string name;
  int64_t b, h, hkv, t, d;
  int64_t q_elements() const { return b * h * t * d; }
  int64_t kv_elements() const { return b * hkv * t * d; }
  int64_t rows() const { return b * h * t; }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(d)); }
  double forward_flops() const { return 4.0 * b * h * static_cast<double>(t) * t * d / 2; }
};

const std::vector<Shape>& BarShapes() {
  static const std::vector<Shape> shapes = {{"S", 16, 12, 4, 1024, 64}, {"M", 4, 16, 8, 2048, 128},
                                            {"L", 2, 16, 8, 4096, 128}};
  return shapes;
}

// A compiled, loaded kernel and its geometry.
using Loaded = bench::LoadedKernel;

// The kernels of attention (forward), attention_delta and attention_grad at `s`, lowered by
// codegen for `target` (which picks the forward).
struct AttentionKernels {
  std::vector<KernelSpec> forward, delta, grad;
};

absl::StatusOr<AttentionKernels> Lower(const Shape& s, const Target& target, bool fused_backward = true) {
  Module m;
  Builder a(m.AddFunction("attention"));
  const DType bf16 = DType::kBF16;
  absl::StatusOr<Node*> q = a.Parameter("q", {bf16, {s.b, s.h, s.t, s.d}});
  absl::StatusOr<Node*> k = a.Parameter("k", {bf16, {s.b, s.hkv, s.t, s.d}});
  absl::StatusOr<Node*> v = a.Parameter("v", {bf16, {s.b, s.hkv, s.t, s.d}});
  absl::StatusOr<Node*> dout = a.Parameter("dout", {bf16, {s.b, s.h, s.t, s.d}});
  if (!q.ok() || !k.ok() || !v.ok() || !dout.ok()) return absl::InternalError("attention_bench: parameters");
  const AttrMap scale{{"scale", s.scale()}};
  // O stored bf16, as a training step's attention stores it (narrow-activations-bf16).
  absl::StatusOr<std::vector<Node*>> fwd = a.MultiResultOp(
      Opcode::kAttention, {*q, *k, *v}, {{"scale", s.scale()}, {"out_dtype", Symbol{"bf16"}}}, {"o", "lse"});
  if (!fwd.ok()) return fwd.status();
  absl::StatusOr<Node*> delta = a.Op(Opcode::kAttentionDelta, {(*fwd)[0], *dout});
  if (!delta.ok()) return delta.status();
  absl::StatusOr<std::vector<Node*>> grad = a.MultiResultOp(
      Opcode::kAttentionGrad, {*q, *k, *v, *dout, (*fwd)[1], *delta}, scale, {"dq", "dk", "dv"});
  if (!grad.ok()) return grad.status();
  AttentionKernels kernels;
  const CodegenOptions options{.target = target, .fused_attention_backward = fused_backward};
  for (const auto& n : m.functions()[0]->nodes()) {
    std::vector<KernelSpec>* into = n->opcode() == Opcode::kAttention        ? &kernels.forward
                                    : n->opcode() == Opcode::kAttentionDelta ? &kernels.delta
                                    : n->opcode() == Opcode::kAttentionGrad  ? &kernels.grad
                                                                             : nullptr;
    if (into == nullptr) continue;
    absl::StatusOr<LoweredNode> lowered = LowerNode(*n, options);
    if (!lowered.ok()) return lowered.status();
    *into = lowered->kernels;
  }
  return kernels;
}

using bench::Bf16Tensor;
using bench::RandomBf16Tensor;

// O of query row `row` (of B·H·T) by the attention op's definition, in double.
std::vector<double> ReferenceRow(const Shape& s, const Bf16Tensor& q, const Bf16Tensor& k, const Bf16Tensor& v,
                                 int64_t row) {
  const int64_t bh = row / s.t, i = row % s.t, b = bh / s.h, h = bh % s.h;
  const int64_t kv = (b * s.hkv + h / (s.h / s.hkv)) * s.t * s.d;
  std::vector<double> scores(i + 1);
  double max = -INFINITY;
  for (int64_t j = 0; j <= i; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < s.d; ++c) dot += q.values[row * s.d + c] * k.values[kv + j * s.d + c];
    scores[j] = dot * s.scale();
    max = std::max(max, scores[j]);
  }
  const double m = std::ceil(max * M_LOG2E);
  std::vector<double> o(s.d, 0.0);
  double l = 0;
  for (int64_t j = 0; j <= i; ++j) {
    const double t = std::exp2(scores[j] * M_LOG2E - m);
    l += t;
    const double p = RoundToDType(t, DType::kBF16);
    for (int64_t c = 0; c < s.d; ++c) o[c] += p * v.values[kv + j * s.d + c];
  }
  for (double& x : o) x /= l;
  return o;
}

// Runs `launches` (in order, as one unit) warmup + iters times; times each unit with events.
absl::StatusOr<bench::Timing> Time(const std::vector<std::pair<const Loaded*, std::vector<void*>>>& launches,
                                   const CudaDevice& device, int warmup, int iters) {
  return bench::TimeCalls(device.stream(), warmup, iters, "attention_bench", "a launch", [&]() -> absl::Status {
    for (const auto& [kernel, pointers] : launches) {
      absl::Status st = EnqueueLaunch(kernel->launch, pointers, device.stream(), "attention_bench");
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  });
}

struct Options : bench::RunOptions {
  Options() : bench::RunOptions{.iters = 20, .warmup = 3, .rows = 64, .max_error = 5e-3} {}
  std::vector<std::string> shapes = {"S", "M", "L"};
};

void Report(const Shape& s, const std::string& impl, const bench::Timing& t, double flops, double err_ref,
            double err_other, const std::string& other) {
  const double tflops = flops / (t.median_ms * 1e-3) * 1e-12;
  std::printf(
      "{\"shape\": \"%s\", \"b\": %lld, \"h\": %lld, \"hkv\": %lld, \"t\": %lld, \"d\": %lld, \"impl\": \"%s\", "
      "\"median_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f, \"tflops\": %.1f, \"max_err_ref\": %.3g, "
      "\"max_err_vs\": %.3g, \"vs\": \"%s\"}\n",
      s.name.c_str(), static_cast<long long>(s.b), static_cast<long long>(s.h), static_cast<long long>(s.hkv),
      static_cast<long long>(s.t), static_cast<long long>(s.d), impl.c_str(), t.median_ms, t.min_ms, t.max_ms,
      tflops, err_ref, err_other, other.c_str());
  std::fprintf(stderr, "%-2s %-22s %8.3f ms (min %.3f, max %.3f) %6.1f TFLOP/s  err vs ref %.3g, vs %s %.3g\n",
               s.name.c_str(), impl.c_str(), t.median_ms, t.min_ms, t.max_ms, tflops, err_ref, other.c_str(),
               err_other);
}

absl::Status RunShape(const Shape& s, CudaDevice& device, const Options& opt) {
  if (!device.target().has_wgmma) {
    return absl::FailedPreconditionError(absl::StrCat("the wgmma forward needs sm_90a; this GPU is ", device.arch()));
  }
  absl::StatusOr<AttentionKernels> hopper = Lower(s, *TargetForArch("sm_90a"));
  absl::StatusOr<AttentionKernels> split = Lower(s, *TargetForArch("sm_90a"), /*fused_backward=*/false);
  absl::StatusOr<AttentionKernels> ampere = Lower(s, *TargetForArch("sm_80"));
  if (!hopper.ok()) return hopper.status();
  if (!split.ok()) return split.status();
  if (!ampere.ok()) return ampere.status();
  absl::StatusOr<Loaded> wgmma = bench::LoadKernel(hopper->forward[0], device),
                         mma = bench::LoadKernel(ampere->forward[0], device),
                         delta = bench::LoadKernel(hopper->delta[0], device);
  if (!wgmma.ok()) return wgmma.status();
  if (!mma.ok()) return mma.status();
  if (!delta.ok()) return delta.status();
  // attention_grad's kernels as codegen lowers it: on wgmma (at D 128 dq's zeroing and the
  // fused backward), on wgmma with the fused backward off (the dq and dk/dv kernels; the same
  // kernels at D 64, so not timed twice there), and on mma.sync.
  auto load_all = [&](const std::vector<KernelSpec>& specs) -> absl::StatusOr<std::vector<Loaded>> {
    std::vector<Loaded> loaded;
    for (const KernelSpec& spec : specs) {
      absl::StatusOr<Loaded> l = bench::LoadKernel(spec, device);
      if (!l.ok()) return l.status();
      loaded.push_back(*std::move(l));
    }
    return loaded;
  };
  bool split_differs = split->grad.size() != hopper->grad.size();
  for (size_t i = 0; !split_differs && i < split->grad.size(); ++i) {
    split_differs = split->grad[i].source != hopper->grad[i].source;
  }
  absl::StatusOr<std::vector<Loaded>> grad = load_all(hopper->grad), grad_mma = load_all(ampere->grad);
  absl::StatusOr<std::vector<Loaded>> grad_split = load_all(split_differs ? split->grad : std::vector<KernelSpec>{});
  for (const auto* l : {&grad, &grad_split, &grad_mma}) {
    if (!l->ok()) return l->status();
  }

  const Bf16Tensor q = RandomBf16Tensor(s.q_elements(), -2, 2, 1), k = RandomBf16Tensor(s.kv_elements(), -2, 2, 2),
                   v = RandomBf16Tensor(s.kv_elements(), -1, 1, 3),
                   dout = RandomBf16Tensor(s.q_elements(), -1, 1, 4);
  bench::DeviceBuffers buffers(device, "attention_bench");
  auto upload = [&](const std::vector<uint16_t>* bits, int64_t bytes) {
    return buffers.Upload(bits != nullptr ? bits->data() : nullptr, bytes);
  };
  const int64_t qb = s.q_elements() * 2, kvb = s.kv_elements() * 2;
  absl::StatusOr<void*> dq_in = upload(&q.bits, qb), dk_in = upload(&k.bits, kvb), dv_in = upload(&v.bits, kvb),
                        ddo = upload(&dout.bits, qb);
  absl::StatusOr<void*> o_w = upload(nullptr, s.q_elements() * 2), o_m = upload(nullptr, s.q_elements() * 2),
                        lse = upload(nullptr, s.rows() * 4), lse_m = upload(nullptr, s.rows() * 4),
                        dlt = upload(nullptr, s.rows() * 4), gq = upload(nullptr, s.q_elements() * 4),
                        gk = upload(nullptr, s.kv_elements() * 4), gv = upload(nullptr, s.kv_elements() * 4),
                        mq = upload(nullptr, s.q_elements() * 4), mk = upload(nullptr, s.kv_elements() * 4),
                        mv = upload(nullptr, s.kv_elements() * 4), sq = upload(nullptr, s.q_elements() * 4),
                        sk = upload(nullptr, s.kv_elements() * 4), sv = upload(nullptr, s.kv_elements() * 4);
  for (const auto* p : {&dq_in, &dk_in, &dv_in, &ddo, &o_w, &o_m, &lse, &lse_m, &dlt, &gq, &gk, &gv, &mq, &mk, &mv,
                        &sq, &sk, &sv}) {
    if (!p->ok()) return p->status();
  }
  const std::vector<void*> fwd_w = {*o_w, *lse, *dq_in, *dk_in, *dv_in};
  const std::vector<void*> fwd_m = {*o_m, *lse_m, *dq_in, *dk_in, *dv_in};
  const std::vector<void*> delta_args = {*dlt, *o_w, *ddo};
  const std::vector<void*> dq_args = {*gq, *gk, *gv, *dq_in, *dk_in, *dv_in, *ddo, *lse, *dlt};
  const std::vector<void*> mma_args = {*mq, *mk, *mv, *dq_in, *dk_in, *dv_in, *ddo, *lse, *dlt};
  const std::vector<void*> split_args = {*sq, *sk, *sv, *dq_in, *dk_in, *dv_in, *ddo, *lse, *dlt};

  absl::StatusOr<bench::Timing> t_w = Time({{&*wgmma, fwd_w}}, device, opt.warmup, opt.iters);
  absl::StatusOr<bench::Timing> t_m = Time({{&*mma, fwd_m}}, device, opt.warmup, opt.iters);
  if (!t_w.ok()) return t_w.status();
  if (!t_m.ok()) return t_m.status();
  // attention_grad's kernels all take (dq, dk, dv, q, k, v, dout, lse, delta), each writing its
  // share (codegen/lower_attention.cc): the forward, the delta, then those, as a step runs them.
  auto fwd_bwd = [&](const std::vector<Loaded>& grad_kernels, const std::vector<void*>& grad_args) {
    std::vector<std::pair<const Loaded*, std::vector<void*>>> launches = {{&*wgmma, fwd_w}, {&*delta, delta_args}};
    for (const Loaded& l : grad_kernels) launches.push_back({&l, grad_args});
    return Time(launches, device, opt.warmup, opt.iters);
  };
  absl::StatusOr<bench::Timing> t_fb = fwd_bwd(*grad, dq_args);
  if (!t_fb.ok()) return t_fb.status();
  absl::StatusOr<bench::Timing> t_fb_split = split_differs ? fwd_bwd(*grad_split, split_args) : t_fb;
  if (!t_fb_split.ok()) return t_fb_split.status();
  absl::StatusOr<bench::Timing> t_fb_mma = fwd_bwd(*grad_mma, mma_args);
  if (!t_fb_mma.ok()) return t_fb_mma.status();
  // The wgmma backwards' gradients against the mma.sync one's, from the same O, LSE and
  // Delta: the largest difference over the largest gradient.
  auto relative_difference = [&](void* dq, void* dk, void* dv) {
    double diff = 0, largest = 0;
    for (const auto& [w, m, n] : {std::tuple{dq, *mq, s.q_elements()}, std::tuple{dk, *mk, s.kv_elements()},
                                  std::tuple{dv, *mv, s.kv_elements()}}) {
      std::vector<float> a(n), b(n);
      cudaMemcpy(a.data(), w, n * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(b.data(), m, n * 4, cudaMemcpyDeviceToHost);
      for (int64_t i = 0; i < n; ++i) {
        const double e = std::abs(static_cast<double>(a[i]) - b[i]);
        diff = std::isnan(e) ? INFINITY : std::max(diff, e);
        largest = std::max(largest, std::abs(static_cast<double>(b[i])));
      }
    }
    return largest > 0 ? diff / largest : INFINITY;
  };
  const double grad_rel = relative_difference(*gq, *gk, *gv);
  const double split_rel = split_differs ? relative_difference(*sq, *sk, *sv) : grad_rel;

  std::vector<uint16_t> ow_bits(s.q_elements()), om_bits(s.q_elements());
  cudaMemcpy(ow_bits.data(), *o_w, ow_bits.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(om_bits.data(), *o_m, om_bits.size() * 2, cudaMemcpyDeviceToHost);
  std::vector<float> ow(s.q_elements()), om(s.q_elements());
  for (int64_t i = 0; i < s.q_elements(); ++i) {
    ow[i] = BF16BitsToFloat(ow_bits[i]);
    om[i] = BF16BitsToFloat(om_bits[i]);
  }
  double w_vs_m = 0;
  for (size_t i = 0; i < ow.size(); ++i) {
    const double e = std::abs(static_cast<double>(ow[i]) - om[i]);
    w_vs_m = std::isnan(e) ? INFINITY : std::max(w_vs_m, e);
  }
  // Sampled rows, the last row of each head's sequence among them (the longest).
  double err_w = 0, err_m = 0;
  std::mt19937_64 rng(7);
  for (int r = 0; r < opt.rows; ++r) {
    const int64_t row = r == 0 ? s.t - 1 : static_cast<int64_t>(rng() % s.rows());
    const std::vector<double> want = ReferenceRow(s, q, k, v, row);
    for (int64_t c = 0; c < s.d; ++c) {
      err_w = std::max(err_w, std::abs(ow[row * s.d + c] - want[c]));
      err_m = std::max(err_m, std::abs(om[row * s.d + c] - want[c]));
    }
  }
  Report(s, "kiln fwd wgmma", *t_w, s.forward_flops(), err_w, w_vs_m, "mma.sync");
  Report(s, "kiln fwd mma.sync", *t_m, s.forward_flops(), err_m, w_vs_m, "wgmma");
  Report(s, "kiln fwd+bwd", *t_fb, 3.5 * s.forward_flops(), err_w, grad_rel, "mma.sync bwd, rel");
  if (split_differs) {
    Report(s, "kiln fwd+bwd (split bwd)", *t_fb_split, 3.5 * s.forward_flops(), err_w, split_rel,
           "mma.sync bwd, rel");
  }
  Report(s, "kiln fwd+bwd (mma.sync bwd)", *t_fb_mma, 3.5 * s.forward_flops(), err_w, grad_rel, "wgmma bwd, rel");
  // NaN compares false: written so that it fails.
  if (!(err_w <= opt.max_error && err_m <= opt.max_error && w_vs_m <= opt.max_error)) {
    return absl::InternalError(absl::StrCat("O beyond --max-error ", opt.max_error, ": wgmma vs reference ", err_w,
                                            ", mma.sync vs reference ", err_m, ", wgmma vs mma.sync ", w_vs_m));
  }
  if (!(grad_rel <= opt.max_error && split_rel <= opt.max_error)) {
    return absl::InternalError(absl::StrCat("the wgmma backwards (fused, split) and the mma.sync one differ by ",
                                            grad_rel, " and ", split_rel, " of the largest gradient, beyond --max-error ",
                                            opt.max_error));
  }
  return absl::OkStatus();
}

bool ParseArgs(int argc, char** argv, Options& opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (const bench::OptionRead read = bench::ReadRunOption(argc, argv, i, /*min_rows=*/1, opt);
        read != bench::OptionRead::kOther) {
      if (read == bench::OptionRead::kInvalid) return false;
    } else if (a == "--shapes" && i + 1 < argc) {
      opt.shapes = absl::StrSplit(argv[++i], ',', absl::SkipEmpty());
    } else {
      return false;
    }
  }
  return true;
}

int Main(int argc, char** argv) {
  Options opt;
  if (!ParseArgs(argc, argv, opt)) {
    std::fprintf(stderr, "usage: attention_bench [--shapes S,M,L] [--iters N] [--warmup N] [--rows N] [--max-error X]\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Open();
  if (!device.ok()) {
    std::fprintf(stderr, "attention_bench: no GPU: %s\n", std::string(device.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "attention_bench on %s (%s)\n", (*device)->name().c_str(), (*device)->target().ToString().c_str());
  bench::FailedRows failed("attention_bench");
  for (const std::string& name : opt.shapes) {
    const auto it = std::find_if(BarShapes().begin(), BarShapes().end(), [&](const Shape& s) { return s.name == name; });
    if (it == BarShapes().end()) {
      std::fprintf(stderr, "attention_bench: unknown shape '%s' (S, M, L)\n", name.c_str());
      return 2;
    }
    failed.Check(absl::StrCat("shape ", name), RunShape(*it, **device, opt));
  }
  return failed.ExitCode("shape(s)");
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
