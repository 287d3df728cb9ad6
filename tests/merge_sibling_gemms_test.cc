// merge-sibling-gemms (passes/merge_sibling_gemms.h): GEMMs sharing an operand and GEMM
// chains through C become one GEMM over concatenated operands. IR text in, FileCheck on the
// print; shared-operand merges checked bit for bit on the reference backend, chain merges
// within the bound of f32 summation in another order; what the pass must leave alone; the
// concatenates shared between the forward and the backward; llama-tiny's and gpt2-tiny's
// training steps before and after the pass.
#include "passes/merge_sibling_gemms.h"

#include <cmath>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "frontends/gpt2.h"
#include "frontends/llama.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"
#include "ir/verifier.h"
#include "passes/training_compile.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

std::string Module(absl::string_view body) { return absl::StrCat("module @m\nfunc @main {\n", body, "}\n"); }

std::string Merge(absl::string_view body, bool expect_change = true, bool check_meaning = true) {
  MergeSiblingGemmsPass pass;
  return testing::RunPassOnText(pass, Module(body), expect_change, check_meaning);
}

#define EXPECT_CHECKS(out, checks) EXPECT_TRUE(testing::FileCheck(out, checks).ok()) << testing::FileCheck(out, checks)

// gemm attributes: {a_layout, b_layout, m, n, k} and optionally beta and alpha.
std::string Attrs(absl::string_view a, absl::string_view b, int64_t m, int64_t n, int64_t k, double beta = 0.0,
                  double alpha = 1.0) {
  return absl::StrCat("{a_layout=", a, ", alpha=", alpha == 1.0 ? "1.0" : absl::StrCat(alpha), ", b_layout=", b,
                      ", batch=1, beta=", beta == 0.0 ? "0.0" : "1.0", ", epilogue=none, k=", k, ", m=", m,
                      ", n=", n, "}");
}

// The chain merge sums each element's K products in one f32 accumulator instead of one per
// link: the exact sums agree, their f32 roundings differ by at most (K + 2) 2^-24 sum|a||b|
// per element (tests/gpu_gemm_test.cc's bound for f32 summation in any order), which is far
// below 1e-5 of the inputs' scale here (|a|, |b| < 1, K <= 96).
void ExpectCloseOnRandomInputs(absl::string_view before_text, absl::string_view after_text) {
  std::unique_ptr<kiln::Module> before = *ParseModule(before_text);
  std::unique_ptr<kiln::Module> after = *ParseModule(after_text);
  absl::Status close = CheckMeaningPreserved(*before, *after, {.abs_tolerance = 1e-5});
  EXPECT_TRUE(close.ok()) << close;
}

constexpr absl::string_view kHeaderBefore = R"(  %x = parameter() {index=0} : bf16[64,32]
  %wq = parameter() {index=1} : bf16[48,32]
  %wk = parameter() {index=2} : bf16[16,32]
  %q = gemm(%x, %wq) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=64, n=48} : bf16[64,48]
  %k = gemm(%x, %wk) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=64, n=16} : bf16[64,16]
  %dq = parameter() {index=3} : bf16[64,48]
  %dk = parameter() {index=4} : bf16[64,16]
  %dx.k = gemm(%dk, %wk) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=16, m=64, n=32} : f32[64,32]
  %dx = gemm(%dq, %wq, %dx.k) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=48, m=64, n=32} : f32[64,32]
  return %q, %k, %dx
)";

TEST(MergeSiblingGemms, HeaderExample) {
  std::string out = Merge(kHeaderBefore, /*expect_change=*/true, /*check_meaning=*/false);
  EXPECT_CHECKS(out, R"(
    CHECK:      %wk = parameter() {index=2} : bf16[16,32]
    CHECK-NEXT: %wq.concat = concatenate(%wq, %wk) {dim=0} : bf16[64,32]
    CHECK-NEXT: %q.merged = gemm(%x, %wq.concat) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=64, n=64} : bf16[64,64]
    CHECK-NEXT: %q = slice(%q.merged) {limit=[64,48], start=[0,0], stride=[1,1]} : bf16[64,48]
    CHECK-NEXT: %k = slice(%q.merged) {limit=[64,64], start=[0,48], stride=[1,1]} : bf16[64,16]
    CHECK-NEXT: %dq = parameter() {index=3} : bf16[64,48]
    CHECK-NEXT: %dk = parameter() {index=4} : bf16[64,16]
    CHECK-NEXT: %dq.concat = concatenate(%dq, %dk) {dim=1} : bf16[64,64]
    CHECK-NEXT: %dx = gemm(%dq.concat, %wq.concat) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=64, m=64, n=32} : f32[64,32]
    CHECK-NEXT: return %q, %k, %dx
  )");
  ExpectCloseOnRandomInputs(Module(kHeaderBefore), out);
}

// q, k and v of one input: one gemm of N = 48 + 16 + 16, exact.
TEST(MergeSiblingGemms, SharedInputProjectionsAreOneGemm) {
  std::string out = Merge(absl::StrCat(R"(  %x = parameter() {index=0} : bf16[2,8,32]
  %wq = parameter() {index=1} : bf16[48,32]
  %wk = parameter() {index=2} : bf16[16,32]
  %wv = parameter() {index=3} : bf16[16,32]
  %q = gemm(%x, %wq) )", Attrs("mk", "nk", 16, 48, 32), R"( : f32[2,8,48]
  %k = gemm(%x, %wk) )", Attrs("mk", "nk", 16, 16, 32), R"( : f32[2,8,16]
  %v = gemm(%x, %wv) )", Attrs("mk", "nk", 16, 16, 32), R"( : f32[2,8,16]
  %s = add(%k, %v) : f32[2,8,16]
  return %q, %s
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %wq.concat = concatenate(%wq, %wk, %wv) {dim=0} : bf16[80,32]
    CHECK-NEXT: %q.merged = gemm(%x, %wq.concat) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=16, n=80} : f32[2,8,80]
    CHECK-NEXT: %q = slice(%q.merged) {limit=[2,8,48], start=[0,0,0], stride=[1,1,1]} : f32[2,8,48]
    CHECK-NEXT: %k = slice(%q.merged) {limit=[2,8,64], start=[0,0,48], stride=[1,1,1]} : f32[2,8,16]
    CHECK-NEXT: %v = slice(%q.merged) {limit=[2,8,80], start=[0,0,64], stride=[1,1,1]} : f32[2,8,16]
    CHECK-NEXT: %s = add(%k, %v) : f32[2,8,16]
    CHECK-NOT:  gemm
  )");
}

// As the frontend writes them: each weight converted just before its gemm, q's reshape
// before k's convert. The convert moves up to just before the first piece, so that the
// merged gemm comes before the reshape.
TEST(MergeSiblingGemms, AnOperandDefinedAfterAnEarlierPiecesUseMovesUp) {
  std::string out = Merge(absl::StrCat(R"(  %x = parameter() {index=0} : bf16[16,32]
  %wq0 = parameter() {index=1} : f32[48,32]
  %wk0 = parameter() {index=2} : f32[16,32]
  %wq = convert(%wq0) : bf16[48,32]
  %q = gemm(%x, %wq) )", Attrs("mk", "nk", 16, 48, 32), R"( : bf16[16,48]
  %q4 = reshape(%q) : bf16[16,4,12]
  %wk = convert(%wk0) : bf16[16,32]
  %k = gemm(%x, %wk) )", Attrs("mk", "nk", 16, 16, 32), R"( : bf16[16,16]
  return %q4, %k
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %wq = convert(%wq0) : bf16[48,32]
    CHECK-NEXT: %wk = convert(%wk0) : bf16[16,32]
    CHECK-NEXT: %wq.concat = concatenate(%wq, %wk) {dim=0} : bf16[64,32]
    CHECK-NEXT: %q.merged = gemm(%x, %wq.concat)
    CHECK-NEXT: %q = slice(%q.merged)
    CHECK-NEXT: %k = slice(%q.merged)
    CHECK-NEXT: %q4 = reshape(%q) : bf16[16,4,12]
    CHECK-NEXT: return %q4, %k
  )");
}

// The weight gradients g_iᵀ x of one x: the g_i joined along their last dim (M), one gemm of
// M = 48 + 16, its rows sliced back; exact.
TEST(MergeSiblingGemms, SharedInputWeightGradientsAreOneGemm) {
  std::string out = Merge(absl::StrCat(R"(  %x = parameter() {index=0} : bf16[2,8,32]
  %dq = parameter() {index=1} : bf16[2,8,48]
  %dk = parameter() {index=2} : bf16[2,8,16]
  %gq = gemm(%dq, %x) )", Attrs("km", "kn", 48, 32, 16), R"( : f32[48,32]
  %gk = gemm(%dk, %x) )", Attrs("km", "kn", 16, 32, 16), R"( : f32[16,32]
  return %gq, %gk
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %dq.concat = concatenate(%dq, %dk) {dim=2} : bf16[2,8,64]
    CHECK-NEXT: %gq.merged = gemm(%dq.concat, %x) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=16, m=64, n=32} : f32[64,32]
    CHECK-NEXT: %gq = slice(%gq.merged) {limit=[48,32], start=[0,0], stride=[1,1]} : f32[48,32]
    CHECK-NEXT: %gk = slice(%gq.merged) {limit=[64,32], start=[48,0], stride=[1,1]} : f32[16,32]
    CHECK-NEXT: return %gq, %gk
  )");
}

// A chain of three links whose innermost accumulates into %r: one gemm of K = 48 + 16 + 16
// accumulating into %r; the pieces in the order their weights are defined, whatever the
// chain's order.
TEST(MergeSiblingGemms, ChainsAreOneGemmKeepingTheInnermostC) {
  const std::string before = Module(absl::StrCat(R"(  %wq = parameter() {index=0} : bf16[48,32]
  %wk = parameter() {index=1} : bf16[16,32]
  %wv = parameter() {index=2} : bf16[16,32]
  %dq = parameter() {index=3} : bf16[64,48]
  %dk = parameter() {index=4} : bf16[64,16]
  %dv = parameter() {index=5} : bf16[64,16]
  %r = parameter() {index=6} : f32[64,32]
  %d1 = gemm(%dq, %wq, %r) )", Attrs("mk", "kn", 64, 32, 48, 1.0), R"( : f32[64,32]
  %d2 = gemm(%dv, %wv, %d1) )", Attrs("mk", "kn", 64, 32, 16, 1.0), R"( : f32[64,32]
  %d3 = gemm(%dk, %wk, %d2) )", Attrs("mk", "kn", 64, 32, 16, 1.0), R"( : f32[64,32]
  %n = neg(%d3) : f32[64,32]
  return %n
)"));
  MergeSiblingGemmsPass pass;
  std::string out = testing::RunPassOnText(pass, before, true, /*check_meaning=*/false);
  EXPECT_CHECKS(out, R"(
    CHECK:      %wv = parameter() {index=2} : bf16[16,32]
    CHECK-NEXT: %wq.concat = concatenate(%wq, %wk, %wv) {dim=0} : bf16[80,32]
    CHECK:      %dv = parameter() {index=5} : bf16[64,16]
    CHECK-NEXT: %dq.concat = concatenate(%dq, %dk, %dv) {dim=1} : bf16[64,80]
    CHECK-NEXT: %r = parameter() {index=6} : f32[64,32]
    CHECK-NEXT: %d3 = gemm(%dq.concat, %wq.concat, %r) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=80, m=64, n=32} : f32[64,32]
    CHECK-NEXT: %n = neg(%d3) : f32[64,32]
    CHECK-NOT:  gemm
  )");
  ExpectCloseOnRandomInputs(before, out);
}

// The check above can fail: a chain merge that dropped the innermost C would be off by |r|.
TEST(MergeSiblingGemms, TheChainCheckSeesALostC) {
  const std::string before = Module(absl::StrCat(R"(  %w1 = parameter() {index=0} : bf16[16,32]
  %w2 = parameter() {index=1} : bf16[16,32]
  %g1 = parameter() {index=2} : bf16[64,16]
  %g2 = parameter() {index=3} : bf16[64,16]
  %r = parameter() {index=4} : f32[64,32]
  %d1 = gemm(%g1, %w1, %r) )", Attrs("mk", "kn", 64, 32, 16, 1.0), R"( : f32[64,32]
  %d2 = gemm(%g2, %w2, %d1) )", Attrs("mk", "kn", 64, 32, 16, 1.0), R"( : f32[64,32]
  return %d2
)"));
  std::string lost = before;
  absl::StrReplaceAll({{"%d1 = gemm(%g1, %w1, %r) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=1.0",
                        "%d1 = gemm(%g1, %w1) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0"}},
                      &lost);
  ASSERT_NE(lost, before);
  absl::Status close = CheckMeaningPreserved(**ParseModule(before), **ParseModule(lost), {.abs_tolerance = 1e-5});
  EXPECT_FALSE(close.ok());
}

// Left alone: different a (no sibling), different layouts, a bias epilogue, beta != 0
// siblings, different alpha, batch > 1, a chain link with another use, a km chain (the
// micro-batches' weight gradients), the same weight twice (cse's duplicate, not siblings).
TEST(MergeSiblingGemms, LeavesOtherGemmsAlone) {
  const std::string params = R"(  %x = parameter() {index=0} : bf16[16,32]
  %y = parameter() {index=1} : bf16[16,32]
  %w1 = parameter() {index=2} : bf16[8,32]
  %w2 = parameter() {index=3} : bf16[8,32]
  %r = parameter() {index=4} : f32[16,8]
  %b = parameter() {index=5} : f32[8]
)";
  const std::string nk = Attrs("mk", "nk", 16, 8, 32);
  for (const std::string& body : {
           // different a
           absl::StrCat(params, "  %p = gemm(%x, %w1) ", nk, " : f32[16,8]\n  %q = gemm(%y, %w2) ", nk,
                        " : f32[16,8]\n  return %p, %q\n"),
           // different b layouts: %w2 read as [K, N] cannot join %w1 read as [N, K]
           absl::StrCat("  %x = parameter() {index=0} : bf16[16,32]\n  %w1 = parameter() {index=1} : bf16[8,32]\n",
                        "  %w2 = parameter() {index=2} : bf16[32,8]\n  %p = gemm(%x, %w1) ", nk,
                        " : f32[16,8]\n  %q = gemm(%x, %w2) ", Attrs("mk", "kn", 16, 8, 32),
                        " : f32[16,8]\n  return %p, %q\n"),
           // a bias epilogue
           absl::StrCat(params, "  %p = gemm(%x, %w1) ", nk, " : f32[16,8]\n  %q = gemm(%x, %w2, %b) ",
                        absl::StrReplaceAll(nk, {{"epilogue=none", "epilogue=bias"}}),
                        " : f32[16,8]\n  return %p, %q\n"),
           // beta != 0 siblings
           absl::StrCat(params, "  %p = gemm(%x, %w1, %r) ", Attrs("mk", "nk", 16, 8, 32, 1.0),
                        " : f32[16,8]\n  %q = gemm(%x, %w2, %r) ", Attrs("mk", "nk", 16, 8, 32, 1.0),
                        " : f32[16,8]\n  return %p, %q\n"),
           // different alpha
           absl::StrCat(params, "  %p = gemm(%x, %w1) ", nk, " : f32[16,8]\n  %q = gemm(%x, %w2) ",
                        Attrs("mk", "nk", 16, 8, 32, 0.0, 0.5), " : f32[16,8]\n  return %p, %q\n"),
           // batch 2
           absl::StrCat(params, "  %p = gemm(%x, %w1) ", absl::StrReplaceAll(Attrs("mk", "nk", 8, 4, 32), {{"batch=1", "batch=2"}}),
                        " : f32[16,4]\n  %q = gemm(%x, %w2) ", absl::StrReplaceAll(Attrs("mk", "nk", 8, 4, 32), {{"batch=1", "batch=2"}}),
                        " : f32[16,4]\n  return %p, %q\n"),
           // the same weight twice
           absl::StrCat(params, "  %p = gemm(%x, %w1) ", nk, " : f32[16,8]\n  %q = gemm(%x, %w1) ", nk,
                        " : f32[16,8]\n  return %p, %q\n"),
           // a chain whose inner link is also read elsewhere
           absl::StrCat(params, "  %p = gemm(%x, %w1) ", Attrs("mk", "kn", 16, 8, 32),
                        " : f32[16,8]\n  %q = gemm(%y, %w2, %p) ", Attrs("mk", "kn", 16, 8, 32, 1.0),
                        " : f32[16,8]\n  return %p, %q\n"),
           // a km chain: the weight gradients of two micro-batches
           absl::StrCat(params, "  %p = gemm(%x, %y) ", Attrs("km", "kn", 32, 32, 16),
                        " : f32[32,32]\n  %q = gemm(%y, %x, %p) ", Attrs("km", "kn", 32, 32, 16, 1.0),
                        " : f32[32,32]\n  return %q\n"),
       }) {
    std::string out = Merge(body, /*expect_change=*/false);
    EXPECT_EQ(out.find("concatenate"), std::string::npos) << out;
    EXPECT_NE(out.find("gemm"), std::string::npos) << out;  // a parse error would print no gemm
  }
}

// Pieces above kMaxMergedPieceFlops stay apart: here 2 * 16384 * 2048 * 4096 = 2^38 FLOPs
// each. (Not evaluated: the reference would take minutes.)
TEST(MergeSiblingGemms, LargePiecesStayApart) {
  std::string body = absl::StrCat(R"(  %x = parameter() {index=0} : bf16[16384,4096]
  %w1 = parameter() {index=1} : bf16[2048,4096]
  %w2 = parameter() {index=2} : bf16[256,4096]
  %p = gemm(%x, %w1) )", Attrs("mk", "nk", 16384, 2048, 4096), R"( : bf16[16384,2048]
  %q = gemm(%x, %w2) )", Attrs("mk", "nk", 16384, 256, 4096), R"( : bf16[16384,256]
  return %p, %q
)");
  std::string out = Merge(body, /*expect_change=*/false, /*check_meaning=*/false);
  EXPECT_EQ(out.find("concatenate"), std::string::npos) << out;
  // Halve K and both merge: the threshold, not the shapes, kept them apart.
  std::string smaller = absl::StrReplaceAll(body, {{"4096]", "2048]"}, {"k=4096", "k=2048"}});
  out = Merge(smaller, /*expect_change=*/true, /*check_meaning=*/false);
  EXPECT_NE(out.find("concatenate(%w1, %w2) {dim=0}"), std::string::npos) << out;
}

// The forward's projections, the input gradient's chain and the weight gradients of one layer:
// the weights are concatenated once (read by the forward and the dX gemm), and so are the
// output gradients (read by the dX and the dW gemm). Three gemms and two concatenates.
TEST(MergeSiblingGemms, ForwardAndBackwardShareTheConcatenates) {
  std::string out = Merge(absl::StrCat(R"(  %x = parameter() {index=0} : bf16[64,32]
  %wk0 = parameter() {index=1} : f32[16,32]
  %wq0 = parameter() {index=2} : f32[48,32]
  %wq = convert(%wq0) : bf16[48,32]
  %wk = convert(%wk0) : bf16[16,32]
  %q = gemm(%x, %wq) )", Attrs("mk", "nk", 64, 48, 32), R"( : bf16[64,48]
  %k = gemm(%x, %wk) )", Attrs("mk", "nk", 64, 16, 32), R"( : bf16[64,16]
  %dk = mul(%k, %k) : bf16[64,16]
  %dq = mul(%q, %q) : bf16[64,48]
  %dx.q = gemm(%dq, %wq) )", Attrs("mk", "kn", 64, 32, 48), R"( : f32[64,32]
  %dx = gemm(%dk, %wk, %dx.q) )", Attrs("mk", "kn", 64, 32, 16, 1.0), R"( : f32[64,32]
  %gk = gemm(%dk, %x) )", Attrs("km", "kn", 16, 32, 64), R"( : f32[16,32]
  %gq = gemm(%dq, %x) )", Attrs("km", "kn", 48, 32, 64), R"( : f32[48,32]
  return %dx, %gq, %gk
)"), /*expect_change=*/true, /*check_meaning=*/false);
  EXPECT_CHECKS(out, R"(
    CHECK:      %wq.concat = concatenate(%wq, %wk) {dim=0} : bf16[64,32]
    CHECK:      = gemm(%x, %wq.concat)
    CHECK:      %dq.concat = concatenate(%dq, %dk) {dim=1} : bf16[64,64]
    CHECK-NEXT: %gq.merged = gemm(%dq.concat, %x) {{.*}}k=64, m=64, n=32} : f32[64,32]
    CHECK-NEXT: %gq = slice(%gq.merged) {limit=[48,32], start=[0,0], stride=[1,1]} : f32[48,32]
    CHECK-NEXT: %gk = slice(%gq.merged) {limit=[64,32], start=[48,0], stride=[1,1]} : f32[16,32]
    CHECK-NEXT: %dx = gemm(%dq.concat, %wq.concat) {{.*}}k=64, m=64, n=32} : f32[64,32]
  )");
  std::unique_ptr<kiln::Module> m = *ParseModule(out);
  int gemms = 0, concats = 0;
  for (const auto& n : m->functions()[0]->nodes()) {
    gemms += n->opcode() == Opcode::kGemm;
    concats += n->opcode() == Opcode::kConcatenate;
  }
  EXPECT_EQ(gemms, 3) << out;
  EXPECT_EQ(concats, 2) << out;
}

// --- training steps -----------------------------------------------------------------------

struct GemmCounts {
  int64_t gemms = 0, concats = 0, slices = 0;
};

GemmCounts CountIn(const Function& f) {
  GemmCounts c;
  for (const auto& n : f.nodes()) {
    c.gemms += n->opcode() == Opcode::kGemm;
    c.concats += n->opcode() == Opcode::kConcatenate;
    c.slices += n->opcode() == Opcode::kSlice;
  }
  return c;
}

// The step through the default pipeline with this pass and fuse-loops disabled (`before`),
// and a copy with this pass run on it (`after`), so that the comparison is of this pass alone.
struct StepPair {
  std::unique_ptr<kiln::Module> before, after;
  TrainingStepLayout layout;
};

StepPair CompileStep(std::unique_ptr<kiln::Module> m, int64_t accum) {
  CompileOptions options;
  options.disabled_passes = {std::string(MergeSiblingGemmsPass::kName), "fuse-loops"};
  TrainingStepOptions step;
  step.accum_steps = accum;
  absl::StatusOr<TrainingCompile> tc = TrainingCompile::Create(step, options);
  EXPECT_TRUE(tc.ok()) << tc.status();
  absl::Status run = tc->Run(*m);
  EXPECT_TRUE(run.ok()) << run;
  StepPair pair{.before = CloneModule(*m), .after = std::move(m), .layout = tc->layout()};
  MergeSiblingGemmsPass pass;
  absl::StatusOr<bool> changed = pass.Run(*pair.after);
  EXPECT_TRUE(changed.ok()) << changed.status();
  absl::Status verified = VerifyModule(*pair.after);
  EXPECT_TRUE(verified.ok()) << verified;
  return pair;
}

// Inputs in the ranges a real step sees (tests/pass_meaning_test.cc), so the outputs are finite.
DifferentialCheckOptions StepCheck(const TrainingStepLayout& layout, double abs_tolerance, double rel_tolerance) {
  DifferentialCheckOptions check{.abs_tolerance = abs_tolerance, .rel_tolerance = rel_tolerance};
  for (int64_t i = 0; i < layout.num_params; ++i) check.ranges[layout.first_v() + i] = {0.0, 1e-2};
  check.ranges[layout.t_index()] = {1.0, 100.0};
  check.ranges[layout.lr_index()] = {1e-4, 1e-2};
  return check;
}

// llama-tiny (2 layers, GQA 4/2 heads): per layer the q/k/v and gate/up projections, their
// weight gradients and their input-gradient chains each become one gemm: 21 gemms -> 12 per
// layer with --accum 1 (o_proj's and down's three and the head's stay apart). With f32 kept in double by the
// reference (so the chains' f32 roundings, which the merge changes, are out of the picture)
// the step agrees to 1e-9: the sums are the same. In f32 the merged chain rounds once where
// the links rounded each partial sum, so a bf16 operand read downstream (the norm backward's
// bf16 copy, the next layer's GEMMs) may land on its neighbouring value, and AdamW divides
// what that changes by sqrt(v): the weights and moments (of magnitude <= 1 here) agree to
// 1e-4 (measured: 2.7e-5 at worst), and the loss, the forward's, exactly.
TEST(MergeSiblingGemms, LlamaTinyTrainingStep) {
  for (int64_t accum : {1, 2}) {
    ModelConfig c = *PresetConfig("llama-tiny");
    StepPair s = CompileStep(*BuildLlamaModule(c, {.batch = 2, .seq_len = 16, .precision = Precision::kBf16}), accum);
    const GemmCounts b = CountIn(*s.before->FindFunction("train_step"));
    const GemmCounts a = CountIn(*s.after->FindFunction("train_step"));
    std::printf("llama-tiny step, accum %lld: gemms %lld -> %lld, concatenates %lld -> %lld, slices %lld -> %lld\n",
                static_cast<long long>(accum), static_cast<long long>(b.gemms), static_cast<long long>(a.gemms),
                static_cast<long long>(b.concats), static_cast<long long>(a.concats), static_cast<long long>(b.slices),
                static_cast<long long>(a.slices));
    const int64_t layers = c.n_layers;
    // Per layer and micro-batch: the forward's q/k/v (3 -> 1) and gate/up (2 -> 1), and the
    // two input-gradient chains alike; the dW merges in micro-batch 0 only (later ones
    // accumulate into its results, beta=1, and stay apart).
    EXPECT_EQ(b.gemms - a.gemms, layers * (accum * (2 + 1 + 2 + 1) + (2 + 1))) << "accum " << accum;
    // Weights concatenated once for all micro-batches (q/k/v, gate/up per layer), output
    // gradients once per micro-batch.
    EXPECT_EQ(a.concats - b.concats, layers * (2 + 2 * accum)) << "accum " << accum;

    DifferentialCheckOptions exact_f32 = StepCheck(s.layout, 1e-9, 1e-9);
    exact_f32.reference.f32_as_f64 = true;
    absl::Status close = CheckMeaningPreserved(*s.before, *s.after, exact_f32);
    EXPECT_TRUE(close.ok()) << "accum " << accum << ", f32 as f64: " << close;
    absl::StatusOr<DifferentialReport> report = CompareFunctions(
        *s.before->FindFunction("train_step"), *s.after->FindFunction("train_step"), StepCheck(s.layout, 1e-4, 0));
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->within_tolerance()) << "accum " << accum << ":\n" << report->ToString();
    EXPECT_EQ(report->outputs[0].max_abs_error, 0.0) << "the loss is the forward's: " << report->ToString();
  }
}

// gpt2-tiny: its q/k/v are one c_attn already and every projection has a bias epilogue, so
// the pass finds nothing to merge, and the step is unchanged.
TEST(MergeSiblingGemms, Gpt2TinyTrainingStep) {
  ModelConfig c = *PresetConfig("gpt2-tiny");
  StepPair s = CompileStep(*BuildModelModule(c, {.batch = 2, .seq_len = 16, .precision = Precision::kBf16}), 1);
  const GemmCounts b = CountIn(*s.before->FindFunction("train_step"));
  const GemmCounts a = CountIn(*s.after->FindFunction("train_step"));
  std::printf("gpt2-tiny step: gemms %lld -> %lld\n", static_cast<long long>(b.gemms), static_cast<long long>(a.gemms));
  EXPECT_GT(b.gemms, 0);
  EXPECT_EQ(a.gemms, b.gemms);
  EXPECT_EQ(a.concats, b.concats);
  absl::Status same = CheckMeaningPreserved(*s.before, *s.after, StepCheck(s.layout, 0, 0));
  EXPECT_TRUE(same.ok()) << same;
}

}  // namespace
}  // namespace kiln
