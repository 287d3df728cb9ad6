// chunk-lm-head (passes/chunk_lm_head.h): the LM head and its loss in row chunks. IR text in,
// FileCheck on the print, meaning checked on the reference backend (tests/testing/pass_test.h);
// the chunk count; what is left alone; and llama-tiny's training step, where the pass keeps every
// value (kiln check's comparison) and the arena shrinks.
#include "passes/chunk_lm_head.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "ir/text_format.h"
#include "passes/training_compile.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

#define EXPECT_CHECKS(out, checks) EXPECT_TRUE(testing::FileCheck(out, checks).ok()) << testing::FileCheck(out, checks)

// An LM head over N = 2 x 16 rows of 8 features, 24 classes, with its loss and gradients, as
// autodiff and the default pipeline leave it (bf16 logits, a constant mean-loss cotangent).
std::string LmHead(absl::string_view dw_extra = "") {
  return absl::StrCat(R"(module @m
func @main {
  %x = parameter() {index=0} : bf16[2,16,8]
  %w = parameter() {index=1} : bf16[24,8]
  %targets = parameter() {index=2} : i32[2,16]
  %logits = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=8, m=32, n=24} : bf16[2,16,24]
  %l2 = reshape(%logits) : bf16[32,24]
  %labels = reshape(%targets) : i32[32]
  %loss, %lse = cross_entropy(%l2, %labels) : (f32[32], f32[32])
  %total = reduce_sum(%loss) {dims=[0]} : f32[]
  %dloss = constant() {value=0.03125} : f32[32]
  %dl = cross_entropy_grad(%l2, %labels, %dloss, %lse) : bf16[32,24]
  %dl3 = reshape(%dl) : bf16[2,16,24]
  %dx = gemm(%dl3, %w) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=24, m=32, n=8} : f32[2,16,8]
  %dw = gemm(%dl3, %x) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=32, m=24, n=8} : f32[24,8]
)", dw_extra, R"(  return %total, %dx, %dw
}
)");
}

// 16 rows a chunk: two chunks of the 32.
constexpr int64_t kTwoChunks = 16;

// The weight gradient's sum over rows is reassociated (two f32 partial sums): with f32 kept in
// double by the reference, the same sums agree to 1e-9; everything else is the same value.
DifferentialCheckOptions SameSums() {
  DifferentialCheckOptions check{.abs_tolerance = 1e-9, .rel_tolerance = 1e-9};
  check.reference.f32_as_f64 = true;
  check.int_range = {0.0, 24.0};  // labels over every class
  return check;
}

TEST(ChunkLmHead, HeaderExample) {
  ChunkLmHeadPass pass(kTwoChunks);
  const std::string out = testing::RunPassOnText(pass, LmHead(), /*expect_change=*/true, /*check_meaning=*/false);
  absl::Status same = CheckMeaningPreserved(**ParseModule(LmHead()), **ParseModule(out), SameSums());
  EXPECT_TRUE(same.ok()) << same;
  EXPECT_CHECKS(out, R"(
    CHECK:      %x.rows = reshape(%x) : bf16[32,8]
    CHECK:      slice(%x.rows) {limit=[16,8], start=[0,0], stride=[1,1]} : bf16[16,8]
    CHECK:      slice(%labels) {limit=[16], start=[0], stride=[1]} : i32[16]
    CHECK:      constant() {value=0.03125} : f32[16]
    CHECK:      gemm({{.*}}, %w) {{.*}}m=16, n=24} : bf16[16,24]
    CHECK:      cross_entropy({{.*}}) : (f32[16], f32[16])
    CHECK:      cross_entropy_grad({{.*}}) : bf16[16,24]
    CHECK:      gemm({{.*}}, %w) {{.*}}k=24, m=16, n=8} : f32[16,8]
    CHECK:      %dw.0 = gemm({{.*}}) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=16, m=24, n=8} : f32[24,8]
    CHECK:      slice(%x.rows) {limit=[32,8], start=[16,0], stride=[1,1]} : bf16[16,8]
    CHECK:      %dw = gemm({{.*}}, %dw.0) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=16, m=24, n=8} : f32[24,8]
    CHECK:      %loss = concatenate({{.*}}) {dim=0} : f32[32]
    CHECK:      concatenate({{.*}}) {dim=0} : f32[32,8]
    CHECK:      %dx = reshape({{.*}}) : f32[2,16,8]
    CHECK:      %total = reduce_sum(%loss)
    CHECK-NOT:  bf16[32,24]
    CHECK-NOT:  bf16[2,16,24]
  )");
}

// The presets' cotangent is a broadcast of the scalar 1/N (canonicalize folds only small
// broadcasts into a constant): the same rewrite, each chunk's cotangent a constant.
TEST(ChunkLmHead, ABroadcastScalarCotangentSplitsToo) {
  std::string text = LmHead();
  const std::string constant = "  %dloss = constant() {value=0.03125} : f32[32]\n";
  ASSERT_NE(text.find(constant), std::string::npos);
  text.replace(text.find(constant), constant.size(),
               "  %mean = constant() {value=0.03125} : f32[]\n"
               "  %dloss = broadcast(%mean) {dims=[]} : f32[32]\n");
  ChunkLmHeadPass pass(kTwoChunks);
  const std::string out = testing::RunPassOnText(pass, text, /*expect_change=*/true, /*check_meaning=*/false);
  absl::Status same = CheckMeaningPreserved(**ParseModule(text), **ParseModule(out), SameSums());
  EXPECT_TRUE(same.ok()) << same;
  EXPECT_CHECKS(out, R"(
    CHECK:      constant() {value=0.03125} : f32[16]
    CHECK:      cross_entropy_grad({{.*}}) : bf16[16,24]
    CHECK:      constant() {value=0.03125} : f32[16]
    CHECK:      cross_entropy_grad({{.*}}) : bf16[16,24]
    CHECK-NOT:  broadcast
  )");
}

// llama-S as `kiln train` compiles it (16 x 1024 tokens): 4096 rows a chunk is 4 chunks.
TEST(ChunkLmHead, TheLlamaSPresetStepSplits) {
  std::unique_ptr<Module> m = *BuildLlamaModule(*PresetConfig("llama-S"), {});
  CompileOptions options;
  options.lm_head_chunk_rows = 4096;
  absl::StatusOr<TrainingCompile> tc = TrainingCompile::Create({}, options);
  ASSERT_TRUE(tc.ok()) << tc.status();
  ASSERT_TRUE(tc->Run(*m).ok());
  int64_t ce = 0, ce_grad = 0;
  for (const auto& node : m->FindFunction("train_step")->nodes()) {
    ce += node->opcode() == Opcode::kCrossEntropy;
    ce_grad += node->opcode() == Opcode::kCrossEntropyGrad;
  }
  EXPECT_EQ(ce, 4);
  EXPECT_EQ(ce_grad, 4);
}

TEST(ChunkLmHead, ChunkCount) {
  EXPECT_EQ(LmHeadChunks(32, 0), 1);   // off
  EXPECT_EQ(LmHeadChunks(32, 32), 1);  // one chunk holds them
  EXPECT_EQ(LmHeadChunks(32, 16), 2);
  EXPECT_EQ(LmHeadChunks(32, 9), 4);   // 8 rows a chunk: the largest multiple of 8 within
  EXPECT_EQ(LmHeadChunks(32, 7), 1);   // under 8 rows a chunk: left alone
  EXPECT_EQ(LmHeadChunks(40, 20), 5);  // 40 / 2 = 20 rows is no multiple of 8; 40 / 5 = 8 is
  // llama-M's 8192 tokens, 4096 at a time: 2 chunks.
  EXPECT_EQ(LmHeadChunks(8192, 4096), 2);
}

TEST(ChunkLmHead, OffOrOneChunkChangesNothing) {
  for (int64_t rows : {int64_t{0}, int64_t{32}, int64_t{100}}) {
    ChunkLmHeadPass pass(rows);
    testing::RunPassOnText(pass, LmHead(), /*expect_change=*/false);
  }
}

// A tied embedding's weight gradient accumulates into C (GPT-2's: the embedding's gradient, made
// at the end of the backward): the chunks sum without it and C is added where the gemm was.
TEST(ChunkLmHead, TiedWeightGradientAddsItsC) {
  const std::string with_c = absl::StrCat(R"(module @m
func @main {
  %x = parameter() {index=0} : bf16[32,8]
  %w = parameter() {index=1} : bf16[24,8]
  %labels = parameter() {index=2} : i32[32]
  %c = parameter() {index=3} : f32[24,8]
  %logits = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=8, m=32, n=24} : bf16[32,24]
  %loss, %lse = cross_entropy(%logits, %labels) : (f32[32], f32[32])
  %dloss = constant() {value=0.03125} : f32[32]
  %dl = cross_entropy_grad(%logits, %labels, %dloss, %lse) : bf16[32,24]
  %dx = gemm(%dl, %w) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=24, m=32, n=8} : f32[32,8]
  %dw = gemm(%dl, %x, %c) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=32, m=24, n=8} : f32[24,8]
  return %loss, %dx, %dw
}
)");
  ChunkLmHeadPass pass(kTwoChunks);
  const std::string out = testing::RunPassOnText(pass, with_c, /*expect_change=*/true, /*check_meaning=*/false);
  EXPECT_CHECKS(out, R"(
    CHECK:      %dw.0 = gemm({{.*}}) {{.*}}beta=0.0{{.*}} : f32[24,8]
    CHECK:      %dw.1 = gemm({{.*}}, %dw.0) {{.*}}beta=1.0{{.*}} : f32[24,8]
    CHECK:      %dw = add(%dw.1, %c) : f32[24,8]
    CHECK:      return %loss, %dx, %dw
  )");
  absl::Status same = CheckMeaningPreserved(**ParseModule(with_c), **ParseModule(out), SameSums());
  EXPECT_TRUE(same.ok()) << same;
}

// A cotangent that is not a constant, another reader of the logits: each is left alone.
TEST(ChunkLmHead, LeavesWhatItCannotSplit) {
  const std::string dloss_parameter = absl::StrCat(R"(module @m
func @main {
  %x = parameter() {index=0} : bf16[32,8]
  %w = parameter() {index=1} : bf16[24,8]
  %labels = parameter() {index=2} : i32[32]
  %dloss = parameter() {index=3} : f32[32]
  %logits = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=8, m=32, n=24} : bf16[32,24]
  %loss, %lse = cross_entropy(%logits, %labels) : (f32[32], f32[32])
  %dl = cross_entropy_grad(%logits, %labels, %dloss, %lse) : bf16[32,24]
  %dx = gemm(%dl, %w) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=24, m=32, n=8} : f32[32,8]
  %dw = gemm(%dl, %x) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=32, m=24, n=8} : f32[24,8]
  return %loss, %dx, %dw
}
)");
  const std::string logits_read_again = absl::StrCat(R"(module @m
func @main {
  %x = parameter() {index=0} : bf16[32,8]
  %w = parameter() {index=1} : bf16[24,8]
  %labels = parameter() {index=2} : i32[32]
  %logits = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=8, m=32, n=24} : bf16[32,24]
  %loss, %lse = cross_entropy(%logits, %labels) : (f32[32], f32[32])
  %dloss = constant() {value=0.03125} : f32[32]
  %dl = cross_entropy_grad(%logits, %labels, %dloss, %lse) : bf16[32,24]
  %dx = gemm(%dl, %w) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=24, m=32, n=8} : f32[32,8]
  %dw = gemm(%dl, %x) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=32, m=24, n=8} : f32[24,8]
  %probs = softmax(%logits) : bf16[32,24]
  return %loss, %dx, %dw, %probs
}
)");
  for (const std::string* text : {&dloss_parameter, &logits_read_again}) {
    ChunkLmHeadPass pass(kTwoChunks);
    const std::string out = testing::RunPassOnText(pass, *text, /*expect_change=*/false);
    EXPECT_CHECKS(out, "CHECK: gemm(%x, %w) {{.*}} : bf16[32,24]");
  }
}

// llama-tiny's training step with the pass against without: every output the same up to the
// weight gradient's reassociated f32 sum (the differential check kiln check runs), and no value
// of the step the full logits.
TEST(ChunkLmHead, LlamaTinyStepKeepsItsValuesInLessMemory) {
  const ModelConfig c = *PresetConfig("llama-tiny");
  std::optional<TrainingStepLayout> layout;
  auto compile = [&](int64_t chunk_rows) {
    std::unique_ptr<Module> m = *BuildLlamaModule(c, {.batch = 4, .seq_len = 64, .precision = Precision::kBf16});
    CompileOptions options;
    options.lm_head_chunk_rows = chunk_rows;
    absl::StatusOr<TrainingCompile> tc = TrainingCompile::Create({}, options);
    EXPECT_TRUE(tc.ok()) << tc.status();
    absl::Status run = tc->Run(*m);
    EXPECT_TRUE(run.ok()) << run;
    layout = tc->layout();
    return m;
  };
  // 4 x 64 = 256 rows of 256 bf16 logits (128 KiB): chunks of 64 rows.
  std::unique_ptr<Module> whole = compile(0), chunked = compile(64);
  auto count = [](const Module& m, Opcode op) {
    int64_t n = 0;
    for (const auto& node : m.FindFunction("train_step")->nodes()) n += node->opcode() == op;
    return n;
  };
  EXPECT_EQ(count(*whole, Opcode::kCrossEntropy), 1);
  EXPECT_EQ(count(*chunked, Opcode::kCrossEntropy), 4);
  EXPECT_EQ(count(*chunked, Opcode::kCrossEntropyGrad), 4);
  // Inputs in a real step's ranges (tests/merge_sibling_gemms_test.cc), f32 kept in double.
  DifferentialCheckOptions check{.abs_tolerance = 1e-9, .rel_tolerance = 1e-9};
  check.reference.f32_as_f64 = true;
  for (int64_t i = 0; i < layout->num_params; ++i) check.ranges[layout->first_v() + i] = {0.0, 1e-2};
  check.ranges[layout->t_index()] = {1.0, 100.0};
  check.ranges[layout->lr_index()] = {1e-4, 1e-2};
  absl::Status same = CheckMeaningPreserved(*whole, *chunked, check);
  EXPECT_TRUE(same.ok()) << same;
  // No value of the chunked step's LM head and loss holds more than a chunk of logits or their
  // gradient (llama-tiny's merged q/k/v projection is [.., 256] too, hence the scopes).
  auto largest_logits = [&](const Module& m) {
    int64_t bytes = 0;
    for (const auto& node : m.FindFunction("train_step")->nodes()) {
      if (node->has_multiple_results() || (node->scope() != "lm_head" && node->scope() != "loss")) continue;
      if (node->type().rank() >= 2 && node->type().dims.back() == c.vocab_size) {
        bytes = std::max(bytes, node->type().num_bytes());
      }
    }
    return bytes;
  };
  EXPECT_EQ(largest_logits(*whole), 256 * 256 * 2);
  EXPECT_EQ(largest_logits(*chunked), 64 * 256 * 2);
}

}  // namespace
}  // namespace kiln
