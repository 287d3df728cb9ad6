// narrow-activations-bf16 (passes/narrow_activations.h): a gemm whose f32 result is read only
// by converts to bf16 writes bf16 itself. IR text in, FileCheck on the print, meaning checked
// on the reference backend (tests/testing/pass_test.h); the gemm's rounding rule that makes it
// exact; and the count on llama-tiny's training step.
#include "passes/narrow_activations.h"

#include <cmath>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "codegen/capabilities.h"
#include "frontends/llama.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"
#include "passes/training_compile.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/models.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

std::string Narrow(absl::string_view body, bool expect_change = true) {
  NarrowActivationsPass pass;
  return testing::RunPassOnText(pass, absl::StrCat("module @m\nfunc @main {\n", body, "}\n"), expect_change);
}

#define EXPECT_CHECKS(out, checks) EXPECT_TRUE(testing::FileCheck(out, checks).ok()) << testing::FileCheck(out, checks)

constexpr absl::string_view kGemmAttrs =
    "{a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=16, n=64}";

TEST(NarrowActivations, HeaderExample) {
  std::string out = Narrow(absl::StrCat(R"(
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[64,32]
  %y = gemm(%x, %w) )", kGemmAttrs, R"( : f32[16,64]
  %yb = convert(%y) : bf16[16,64]
  %z = mul(%yb, %yb) : bf16[16,64]
  return %z
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %y = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=16, n=64} : bf16[16,64]
    CHECK-NEXT: %z = mul(%y, %y) : bf16[16,64]
    CHECK-NOT:  convert
  )");
}

// A bias that is a bf16 vector widened to f32 (autocast's bf16 bias copy, GPT-2's qkv and
// MLP projections): the narrowed gemm reads the bf16 vector, the widening goes. A bias that
// is f32 in its own right keeps the gemm f32 (a bf16 D takes only a bf16 bias).
TEST(NarrowActivations, ABiasThatIsAWidenedBf16VectorComesAlong) {
  constexpr absl::string_view kBiasAttrs =
      "{a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=bias, k=32, m=16, n=64}";
  std::string out = Narrow(absl::StrCat(R"(
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[64,32]
  %b = parameter() {index=2} : f32[64]
  %b16 = convert(%b) : bf16[64]
  %b32 = convert(%b16) : f32[64]
  %y = gemm(%x, %w, %b32) )", kBiasAttrs, R"( : f32[16,64]
  %yb = convert(%y) : bf16[16,64]
  return %yb
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %b16 = convert(%b) : bf16[64]
    CHECK-NEXT: %y = gemm(%x, %w, %b16) {{.*}}epilogue=bias{{.*}} : bf16[16,64]
    CHECK-NEXT: return %y
  )");
  Narrow(absl::StrCat(R"(
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[64,32]
  %b = parameter() {index=2} : f32[64]
  %y = gemm(%x, %w, %b) )", kBiasAttrs, R"( : f32[16,64]
  %yb = convert(%y) : bf16[16,64]
  return %yb
)"), /*expect_change=*/false);
}

// Every convert of the result goes (cse may not have merged them yet), whatever shape the
// result has.
TEST(NarrowActivations, EveryConvertIsReplaced) {
  std::string out = Narrow(absl::StrCat(R"(
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[64,32]
  %y = gemm(%x, %w) )", kGemmAttrs, R"( : f32[2,8,64]
  %a = convert(%y) : bf16[2,8,64]
  %b = convert(%y) : bf16[2,8,64]
  return %a, %b
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %y = gemm(%x, %w) {{.*}} : bf16[2,8,64]
    CHECK-NEXT: return %y, %y
  )");
}

// Reshapes and transposes between the gemm and its converts move values: they are retyped
// bf16 with it (the V projection on its way to attention).
TEST(NarrowActivations, SeesThroughReshapesAndTransposes) {
  std::string out = Narrow(absl::StrCat(R"(
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[64,32]
  %y = gemm(%x, %w) )", kGemmAttrs, R"( : f32[16,64]
  %r = reshape(%y) : f32[2,8,4,16]
  %t = transpose(%r) {perm=[0,2,1,3]} : f32[2,4,8,16]
  %tb = convert(%t) : bf16[2,4,8,16]
  %rb = convert(%r) : bf16[2,8,4,16]
  return %tb, %rb
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %y = gemm(%x, %w) {{.*}} : bf16[16,64]
    CHECK-NEXT: %r = reshape(%y) : bf16[2,8,4,16]
    CHECK-NEXT: %t = transpose(%r) {perm=[0,2,1,3]} : bf16[2,4,8,16]
    CHECK-NEXT: return %t, %r
  )");
  // One f32 reader past the transpose keeps the whole chain f32.
  std::string kept = Narrow(absl::StrCat(R"(
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[64,32]
  %y = gemm(%x, %w) )", kGemmAttrs, R"( : f32[16,64]
  %t = transpose(%y) {perm=[1,0]} : f32[64,16]
  %tb = convert(%t) : bf16[64,16]
  %n = neg(%t) : f32[64,16]
  return %tb, %n
)"), /*expect_change=*/false);
  EXPECT_CHECKS(kept, "CHECK: %y = gemm(%x, %w) {{.*}} : f32[16,64]");
}

// Left alone: another reader of the f32 value, a function output, a convert to another
// dtype, a gemm that accumulates into an f32 C, f32 operands (cuBLASLt writes f32 or the
// operands' dtype).
TEST(NarrowActivations, OnlyWhenEveryUseRoundsToBf16) {
  const std::string gemm = absl::StrCat("gemm(%x, %w) ", kGemmAttrs, " : f32[16,64]");
  const std::string params = R"(
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[64,32]
)";
  for (const std::string& body : {
           absl::StrCat(params, "  %y = ", gemm, "\n  %yb = convert(%y) : bf16[16,64]\n  %n = neg(%y) : f32[16,64]\n",
                        "  return %yb, %n\n"),
           absl::StrCat(params, "  %y = ", gemm, "\n  %yb = convert(%y) : bf16[16,64]\n  return %yb, %y\n"),
           absl::StrCat(params, "  %y = ", gemm, "\n  %yh = convert(%y) : f16[16,64]\n  return %yh\n"),
           absl::StrCat(params, "  %c = parameter() {index=2} : f32[16,64]\n",
                        "  %y = gemm(%x, %w, %c) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=1.0, "
                        "epilogue=none, k=32, m=16, n=64} : f32[16,64]\n",
                        "  %yb = convert(%y) : bf16[16,64]\n  return %yb\n"),
           std::string(R"(
  %x = parameter() {index=0} : f32[16,32]
  %w = parameter() {index=1} : f32[64,32]
  %y = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=16, n=64} : f32[16,64]
  %yb = convert(%y) : bf16[16,64]
  return %yb
)"),
       }) {
    std::string out = Narrow(body, /*expect_change=*/false);
    EXPECT_NE(out.find(": f32[16,64]"), std::string::npos) << body << out;
  }
}

constexpr absl::string_view kCrossEntropyParams = R"(
  %logits = parameter() {index=0} : f32[16,64]
  %labels = parameter() {index=1} : i32[16]
  %dloss = parameter() {index=2} : f32[16]
  %lse = parameter() {index=3} : f32[16]
)";

// The header's second example: the loss gradient that only feeds the LM head's backward
// GEMMs, through the reshape back to [B, T, V], is rounded to bf16 by its own kernel.
TEST(NarrowActivations, CrossEntropyGradWritesBf16) {
  std::string out = Narrow(absl::StrCat(kCrossEntropyParams, R"(
  %g = cross_entropy_grad(%logits, %labels, %dloss, %lse) {classes=50} : f32[16,64]
  %r = reshape(%g) : f32[2,8,64]
  %rb = convert(%r) : bf16[2,8,64]
  %gb = convert(%g) : bf16[16,64]
  return %rb, %gb
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %g = cross_entropy_grad(%logits, %labels, %dloss, %lse) {classes=50, out_dtype=bf16} : bf16[16,64]
    CHECK-NEXT: %r = reshape(%g) : bf16[2,8,64]
    CHECK-NEXT: return %r, %g
  )");
}

// Left alone: an f32 reader of the gradient, a function output, a convert to f16, bf16
// logits (whose gradient is bf16 already) and a gradient that already has out_dtype.
TEST(NarrowActivations, CrossEntropyGradOnlyWhenEveryUseRoundsToBf16) {
  const std::string grad = "  %g = cross_entropy_grad(%logits, %labels, %dloss, %lse) : f32[16,64]\n";
  for (const std::string& body : {
           absl::StrCat(kCrossEntropyParams, grad, "  %gb = convert(%g) : bf16[16,64]\n  %n = neg(%g) : f32[16,64]\n",
                        "  return %gb, %n\n"),
           absl::StrCat(kCrossEntropyParams, grad, "  %gb = convert(%g) : bf16[16,64]\n  return %gb, %g\n"),
           absl::StrCat(kCrossEntropyParams, grad, "  %gh = convert(%g) : f16[16,64]\n  return %gh\n"),
           absl::StrCat(kCrossEntropyParams,
                        "  %lb = convert(%logits) : bf16[16,64]\n"
                        "  %g = cross_entropy_grad(%lb, %labels, %dloss, %lse) : bf16[16,64]\n"
                        "  %gf = convert(%g) : f32[16,64]\n  %gb = convert(%gf) : bf16[16,64]\n  return %gb\n"),
           absl::StrCat(kCrossEntropyParams,
                        "  %g = cross_entropy_grad(%logits, %labels, %dloss, %lse) {out_dtype=f32} : f32[16,64]\n"
                        "  %gb = convert(%g) : bf16[16,64]\n  return %gb\n"),
       }) {
    std::string out = Narrow(body, /*expect_change=*/false);
    EXPECT_EQ(out.find("out_dtype=bf16"), std::string::npos) << body << out;
    EXPECT_NE(out.find("convert("), std::string::npos) << body << out;
  }
}

// The decode step's attention output, read only as the o projection's bf16 operand (through
// the reshape that joins its heads), is written bf16 by paged_attention {out_dtype=bf16}; an
// f32 reader keeps it f32.
TEST(NarrowActivations, PagedAttentionWritesBf16) {
  constexpr absl::string_view kParams = R"(
  %q = parameter() {index=0} : bf16[2,1,4,8]
  %pool = parameter() {index=1} : bf16[1,4,2,2,8]
  %tables = parameter() {index=2} : i32[2,2]
  %positions = parameter() {index=3} : i32[2,1]
  %o = paged_attention(%q, %pool, %pool, %tables, %positions) {layer=0, scale=0.35} : f32[2,1,4,8]
  %flat = reshape(%o) : f32[2,1,32]
)";
  std::string out = Narrow(absl::StrCat(kParams, "  %ob = convert(%flat) : bf16[2,1,32]\n  return %ob\n"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %o = paged_attention(%q, %pool, %pool, %tables, %positions) {layer=0, out_dtype=bf16, scale=0.35} : bf16[2,1,4,8]
    CHECK-NEXT: %flat = reshape(%o) : bf16[2,1,32]
    CHECK-NEXT: return %flat
  )");
  std::string kept = Narrow(absl::StrCat(kParams, "  %ob = convert(%flat) : bf16[2,1,32]\n",
                                         "  %n = neg(%flat) : f32[2,1,32]\n  return %ob, %n\n"),
                            /*expect_change=*/false);
  EXPECT_EQ(kept.find("out_dtype"), std::string::npos) << kept;
}

// The flash attention of a training step: O feeds the o projection as bf16 (through the
// transpose and reshape that join the heads) and attention_delta, which rounds O to bf16
// itself, so attention stores O bf16 ({out_dtype=bf16}), the movers are retyped, the convert
// goes and attention_delta reads the bf16 O. The LSE, attention's second result, stays f32.
// The meaning check (RunPassOnText) compares every output bit for bit, Delta and the
// gradients included.
constexpr absl::string_view kAttentionParams = R"(
  %q = parameter() {index=0} : bf16[1,2,16,8]
  %k = parameter() {index=1} : bf16[1,1,16,8]
  %v = parameter() {index=2} : bf16[1,1,16,8]
  %dout = parameter() {index=3} : bf16[1,2,16,8]
  %o, %o.lse = attention(%q, %k, %v) {scale=0.35} : (f32[1,2,16,8], f32[1,2,16])
)";
constexpr absl::string_view kAttentionBackward = R"(
  %delta = attention_delta(%o, %dout) : f32[1,2,16]
  %dq, %dk, %dv = attention_grad(%q, %k, %v, %dout, %o.lse, %delta) {scale=0.35} : (f32[1,2,16,8], f32[1,1,16,8], f32[1,1,16,8])
)";

TEST(NarrowActivations, AttentionWritesBf16) {
  std::string out = Narrow(absl::StrCat(kAttentionParams, R"(
  %t = transpose(%o) {perm=[0,2,1,3]} : f32[1,16,2,8]
  %r = reshape(%t) : f32[1,16,16]
  %rb = convert(%r) : bf16[1,16,16]
)", kAttentionBackward, "  return %rb, %delta, %dq, %dk, %dv\n"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %o, %o.lse = attention(%q, %k, %v) {out_dtype=bf16, scale=0.35} : (bf16[1,2,16,8], f32[1,2,16])
    CHECK-NEXT: %t = transpose(%o) {perm=[0,2,1,3]} : bf16[1,16,2,8]
    CHECK-NEXT: %r = reshape(%t) : bf16[1,16,16]
    CHECK-NEXT: %delta = attention_delta(%o, %dout) : f32[1,2,16]
    CHECK-NOT:  convert
    CHECK:      return %r, %delta, %dq, %dk, %dv
  )");
  // attention_delta alone (an O no forward reader keeps) narrows too: Delta rounds O itself.
  std::string delta_only = Narrow(absl::StrCat(kAttentionParams, kAttentionBackward, "  return %delta, %dq\n"));
  EXPECT_CHECKS(delta_only, "CHECK: attention(%q, %k, %v) {out_dtype=bf16, scale=0.35} : (bf16[1,2,16,8], f32[1,2,16])");
}

// Left alone: an f32 reader of O (even past the movers), O a function output, a convert to
// f16, and an attention that already has out_dtype.
TEST(NarrowActivations, AttentionOnlyWhenEveryUseRoundsToBf16) {
  for (const std::string& body : {
           absl::StrCat(kAttentionParams, "  %ob = convert(%o) : bf16[1,2,16,8]\n  %n = neg(%o) : f32[1,2,16,8]\n",
                        kAttentionBackward, "  return %ob, %n, %dq\n"),
           absl::StrCat(kAttentionParams, "  %t = transpose(%o) {perm=[0,2,1,3]} : f32[1,16,2,8]\n",
                        "  %tb = convert(%t) : bf16[1,16,2,8]\n  %n = neg(%t) : f32[1,16,2,8]\n",
                        kAttentionBackward, "  return %tb, %n, %dq\n"),
           absl::StrCat(kAttentionParams, kAttentionBackward, "  return %o, %dq\n"),
           absl::StrCat(kAttentionParams, "  %oh = convert(%o) : f16[1,2,16,8]\n", kAttentionBackward,
                        "  return %oh, %dq\n"),
       }) {
    std::string out = Narrow(body, /*expect_change=*/false);
    EXPECT_EQ(out.find("out_dtype"), std::string::npos) << body << out;
    EXPECT_NE(out.find("(f32[1,2,16,8], f32[1,2,16])"), std::string::npos) << body << out;
  }
  Narrow(R"(
  %q = parameter() {index=0} : bf16[1,2,16,8]
  %k = parameter() {index=1} : bf16[1,1,16,8]
  %o, %o.lse = attention(%q, %k, %k) {out_dtype=bf16, scale=0.35} : (bf16[1,2,16,8], f32[1,2,16])
  %of = convert(%o) : f32[1,2,16,8]
  %ob = convert(%of) : bf16[1,2,16,8]
  return %ob
)", /*expect_change=*/false);
}

// The rule that makes the pass exact (ir/op_table.h): a bf16 gemm result is the f32
// accumulator rounded to bf16, not the exact sum rounded once. A = [1, 2^-8, 2^-33],
// B = [1, 1, 1]: the sum 1 + 2^-8 + 2^-33 is just above the halfway point between bf16's 1
// and 1 + 2^-7, so rounding it once would give 1 + 2^-7; in f32 it is 1 + 2^-8 exactly, a
// tie, which bf16 rounds to even: 1. cuBLASLt (f32 compute, bf16 D) gives 1.
TEST(NarrowActivations, ABf16GemmResultIsTheF32ResultRounded) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @main {
  %a = parameter() {index=0} : bf16[1,3]
  %b = parameter() {index=1} : bf16[1,3]
  %wide = gemm(%a, %b) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=3, m=1, n=1} : f32[1,1]
  %via_f32 = convert(%wide) : bf16[1,1]
  %direct = gemm(%a, %b) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=3, m=1, n=1} : bf16[1,1]
  return %wide, %via_f32, %direct
})");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<HostTensor> args = {
      HostTensor::FromValues({DType::kBF16, {1, 3}}, {1, std::ldexp(1.0, -8), std::ldexp(1.0, -33)}),
      HostTensor::FromValues({DType::kBF16, {1, 3}}, {1, 1, 1})};
  absl::StatusOr<std::vector<HostTensor>> out = EvaluateFunction(*(*m)->functions()[0], args);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].values()[0], 1 + std::ldexp(1.0, -8));
  EXPECT_EQ((*out)[1].values()[0], 1.0);
  EXPECT_EQ((*out)[2].values()[0], 1.0);
}

// llama's training step at batch 1 and `seq_len` tokens, compiled as kiln train does with
// `options`, and with narrow-activations-bf16 disabled too unless `narrow`.
std::unique_ptr<Module> CompileLlamaStep(const ModelConfig& c, int64_t seq_len, CompileOptions options, bool narrow) {
  std::unique_ptr<Module> m = *BuildLlamaModule(c, {.batch = 1, .seq_len = seq_len, .precision = Precision::kBf16});
  if (!narrow) options.disabled_passes.push_back(std::string(NarrowActivationsPass::kName));
  absl::StatusOr<TrainingCompile> tc = TrainingCompile::Create({}, options);
  EXPECT_TRUE(tc.ok()) << tc.status();
  absl::Status run = tc->Run(*m);
  EXPECT_TRUE(run.ok()) << run;
  return m;
}

struct StepCounts {
  int64_t converts = 0;    // fusion bodies included
  int64_t fusions = 0;     // generated kernels
  int64_t bf16_gemms = 0;  // gemms that write bf16
  int64_t f32_gemms = 0;
  int64_t bf16_loss_grads = 0;  // cross_entropy_grad {out_dtype=bf16}
};

void CountInto(const Function& f, StepCounts& c) {
  for (const auto& n : f.nodes()) {
    c.converts += n->opcode() == Opcode::kConvert;
    c.fusions += n->opcode() == Opcode::kFusion;
    if (n->opcode() == Opcode::kGemm) (n->type().dtype == DType::kBF16 ? c.bf16_gemms : c.f32_gemms)++;
    c.bf16_loss_grads += n->opcode() == Opcode::kCrossEntropyGrad && n->type().dtype == DType::kBF16;
    if (n->body() != nullptr) CountInto(*n->body(), c);
  }
}

StepCounts CountStep(const Function& f) {
  StepCounts c;
  CountInto(f, c);
  return c;
}

// llama-tiny's training step through the training compile, with and without the pass: the
// GEMMs whose results feed only bf16 converts write bf16 (the projections whose outputs are
// the next GEMM's operands), so does the loss gradient that feeds the LM head's backward
// GEMMs, the step computes the same values, and nothing is left for the pass.
TEST(NarrowActivations, LlamaTinyTrainingStep) {
  const ModelConfig c = *PresetConfig("llama-tiny");
  auto compile = [&](bool narrow) { return CompileLlamaStep(c, 16, CompileOptions{}, narrow); };
  std::unique_ptr<Module> before = compile(false);
  std::unique_ptr<Module> after = compile(true);
  const StepCounts b = CountStep(*before->FindFunction("train_step"));
  const StepCounts a = CountStep(*after->FindFunction("train_step"));
  std::printf("llama-tiny step: converts %lld -> %lld, fusions %lld -> %lld, bf16 gemms %lld -> %lld (of %lld)\n",
              static_cast<long long>(b.converts), static_cast<long long>(a.converts),
              static_cast<long long>(b.fusions), static_cast<long long>(a.fusions),
              static_cast<long long>(b.bf16_gemms), static_cast<long long>(a.bf16_gemms),
              static_cast<long long>(a.bf16_gemms + a.f32_gemms));
  // Before the pass, the bf16 gemms are the frontend's (the activation projections, bf16 by
  // the policy); the pass narrows the f32 ones whose results only feed converts.
  EXPECT_GT(a.bf16_gemms, b.bf16_gemms);
  EXPECT_EQ(a.bf16_gemms + a.f32_gemms, b.bf16_gemms + b.f32_gemms);
  // The loss gradient is bf16 before the pass: the policy's logits are bf16, so is their
  // gradient (cross_entropy_grad of bf16 logits), which the pass leaves alone.
  EXPECT_EQ(b.bf16_loss_grads, 1);
  EXPECT_EQ(a.bf16_loss_grads, 1);
  // One convert per narrowed gemm (after cse).
  EXPECT_EQ(a.converts, b.converts - (a.bf16_gemms - b.bf16_gemms));
  // Nothing left for the pass: running it again changes nothing.
  NarrowActivationsPass again;
  absl::StatusOr<bool> changed = again.Run(*after);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  absl::Status same = CheckMeaningPreserved(*before, *after);
  EXPECT_TRUE(same.ok()) << same;
}

// llama's training step with flash attention (head dim 64, 64 tokens: shapes the kernels
// take), as `kiln train` compiles it but for fuse-loops, with and without the pass: every layer's attention
// stores O bf16, read by the o projection's movers and by attention_delta and by no convert,
// and the step computes the same values, bit for bit.
TEST(NarrowActivations, FlashLlamaTrainingStepStoresAttentionOutputBf16) {
  const ModelConfig c = testing::FlashTinyConfig();
  CompileOptions options;
  options.capabilities = &CodegenCapabilities();
  // Without fuse-loops, whose fusions would hide O's movers (and converts) in their bodies.
  options.disabled_passes = {"fuse-loops"};
  auto compile = [&](bool narrow) { return CompileLlamaStep(c, c.seq_len, options, narrow); };
  std::unique_ptr<Module> before = compile(false);
  std::unique_ptr<Module> after = compile(true);
  auto attentions = [](const Module& m) {
    std::vector<const Node*> out;
    for (const auto& n : m.FindFunction("train_step")->nodes()) {
      if (n->opcode() == Opcode::kAttention) out.push_back(n.get());
    }
    return out;
  };
  ASSERT_EQ(attentions(*before).size(), static_cast<size_t>(c.n_layers));
  for (const Node* a : attentions(*before)) EXPECT_EQ(a->result_type(0).dtype, DType::kF32);
  ASSERT_EQ(attentions(*after).size(), static_cast<size_t>(c.n_layers));
  for (const Node* a : attentions(*after)) {
    EXPECT_EQ(a->result_type(0).dtype, DType::kBF16) << a->name();
    EXPECT_EQ(a->result_type(1).dtype, DType::kF32) << a->name();
    EXPECT_TRUE(a->attrs().Has("out_dtype")) << a->name();
    // O's readers: the movers on the way to the o projection, each bf16 and read by no
    // convert, and attention_delta.
    int deltas = 0;
    std::vector<const Node*> pending = {a->result(0)};
    while (!pending.empty()) {
      const Node* v = pending.back();
      pending.pop_back();
      for (const Node* u : v->users()) {
        EXPECT_NE(u->opcode(), Opcode::kConvert) << "%" << u->name() << " converts O of %" << a->name();
        if (u->opcode() == Opcode::kAttentionDelta) {
          ++deltas;
        } else if (u->opcode() == Opcode::kTranspose || u->opcode() == Opcode::kReshape) {
          EXPECT_EQ(u->type().dtype, DType::kBF16) << u->name();
          pending.push_back(u);
        }
      }
    }
    EXPECT_EQ(deltas, 1) << a->name();
  }
  absl::Status same = CheckMeaningPreserved(*before, *after);
  EXPECT_TRUE(same.ok()) << same;
}

}  // namespace
}  // namespace kiln
