// Lowering of the composite ops (codegen/lower_composite.cc) to the templates of kernels/:
// for every composite op, over shapes that take each geometry path (rows of length 1, odd
// lengths on the scalar path, multiples of the 16-byte width, 32000-wide LM-head rows) and
// every dtype the op allows, the lowering succeeds, its kernels follow the kernel_spec.h
// contract, fit the hardware, and compile with NVRTC for sm_90a. No GPU is needed; the
// numbers these kernels compute are checked on a GPU against the reference backend.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/kernel_source.h"
#include "codegen/lower_composite.h"
#include "codegen/nvrtc_compiler.h"
#include "gtest/gtest.h"
#include "ir/builder.h"

namespace kiln {
namespace {

constexpr DType kF32 = DType::kF32, kBF16 = DType::kBF16, kF16 = DType::kF16, kF8 = DType::kF8E4M3,
                kI32 = DType::kI32, kI64 = DType::kI64;

// A module whose function takes `operands` as parameters and applies `op` to them once; the
// node is named with dots so that kernel names must sanitize it.
struct OneOp {
  std::unique_ptr<Module> module;
  Node* node = nullptr;
};

// `results`: how many the node has (an op whose attributes set the count, such as
// add_rms_norm_grad_input's {copy_dtype}, says so here).
OneOp MakeOneOp(Opcode op, const std::vector<TensorType>& operands, AttrMap attrs = {},
                const TensorType* declared = nullptr, int results = 0) {
  if (results == 0) results = GetOpInfo(op).num_results;
  OneOp one{std::make_unique<Module>("m"), nullptr};
  Builder b(one.module->AddFunction("f"));
  std::vector<Node*> params;
  for (size_t i = 0; i < operands.size(); ++i) {
    absl::StatusOr<Node*> p = b.Parameter(absl::StrCat("p", i), operands[i]);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return one;
    params.push_back(*p);
  }
  if (results > 1) {  // the node itself, not its results
    std::vector<std::string> names;
    for (int i = 0; i < results; ++i) names.push_back(absl::StrCat("layers.0.out.", i));
    absl::StatusOr<std::vector<Node*>> results = b.MultiResultOp(op, params, std::move(attrs), std::move(names));
    EXPECT_TRUE(results.ok()) << results.status();
    if (results.ok()) one.node = (*results)[0]->operand(0);
    return one;
  }
  absl::StatusOr<Node*> node = b.Named("layers.0.out").Op(op, params, std::move(attrs), declared);
  EXPECT_TRUE(node.ok()) << node.status();
  if (node.ok()) one.node = *node;
  return one;
}

// The parameter list of `kernel`'s extern "C" function, split at commas.
std::vector<std::string> KernelParams(const KernelSpec& kernel) {
  const size_t open = kernel.source.find(kernel.name + "(");
  if (open == std::string::npos) return {};
  const size_t start = open + kernel.name.size() + 1;
  const std::string list = kernel.source.substr(start, kernel.source.find(')', start) - start);
  std::vector<std::string> params;
  size_t from = 0;
  for (size_t comma; (comma = list.find(',', from)) != std::string::npos; from = comma + 1) {
    params.push_back(list.substr(from, comma - from));
  }
  params.push_back(list.substr(from));
  return params;
}

// Lowers `node` and checks every kernel: the name, the signature contract, a launch that
// fits (whole warps, at most 1024 threads, a non-empty grid, static shared memory only),
// and an NVRTC compile for sm_90a. Returns the kernels for further checks.
std::vector<KernelSpec> LowerAndCompile(const Node* node, const CodegenOptions& options = {}) {
  if (node == nullptr) return {};
  absl::StatusOr<LoweredNode> lowered = LowerCompositeNode(*node, options);
  EXPECT_TRUE(lowered.ok()) << lowered.status();
  if (!lowered.ok()) return {};
  EXPECT_EQ(lowered->kind, LoweringKind::kKernels);
  for (const KernelSpec& kernel : lowered->kernels) {
    SCOPED_TRACE(kernel.name);
    EXPECT_EQ(kernel.name.rfind(codegen::KernelName(*node), 0), 0u);
    // Outputs, operands, and the scratch pointer last when the node asks for scratch.
    EXPECT_EQ(KernelParams(kernel).size(),
              static_cast<size_t>(node->num_results() + node->num_operands() + (lowered->scratch_bytes > 0 ? 1 : 0)))
        << kernel.source;
    EXPECT_EQ(kernel.block[0] % 32, 0u);
    EXPECT_LE(kernel.block[0] * kernel.block[1] * kernel.block[2], 1024u);
    EXPECT_GE(kernel.grid[0], 1u);
    EXPECT_LE(kernel.grid[0], 0x7fffffffu);
    EXPECT_EQ(kernel.grid[1] * kernel.grid[2], 1u);
    EXPECT_LE(kernel.shared_bytes, 48u * 1024);
    absl::StatusOr<CompiledKernel> compiled = CompileKernel(kernel, NvrtcOptions{});
    EXPECT_TRUE(compiled.ok()) << compiled.status();
    if (compiled.ok()) {
      EXPECT_EQ(compiled->name, kernel.name);
      EXPECT_FALSE(compiled->cubin.empty());
    }
  }
  return lowered->kernels;
}

AttrMap Eps() { return {{"eps", 1e-5}}; }

TEST(CompositeKernelsTest, RmsNormForward) {
  struct Shape {
    DType x, w;
    std::vector<int64_t> dims;
  };
  for (const Shape& s : std::vector<Shape>{{kBF16, kF32, {4, 768}},
                                           {kF32, kF32, {3, 1}},
                                           {kF32, kBF16, {2, 5, 33}},
                                           {kBF16, kBF16, {2, 8192}},
                                           {kF8, kF32, {16, 256}},
                                           {kF16, kF32, {2, 32000}}}) {
    SCOPED_TRACE((TensorType{s.x, s.dims}).ToString());
    OneOp one = MakeOneOp(Opcode::kRmsNorm, {{s.x, s.dims}, {s.w, {s.dims.back()}}}, Eps());
    EXPECT_EQ(LowerAndCompile(one.node).size(), 1u);
  }
}

TEST(CompositeKernelsTest, RmsNormGradInput) {
  struct Shape {
    DType x, w, dy;
    std::vector<int64_t> dims;
  };
  for (const Shape& s : std::vector<Shape>{{kBF16, kF32, kBF16, {4, 768}},
                                           {kF32, kF32, kF32, {3, 1}},
                                           {kF32, kF32, kBF16, {7, 33}},
                                           {kBF16, kBF16, kF32, {2, 8192}}}) {
    SCOPED_TRACE((TensorType{s.x, s.dims}).ToString());
    OneOp one = MakeOneOp(Opcode::kRmsNormGradInput, {{s.x, s.dims}, {s.w, {s.dims.back()}}, {s.dy, s.dims}}, Eps());
    EXPECT_EQ(LowerAndCompile(one.node).size(), 1u);
  }
}

TEST(CompositeKernelsTest, RmsNormGradWeight) {
  struct Shape {
    DType x, w, dy;
    std::vector<int64_t> dims;
  };
  for (const Shape& s : std::vector<Shape>{{kBF16, kF32, kBF16, {16384, 768}},
                                           {kF32, kF32, kF32, {3, 1}},
                                           {kF32, kBF16, kF32, {7, 33}},
                                           {kBF16, kF32, kBF16, {4, 8192}},
                                           {kF32, kF32, kF32, {0, 8}}}) {  // no rows: dw = 0
    SCOPED_TRACE((TensorType{s.x, s.dims}).ToString());
    OneOp one = MakeOneOp(Opcode::kRmsNormGradWeight, {{s.x, s.dims}, {s.w, {s.dims.back()}}, {s.dy, s.dims}}, Eps());
    EXPECT_EQ(LowerAndCompile(one.node).size(), 1u);
  }
}

// The input gradients {weight_grad=1}: two kernels (the row kernel summing dw's partial rows
// into the scratch, then the fold), over every row geometry (a warp per row with 16-byte
// accesses, one element, the scalar path, a block per row, no rows: dw = 0), the plain and
// residual forms, with and without the copy; the row kernel keeps the plain kernel's block
// (its dx is the same bits) in fewer blocks, and the scratch holds a partial row per block.
TEST(CompositeKernelsTest, InputGradientsWithTheWeightGradient) {
  struct Shape {
    DType x, w, dy;
    std::vector<int64_t> dims;
  };
  for (const Shape& s : std::vector<Shape>{{kF32, kF32, kF32, {4, 768}},
                                           {kF32, kF32, kBF16, {16384, 768}},
                                           {kF32, kF32, kF32, {3, 1}},
                                           {kF32, kBF16, kF32, {7, 33}},
                                           {kF32, kF32, kBF16, {2, 8192}},
                                           {kF32, kF32, kF32, {8192, 2048}},
                                           {kF32, kF32, kF32, {0, 8}}}) {
    SCOPED_TRACE((TensorType{s.dy, s.dims}).ToString());
    const int64_t d = s.dims.back();
    const TensorType x{s.x, s.dims}, w{s.w, {d}}, dy{s.dy, s.dims};
    AttrMap with_dw = Eps();
    with_dw.Set("weight_grad", int64_t{1});
    AttrMap with_copy = with_dw;
    with_copy.Set("copy_dtype", Symbol{"bf16"});
    OneOp plain = MakeOneOp(Opcode::kRmsNormGradInput, {x, w, dy}, Eps());
    OneOp merged = MakeOneOp(Opcode::kRmsNormGradInput, {x, w, dy}, with_dw, nullptr, 2);
    OneOp residual = MakeOneOp(Opcode::kAddRmsNormGradInput, {x, x, w, dy}, with_dw, nullptr, 2);
    OneOp copied = MakeOneOp(Opcode::kAddRmsNormGradInput, {x, x, w, dy}, with_copy, nullptr, 3);
    absl::StatusOr<LoweredNode> alone = LowerCompositeNode(*plain.node, {});
    ASSERT_TRUE(alone.ok()) << alone.status();
    for (const OneOp* one : {&merged, &residual, &copied}) {
      const std::vector<KernelSpec> kernels = LowerAndCompile(one->node);
      ASSERT_EQ(kernels.size(), 2u);
      absl::StatusOr<LoweredNode> lowered = LowerCompositeNode(*one->node, {});
      ASSERT_TRUE(lowered.ok()) << lowered.status();
      EXPECT_EQ(lowered->scratch_bytes, int64_t{kernels[0].grid[0]} * d * 4);
      EXPECT_LE(kernels[0].grid[0], 512u);
      if (!alone->kernels.empty()) {
        EXPECT_EQ(kernels[0].block[0], alone->kernels[0].block[0]);
        EXPECT_LE(kernels[0].grid[0], alone->kernels[0].grid[0]);
      }
      EXPECT_NE(kernels[0].source.find("RmsNormGradInputAndWeight<"), std::string::npos) << kernels[0].source;
      EXPECT_NE(kernels[1].source.find("RmsNormWeightGradFold<"), std::string::npos) << kernels[1].source;
      EXPECT_EQ(kernels[1].name, kernels[0].name + "_fold");
    }
  }
  // llama-S's rows: 2048 blocks of 8 rows for dx alone; 256 of 8 x 8 rows with dw, 768 KiB of
  // partials; the fold 24 blocks of 32 columns.
  OneOp s = MakeOneOp(Opcode::kRmsNormGradInput, {{kF32, {16384, 768}}, {kF32, {768}}, {kF32, {16384, 768}}},
                      AttrMap{{"eps", 1e-5}, {"weight_grad", int64_t{1}}}, nullptr, 2);
  absl::StatusOr<LoweredNode> lowered = LowerCompositeNode(*s.node, {});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->kernels[0].grid[0], 256u);
  EXPECT_EQ(lowered->kernels[0].block[0], 256u);
  EXPECT_EQ(lowered->kernels[1].grid[0], 24u);
  EXPECT_EQ(lowered->scratch_bytes, 256 * 768 * 4);
}

// layer_norm compiles under NVRTC for GPT-2's widths (768, 1024) and odd ones, any float dtypes.
TEST(CompositeKernelsTest, LayerNormForward) {
  struct Shape {
    DType x, w;
    std::vector<int64_t> dims;
  };
  for (const Shape& s : std::vector<Shape>{{kF32, kF32, {4, 768}},
                                           {kBF16, kF32, {2, 1024, 1024}},
                                           {kF32, kF32, {3, 1}},
                                           {kF32, kBF16, {2, 5, 33}},
                                           {kF16, kF32, {2, 8192}}}) {
    SCOPED_TRACE((TensorType{s.x, s.dims}).ToString());
    const int64_t d = s.dims.back();
    OneOp one = MakeOneOp(Opcode::kLayerNorm, {{s.x, s.dims}, {s.w, {d}}, {s.w, {d}}}, Eps());
    EXPECT_EQ(LowerAndCompile(one.node).size(), 1u);
  }
}

// layer_norm_grad_input and add_layer_norm_grad_input (fuse-residual-norm's fused layer_norm
// backward): one row kernel plain, with the residual gradient, with its bf16 copy; with
// {weight_grad=1} two kernels (the row kernel summing dw's and db's partial rows, the fold of
// 2 D columns), the row kernel in the plain kernel's block (dx the same bits), the scratch a
// partial row of 2 D floats per block. Every row geometry (a warp per row with 16-byte
// accesses, one element, the scalar path, a block per row, no rows) and dy f32 or bf16.
TEST(CompositeKernelsTest, LayerNormGradInput) {
  struct Shape {
    DType x, w, dy;
    std::vector<int64_t> dims;
  };
  for (const Shape& s : std::vector<Shape>{{kF32, kF32, kF32, {4, 768}},
                                           {kF32, kF32, kBF16, {16384, 768}},
                                           {kF32, kF32, kF32, {3, 1}},
                                           {kF32, kBF16, kF32, {7, 33}},
                                           {kF32, kF32, kBF16, {2, 8192}},
                                           {kF32, kF32, kF32, {0, 8}}}) {
    SCOPED_TRACE((TensorType{s.dy, s.dims}).ToString());
    const int64_t d = s.dims.back();
    const TensorType x{s.x, s.dims}, w{s.w, {d}}, dy{s.dy, s.dims};
    AttrMap copy = Eps();
    copy.Set("copy_dtype", Symbol{"bf16"});
    AttrMap with_dw = Eps();
    with_dw.Set("weight_grad", int64_t{1});
    AttrMap with_copy = with_dw;
    with_copy.Set("copy_dtype", Symbol{"bf16"});
    OneOp plain = MakeOneOp(Opcode::kLayerNormGradInput, {x, w, dy}, Eps());
    absl::StatusOr<LoweredNode> alone = LowerCompositeNode(*plain.node, {});
    ASSERT_TRUE(alone.ok()) << alone.status();
    if (s.dims[0] > 0) {
      for (const OneOp* one : {&plain}) {
        const std::vector<KernelSpec> kernels = LowerAndCompile(one->node);
        ASSERT_EQ(kernels.size(), 1u);
        EXPECT_NE(kernels[0].source.find("LayerNormGradInput<"), std::string::npos) << kernels[0].source;
      }
      EXPECT_EQ(LowerAndCompile(MakeOneOp(Opcode::kAddLayerNormGradInput, {x, x, w, dy}, Eps()).node).size(), 1u);
      const std::vector<KernelSpec> copied =
          LowerAndCompile(MakeOneOp(Opcode::kAddLayerNormGradInput, {x, x, w, dy}, copy, nullptr, 2).node);
      ASSERT_EQ(copied.size(), 1u);
      EXPECT_NE(copied[0].source.find("__nv_bfloat16* dx_copy"), std::string::npos) << copied[0].source;
    }
    OneOp merged = MakeOneOp(Opcode::kLayerNormGradInput, {x, w, dy}, with_dw, nullptr, 3);
    OneOp residual = MakeOneOp(Opcode::kAddLayerNormGradInput, {x, x, w, dy}, with_dw, nullptr, 3);
    OneOp all = MakeOneOp(Opcode::kAddLayerNormGradInput, {x, x, w, dy}, with_copy, nullptr, 4);
    for (const OneOp* one : {&merged, &residual, &all}) {
      const std::vector<KernelSpec> kernels = LowerAndCompile(one->node);
      ASSERT_EQ(kernels.size(), 2u);
      absl::StatusOr<LoweredNode> lowered = LowerCompositeNode(*one->node, {});
      ASSERT_TRUE(lowered.ok()) << lowered.status();
      EXPECT_EQ(lowered->scratch_bytes, int64_t{kernels[0].grid[0]} * 2 * d * 4);
      EXPECT_LE(kernels[0].grid[0], 512u);
      if (!alone->kernels.empty()) {
        EXPECT_EQ(kernels[0].block[0], alone->kernels[0].block[0]);
        EXPECT_LE(kernels[0].grid[0], alone->kernels[0].grid[0]);
      }
      EXPECT_NE(kernels[0].source.find("LayerNormGradInputAndWeight<"), std::string::npos) << kernels[0].source;
      EXPECT_NE(kernels[1].source.find("LayerNormWeightGradFold<"), std::string::npos) << kernels[1].source;
      EXPECT_EQ(kernels[1].name, kernels[0].name + "_fold");
      EXPECT_EQ(kernels[1].grid[0], static_cast<unsigned>((2 * d + 31) / 32));
    }
  }
  // gpt2-124M's rows: 2048 blocks of 8 rows for dx alone; 256 of 8 x 8 rows with dw and db,
  // 1.5 MiB of partials; the fold 48 blocks of 32 columns.
  OneOp s = MakeOneOp(Opcode::kAddLayerNormGradInput,
                      {{kF32, {16, 1024, 768}}, {kF32, {16, 1024, 768}}, {kF32, {768}}, {kF32, {16, 1024, 768}}},
                      AttrMap{{"eps", 1e-5}, {"copy_dtype", Symbol{"bf16"}}, {"weight_grad", int64_t{1}}}, nullptr, 4);
  absl::StatusOr<LoweredNode> lowered = LowerCompositeNode(*s.node, {});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->kernels[0].grid[0], 256u);
  EXPECT_EQ(lowered->kernels[0].block[0], 256u);
  EXPECT_EQ(lowered->kernels[1].grid[0], 48u);
  EXPECT_EQ(lowered->scratch_bytes, 256 * 2 * 768 * 4);
}

// fuse-residual-norm's ops: the residual forms of the norm kernels, over the same geometry
// paths (a warp per row with 16-byte accesses, one element, the scalar path, a block per
// row), with y f32 or bf16, and the residual gradient with and without its bf16 copy; and
// the norms written bf16.
TEST(CompositeKernelsTest, FusedResidualNorms) {
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{4, 768}, {3, 1}, {2, 5, 33}, {2, 8192}}) {
    SCOPED_TRACE((TensorType{kF32, dims}).ToString());
    const TensorType x{kF32, dims}, w{kF32, {dims.back()}};
    for (bool narrow : {false, true}) {
      AttrMap attrs = Eps();
      if (narrow) attrs.Set("out_dtype", Symbol{"bf16"});
      EXPECT_EQ(LowerAndCompile(MakeOneOp(Opcode::kAddRmsNorm, {x, x, w}, attrs).node).size(), 1u);
      EXPECT_EQ(LowerAndCompile(MakeOneOp(Opcode::kAddLayerNorm, {x, x, w, w}, attrs).node).size(), 1u);
      if (narrow) {
        EXPECT_EQ(LowerAndCompile(MakeOneOp(Opcode::kRmsNorm, {x, w}, attrs).node).size(), 1u);
        EXPECT_EQ(LowerAndCompile(MakeOneOp(Opcode::kLayerNorm, {x, w, w}, attrs).node).size(), 1u);
      }
    }
    EXPECT_EQ(LowerAndCompile(MakeOneOp(Opcode::kAddRmsNormGradInput, {x, x, w, x}, Eps()).node).size(), 1u);
    AttrMap copy = Eps();
    copy.Set("copy_dtype", Symbol{"bf16"});
    std::vector<KernelSpec> kernels =
        LowerAndCompile(MakeOneOp(Opcode::kAddRmsNormGradInput, {x, x, w, x}, copy, nullptr, 2).node);
    ASSERT_EQ(kernels.size(), 1u);
    EXPECT_NE(kernels[0].source.find("__nv_bfloat16* dx_copy"), std::string::npos) << kernels[0].source;
  }
}

TEST(CompositeKernelsTest, Softmax) {
  for (const TensorType& x : std::vector<TensorType>{{kF32, {4, 32000}},
                                                     {kBF16, {2, 3, 32000}},
                                                     {kF32, {2, 32001}},
                                                     {kF32, {5, 1}},
                                                     {kBF16, {3, 33}},
                                                     {kF16, {8, 128}}}) {
    SCOPED_TRACE(x.ToString());
    OneOp one = MakeOneOp(Opcode::kSoftmax, {x});
    EXPECT_EQ(LowerAndCompile(one.node).size(), 1u);
  }
}

TEST(CompositeKernelsTest, SoftmaxGrad) {
  for (const TensorType& y : std::vector<TensorType>{{kBF16, {4, 32000}}, {kF32, {5, 1}}, {kF32, {3, 33}}}) {
    SCOPED_TRACE(y.ToString());
    OneOp one = MakeOneOp(Opcode::kSoftmaxGrad, {y, y});
    EXPECT_EQ(LowerAndCompile(one.node).size(), 1u);
  }
}

TEST(CompositeKernelsTest, CrossEntropyAndGradient) {
  struct Shape {
    DType logits, labels;
    int64_t rows, classes;
  };
  for (const Shape& s : std::vector<Shape>{{kBF16, kI32, 8, 32000},
                                           {kBF16, kI32, 4, 50304},  // GPT-2's padded head, bf16 logits
                                           {kF32, kI32, 4, 50304},
                                           {kF32, kI64, 3, 32001},
                                           {kF32, kI32, 4, 1},
                                           {kF32, kI32, 2, 0}}) {  // no classes: every label is out of range
    SCOPED_TRACE((TensorType{s.logits, {s.rows, s.classes}}).ToString());
    const std::vector<TensorType> operands = {{s.logits, {s.rows, s.classes}}, {s.labels, {s.rows}}};
    OneOp loss = MakeOneOp(Opcode::kCrossEntropy, operands);
    if (s.classes == 0) {  // the gradient is empty
      EXPECT_EQ(LowerAndCompile(loss.node).size(), 1u);
      continue;
    }
    const std::vector<KernelSpec> forward = LowerAndCompile(loss.node);
    ASSERT_EQ(forward.size(), 1u);
    EXPECT_NE(forward[0].source.find("(float* loss, float* lse, "), std::string::npos) << forward[0].source;
    std::vector<TensorType> grad_operands = operands;
    grad_operands.push_back({kF32, {s.rows}});  // dloss
    grad_operands.push_back({kF32, {s.rows}});  // lse
    OneOp grad = MakeOneOp(Opcode::kCrossEntropyGrad, grad_operands);
    EXPECT_EQ(LowerAndCompile(grad.node).size(), 1u);
    // The gradient rounded to bf16 on store (narrow-activations-bf16's form), and an f32
    // gradient of bf16 logits, also with GPT-2's padded vocabulary.
    const DType other = s.logits == kBF16 ? kF32 : kBF16;
    for (int64_t classes : {s.classes, (s.classes + 1) / 2}) {
      OneOp narrow = MakeOneOp(Opcode::kCrossEntropyGrad, grad_operands,
                               {{"out_dtype", Symbol{std::string(DTypeName(other))}}, {"classes", classes}});
      ASSERT_NE(narrow.node, nullptr);
      EXPECT_EQ(narrow.node->type().dtype, other);
      const std::vector<KernelSpec> kernels = LowerAndCompile(narrow.node);
      ASSERT_EQ(kernels.size(), 1u);
      EXPECT_NE(kernels[0].source.find(other == kBF16 ? "__nv_bfloat16* out" : "float* out"), std::string::npos)
          << kernels[0].source;
      EXPECT_NE(kernels[0].source.find(s.logits == kBF16 ? "const __nv_bfloat16* logits" : "const float* logits"),
                std::string::npos)
          << kernels[0].source;
    }
  }
}

TEST(CompositeKernelsTest, Rope) {
  struct Shape {
    DType x;
    std::vector<int64_t> dims;
    int64_t inverse;
  };
  for (const Shape& s : std::vector<Shape>{{kBF16, {2, 16, 4, 64}, 0},
                                           {kF32, {1, 3, 2, 6}, 1},  // half of 3: the scalar path
                                           {kF16, {1, 1, 1, 2}, 0},
                                           {kF32, {2, 1024, 12, 128}, 1}}) {
    SCOPED_TRACE((TensorType{s.x, s.dims}).ToString());
    OneOp one = MakeOneOp(Opcode::kRope, {{s.x, s.dims}, {kI32, {s.dims[1]}}},
                          {{"theta", 10000.0}, {"inverse", s.inverse}});
    const std::vector<KernelSpec> kernels = LowerAndCompile(one.node);
    ASSERT_EQ(kernels.size(), 1u);
    // theta as an exact double literal; inverse as the template's flag.
    EXPECT_NE(kernels[0].source.find(s.inverse ? "true>(out, x, positions, 0x1.388p+13)"
                                               : "false>(out, x, positions, 0x1.388p+13)"),
              std::string::npos)
        << kernels[0].source;
  }
}

// One kernel writing all three results, on the scalar path (an odd size), 16-byte accesses,
// and a grid capped below one thread per chunk (the kernel strides); the betas' complements
// are exact f32 literals.
TEST(CompositeKernelsTest, AdamWUpdate) {
  const TensorType scalar{kF32, {}};
  for (int64_t n : {int64_t{7}, int64_t{4096}, int64_t{50'000'000}}) {
    {
      SCOPED_TRACE(absl::StrCat(n, " elements"));
      const TensorType state{kF32, {n}};
      OneOp one = MakeOneOp(Opcode::kAdamWUpdate, {state, state, state, state, scalar, scalar, scalar, scalar},
                            {{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}}, nullptr, /*results=*/3);
      const std::vector<KernelSpec> kernels = LowerAndCompile(one.node);
      ASSERT_EQ(kernels.size(), 1u);
      EXPECT_EQ(KernelParams(kernels[0])[0], "float* p_new");
      EXPECT_EQ(KernelParams(kernels[0])[2], " float* v_new");  // split at commas
      const int vec = n % 4 == 0 ? 4 : 1;
      EXPECT_NE(kernels[0].source.find(absl::StrCat(n, "LL, ", vec, ">(p_new, m_new, v_new, p, g, m, v, step_size, ",
                                                    "decay, sqrt_bc2, grad_scale, ",
                                                    "0x1.ccccccp-1f, 0x1.99999ap-4f, 0x1.e66666p-1f, 0x1.99999ap-5f")),
                std::string::npos)
          << kernels[0].source;
      const int64_t threads = static_cast<int64_t>(kernels[0].grid[0]) * kernels[0].block[0];
      if (n < 1000 * 1000) {
        EXPECT_GE(threads * vec, n) << "one pass covers a small tensor";
      } else {
        EXPECT_LT(threads * vec, n) << "a large tensor is strided over, not given a thread per chunk";
      }
    }
  }
}

// A grouped node (group-optimizer-updates'): one kernel for every group, blocks split among
// the groups by size (a group on the scalar path, 16-byte groups, one strided over), the
// slice table in constant memory, the pointers picked by a switch; it compiles without
// spills, and a node past the 4 KiB of kernel parameters is refused.
TEST(CompositeKernelsTest, GroupedAdamWUpdate) {
  const TensorType scalar{kF32, {}};
  const AttrMap attrs{{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}};
  auto grouped = [&](const std::vector<int64_t>& sizes) {
    std::vector<TensorType> operands;
    for (int64_t n : sizes) operands.insert(operands.end(), 4, TensorType{kF32, {n}});
    operands.insert(operands.end(), 4, scalar);
    return MakeOneOp(Opcode::kAdamWUpdate, operands, attrs, nullptr, 3 * static_cast<int>(sizes.size()));
  };
  const std::vector<int64_t> sizes = {7, 4096, 768, 50'000'000};
  OneOp one = grouped(sizes);
  const std::vector<KernelSpec> kernels = LowerAndCompile(one.node);
  ASSERT_EQ(kernels.size(), 1u);
  const std::string& src = kernels[0].source;
  std::printf("%s\n", src.c_str());
  EXPECT_EQ(KernelParams(kernels[0])[0], "float* p_new_0");
  EXPECT_EQ(KernelParams(kernels[0]).size(), 7 * sizes.size() + 4);
  EXPECT_NE(src.find("AdamWUpdateGroups<4>(kGroupSlices, "), std::string::npos) << src;
  EXPECT_NE(src.find("{7LL, 1, 0},"), std::string::npos) << src;  // the scalar path's group first, one block
  EXPECT_NE(src.find("{4096LL, 4, 1},"), std::string::npos) << src;
  EXPECT_NE(src.find("0x1.ccccccp-1f, 0x1.99999ap-4f, 0x1.e66666p-1f, 0x1.99999ap-5f"), std::string::npos) << src;
  EXPECT_NE(src.find(absl::StrCat("{0LL, 1, ", kernels[0].grid[0], "},")), std::string::npos)
      << "the last entry closes the grid: " << src;
  // The big group is strided over, at most the one-tensor kernel's grid in all.
  const CodegenOptions defaults;
  EXPECT_LE(kernels[0].grid[0], 16u * defaults.target.sm_count);
  absl::StatusOr<CompiledKernel> compiled = CompileKernel(kernels[0], NvrtcOptions{.ptxas_info = true});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  std::printf("grouped adamw_update (4 groups): %s\n", compiled->log.c_str());
  EXPECT_NE(compiled->log.find("0 bytes spill stores"), std::string::npos) << compiled->log;

  // 72 groups fill 4064 of the 4096 bytes; 73 do not fit.
  OneOp full = grouped(std::vector<int64_t>(72, 768));
  EXPECT_EQ(LowerAndCompile(full.node).size(), 1u);
  OneOp over = grouped(std::vector<int64_t>(73, 768));
  absl::StatusOr<LoweredNode> refused = LowerCompositeNode(*over.node, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("73 parameter groups take 4120 bytes of kernel parameters, over 4096"),
            std::string::npos)
      << refused.status();
}

TEST(CompositeKernelsTest, Gather) {
  struct Shape {
    TensorType table, indices;
  };
  for (const Shape& s : std::vector<Shape>{{{kF32, {100, 768}}, {kI32, {4, 5}}},    // 16-byte units
                                           {{kBF16, {10, 3}}, {kI64, {7}}},        // 6-byte rows: 2-byte units
                                           {{kI32, {5}}, {kI32, {3}}},             // scalar rows
                                           {{DType::kPred, {4, 3}}, {kI32, {2}}},  // 1-byte units
                                           {{kF32, {32000, 1}}, {kI32, {16}}}}) {
    SCOPED_TRACE(s.table.ToString());
    OneOp one = MakeOneOp(Opcode::kGather, {s.table, s.indices});
    EXPECT_EQ(LowerAndCompile(one.node).size(), 1u);
  }
}

TEST(CompositeKernelsTest, ScatterAddZeroFillsFirst) {
  struct Shape {
    TensorType indices, updates, result;
    size_t kernels;
  };
  for (const Shape& s : std::vector<Shape>{{{kI32, {4, 5}}, {kF32, {4, 5, 768}}, {kF32, {100, 768}}, 2},
                                           {{kI64, {6}}, {kF32, {6, 3}}, {kF32, {10, 3}}, 2},  // float atomics
                                           {{kI32, {0}}, {kF32, {0, 4}}, {kF32, {5, 4}}, 1}}) {  // zeros only
    SCOPED_TRACE(s.result.ToString());
    OneOp one = MakeOneOp(Opcode::kScatterAdd, {s.indices, s.updates}, {}, &s.result);
    const std::vector<KernelSpec> kernels = LowerAndCompile(one.node);
    ASSERT_EQ(kernels.size(), s.kernels);
    EXPECT_EQ(kernels[0].name, codegen::KernelName(*one.node) + "_zero_fill");
    EXPECT_NE(kernels[0].source.find("ZeroFill<"), std::string::npos);
    if (kernels.size() == 2) {
      EXPECT_NE(kernels[1].source.find("ScatterAdd<"), std::string::npos);
    }
  }
}

// The geometry policy of the composite lowerings (codegen/composite_wrapper.h, lower_rms_norm.cc),
// on the shapes the reference models use.
TEST(CompositeKernelsTest, RowGeometry) {
  // 768 bf16: 96 chunks of 8, a warp per row, 8 rows per 256-thread block.
  OneOp norm = MakeOneOp(Opcode::kRmsNorm, {{kBF16, {4096, 768}}, {kF32, {768}}}, Eps());
  absl::StatusOr<LoweredNode> lowered = LowerCompositeNode(*norm.node, {});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->kernels[0].block[0], 256u);
  EXPECT_EQ(lowered->kernels[0].grid[0], 512u);

  // A 32000-wide LM-head row: one 1024-thread block per row, 32 floats a thread.
  OneOp softmax = MakeOneOp(Opcode::kSoftmax, {{kF32, {6, 32000}}});
  lowered = LowerCompositeNode(*softmax.node, {});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->kernels[0].block[0], 1024u);
  EXPECT_EQ(lowered->kernels[0].grid[0], 6u);

  // Fewer rows than a block holds: the block shrinks to the rows there are.
  OneOp tiny = MakeOneOp(Opcode::kSoftmax, {{kF32, {5, 1}}});
  lowered = LowerCompositeNode(*tiny.node, {});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->kernels[0].block[0], 5u * 32);
  EXPECT_EQ(lowered->kernels[0].grid[0], 1u);

  // The weight gradient: at most 256 partial blocks, each 64 of the 16384 rows.
  OneOp dw = MakeOneOp(Opcode::kRmsNormGradWeight, {{kBF16, {16384, 768}}, {kF32, {768}}, {kBF16, {16384, 768}}},
                       Eps());
  lowered = LowerCompositeNode(*dw.node, {});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->kernels[0].grid[0], 256u);
  EXPECT_EQ(lowered->kernels[0].block[0], 256u);
  EXPECT_NE(lowered->kernels[0].source.find("g_partials[196608]"), std::string::npos);
}

TEST(CompositeKernelsTest, SourcesAreDeterministic) {
  OneOp a = MakeOneOp(Opcode::kCrossEntropyGrad, {{kBF16, {8, 32000}}, {kI32, {8}}, {kF32, {8}}, {kF32, {8}}});
  OneOp b = MakeOneOp(Opcode::kCrossEntropyGrad, {{kBF16, {8, 32000}}, {kI32, {8}}, {kF32, {8}}, {kF32, {8}}});
  absl::StatusOr<LoweredNode> la = LowerCompositeNode(*a.node, {});
  absl::StatusOr<LoweredNode> lb = LowerCompositeNode(*b.node, {});
  ASSERT_TRUE(la.ok() && lb.ok());
  ASSERT_EQ(la->kernels.size(), 1u);
  EXPECT_EQ(la->kernels[0].source, lb->kernels[0].source);
  EXPECT_EQ(la->kernels[0].name, "k_layers_0_out_cross_entropy_grad");
}

TEST(CompositeKernelsTest, AttributesAreExactLiterals) {
  OneOp usual = MakeOneOp(Opcode::kRmsNormGradInput, {{kF32, {2, 8}}, {kF32, {8}}, {kF32, {2, 8}}}, Eps());
  absl::StatusOr<LoweredNode> grad = LowerCompositeNode(*usual.node, {});
  ASSERT_TRUE(grad.ok()) << grad.status();
  EXPECT_NE(grad->kernels[0].source.find("(out, x, w, dy, 0x1.4f8b58p-17f)"), std::string::npos)  // (float)1e-5
      << grad->kernels[0].source;

  OneOp norm = MakeOneOp(Opcode::kRmsNorm, {{kF32, {2, 8}}, {kF32, {8}}}, {{"eps", 0.0}});
  absl::StatusOr<LoweredNode> lowered = LowerCompositeNode(*norm.node, {});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_NE(lowered->kernels[0].source.find("0x0p+0f)"), std::string::npos) << lowered->kernels[0].source;
  EXPECT_EQ(LowerAndCompile(norm.node).size(), 1u);  // eps = 0 is valid C++ too
}

TEST(CompositeKernelsTest, ScatterAddOfNonF32IsAClearError) {
  const TensorType result{kBF16, {10, 4}};
  OneOp one = MakeOneOp(Opcode::kScatterAdd, {{kI32, {3}}, {kBF16, {3, 4}}}, {}, &result);
  absl::StatusOr<LoweredNode> lowered = LowerCompositeNode(*one.node, {});
  ASSERT_FALSE(lowered.ok());
  EXPECT_EQ(lowered.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(lowered.status().message().find("%layers.0.out"), absl::string_view::npos) << lowered.status();
  EXPECT_NE(lowered.status().message().find("f32"), absl::string_view::npos) << lowered.status();
  EXPECT_NE(lowered.status().message().find("bf16[10,4]"), absl::string_view::npos) << lowered.status();
}

TEST(CompositeKernelsTest, BadOptionsAndOpsAreErrors) {
  OneOp softmax = MakeOneOp(Opcode::kSoftmax, {{kF32, {4, 8}}});
  CodegenOptions odd;
  odd.threads_per_block = 100;
  absl::StatusOr<LoweredNode> lowered = LowerCompositeNode(*softmax.node, odd);
  ASSERT_FALSE(lowered.ok());
  EXPECT_NE(lowered.status().message().find("threads_per_block 100"), absl::string_view::npos) << lowered.status();

  OneOp add = MakeOneOp(Opcode::kAdd, {{kF32, {4}}, {kF32, {4}}});
  lowered = LowerCompositeNode(*add.node, {});
  ASSERT_FALSE(lowered.ok());
  EXPECT_NE(lowered.status().message().find("not a composite op"), absl::string_view::npos) << lowered.status();

  OneOp norm = MakeOneOp(Opcode::kRmsNorm, {{kF32, {2, 8}}, {kF32, {8}}}, {{"eps", INFINITY}});
  lowered = LowerCompositeNode(*norm.node, {});
  ASSERT_FALSE(lowered.ok());
  EXPECT_NE(lowered.status().message().find("must be finite"), absl::string_view::npos) << lowered.status();
}

TEST(CompositeKernelsTest, EmptyOutputsNeedNoKernels) {
  OneOp softmax = MakeOneOp(Opcode::kSoftmax, {{kF32, {0, 8}}});
  absl::StatusOr<LoweredNode> lowered = LowerCompositeNode(*softmax.node, {});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->kind, LoweringKind::kKernels);
  EXPECT_TRUE(lowered->kernels.empty());
}

}  // namespace
}  // namespace kiln
