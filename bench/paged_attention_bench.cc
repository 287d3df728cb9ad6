// paged_attention_bench: times the decode step's paged attention on the GPU, the kernels exactly
// as codegen emits them (codegen/lower_paged_kv.cc: kernels/paged_kv.cuh's PagedAttentionSplitMma
// or PagedAttentionSplit, whose last split adds the partials when the keys split), at llama-M's heads (16 query heads, 8 kv
// heads, head dim 128, a bf16 pool of 16-token blocks, O stored bf16 as the decode step stores
// it) for each --batches B: B sequences of one new token, each over --keys keys (the decode
// benchmark's sequences are all one length: prompts of 512, then decoded in lockstep) in
// blocks scattered over a pool of B whole --context contexts. With --tokens T, each sequence's
// last T keys are query rows (a prefill over a cached prefix of keys - T: q [B, T, H, D], row t
// over keys - T + t + 1 keys), where the tensor-core kernel takes several query rows a block
// ("+untiled": one). Each --geometries entry is a
// CodegenOptions::paged_attention as ParsePagedAttentionGeometry reads it (codegen/lower_node.h:
// "tc4x3x4x2", the default, is the tensor-core kernel PagedAttentionSplitMma; "4(8)x5x4x4" the
// CUDA-core PagedAttentionSplit; "+combine" and "+fold"), so the variants compare in one run;
// the first is the default.
// Each row: median, min and max us over the timed calls (CUDA events around the launch, after
// warm-up), the sequences' K and V bytes (each once) over the median (GB/s), and
// the max |error| of the bf16 O against a double evaluation of the op's definition
// (ir/op_table.h: softmax(q k * scale) v with P unrounded) on every (row, head).
// bench/paged_attention_torch.py times torch SDPA over the same keys held densely (what HF's
// static cache runs); bench/paged_attention_h200.sh runs both. One JSON object a line on
// stdout, a table on stderr.
//
//   paged_attention_bench [--batches 1,32] [--keys 640] [--context 768] [--tokens 1]
//                         [--geometries tc4x3x4x2,tc4x3x4x4,4(8)x5x4x4,4x5x4x4+combine] [--iters 50]
//                         [--warmup 5]
//                         [--max-error 5e-3]
//
// Self-checking: exit 1 when a row's O is further than --max-error from the reference (or NaN).
// Linked like the GPU tests (Abseil and protobuf statically, the CUDA runtime statically, never
// libcuda); without a GPU it says so and exits 1.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/bench_util.h"
#include "codegen/lower_node.h"
#include "codegen/nvrtc_compiler.h"
#include "ir/builder.h"
#include "ir/graph.h"
#include "ir/numerics.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/kernel_launch.h"

namespace kiln {
namespace {

constexpr int64_t kHeads = 16, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;

struct Options : bench::RunOptions {
  Options() : bench::RunOptions{.iters = 50, .warmup = 5, .rows = 1, .max_error = 5e-3} {}
  std::vector<int64_t> batches = {1, 32};
  int64_t keys = 640, context = 768, tokens = 1;
  std::vector<CodegenOptions::PagedAttentionGeometry> geometries = DefaultGeometries();

  // The default, the tensor-core kernel's neighbours and the CUDA-core kernel's default.
  static std::vector<CodegenOptions::PagedAttentionGeometry> DefaultGeometries() {
    std::vector<CodegenOptions::PagedAttentionGeometry> all(6);
    all[1].tensor_core_blocks_per_sm = 4;
    all[2].warp_stages = 4;
    all[3].min_split_blocks = 8;
    all[4].warps = 2, all[4].tensor_core_blocks_per_sm = 4;
    all[5].tensor_cores = false;
    return all;
  }
};


using Loaded = bench::LoadedKernel;

using bench::Bf16Tensor;

// One batch's inputs: q [B, T, H, D], the pools [1, B * blocks_per_row, KV, BS, D], each
// sequence's table a random choice of the pool's blocks (no two share one), positions keys - T
// .. keys - 1.
struct Inputs {
  int64_t batch = 0, tokens = 1, max_blocks = 0, pool_blocks = 0;
  Bf16Tensor q, k, v;
  std::vector<int32_t> tables, positions;
};

Inputs MakeInputs(int64_t batch, const Options& opt) {
  Inputs in;
  in.batch = batch;
  in.tokens = opt.tokens;
  in.max_blocks = (opt.context + kBlockSize - 1) / kBlockSize;
  in.pool_blocks = batch * in.max_blocks;
  const int64_t pool = in.pool_blocks * kKvHeads * kBlockSize * kHeadDim;
  in.q = bench::RandomBf16Tensor(batch * opt.tokens * kHeads * kHeadDim, -1, 1, 11);
  in.k = bench::RandomBf16Tensor(pool, -2, 2, 12);
  in.v = bench::RandomBf16Tensor(pool, -1, 1, 13);
  std::vector<int32_t> order(in.pool_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(14));
  in.tables.assign(order.begin(), order.end());  // row b's table: order[b * max_blocks, ...)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < opt.tokens; ++t) in.positions.push_back(static_cast<int32_t>(opt.keys - opt.tokens + t));
  }
  return in;
}

// O[b, t, h, :] by the definition, in double.
std::vector<double> Reference(const Inputs& in) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  std::vector<double> o(in.batch * in.tokens * kHeads * kHeadDim, 0.0);
  for (int64_t bt = 0; bt < in.batch * in.tokens; ++bt) {
    const int64_t b = bt / in.tokens, keys = in.positions[bt] + 1;
    std::vector<double> s(keys);
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t kv = h / (kHeads / kKvHeads);
      const double* q = &in.q.values[(bt * kHeads + h) * kHeadDim];
      auto row = [&](int64_t j) {
        const int64_t block = in.tables[b * in.max_blocks + j / kBlockSize];
        return ((block * kKvHeads + kv) * kBlockSize + j % kBlockSize) * kHeadDim;
      };
      double max = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < kHeadDim; ++d) dot += q[d] * in.k.values[row(j) + d];
        s[j] = dot * scale;
        max = std::max(max, s[j]);
      }
      double l = 0;
      double* out = &o[(bt * kHeads + h) * kHeadDim];
      for (int64_t j = 0; j < keys; ++j) {
        const double p = std::exp(s[j] - max);
        l += p;
        for (int64_t d = 0; d < kHeadDim; ++d) out[d] += p * in.v.values[row(j) + d];
      }
      for (int64_t d = 0; d < kHeadDim; ++d) out[d] /= l;
    }
  }
  return o;
}

absl::StatusOr<std::vector<KernelSpec>> Lower(const Inputs& in, const Target& target,
                                              const CodegenOptions::PagedAttentionGeometry& geometry,
                                              int64_t& scratch_bytes) {
  Module m;
  Builder b(m.AddFunction("decode"));
  const DType bf16 = DType::kBF16;
  const std::vector<int64_t> pool = {1, in.pool_blocks, kKvHeads, kBlockSize, kHeadDim};
  absl::StatusOr<Node*> q = b.Parameter("q", {bf16, {in.batch, in.tokens, kHeads, kHeadDim}});
  absl::StatusOr<Node*> k = b.Parameter("k_pool", {bf16, pool});
  absl::StatusOr<Node*> v = b.Parameter("v_pool", {bf16, pool});
  absl::StatusOr<Node*> tables = b.Parameter("block_tables", {DType::kI32, {in.batch, in.max_blocks}});
  absl::StatusOr<Node*> positions = b.Parameter("positions", {DType::kI32, {in.batch, in.tokens}});
  for (const auto* p : {&q, &k, &v, &tables, &positions}) {
    if (!p->ok()) return p->status();
  }
  absl::StatusOr<Node*> o = b.Op(Opcode::kPagedAttention, {*q, *k, *v, *tables, *positions},
                                 AttrMap{{"layer", int64_t{0}},
                                         {"scale", 1.0 / std::sqrt(static_cast<double>(kHeadDim))},
                                         {"out_dtype", Symbol{"bf16"}}});
  if (!o.ok()) return o.status();
  CodegenOptions options{.target = target};
  options.paged_attention = geometry;
  absl::StatusOr<LoweredNode> lowered = LowerNode(**o, options);
  if (!lowered.ok()) return lowered.status();
  scratch_bytes = lowered->scratch_bytes;
  return lowered->kernels;
}

absl::Status RunBatch(int64_t batch, CudaDevice& device, const Options& opt) {
  const Inputs in = MakeInputs(batch, opt);
  const std::vector<double> want = Reference(in);
  const double bytes = 2.0 * batch * kKvHeads * opt.keys * kHeadDim * 2;  // K and V, bf16, a sequence's once
  bench::DeviceBuffers buffers(device, "paged_attention_bench");
  absl::StatusOr<void*> q = buffers.Upload(in.q.bits.data(), in.q.bits.size() * 2);
  absl::StatusOr<void*> k = buffers.Upload(in.k.bits.data(), in.k.bits.size() * 2);
  absl::StatusOr<void*> v = buffers.Upload(in.v.bits.data(), in.v.bits.size() * 2);
  absl::StatusOr<void*> tables = buffers.Upload(in.tables.data(), in.tables.size() * 4);
  absl::StatusOr<void*> positions = buffers.Upload(in.positions.data(), in.positions.size() * 4);
  absl::StatusOr<void*> out = buffers.Upload(nullptr, batch * opt.tokens * kHeads * kHeadDim * 2);
  for (const auto* p : {&q, &k, &v, &tables, &positions, &out}) {
    if (!p->ok()) return p->status();
  }
  absl::Status worst = absl::OkStatus();
  for (const CodegenOptions::PagedAttentionGeometry& geometry : opt.geometries) {
    const std::string name = PagedAttentionGeometryName(geometry);
    int64_t scratch_bytes = 0;
    absl::StatusOr<std::vector<KernelSpec>> specs = Lower(in, device.target(), geometry, scratch_bytes);
    if (!specs.ok()) return specs.status();
    absl::StatusOr<void*> scratch = buffers.Upload(nullptr, std::max<int64_t>(scratch_bytes, 16));
    if (!scratch.ok()) return scratch.status();
    // The split kernel (and a combine kernel, without fold_combine) take (out, q, k_pool,
    // v_pool, block_tables, positions[, partials]).
    std::vector<Loaded> kernels;
    for (const KernelSpec& spec : *specs) {
      absl::StatusOr<Loaded> l = bench::LoadKernel(spec, device);
      if (!l.ok()) return l.status();
      kernels.push_back(*std::move(l));
    }
    std::vector<void*> args = {*out, *q, *k, *v, *tables, *positions};
    if (scratch_bytes > 0) args.push_back(*scratch);
    absl::StatusOr<bench::Timing> t =
        bench::TimeCalls(device.stream(), opt.warmup, opt.iters, "paged_attention_bench", "a call", [&]() -> absl::Status {
          for (size_t i = 0; i < kernels.size(); ++i) {
            absl::Status st = EnqueueLaunch(kernels[i].launch, args, device.stream(), "paged_attention_bench");
            if (!st.ok()) return st;
          }
          return absl::OkStatus();
        });
    if (!t.ok()) return t.status();
    std::vector<uint16_t> got(want.size());
    cudaMemcpy(got.data(), *out, got.size() * 2, cudaMemcpyDeviceToHost);
    double err = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double e = std::abs(BF16BitsToFloat(got[i]) - want[i]);
      err = std::isnan(e) ? INFINITY : std::max(err, e);
    }
    const double gbps = bytes / (t->median_ms * 1e-3) * 1e-9;
    std::printf(
        "{\"batch\": %lld, \"tokens\": %lld, \"keys\": %lld, \"impl\": \"kiln %s\", \"launches\": %zu, "
        "\"median_us\": %.2f, \"min_us\": %.2f, \"max_us\": %.2f, \"gbps\": %.0f, \"max_err\": %.3g}\n",
        static_cast<long long>(batch), static_cast<long long>(opt.tokens), static_cast<long long>(opt.keys), name.c_str(),
        kernels.size(),
        t->median_ms * 1e3, t->min_ms * 1e3, t->max_ms * 1e3, gbps, err);
    std::fprintf(stderr, "batch %-3lld x %lld kiln %-10s %zu launches %8.2f us (min %.2f, max %.2f) %6.0f GB/s  err %.3g\n",
                 static_cast<long long>(batch), static_cast<long long>(opt.tokens), name.c_str(), kernels.size(),
                 t->median_ms * 1e3, t->min_ms * 1e3,
                 t->max_ms * 1e3, gbps, err);
    if (!(err <= opt.max_error)) {  // NaN compares false
      worst = absl::InternalError(absl::StrCat("batch ", batch, ", geometry ", name, ": O is ", err,
                                               " from the reference, beyond --max-error ", opt.max_error));
    }
  }
  return worst;
}

bool ParseArgs(int argc, char** argv, Options& opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::vector<int64_t> ints;
    if (const bench::OptionRead read = bench::ReadRunOption(argc, argv, i, /*min_rows=*/1, opt);
        read != bench::OptionRead::kOther) {
      if (read == bench::OptionRead::kInvalid) return false;
    } else if (a == "--batches" && i + 1 < argc) {
      if (!bench::ParsePositiveInts(argv[++i], ',', opt.batches)) return false;
    } else if ((a == "--keys" || a == "--context" || a == "--tokens") && i + 1 < argc) {
      if (!bench::ParsePositiveInts(argv[++i], ',', ints) || ints.size() != 1) return false;
      (a == "--keys" ? opt.keys : a == "--context" ? opt.context : opt.tokens) = ints[0];
    } else if (a == "--geometries" && i + 1 < argc) {
      opt.geometries.clear();
      for (absl::string_view g : absl::StrSplit(argv[++i], ',', absl::SkipEmpty())) {
        absl::StatusOr<CodegenOptions::PagedAttentionGeometry> geometry = ParsePagedAttentionGeometry(g);
        if (!geometry.ok()) {
          std::fprintf(stderr, "paged_attention_bench: %s\n", std::string(geometry.status().message()).c_str());
          return false;
        }
        opt.geometries.push_back(*geometry);
      }
      if (opt.geometries.empty()) return false;
    } else {
      return false;
    }
  }
  return opt.keys <= opt.context && opt.tokens <= opt.keys;
}

int Main(int argc, char** argv) {
  Options opt;
  if (!ParseArgs(argc, argv, opt)) {
    std::fprintf(stderr,
                 "usage: paged_attention_bench [--batches 1,32] [--keys N <= --context N] [--tokens T <= N] [--geometries [tc]WxSxMxB[+combine|+fold],...] "
                 "[--iters N] [--warmup N] [--max-error X]\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Open();
  if (!device.ok()) {
    std::fprintf(stderr, "paged_attention_bench: no GPU: %s\n", std::string(device.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "paged_attention_bench on %s (%s): %lld keys a row, context %lld\n", (*device)->name().c_str(),
               (*device)->target().ToString().c_str(), static_cast<long long>(opt.keys),
               static_cast<long long>(opt.context));
  bench::FailedRows failed("paged_attention_bench");
  for (int64_t batch : opt.batches) failed.Check(absl::StrCat("batch ", batch), RunBatch(batch, **device, opt));
  return failed.ExitCode("batch(es)");
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
