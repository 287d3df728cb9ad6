// kv_cache_write and paged_attention (ir/op_table.h): their reference semantics on small
// hand-checked cases, against the flash `attention` op over the same K/V laid out
// contiguously, their data errors, and (with the CUDA toolkit) their kernels under NVRTC.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "ir/builder.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"
#include "ir/verifier.h"
#ifdef KILN_WITH_CUDA
#include "codegen/lower_node.h"
#include "codegen/nvrtc_compiler.h"
#endif

namespace kiln {
namespace {

const DType f32 = DType::kF32;
const DType i32 = DType::kI32;

HostTensor Ints(std::vector<int64_t> dims, std::vector<double> v) { return HostTensor::FromValues({i32, dims}, v); }

TEST(PagedKvOps, KvCacheWriteStoresRowsAtTheirSlotsOfOneLayer) {
  auto text = R"(module @m

func @f {
  %pool = parameter() {index=0} : f32[2,3,1,2,2]
  %x = parameter() {index=1} : f32[3,1,2]
  %slots = parameter() {index=2} : i32[3]
  %out = kv_cache_write(%pool, %x, %slots) {layer=1} : f32[2,3,1,2,2]
  return %out
}
)";
  auto m = ParseModule(text);
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& f = *(*m)->functions()[0];
  HostTensor pool({f32, {2, 3, 1, 2, 2}});
  HostTensor x = HostTensor::FromValues({f32, {3, 1, 2}}, {1, 2, 3, 4, 5, 6});
  // Row 0 to slot 5 (block 2, offset 1), row 1 nowhere, row 2 to slot 0.
  auto out = EvaluateFunction(f, {pool, x, Ints({3}, {5, -1, 0})});
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> expected(24, 0.0);
  const int64_t layer1 = 12;  // 3 blocks x 1 head x 2 slots x 2
  expected[layer1 + 2 * 4 + 1 * 2 + 0] = 1;
  expected[layer1 + 2 * 4 + 1 * 2 + 1] = 2;
  expected[layer1 + 0] = 5;
  expected[layer1 + 1] = 6;
  EXPECT_EQ((*out)[0].values(), expected);

  auto beyond = EvaluateFunction(f, {pool, x, Ints({3}, {6, -1, 0})});
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().message().find("slot 6 of row 0 is outside [0, 6)"), std::string::npos) << beyond.status();
  auto twice = EvaluateFunction(f, {pool, x, Ints({3}, {4, 4, 0})});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("both write slot 4"), std::string::npos) << twice.status();
}

TEST(PagedKvOps, ShapeErrorsNameTheOperand) {
  Module m("m");
  Builder b(m.AddFunction("f"));
  Node* pool = *b.Parameter("pool", {f32, {2, 3, 1, 2, 2}});
  Node* x = *b.Parameter("x", {f32, {3, 2, 2}});
  Node* slots = *b.Parameter("slots", {i32, {3}});
  auto bad = b.Op(Opcode::kKvCacheWrite, {pool, x, slots}, AttrMap{{"layer", int64_t{0}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rows f32[3,2,2] must be float [N, 1, 2]"), std::string::npos) << bad.status();
  Node* x1 = *b.Parameter("x1", {f32, {3, 1, 2}});
  auto layer = b.Op(Opcode::kKvCacheWrite, {pool, x1, slots}, AttrMap{{"layer", int64_t{2}}});
  ASSERT_FALSE(layer.ok());
  EXPECT_NE(layer.status().message().find("layer 2 is outside the pool's 2 layers"), std::string::npos)
      << layer.status();
}

// One sequence of T = 6 tokens whose K/V sit in scrambled blocks of 2: paged attention at
// positions 0..5 computes what the causal `attention` op computes over the contiguous K/V,
// up to the two ops' documented rounding (paged: P in f32; attention: P rounded to bf16).
TEST(PagedKvOps, PagedAttentionIsCausalAttentionThroughTheBlockTable) {
  const int64_t t = 6, h = 4, hkv = 2, d = 8, bs = 2, nb = 5;
  Module m("m");
  Builder b(m.AddFunction("f"));
  Node* q = *b.Parameter("q", {f32, {1, t, h, d}});
  Node* k = *b.Parameter("k", {f32, {t, hkv, d}});
  Node* v = *b.Parameter("v", {f32, {t, hkv, d}});
  const DType bf16 = DType::kBF16;
  Node* empty = *b.Constant(0, {bf16, {1, nb, hkv, bs, d}});
  // Token j at block table[j / 2] = {3, 0, 4}[...], offset j % 2.
  Node* slots = *b.ConstantValues({6, 7, 0, 1, 8, 9}, {i32, {t}});
  Node* table = *b.ConstantValues({3, 0, 4, -1}, {i32, {1, 4}});
  Node* positions = *b.ConstantValues({0, 1, 2, 3, 4, 5}, {i32, {1, t}});
  const AttrMap layer{{"layer", int64_t{0}}};
  Node* k_pool = *b.Op(Opcode::kKvCacheWrite, {empty, *b.Convert(k, bf16), slots}, layer);
  Node* v_pool = *b.Op(Opcode::kKvCacheWrite, {empty, *b.Convert(v, bf16), slots}, layer);
  const double scale = 1 / std::sqrt(8.0);
  Node* paged = *b.Op(Opcode::kPagedAttention, {*b.Convert(q, bf16), k_pool, v_pool, table, positions},
                      AttrMap{{"layer", int64_t{0}}, {"scale", scale}});
  // The same through attention: [1, H, T, D] operands.
  Node* qh = *b.Convert(*b.Transpose(q, {0, 2, 1, 3}), bf16);
  Node* kh = *b.Convert(*b.Transpose(*b.Reshape(k, {1, t, hkv, d}), {0, 2, 1, 3}), bf16);
  Node* vh = *b.Convert(*b.Transpose(*b.Reshape(v, {1, t, hkv, d}), {0, 2, 1, 3}), bf16);
  auto flash = *b.MultiResultOp(Opcode::kAttention, {qh, kh, vh}, AttrMap{{"scale", scale}});
  Node* flash_o = *b.Transpose(flash[0], {0, 2, 1, 3});
  ASSERT_TRUE(b.Return({paged, flash_o}).ok());
  ASSERT_TRUE(VerifyModule(m).ok()) << VerifyModule(m);
  const Function& f = *m.functions()[0];
  auto out = EvaluateFunction(f, {HostTensor::Random({f32, {1, t, h, d}}, 1), HostTensor::Random({f32, {t, hkv, d}}, 2),
                                  HostTensor::Random({f32, {t, hkv, d}}, 3)});
  ASSERT_TRUE(out.ok()) << out.status();
  double worst = 0;
  for (int64_t i = 0; i < (*out)[0].num_elements(); ++i) worst = std::max(worst, std::fabs((*out)[0][i] - (*out)[1][i]));
  EXPECT_LT(worst, 1e-2) << "f32 P (paged) against P rounded to bf16 (attention)";
  EXPECT_GT(std::fabs((*out)[0][0]), 0.0);
}

// {out_dtype=bf16}: the f32 O rounded once, bit for bit convert(paged_attention) of the same
// inputs (what narrow-activations-bf16 relies on); a non-float out_dtype is an error.
TEST(PagedKvOps, OutDtypeIsTheF32ResultRoundedOnce) {
  const int64_t t = 5, h = 4, hkv = 2, d = 8, bs = 2, nb = 4;
  Module m("m");
  Builder b(m.AddFunction("f"));
  const DType bf16 = DType::kBF16;
  Node* q = *b.Parameter("q", {bf16, {1, t, h, d}});
  Node* pool = *b.Parameter("pool", {bf16, {1, nb, hkv, bs, d}});
  Node* table = *b.ConstantValues({2, 0, 3, 1}, {i32, {1, 4}});
  Node* positions = *b.ConstantValues({0, 1, 2, 3, 4}, {i32, {1, t}});
  const AttrMap attrs{{"layer", int64_t{0}}, {"scale", 0.35}};
  Node* wide = *b.Op(Opcode::kPagedAttention, {q, pool, pool, table, positions}, attrs);
  AttrMap narrow_attrs = attrs;
  narrow_attrs.Set("out_dtype", Symbol{"bf16"});
  Node* narrow = *b.Op(Opcode::kPagedAttention, {q, pool, pool, table, positions}, narrow_attrs);
  EXPECT_EQ(narrow->type().ToString(), "bf16[1,5,4,8]");
  ASSERT_TRUE(b.Return({*b.Convert(wide, bf16), narrow}).ok());
  ASSERT_TRUE(VerifyModule(m).ok()) << VerifyModule(m);
  auto out = EvaluateFunction(*m.functions()[0], {HostTensor::Random({bf16, {1, t, h, d}}, 4),
                                                  HostTensor::Random({bf16, {1, nb, hkv, bs, d}}, 5)});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].values(), (*out)[1].values());
  EXPECT_NE((*out)[1].values()[0], 0.0);

  Builder bad(m.AddFunction("g"));
  Node* q2 = *bad.Parameter("q", {bf16, {1, t, h, d}});
  Node* pool2 = *bad.Parameter("pool", {bf16, {1, nb, hkv, bs, d}});
  Node* table2 = *bad.Parameter("table", {i32, {1, 4}});
  Node* positions2 = *bad.Parameter("positions", {i32, {1, t}});
  AttrMap int_attrs = attrs;
  int_attrs.Set("out_dtype", Symbol{"i32"});
  absl::StatusOr<Node*> refused = bad.Op(Opcode::kPagedAttention, {q2, pool2, pool2, table2, positions2}, int_attrs);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("out_dtype i32 must be a float type"), std::string::npos)
      << refused.status();
}

TEST(PagedKvOps, PaddingRowsAreZeroAndBadTablesAreErrors) {
  auto text = R"(module @m

func @f {
  %q = parameter() {index=0} : f32[2,1,1,2]
  %k = parameter() {index=1} : f32[1,2,1,2,2]
  %tables = parameter() {index=2} : i32[2,2]
  %pos = parameter() {index=3} : i32[2,1]
  %o = paged_attention(%q, %k, %k, %tables, %pos) {layer=0, scale=1.0} : f32[2,1,1,2]
  return %o
}
)";
  auto m = ParseModule(text);
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& f = *(*m)->functions()[0];
  const HostTensor q = HostTensor::FromValues({f32, {2, 1, 1, 2}}, {1, 0, 1, 0});
  // Block 1 holds keys [1, 1] and [0, 2]; sequence 0 reads keys 0 and 1 of it.
  const HostTensor k = HostTensor::FromValues({f32, {1, 2, 1, 2, 2}}, {9, 9, 9, 9, 1, 1, 0, 2});
  auto out = EvaluateFunction(f, {q, k, Ints({2, 2}, {1, 0, -1, -1}), Ints({2, 1}, {1, -1})});
  ASSERT_TRUE(out.ok()) << out.status();
  // Scores q.k = 1 and 0: P = (e/(e+1), 1/(e+1)); O = P0 [1,1] + P1 [0,2].
  const double p0 = std::exp(1.0) / (std::exp(1.0) + 1), p1 = 1 - p0;
  EXPECT_NEAR((*out)[0][0], p0, 1e-6);
  EXPECT_NEAR((*out)[0][1], p0 + 2 * p1, 1e-6);
  EXPECT_EQ((*out)[0][2], 0.0);  // the padding row
  EXPECT_EQ((*out)[0][3], 0.0);
  auto bad_block = EvaluateFunction(f, {q, k, Ints({2, 2}, {2, 0, -1, -1}), Ints({2, 1}, {1, -1})});
  ASSERT_FALSE(bad_block.ok());
  EXPECT_NE(bad_block.status().message().find("block_tables[0,0] = 2 is outside the pool's 2 blocks"),
            std::string::npos)
      << bad_block.status();
  auto beyond = EvaluateFunction(f, {q, k, Ints({2, 2}, {1, 0, -1, -1}), Ints({2, 1}, {4, -1})});
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().message().find("position 4 of query [0,0] is beyond the 2 blocks"), std::string::npos)
      << beyond.status();
}

#ifdef KILN_WITH_CUDA
// The geometry's text ($KILN_PAGED_ATTENTION, bench/paged_attention_bench) names every field
// it sets and reads back to the same geometry; text that is not one says what it wants.
TEST(PagedKvOps, GeometryTextRoundTrips) {
  CodegenOptions::PagedAttentionGeometry scalar;
  scalar.tensor_cores = false;
  CodegenOptions::PagedAttentionGeometry bulk;
  bulk.bulk_copies = true;
  CodegenOptions::PagedAttentionGeometry few_splits;
  few_splits.min_split_blocks = 8;
  few_splits.fold_combine = false;
  CodegenOptions::PagedAttentionGeometry untiled;
  untiled.query_tiles = false;
  for (const auto& [geometry, text] : std::vector<std::pair<CodegenOptions::PagedAttentionGeometry, std::string>>{
           {CodegenOptions::PagedAttentionGeometry{}, "tc4x3x4x2"}, {scalar, "4(8)x5x4x4"},
           {few_splits, "tc4x3x8x2+combine"}, {bulk, "tc4x3x4x2+bulk"}, {untiled, "tc4x3x4x2+untiled"}}) {
    EXPECT_EQ(PagedAttentionGeometryName(geometry), text);
    auto parsed = ParsePagedAttentionGeometry(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(PagedAttentionGeometryName(*parsed), text);
    EXPECT_EQ(parsed->tensor_cores, geometry.tensor_cores);
    EXPECT_EQ(parsed->min_split_blocks, geometry.min_split_blocks);
    EXPECT_EQ(parsed->fold_combine, geometry.fold_combine);
    EXPECT_EQ(parsed->bulk_copies, geometry.bulk_copies);
    EXPECT_EQ(parsed->query_tiles, geometry.query_tiles);
  }
  auto fold = ParsePagedAttentionGeometry("8x5x4x4+fold");
  ASSERT_TRUE(fold.ok()) << fold.status();
  EXPECT_EQ(fold->few_rows_warps, 8);  // the warps named serve every batch
  EXPECT_FALSE(fold->tensor_cores);
  EXPECT_GT(fold->fold_max_rows, 1 << 20);
  for (const char* bad : {"", "tc4x3x4", "tc4x3x4x2x1", "tc0x3x4x2", "4(x)x5x4x4", "tc4xthreex4x2", "4x5x4x4+fold+combine",
                          "4x5x4x4+bulk", "4x5x4x4+untiled"}) {
    auto parsed = ParsePagedAttentionGeometry(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), "WARPSxSTAGES")) << parsed.status();
  }
}

// The kernels compile for sm_90a (they are not run here: no GPU in CI); kv_cache_write's copy
// is skipped when the result is given the pool's own buffer.
TEST(PagedKvOps, KernelsCompileUnderNvrtc) {
  Module m("m");
  Builder b(m.AddFunction("decode"));
  const DType bf16 = DType::kBF16;
  Node* pool = *b.Parameter("k_pool", {bf16, {4, 64, 8, 16, 128}});
  Node* rows = *b.Parameter("rows", {f32, {8, 8, 128}});
  Node* slots = *b.Parameter("slots", {i32, {8}});
  Node* q = *b.Parameter("q", {bf16, {8, 1, 32, 128}});
  Node* tables = *b.Parameter("tables", {i32, {8, 16}});
  Node* positions = *b.Parameter("positions", {i32, {8, 1}});
  Node* written = *b.Op(Opcode::kKvCacheWrite, {pool, rows, slots}, AttrMap{{"layer", int64_t{3}}});
  Node* o = *b.Op(Opcode::kPagedAttention, {q, written, written, tables, positions},
                  AttrMap{{"layer", int64_t{3}}, {"scale", 0.08838834764831845}});
  ASSERT_TRUE(b.Return({o, written}).ok());
  auto write = LowerNode(*written);
  ASSERT_TRUE(write.ok()) << write.status();
  ASSERT_EQ(write->kernels.size(), 2u);
  EXPECT_NE(write->kernels[0].source.find("PoolCopy<__nv_bfloat16"), std::string::npos) << write->kernels[0].source;
  auto attention = LowerNode(*o);
  ASSERT_TRUE(attention.ok()) << attention.status();
  // 8 sequences x 8 kv heads = 64 blocks would leave most of 132 SMs idle: the keys split
  // up to 4 blocks per SM (528 / 64 = 8, rounded down: one wave), but no split is shorter
  // than four KV blocks (16 / 4 = 4): 4 splits of a row's (at most 16) blocks. The bf16 pool
  // takes the tensor-core kernel: a block of 4 warps, each taking whole KV blocks (at most
  // one of its split's four) through 2 stages of K and V (2 x 2 x 16 x 128 bf16) of its own
  // shared memory; the last split of each row and kv head adds the splits' partials
  // (scratch: 64 x 4 x 4 heads x (128 + 2) floats; the counts of finished splits are the
  // module's 64: 8 rows, at most fold_max_rows); the tables and positions, parameters
  // nothing writes, are read before the grid-dependency wait (the template's last argument).
  ASSERT_EQ(attention->kernels.size(), 1u);
  EXPECT_EQ(attention->kernels[0].grid[0], 64u * 4u);
  EXPECT_EQ(attention->kernels[0].block[0], 128u);
  EXPECT_EQ(attention->kernels[0].shared_bytes, 4u * 2u * 2u * 16u * 128u * 2u + 16u * 4u + 4u * 4u * (128u + 2u) * 4u);
  EXPECT_NE(attention->kernels[0].source.find("PagedAttentionSplitMma<float, 8LL, 1LL, 32, 128, 3, 64LL, 8, "
                                              "16, 16, 4, 4, 2, true>"),
            std::string::npos)
      << attention->kernels[0].source;
  EXPECT_NE(attention->kernels[0].source.find("static __device__ unsigned int g_splits_done[64];"), std::string::npos);
  EXPECT_NE(attention->kernels[0].source.find("partials, g_splits_done)"), std::string::npos);
  EXPECT_EQ(attention->scratch_bytes, 64 * 4 * 4 * (128 + 2) * 4);
  EXPECT_TRUE(attention->kernels[0].waits_itself);
  // With the caller's promise that no kernel of the step writes the blocks before a row's
  // position's block (kiln's decode), their first copies go before the grid-dependency wait.
  CodegenOptions promised;
  promised.paged_attention.complete_blocks_step_invariant = true;
  auto early = LowerNode(*o, promised);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_NE(early->kernels[0].source.find("16, 16, 4, 4, 2, true, true>"), std::string::npos) << early->kernels[0].source;
  EXPECT_EQ(attention->kernels[0].source.find("2, true, true>"), std::string::npos);
  // Bulk copies: rows of 128 + 8 and a barrier a stage in shared memory.
  CodegenOptions bulk_options = promised;
  bulk_options.paged_attention.bulk_copies = true;
  auto bulk = LowerNode(*o, bulk_options);
  ASSERT_TRUE(bulk.ok()) << bulk.status();
  EXPECT_NE(bulk->kernels[0].source.find("16, 16, 4, 4, 2, true, true, true>"), std::string::npos)
      << bulk->kernels[0].source;
  EXPECT_EQ(bulk->kernels[0].shared_bytes,
            4u * 2u * 2u * 16u * 136u * 2u + 16u * 4u + 4u * 4u * (128u + 2u) * 4u + 4u * 2u * 8u);
  // The CUDA-core kernel: a block of 8 warps (few_rows_warps: 8 rows are at most
  // fold_max_rows) stages 5 KV blocks of K and V (5 x 2 x 16 x 128 bf16) for the whole block.
  CodegenOptions cuda_cores;
  cuda_cores.paged_attention.tensor_cores = false;
  auto scalar = LowerNode(*o, cuda_cores);
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  ASSERT_EQ(scalar->kernels.size(), 1u);
  EXPECT_EQ(scalar->kernels[0].grid[0], 64u * 4u);
  EXPECT_EQ(scalar->kernels[0].block[0], 256u);
  EXPECT_EQ(scalar->kernels[0].shared_bytes, 5u * 2u * 16u * 128u * 2u + 16u * 4u + 8u * 4u * (128u + 2u) * 4u);
  EXPECT_NE(scalar->kernels[0].source.find("PagedAttentionSplit<__nv_bfloat16, float, 8LL, 1LL, 32, 128, 3, 64LL, 8, "
                                           "16, 16, 8, 4, 5, true>"),
            std::string::npos)
      << scalar->kernels[0].source;
  EXPECT_EQ(scalar->scratch_bytes, attention->scratch_bytes);
  // More rows than fold_max_rows take the combine kernel, as does the fold turned off.
  CodegenOptions fewer_rows;
  fewer_rows.paged_attention.fold_max_rows = 4;
  auto past_fold = LowerNode(*o, fewer_rows);
  ASSERT_TRUE(past_fold.ok()) << past_fold.status();
  EXPECT_EQ(past_fold->kernels.size(), 2u);
  // Without the fold, a combine kernel after the split kernel adds the partials.
  CodegenOptions separate;
  separate.paged_attention.fold_combine = false;
  auto combined = LowerNode(*o, separate);
  ASSERT_TRUE(combined.ok()) << combined.status();
  ASSERT_EQ(combined->kernels.size(), 2u);
  EXPECT_EQ(combined->kernels[0].source.find("g_splits_done"), std::string::npos);
  EXPECT_NE(combined->kernels[1].source.find("PagedAttentionCombine<float, 8LL, 32, 128, 8, 4>"), std::string::npos);
  EXPECT_EQ(combined->scratch_bytes, attention->scratch_bytes);
  for (const LoweredNode* lowered : {&*write, &*attention, &*early, &*bulk, &*scalar, &*combined}) {
    for (const KernelSpec& k : lowered->kernels) {
      auto compiled = CompileKernel(k, NvrtcOptions{});
      ASSERT_TRUE(compiled.ok()) << compiled.status() << "\n" << k.source;
      EXPECT_FALSE(compiled->cubin.empty());
    }
  }
}

// At prefill (several query rows a sequence), the tensor-core kernel's block takes consecutive
// query rows of one sequence, as many as a power of two dividing the tokens whose heads fill
// at most the m16 tile: each K and V row it loads serves them all. Its partials, the fold and
// the combine kernel are laid out by those items.
TEST(PagedKvOps, PrefillBlocksTakeSeveralQueryRowsOfASequence) {
  struct Case {
    int64_t batch, tokens, group, max_blocks;
    int64_t query_rows, splits;
    bool combine_kernel;
  };
  // 8 kv heads. 132 SMs x 2 blocks = 264 blocks wanted; splits are at least 4 KV blocks.
  for (const Case& c : {
           // llama-M's heads (group 2): 8 rows a block, 2 x 512 / 8 x 8 kv heads = 1024 items, one split.
           Case{2, 512, 2, 64, 8, 1, false},
           // 20 tokens of a group of 4: 4 rows (20 = 4 x 5); 5 items a kv head: 264 / 40 = 6 splits
           // of up to 10 blocks, cut to ceil(10 / 4) = 3; 20 rows are past fold_max_rows.
           Case{1, 20, 4, 10, 4, 3, true},
           // 6 tokens of a group of 2: 2 rows (6 is no multiple of 4); 24 items, 264 / 24 = 11
           // splits (under 48 / 4 = 12); 6 rows fold the combine into the split kernel.
           Case{1, 6, 2, 48, 2, 11, false},
           // A group of 8 takes 2 rows: 256 items, one split. A group of 1 takes 16: 32 items, 2
           // splits of the 8 blocks, and the combine kernel.
           Case{1, 64, 8, 8, 2, 1, false},
           Case{1, 64, 1, 8, 16, 2, true},
       }) {
    SCOPED_TRACE(absl::StrCat(c.batch, " x ", c.tokens, ", group ", c.group));
    Module m("m");
    Builder b(m.AddFunction("prefill"));
    const DType bf16 = DType::kBF16;
    const int64_t kv_heads = 8;
    Node* pool = *b.Parameter("pool", {bf16, {1, 256, kv_heads, 16, 128}});
    Node* q = *b.Parameter("q", {bf16, {c.batch, c.tokens, kv_heads * c.group, 128}});
    Node* tables = *b.Parameter("tables", {i32, {c.batch, c.max_blocks}});
    Node* positions = *b.Parameter("positions", {i32, {c.batch, c.tokens}});
    Node* o = *b.Op(Opcode::kPagedAttention, {q, pool, pool, tables, positions},
                    AttrMap{{"layer", int64_t{0}}, {"scale", 0.088388}, {"out_dtype", Symbol{"bf16"}}});
    ASSERT_TRUE(b.Return({o}).ok());
    auto tiled = LowerNode(*o);
    ASSERT_TRUE(tiled.ok()) << tiled.status();
    const int64_t items = c.batch * c.tokens / c.query_rows * kv_heads;
    const int64_t item_rows = c.query_rows * c.group;
    EXPECT_EQ(tiled->kernels.at(0).grid[0], static_cast<uint32_t>(items * c.splits));
    EXPECT_TRUE(absl::StrContains(tiled->kernels[0].source, absl::StrCat(", ", c.query_rows, ">(out, q,")))
        << tiled->kernels[0].source;
    // The warps' partials are the item's rows: 4 warps x rows x (128 + 2) floats.
    const int64_t stages = std::clamp<int64_t>((((c.max_blocks + c.splits - 1) / c.splits + 3) / 4) + 1, 2, 3);
    EXPECT_EQ(tiled->kernels[0].shared_bytes,
              static_cast<uint32_t>(4 * stages * 2 * 16 * 128 * 2 + (c.max_blocks + 3) / 4 * 16 +
                                    4 * item_rows * 130 * 4));
    EXPECT_EQ(tiled->scratch_bytes, c.splits > 1 ? items * c.splits * item_rows * 130 * 4 : 0);
    ASSERT_EQ(tiled->kernels.size(), c.combine_kernel ? 2u : 1u);
    if (c.combine_kernel) {
      EXPECT_TRUE(absl::StrContains(tiled->kernels[1].source, absl::StrCat(", ", c.splits, ", ", c.query_rows, ">(out, partials)")))
          << tiled->kernels[1].source;
    } else if (c.splits > 1) {
      EXPECT_TRUE(absl::StrContains(tiled->kernels[0].source, "g_splits_done")) << tiled->kernels[0].source;
    }
    // "+untiled": a block a query row, as before.
    CodegenOptions untiled;
    untiled.paged_attention.query_tiles = false;
    auto rowwise = LowerNode(*o, untiled);
    ASSERT_TRUE(rowwise.ok()) << rowwise.status();
    EXPECT_FALSE(absl::StrContains(rowwise->kernels.at(0).source, absl::StrCat(", ", c.query_rows, ">(out, q,")));
    EXPECT_EQ(rowwise->kernels[0].grid[0] % static_cast<uint32_t>(c.batch * c.tokens * kv_heads), 0u);
    for (const LoweredNode* lowered : {&*tiled, &*rowwise}) {
      for (const KernelSpec& k : lowered->kernels) {
        auto compiled = CompileKernel(k, NvrtcOptions{.ptxas_info = true});
        ASSERT_TRUE(compiled.ok()) << compiled.status() << "\n" << k.source;
        EXPECT_TRUE(absl::StrContains(compiled->log, "0 bytes spill stores")) << compiled->log;
        const size_t used = compiled->log.find("Used");
        std::printf("[ %s %lld x %lld, group %lld ] %s\n", lowered == &*tiled ? "tiled" : "untiled",
                    static_cast<long long>(c.batch), static_cast<long long>(c.tokens), static_cast<long long>(c.group),
                    compiled->log.substr(used, compiled->log.find('\n', used) - used).c_str());
      }
    }
  }
}

// A geometry the split kernel cannot take is an error naming the node and the values, not a
// kernel that fails to compile or launch.
TEST(PagedKvOps, BadSplitGeometryIsAClearError) {
  Module m("m");
  Builder b(m.AddFunction("decode"));
  const DType bf16 = DType::kBF16;
  Node* pool = *b.Parameter("pool", {bf16, {1, 16, 2, 16, 128}});
  Node* q = *b.Parameter("q", {bf16, {2, 1, 4, 128}});
  Node* tables = *b.Parameter("tables", {i32, {2, 8}});
  Node* positions = *b.Parameter("positions", {i32, {2, 1}});
  Node* o = *b.Op(Opcode::kPagedAttention, {q, pool, pool, tables, positions},
                  AttrMap{{"layer", int64_t{0}}, {"scale", 0.125}});
  ASSERT_TRUE(b.Return({o}).ok());
  for (const CodegenOptions::PagedAttentionGeometry& bad :
       {CodegenOptions::PagedAttentionGeometry{.stages = 1}, CodegenOptions::PagedAttentionGeometry{.warps = 0},
        CodegenOptions::PagedAttentionGeometry{.min_split_blocks = 0},
        CodegenOptions::PagedAttentionGeometry{.warp_stages = 1}}) {
    CodegenOptions options;
    options.paged_attention = bad;
    auto lowered = LowerNode(*o, options);
    ASSERT_FALSE(lowered.ok());
    EXPECT_TRUE(absl::StrContains(lowered.status().message(), "CodegenOptions::paged_attention")) << lowered.status();
    EXPECT_TRUE(absl::StrContains(lowered.status().message(), "%")) << "names the node: " << lowered.status();
  }
  // 64 stages of 8 KB do not fit the target's shared memory (the CUDA-core kernel's, for
  // the block), nor do 32 warps of 2 stages each (the tensor-core kernel's, a warp's).
  CodegenOptions deep;
  deep.paged_attention.tensor_cores = false;
  deep.paged_attention.stages = 64;
  CodegenOptions wide;
  wide.paged_attention.warps = 32;
  for (const CodegenOptions& options : {deep, wide}) {
    auto lowered = LowerNode(*o, options);
    ASSERT_FALSE(lowered.ok());
    EXPECT_TRUE(absl::StrContains(lowered.status().message(), "shared memory")) << lowered.status();
  }
}

// The split kernels keep each head of the group's running output in registers (the CUDA-core
// kernel kVec floats a head a thread, the tensor-core kernel O's accumulator fragments): every
// GQA ratio kiln's presets and HF checkpoints use compiles without spilling, at head dims 64
// and 128, on either kernel (the tensor-core one with either way of copying).
TEST(PagedKvOps, PagedAttentionCompilesWithoutSpillsForEveryGroupSize) {
  for (const auto& [tensor_cores, bulk_copies] : {std::pair{true, false}, std::pair{true, true}, std::pair{false, false}}) {
  for (const int64_t head_dim : {64, 128}) {
    for (const int64_t group : {1, 2, 3, 4, 8}) {
      Module m("m");
      Builder b(m.AddFunction("decode"));
      const DType bf16 = DType::kBF16;
      const int64_t kv_heads = 4;
      Node* pool = *b.Parameter("pool", {bf16, {2, 64, kv_heads, 16, head_dim}});
      Node* q = *b.Parameter("q", {bf16, {32, 1, kv_heads * group, head_dim}});
      Node* tables = *b.Parameter("tables", {i32, {32, 48}});
      Node* positions = *b.Parameter("positions", {i32, {32, 1}});
      Node* o = *b.Op(Opcode::kPagedAttention, {q, pool, pool, tables, positions},
                      AttrMap{{"layer", int64_t{1}}, {"scale", 0.125}});
      ASSERT_TRUE(b.Return({o}).ok());
      CodegenOptions options;
      options.paged_attention.tensor_cores = tensor_cores;
      options.paged_attention.bulk_copies = bulk_copies;
      auto attention = LowerNode(*o, options);
      ASSERT_TRUE(attention.ok()) << attention.status();
      EXPECT_EQ(absl::StrContains(attention->kernels.at(0).source, "PagedAttentionSplitMma<"), tensor_cores);
      auto compiled = CompileKernel(attention->kernels.at(0), NvrtcOptions{.ptxas_info = true});
      ASSERT_TRUE(compiled.ok()) << compiled.status();
      EXPECT_TRUE(absl::StrContains(compiled->log, "0 bytes spill stores"))
          << "group " << group << ", head dim " << head_dim << ": " << compiled->log;
      const size_t used = compiled->log.find("Used");
      std::printf("[ %s group %lld head dim %lld ] %s\n",
                  tensor_cores ? (bulk_copies ? "tensor cores, bulk copies" : "tensor cores") : "CUDA cores",
                  static_cast<long long>(group), static_cast<long long>(head_dim),
                  compiled->log.substr(used, compiled->log.find('\n', used) - used).c_str());
    }
  }
  }
}
#endif

}  // namespace
}  // namespace kiln
