// Lowering of fp8_quantize, fp8_dequantize and fp8_scale_update (codegen/lower_fp8.cc) to
// kernels/fp8.cuh: over shapes that take each path (odd sizes on the scalar paths, rows of
// 16-byte chunks, partial tiles, an empty tensor), every input dtype and both formats, the
// lowering succeeds, its kernels follow the kernel_spec.h contract and compile with NVRTC for
// sm_90a without spills. No GPU is needed; tests/gpu_fp8_test.cc checks the values against
// the reference backend bit for bit.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/kernel_source.h"
#include "codegen/lower_node.h"
#include "codegen/nvrtc_compiler.h"
#include "gtest/gtest.h"
#include "ir/builder.h"

namespace kiln {
namespace {

constexpr DType kF32 = DType::kF32, kBF16 = DType::kBF16, kF16 = DType::kF16, kE4M3 = DType::kF8E4M3,
                kE5M2 = DType::kF8E5M2;

// A function applying `op` once to parameters of `operands`; `node` is the op's node (for a
// multi-result op, the node its get_results read).
struct OneOp {
  std::unique_ptr<Module> module = std::make_unique<Module>("m");
  const Node* node = nullptr;
};

OneOp MakeOneOp(Opcode op, const std::vector<TensorType>& operands, AttrMap attrs) {
  OneOp one;
  Builder b(one.module->AddFunction("f"));
  std::vector<Node*> params;
  for (size_t i = 0; i < operands.size(); ++i) params.push_back(*b.Parameter(absl::StrCat("p", i), operands[i]));
  if (op == Opcode::kFp8Quantize) {
    absl::StatusOr<std::vector<Node*>> results = b.MultiResultOp(op, params, std::move(attrs));
    EXPECT_TRUE(results.ok()) << results.status();
    if (results.ok()) one.node = (*results)[0]->operand(0);
    return one;
  }
  absl::StatusOr<Node*> node = b.Named("layers.0.fp8").Op(op, params, std::move(attrs));
  EXPECT_TRUE(node.ok()) << node.status();
  if (node.ok()) one.node = *node;
  return one;
}

// margin >= 0: {update_state=1, margin}, the next state a last result.
OneOp Quantize(TensorType x, DType format, bool transposed, int64_t history = 16, int64_t margin = -1) {
  AttrMap attrs{{"out_dtype", Symbol{std::string(DTypeName(format))}}};
  if (transposed) attrs.Set("transposed", int64_t{1});
  if (margin >= 0) {
    attrs.Set("update_state", int64_t{1});
    attrs.Set("margin", margin);
  }
  return MakeOneOp(Opcode::kFp8Quantize, {x, {kF32, {history + 2}}}, attrs);
}

// Lowers `node` and checks each kernel's contract (the signature: one pointer per result
// and per operand, no scratch), a launch that fits, and an NVRTC compile for sm_90a without
// spills. `ptxas_log`, when given, receives the last kernel's resource report.
std::vector<KernelSpec> LowerAndCompile(const Node* node, std::string* ptxas_log = nullptr) {
  if (node == nullptr) return {};
  absl::StatusOr<LoweredNode> lowered = LowerNode(*node);
  EXPECT_TRUE(lowered.ok()) << lowered.status();
  if (!lowered.ok()) return {};
  EXPECT_EQ(lowered->kind, LoweringKind::kKernels);
  EXPECT_EQ(lowered->scratch_bytes, 0);
  for (const KernelSpec& kernel : lowered->kernels) {
    SCOPED_TRACE(kernel.name);
    EXPECT_EQ(kernel.name.rfind(codegen::KernelName(*node), 0), 0u);
    const std::string open = kernel.name + "(";
    const std::string params = kernel.source.substr(kernel.source.find(open) + open.size());
    EXPECT_EQ(std::count(params.begin(), params.begin() + params.find(')'), ',') + 1,
              node->num_results() + node->num_operands())
        << kernel.source;
    EXPECT_EQ(kernel.block[0] % 32, 0u);
    EXPECT_LE(kernel.block[0], 1024u);
    EXPECT_GE(kernel.grid[0], 1u);
    EXPECT_EQ(kernel.grid[1] * kernel.grid[2] * kernel.block[1] * kernel.block[2], 1u);
    absl::StatusOr<CompiledKernel> compiled = CompileKernel(kernel, NvrtcOptions{.ptxas_info = true});
    EXPECT_TRUE(compiled.ok()) << compiled.status();
    if (!compiled.ok()) continue;
    EXPECT_FALSE(compiled->cubin.empty());
    EXPECT_NE(compiled->log.find("0 bytes spill stores"), std::string::npos) << compiled->log;
    if (ptxas_log != nullptr) *ptxas_log = compiled->log;
  }
  return lowered->kernels;
}

bool Contains(const KernelSpec& k, const std::string& s) { return k.source.find(s) != std::string::npos; }

// One kernel, a grid-stride loop capped at 16 blocks per SM, whose last block writes amax and
// scale_inv from the module-scope max and count it sets back to zero.
TEST(Fp8KernelsTest, QuantizeIsOneGridStrideKernel) {
  struct Case {
    TensorType x;
    DType format;
  };
  for (const Case& c : std::vector<Case>{{{kF32, {3, 5, 7}}, kE4M3},
                                         {{kBF16, {257, 130}}, kE5M2},
                                         {{kF16, {1}}, kE4M3},
                                         {{kBF16, {4096, 2048}}, kE4M3},
                                         {{kF32, {64, 1000}}, kE5M2}}) {
    SCOPED_TRACE(absl::StrCat(c.x.ToString(), " -> ", DTypeName(c.format)));
    OneOp one = Quantize(c.x, c.format, /*transposed=*/false);
    const std::vector<KernelSpec> kernels = LowerAndCompile(one.node);
    ASSERT_EQ(kernels.size(), 1u);
    EXPECT_TRUE(Contains(kernels[0], absl::StrCat("Fp8Quantize<", CudaTypeName(c.x.dtype), ", ", CudaTypeName(c.format),
                                                  ", ", c.x.num_elements(), "LL, 256, 18LL>(q, x, state, ")))
        << kernels[0].source;
    EXPECT_TRUE(Contains(kernels[0], "Fp8QuantizeFinish{amax, scale_inv, nullptr, &g_amax_bits, &g_blocks_done, "))
        << kernels[0].source;
    EXPECT_TRUE(Contains(kernels[0], "static __device__ unsigned int g_blocks_done = 0;")) << kernels[0].source;
    EXPECT_LE(kernels[0].grid[0], 16u * CodegenOptions{}.target.sm_count);
  }
}

// With update_state the kernel takes next_state and passes the format's largest value and
// the margin to the last block's scale update; the next state may take the state's buffer
// (result 3, or 4 after q_t), no other result any operand's.
TEST(Fp8KernelsTest, QuantizeThatUpdatesTheStateWritesItInPlace) {
  struct Case {
    TensorType x;
    DType format;
    bool transposed;
    int64_t history, margin;
    std::string finish;
  };
  for (const Case& c : std::vector<Case>{
           {{kBF16, {257, 130}}, kE5M2, false, 16, 0, "next_state, &g_amax_bits, &g_blocks_done, 0x1.cp+15f, 0}"},
           {{kBF16, {4096, 2048}}, kE4M3, true, 16, 2, "next_state, &g_amax_bits, &g_blocks_done, 0x1.cp+8f, 2}"},
           {{kF32, {3, 5, 7}}, kE4M3, true, 1, 0, "next_state, &g_amax_bits, &g_blocks_done, 0x1.cp+8f, 0}"},
           {{kF32, {64, 1000}}, kE5M2, false, 1024, 1, "next_state, &g_amax_bits, &g_blocks_done, 0x1.cp+15f, 1}"}}) {
    SCOPED_TRACE(absl::StrCat(c.x.ToString(), " -> ", DTypeName(c.format), c.transposed ? " transposed" : "",
                              ", L = ", c.history));
    OneOp one = Quantize(c.x, c.format, c.transposed, c.history, c.margin);
    ASSERT_EQ(one.node->num_results(), c.transposed ? 5 : 4);
    EXPECT_EQ(one.node->result_type(one.node->num_results() - 1), (TensorType{kF32, {c.history + 2}}));
    const std::vector<KernelSpec> kernels = LowerAndCompile(one.node);
    ASSERT_EQ(kernels.size(), 1u);
    EXPECT_TRUE(Contains(kernels[0], absl::StrCat(c.history + 2, "LL>(q, "))) << kernels[0].source;
    EXPECT_TRUE(Contains(kernels[0], c.finish)) << kernels[0].source;
    EXPECT_TRUE(Contains(kernels[0], "float* next_state, ")) << kernels[0].source;
    absl::StatusOr<LoweredNode> lowered = LowerNode(*one.node);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    EXPECT_TRUE(lowered->elementwise_in_place);
    std::vector<int> in_place(one.node->num_results(), -1);
    in_place.back() = 1;
    EXPECT_EQ(lowered->in_place_operand_of_results, in_place);
  }
}

// With q_t: 128 x 128 tiles, one block each; loads of up to 16 bytes where the row length
// allows, q_t's rows written in pieces of up to 16 bytes where the row count allows.
TEST(Fp8KernelsTest, TransposedQuantizeTilesByTheShape) {
  struct Case {
    TensorType x;
    DType format;
    int64_t rows, cols, tiles;
    int in_vec, out_vec;
  };
  for (const Case& c : std::vector<Case>{{{kF32, {3, 5, 7}}, kE4M3, 15, 7, 1, 1, 1},
                                         {{kF32, {257, 130}}, kE5M2, 257, 130, 6, 2, 1},
                                         {{kBF16, {257, 130}}, kE4M3, 257, 130, 6, 2, 1},
                                         {{kBF16, {4096, 2048}}, kE4M3, 4096, 2048, 512, 8, 16},
                                         {{kF32, {4096, 2048}}, kE5M2, 4096, 2048, 512, 4, 16},
                                         {{kF16, {2, 12, 36}}, kE5M2, 24, 36, 1, 4, 8},
                                         {{kBF16, {20, 1}}, kE4M3, 20, 1, 1, 1, 4},
                                         {{kF32, {1, 3}}, kE4M3, 1, 3, 1, 1, 1}}) {
    SCOPED_TRACE(absl::StrCat(c.x.ToString(), " -> ", DTypeName(c.format)));
    OneOp one = Quantize(c.x, c.format, /*transposed=*/true);
    ASSERT_EQ(one.node->num_results(), 4);
    std::string log;
    const std::vector<KernelSpec> kernels = LowerAndCompile(one.node, &log);
    ASSERT_EQ(kernels.size(), 1u);
    EXPECT_TRUE(Contains(kernels[0], absl::StrCat("Fp8QuantizeTransposed<", CudaTypeName(c.x.dtype), ", ",
                                                  CudaTypeName(c.format), ", ", c.rows, "LL, ", c.cols, "LL, ",
                                                  c.in_vec, ", ", c.out_vec, ", 18LL>(q, q_t, x, state, ")))
        << kernels[0].source;
    EXPECT_EQ(kernels[0].grid[0], static_cast<uint32_t>(c.tiles));
    EXPECT_EQ(kernels[0].block[0], 256u);
    if (c.x.dtype == kBF16 && c.rows == 4096)
      std::printf("fp8_quantize %s transposed: %s\n", c.x.ToString().c_str(), log.c_str());
  }
}

// An empty x: the grid-stride form's one block, which writes amax (0), scale_inv and the
// next state; an empty dequantize: nothing to run.
TEST(Fp8KernelsTest, EmptyTensors) {
  OneOp quantize = Quantize({kBF16, {0, 8}}, kE4M3, /*transposed=*/true, 16, /*margin=*/0);
  const std::vector<KernelSpec> kernels = LowerAndCompile(quantize.node);
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(kernels[0].grid[0], 1u);
  EXPECT_TRUE(Contains(kernels[0], "Fp8Quantize<__nv_bfloat16, __nv_fp8_e4m3, 0LL, 256, 18LL>(q, x, state, "))
      << kernels[0].source;
  OneOp dequantize = MakeOneOp(Opcode::kFp8Dequantize, {{kE4M3, {0}}, {kF32, {}}}, {{"out_dtype", Symbol{"f32"}}});
  EXPECT_TRUE(LowerAndCompile(dequantize.node).empty());
}

TEST(Fp8KernelsTest, Dequantize) {
  struct Case {
    TensorType q;
    DType out;
  };
  for (const Case& c : std::vector<Case>{{{kE4M3, {3, 5, 7}}, kBF16},
                                         {{kE5M2, {257, 130}}, kF32},
                                         {{kE4M3, {4096, 2048}}, kF16},
                                         {{kE5M2, {16}}, kBF16}}) {
    SCOPED_TRACE(absl::StrCat(c.q.ToString(), " -> ", DTypeName(c.out)));
    OneOp one =
        MakeOneOp(Opcode::kFp8Dequantize, {c.q, {kF32, {}}}, {{"out_dtype", Symbol{std::string(DTypeName(c.out))}}});
    const std::vector<KernelSpec> kernels = LowerAndCompile(one.node);
    ASSERT_EQ(kernels.size(), 1u);
    EXPECT_TRUE(Contains(kernels[0], absl::StrCat("Fp8Dequantize<", CudaTypeName(c.q.dtype), ", ", CudaTypeName(c.out),
                                                  ", ", c.q.num_elements(), "LL, 256>(out, q, scale_inv)")))
        << kernels[0].source;
  }
}

// One block, whole warps covering the state (up to 256 threads, then several elements per
// thread); the format's largest value and the margin are literals.
TEST(Fp8KernelsTest, ScaleUpdateIsOneBlock) {
  struct Case {
    int64_t history;
    DType format;
    int64_t margin;
    std::string literals;
    uint32_t threads;
  };
  for (const Case& c : std::vector<Case>{{1, kE4M3, 0, "0x1.cp+8f, 0", 32},
                                         {16, kE5M2, 1, "0x1.cp+15f, 1", 32},
                                         {1024, kE4M3, 2, "0x1.cp+8f, 2", 256}}) {
    SCOPED_TRACE(absl::StrCat("L = ", c.history, ", ", DTypeName(c.format)));
    OneOp one = MakeOneOp(Opcode::kFp8ScaleUpdate, {{kF32, {c.history + 2}}, {kF32, {}}},
                          {{"fp8_format", Symbol{std::string(DTypeName(c.format))}}, {"margin", c.margin}});
    const std::vector<KernelSpec> kernels = LowerAndCompile(one.node);
    ASSERT_EQ(kernels.size(), 1u);
    EXPECT_EQ(kernels[0].grid[0], 1u);
    EXPECT_EQ(kernels[0].block[0], c.threads);
    EXPECT_TRUE(Contains(kernels[0], absl::StrCat("Fp8ScaleUpdate<", c.history + 2, "LL, ", c.threads,
                                                  ">(out, state, amax, ", c.literals, ")")))
        << kernels[0].source;
  }
}

}  // namespace
}  // namespace kiln
