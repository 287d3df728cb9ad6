// Delayed scaling's three ops on the GPU (kernels/fp8.cuh through codegen/lower_fp8.cc)
// against the CPU reference backend, bit for bit: every element equal with the same sign
// (-0 is not +0), NaN where the reference has NaN (a NaN's payload and sign are not
// compared: the reference holds values, not bits). The arena is poisoned (0xFF bytes, NaN in
// every float width) so that an element a kernel forgets to write shows.
//   fp8_quantize    f32, bf16 and f16 inputs into e4m3 and e5m2, with and without q_t, on
//                   odd shapes (partial tiles, the scalar paths), 16-byte rows and a
//                   [4096, 2048] tensor; values from far below the format's smallest
//                   subnormal to far past its largest (saturating), exact ties, ±0, ±inf,
//                   NaN, f32's largest and subnormals; scales from the clamps at ±64 to NaN
//                   and fractional exponents; zero tensors; an empty one; results left
//                   unread (their kernels' null outputs); the amax of a second run on the
//                   same executable (it starts from zero every run); with update_state, the
//                   next state over the state in place, run after run.
//   fp8_dequantize  every byte of both formats into f32, bf16 and f16 with power-of-two and
//                   other scale_invs (the product rounded once), overflow, subnormal, NaN.
//   fp8_scale_update  a normal amax, inf and NaN amaxes (overflow), zero histories, margins
//                   0, 1 and 4, L = 1, 16 and 1024, both formats, odd states (NaN and
//                   out-of-range exponents, NaN and negative history entries), tiny and huge
//                   amaxes (the exponent's clamps).
// Without a GPU every test skips, saying why, but the one that compiles every function
// above into a program (codegen, NVRTC, the plan) and evaluates it on the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/compile_program.h"
#include "frontends/gpu_compile.h"
#include "ir/builder.h"
#include "ir/numerics.h"
#include "ir/reference_backend.h"
#include "runtime/cuda/executable.h"
#include "tests/testing/gpu.h"

namespace kiln {
namespace {

constexpr DType kF32 = DType::kF32, kBF16 = DType::kBF16, kF16 = DType::kF16, kE4M3 = DType::kF8E4M3,
                kE5M2 = DType::kF8E5M2;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

CudaDevice* Device() { return testing::TestDevice(); }

// Empty when `got` is `want` bit for bit (NaN for NaN); else the count and the first few.
std::string BitMismatches(const HostTensor& got, const HostTensor& want) {
  if (got.type() != want.type()) return absl::StrCat("type ", got.type().ToString(), " vs ", want.type().ToString());
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::isnan(w) ? std::isnan(g) : (g == w && std::signbit(g) == std::signbit(w));
    if (ok) continue;
    if (++bad <= 5) absl::StrAppend(&first, "\n  [", i, "] gpu ", g, " reference ", w);
  }
  return bad == 0 ? "" : absl::StrCat(bad, " of ", want.num_elements(), " elements differ:", first);
}

// f's outputs for `args` on the reference and on `exe` (compiled from f), compared.
void ExpectRunMatchesReference(const Function& f, CudaExecutable& exe, const std::vector<HostTensor>& args) {
  absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
  ASSERT_TRUE(want.ok()) << want.status();
  for (size_t i = 0; i < args.size(); ++i) ASSERT_TRUE(exe.SetInput(static_cast<int64_t>(i), args[i]).ok());
  ASSERT_TRUE(exe.Run().ok());
  for (size_t o = 0; o < want->size(); ++o) {
    absl::StatusOr<HostTensor> got = exe.Output(static_cast<int>(o));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(BitMismatches(*got, (*want)[o]), "")
        << "@" << f.name() << " output " << o << " (%" << f.outputs()[o]->name() << ")";
  }
}

std::unique_ptr<CudaExecutable> Compile(const Function& f) {
  absl::StatusOr<std::unique_ptr<CudaExecutable>> exe = CompileForGpu(f, *Device(), {.poison_arena = true});
  EXPECT_TRUE(exe.ok()) << exe.status();
  return exe.ok() ? *std::move(exe) : nullptr;
}

// ---- fp8_quantize -----------------------------------------------------------------------

// Which results the function returns (the others' buffers are not planned: null outputs).
enum class Returned { kAll, kQTransposedAndAmax, kQOnly };

// @quantize(x, state) returning `returned` of fp8_quantize's results.
std::unique_ptr<Function> QuantizeFunction(TensorType x, DType format, bool transposed, Returned returned,
                                           int64_t history = 4) {
  auto f = std::make_unique<Function>("quantize");
  Builder b(f.get());
  Node* xp = *b.Parameter("x", std::move(x));
  Node* state = *b.Parameter("state", {kF32, {history + 2}});
  AttrMap attrs{{"out_dtype", Symbol{std::string(DTypeName(format))}}};
  if (transposed) attrs.Set("transposed", int64_t{1});
  std::vector<std::string> names = {"q", "amax", "scale_inv"};
  if (transposed) names.push_back("q_t");
  absl::StatusOr<std::vector<Node*>> r = b.MultiResultOp(Opcode::kFp8Quantize, {xp, state}, attrs, names);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return f;
  std::vector<Node*> outputs = *r;
  if (returned == Returned::kQTransposedAndAmax) outputs = {(*r)[3], (*r)[1]};
  if (returned == Returned::kQOnly) outputs = {(*r)[0]};
  EXPECT_TRUE(b.Return(outputs).ok());
  return f;
}

// A state whose exponent element is `e` (any float: floor and clamp are the op's).
HostTensor State(double e, int64_t history = 4) {
  std::vector<double> v(history + 2, 0.0);
  v[0] = e;
  for (int64_t i = 2; i < history + 2; ++i) v[i] = 0.5 * static_cast<double>(i);
  return HostTensor::FromValues({kF32, {history + 2}}, std::move(v));
}

enum class Values { kWide, kWideWithNaN, kZeros };

// x for a scale 2^e: magnitudes 2^k with x 2^e from 2^-22 (far below e5m2's smallest
// subnormal) to 2^18 (past e5m2's largest), half of them with 5-bit significands (exact ties
// between fp8 neighbours), mixed signs; the first elements special: ±0, ±inf, the formats'
// largest values and the ties above them, f32's largest (x 2^64 overflows f32) and a
// subnormal; with kWideWithNaN, NaNs among them.
HostTensor QuantizeInput(const TensorType& type, uint64_t seed, int e, Values values) {
  std::vector<double> v(type.num_elements(), 0.0);
  if (values == Values::kZeros) {
    for (size_t i = 0; i < v.size(); i += 3) v[i] = -0.0;
    return HostTensor::FromValues(type, std::move(v));
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> exponent(-22, 18), bits(0, 31), coin(0, 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (size_t i = 0; i < v.size(); ++i) {
    const double significand = coin(rng) ? 1.0 + bits(rng) / 32.0 : 1.0 + unit(rng);
    v[i] = (coin(rng) ? -1.0 : 1.0) * std::ldexp(significand, exponent(rng) - e);
  }
  const double scale_inv = std::ldexp(1.0, -e);
  const std::vector<double> specials = {0.0,
                                        -0.0,
                                        kInf,
                                        -kInf,
                                        448 * scale_inv,
                                        464 * scale_inv,
                                        -480 * scale_inv,
                                        57344 * scale_inv,
                                        61440 * scale_inv,
                                        0x1.fffffep127,
                                        -0x1p-130,
                                        0x1p-10 * scale_inv,
                                        0x1.8p-10 * scale_inv,
                                        0x1p-17 * scale_inv};
  for (size_t i = 0; i < specials.size() && i < v.size(); ++i) v[(i * 7919) % v.size()] = specials[i];
  if (values == Values::kWideWithNaN) {
    for (size_t i = v.size() / 3; i < v.size(); i += v.size() / 2 + 1) v[i] = i % 2 ? kNaN : -kNaN;
  }
  return HostTensor::FromValues(type, std::move(v));
}

struct QuantizeCase {
  std::vector<int64_t> dims;
  DType x, format;
  bool transposed;
};

std::vector<QuantizeCase> QuantizeCases() {
  std::vector<QuantizeCase> cases;
  const std::vector<std::vector<int64_t>> shapes = {{3, 5, 7},   {257, 130}, {33},    {1},
                                                    {2, 12, 36}, {128, 256}, {20, 1}, {4096, 2048}};
  for (size_t s = 0; s < shapes.size(); ++s) {
    int d = 0;
    for (DType x : {kF32, kBF16, kF16}) {
      ++d;
      if (shapes[s][0] == 4096 && x == kF16) continue;  // the large shape in f32 and bf16 only
      for (int transposed : {0, 1}) {
        // The formats alternate so that each shape and dtype meets both, with q_t and without.
        cases.push_back({shapes[s], x, (s + d + transposed) % 2 ? kE5M2 : kE4M3, transposed == 1});
      }
    }
  }
  return cases;
}

TEST(GpuFp8, QuantizeMatchesTheReference) {
  KILN_REQUIRE_GPU();
  for (const QuantizeCase& c : QuantizeCases()) {
    const TensorType x{c.x, c.dims};
    SCOPED_TRACE(absl::StrCat(x.ToString(), " -> ", DTypeName(c.format), c.transposed ? " transposed" : ""));
    const std::unique_ptr<Function> f = QuantizeFunction(x, c.format, c.transposed, Returned::kAll);
    const std::unique_ptr<CudaExecutable> exe = Compile(*f);
    ASSERT_NE(exe, nullptr);
    // Scales: 1, a fractional exponent (floor), negative ones, the clamps, NaN (scale 1).
    struct Run {
      double state_e;
      int e;  // what the op makes of it
      Values values;
    };
    for (const Run& run : {Run{0, 0, Values::kWide}, Run{2.7, 2, Values::kWideWithNaN}, Run{-0.5, -1, Values::kWide},
                           Run{-9, -9, Values::kWide}, Run{100, 64, Values::kWide}, Run{-1e9, -64, Values::kWide},
                           Run{kNaN, 0, Values::kWide}, Run{3, 3, Values::kZeros}}) {
      SCOPED_TRACE(absl::StrCat("state[0] = ", run.state_e));
      ExpectRunMatchesReference(*f, *exe, {QuantizeInput(x, 17 + run.e, run.e, run.values), State(run.state_e)});
    }
  }
}

// The amax is zeroed by every run: a run of small values after one of large ones (and after
// one with NaNs) reports the small values' max.
TEST(GpuFp8, QuantizeAmaxStartsFromZeroEveryRun) {
  KILN_REQUIRE_GPU();
  for (bool transposed : {false, true}) {
    const TensorType x{kBF16, {257, 130}};
    const std::unique_ptr<Function> f = QuantizeFunction(x, kE4M3, transposed, Returned::kAll);
    const std::unique_ptr<CudaExecutable> exe = Compile(*f);
    ASSERT_NE(exe, nullptr);
    ExpectRunMatchesReference(*f, *exe, {QuantizeInput(x, 1, 0, Values::kWideWithNaN), State(0)});
    ExpectRunMatchesReference(*f, *exe, {QuantizeInput(x, 2, 0, Values::kWide), State(0)});
    ExpectRunMatchesReference(*f, *exe, {HostTensor::Random(x, 3, -0.25, 0.125), State(0)});
    ExpectRunMatchesReference(*f, *exe, {QuantizeInput(x, 4, 0, Values::kZeros), State(0)});
  }
}

// Results the function does not return get no buffer: the kernels skip their null outputs
// and still write the rest.
TEST(GpuFp8, QuantizeWritesOnlyTheResultsRead) {
  KILN_REQUIRE_GPU();
  for (const TensorType& x : {TensorType{kF32, {3, 5, 7}}, TensorType{kBF16, {128, 256}}}) {
    for (Returned returned : {Returned::kQTransposedAndAmax, Returned::kQOnly}) {
      const bool transposed = returned == Returned::kQTransposedAndAmax;
      SCOPED_TRACE(absl::StrCat(x.ToString(), transposed ? " q_t and amax" : " q only"));
      const std::unique_ptr<Function> f = QuantizeFunction(x, kE5M2, transposed, returned);
      const std::unique_ptr<CudaExecutable> exe = Compile(*f);
      ASSERT_NE(exe, nullptr);
      ExpectRunMatchesReference(*f, *exe, {QuantizeInput(x, 5, 1, Values::kWide), State(1)});
    }
  }
}

// No elements: amax 0 and scale_inv 2^-e all the same.
TEST(GpuFp8, QuantizeOfAnEmptyTensor) {
  KILN_REQUIRE_GPU();
  const TensorType x{kBF16, {0, 8}};
  const std::unique_ptr<Function> f = QuantizeFunction(x, kE4M3, /*transposed=*/true, Returned::kAll);
  const std::unique_ptr<CudaExecutable> exe = Compile(*f);
  ASSERT_NE(exe, nullptr);
  ExpectRunMatchesReference(*f, *exe, {HostTensor(x), State(-5)});
}

// ---- fp8_quantize {update_state=1} (fuse-fp8-scale-update's) ---------------------------

// @quantize_update(x, state) -> every result, the next state donated to the state (written
// over it by the last block).
std::unique_ptr<Function> QuantizeUpdateFunction(TensorType x, DType format, bool transposed, int64_t history,
                                                 int64_t margin) {
  auto f = std::make_unique<Function>("quantize_update");
  Builder b(f.get());
  Node* xp = *b.Parameter("x", std::move(x));
  Node* state = *b.Parameter("state", {kF32, {history + 2}});
  AttrMap attrs{{"out_dtype", Symbol{std::string(DTypeName(format))}}, {"update_state", int64_t{1}},
                {"margin", margin}};
  if (transposed) attrs.Set("transposed", int64_t{1});
  absl::StatusOr<std::vector<Node*>> r = b.MultiResultOp(Opcode::kFp8Quantize, {xp, state}, attrs);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return f;
  std::vector<int64_t> aliases(r->size(), -1);
  aliases.back() = 1;
  EXPECT_TRUE(b.Return(*r, aliases).ok());
  return f;
}

// Run after run on one executable, each run's state the last one's next state: the results
// and the next state bit for bit the reference's (so the module-scope max and block count
// start from zero every launch, and the state is overwritten only after every block read
// it), through growing and shrinking amaxes, NaNs (an overflow) and zeros; the next state
// takes the state's buffer.
TEST(GpuFp8, QuantizeThatUpdatesTheStateMatchesTheReferenceRunAfterRun) {
  KILN_REQUIRE_GPU();
  struct Case {
    TensorType x;
    DType format;
    bool transposed;
    int64_t history, margin;
  };
  for (const Case& c : {Case{{kBF16, {257, 130}}, kE5M2, false, 16, 0}, Case{{kBF16, {4096, 2048}}, kE4M3, true, 16, 1},
                        Case{{kF32, {3, 5, 7}}, kE4M3, true, 1, 0}, Case{{kF32, {1024, 768}}, kE4M3, true, 16, 0},
                        Case{{kF16, {33}}, kE5M2, false, 4, 2}, Case{{kBF16, {0, 8}}, kE4M3, true, 16, 0}}) {
    SCOPED_TRACE(absl::StrCat(c.x.ToString(), " -> ", DTypeName(c.format), c.transposed ? " transposed" : "",
                              ", L = ", c.history, ", margin ", c.margin));
    const std::unique_ptr<Function> f = QuantizeUpdateFunction(c.x, c.format, c.transposed, c.history, c.margin);
    const std::unique_ptr<CudaExecutable> exe = Compile(*f);
    ASSERT_NE(exe, nullptr);
    EXPECT_EQ(exe->buffer_plan().in_place_outputs, 1);
    HostTensor state(TensorType{kF32, {c.history + 2}});  // zeros: scale 1, no history
    const std::vector<HostTensor> inputs = {
        HostTensor::Random(c.x, 1, -1.0, 1.0),           HostTensor::Random(c.x, 2, -300.0, 200.0),
        QuantizeInput(c.x, 3, 0, Values::kWideWithNaN),  HostTensor::Random(c.x, 4, -1e-3, 1e-3),
        QuantizeInput(c.x, 5, -4, Values::kZeros),       HostTensor::Random(c.x, 6, -0.5, 0.25),
        HostTensor::Random(c.x, 7, -40.0, 40.0)};
    for (size_t run = 0; run < inputs.size(); ++run) {
      SCOPED_TRACE(absl::StrCat("run ", run));
      ExpectRunMatchesReference(*f, *exe, {inputs[run], state});
      absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(*f, {inputs[run], state});
      ASSERT_TRUE(want.ok()) << want.status();
      state = want->back();
    }
  }
}

// ---- fp8_dequantize ---------------------------------------------------------------------

std::unique_ptr<Function> DequantizeFunction(TensorType q, DType out) {
  auto f = std::make_unique<Function>("dequantize");
  Builder b(f.get());
  Node* qp = *b.Parameter("q", std::move(q));
  Node* s = *b.Parameter("scale_inv", {kF32, {}});
  absl::StatusOr<Node*> d = b.Op(Opcode::kFp8Dequantize, {qp, s}, {{"out_dtype", Symbol{std::string(DTypeName(out))}}});
  EXPECT_TRUE(d.ok()) << d.status();
  if (d.ok()) {
    EXPECT_TRUE(b.Return({*d}).ok());
  }
  return f;
}

// Every byte of the format, over and over, from a seeded start.
HostTensor EveryFp8Value(const TensorType& type, uint64_t seed) {
  std::vector<double> v(type.num_elements());
  for (size_t i = 0; i < v.size(); ++i) {
    const uint8_t bits = static_cast<uint8_t>(i * 37 + seed);
    v[i] = type.dtype == kE4M3 ? F8E4M3BitsToFloat(bits) : F8E5M2BitsToFloat(bits);
  }
  return HostTensor::FromValues(type, std::move(v));
}

TEST(GpuFp8, DequantizeMatchesTheReference) {
  KILN_REQUIRE_GPU();
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{3, 5, 7}, {257, 130}, {4096, 2048}, {16}}) {
    for (DType q : {kE4M3, kE5M2}) {
      for (DType out : {kF32, kBF16, kF16}) {
        const TensorType qt{q, dims};
        SCOPED_TRACE(absl::StrCat(qt.ToString(), " -> ", DTypeName(out)));
        const std::unique_ptr<Function> f = DequantizeFunction(qt, out);
        const std::unique_ptr<CudaExecutable> exe = Compile(*f);
        ASSERT_NE(exe, nullptr);
        // Powers of two (exact unless the result overflows or leaves the range), others (the
        // product rounded once), f32's smallest normal and a subnormal, NaN.
        for (double s : {1.0, 0x1p-5, 0x1p20, 0x1p-64, 0x1p64, 0.1, 3.0, -0x1.fffffep-3, 0x1p-126, 0x1.8p-140, kNaN}) {
          SCOPED_TRACE(absl::StrCat("scale_inv ", s));
          ExpectRunMatchesReference(
              *f, *exe, {EveryFp8Value(qt, static_cast<uint64_t>(dims[0])), HostTensor::FromValues({kF32, {}}, {s})});
        }
      }
    }
  }
}

// A quantize feeding a dequantize (its transposed copy), as a GEMM's fallback would read it.
TEST(GpuFp8, QuantizeThenDequantize) {
  KILN_REQUIRE_GPU();
  Function f("round_trip");
  Builder b(&f);
  const TensorType x{kBF16, {257, 130}};
  Node* xp = *b.Parameter("x", x);
  Node* state = *b.Parameter("state", {kF32, {6}});
  absl::StatusOr<std::vector<Node*>> q =
      b.MultiResultOp(Opcode::kFp8Quantize, {xp, state}, {{"out_dtype", Symbol{"f8e4m3"}}, {"transposed", int64_t{1}}});
  ASSERT_TRUE(q.ok()) << q.status();
  absl::StatusOr<Node*> d = b.Op(Opcode::kFp8Dequantize, {(*q)[3], (*q)[2]}, {{"out_dtype", Symbol{"bf16"}}});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(b.Return({*d, (*q)[1]}).ok());
  const std::unique_ptr<CudaExecutable> exe = Compile(f);
  ASSERT_NE(exe, nullptr);
  ExpectRunMatchesReference(f, *exe, {QuantizeInput(x, 9, 4, Values::kWide), State(4)});
}

// ---- fp8_scale_update -------------------------------------------------------------------

std::unique_ptr<Function> ScaleUpdateFunction(int64_t history, DType format, int64_t margin) {
  auto f = std::make_unique<Function>("scale_update");
  Builder b(f.get());
  Node* state = *b.Parameter("state", {kF32, {history + 2}});
  Node* amax = *b.Parameter("amax", {kF32, {}});
  absl::StatusOr<Node*> next = b.Op(Opcode::kFp8ScaleUpdate, {state, amax},
                                    {{"fp8_format", Symbol{std::string(DTypeName(format))}}, {"margin", margin}});
  EXPECT_TRUE(next.ok()) << next.status();
  if (next.ok()) {
    EXPECT_TRUE(b.Return({*next}).ok());
  }
  return f;
}

struct StateRun {
  std::string what;
  double e, overflows;
  double amax;
  // History entries (newest first) before the random rest; `random` fills the rest with
  // positive values below 2^k for k from -30 to 30, or zeros.
  std::vector<double> first;
  bool random = true;
};

HostTensor StateFor(const StateRun& run, int64_t history, uint64_t seed) {
  std::vector<double> v(history + 2, 0.0);
  v[0] = run.e;
  v[1] = run.overflows;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (int64_t i = 0; i < history; ++i) {
    double& h = v[2 + i];
    if (i < static_cast<int64_t>(run.first.size())) {
      h = run.first[i];
    } else if (run.random) {
      h = std::ldexp(unit(rng), exponent(rng));
    }
  }
  return HostTensor::FromValues({kF32, {history + 2}}, std::move(v));
}

TEST(GpuFp8, ScaleUpdateMatchesTheReference) {
  KILN_REQUIRE_GPU();
  const std::vector<StateRun> runs = {
      {"normal amax", 3, 0, 3.7, {}},
      {"normal amax, the newest the largest", -2, 1, 1e6, {}},
      {"an amax on the format's largest", 0, 0, 448, {}, false},
      {"an amax just past it", 0, 0, 448.00003, {}, false},
      {"e5m2's largest", 0, 0, 57344, {}, false},
      {"inf amax", 3, 2, kInf, {}},
      {"-inf amax", -64, 0, -kInf, {}},
      {"NaN amax", 5.5, 7, kNaN, {}},
      {"zero history and amax", 7, 0, 0, {}, false},
      {"zero history, negative amax", -3, 0, -1.5, {}, false},
      {"a tiny amax (the +64 clamp)", 0, 0, 0x1p-140, {}, false},
      {"a huge amax (the -64 clamp)", 0, 0, 0x1.fffffep127, {}, false},
      {"NaN and negative history entries", 1, 0, 0.25, {kNaN, -8, 2}},
      {"NaN and out-of-range exponents", kNaN, 0, kInf, {}},
      {"an exponent past the clamp", 1e9, 3, kNaN, {}},
      {"a fractional exponent, zero amax", -7.25, 0, 0, {}, false},
  };
  struct Config {
    int64_t history;
    DType format;
    int64_t margin;
  };
  for (const Config& c : {Config{1, kE4M3, 0}, Config{16, kE4M3, 1}, Config{16, kE5M2, 0}, Config{1024, kE5M2, 4},
                          Config{300, kE4M3, 0}}) {
    SCOPED_TRACE(absl::StrCat("L = ", c.history, ", ", DTypeName(c.format), ", margin ", c.margin));
    const std::unique_ptr<Function> f = ScaleUpdateFunction(c.history, c.format, c.margin);
    const std::unique_ptr<CudaExecutable> exe = Compile(*f);
    ASSERT_NE(exe, nullptr);
    uint64_t seed = 0;
    for (const StateRun& run : runs) {
      SCOPED_TRACE(run.what);
      ExpectRunMatchesReference(*f, *exe,
                                {StateFor(run, c.history, ++seed), HostTensor::FromValues({kF32, {}}, {run.amax})});
    }
  }
}

// ---- without a GPU ----------------------------------------------------------------------

// Every function the tests above run compiles into a program for sm_90a (the kernels, the
// plan, null outputs for the results left unread) and runs on the reference with their
// inputs: what CI checks of them without a device.
TEST(GpuFp8, TheFunctionsCompileWithoutAGpu) {
  auto check = [](const Function& f, const std::vector<HostTensor>& args) {
    SCOPED_TRACE(f.name());
    absl::StatusOr<CompiledProgram> program = CompileProgram(f, {});
    EXPECT_TRUE(program.ok()) << program.status();
    absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
    EXPECT_TRUE(want.ok()) << want.status();
  };
  for (const QuantizeCase& c : QuantizeCases()) {
    const TensorType x{c.x, c.dims};
    SCOPED_TRACE(absl::StrCat(x.ToString(), " -> ", DTypeName(c.format), c.transposed ? " transposed" : ""));
    check(*QuantizeFunction(x, c.format, c.transposed, Returned::kAll),
          {QuantizeInput(x, 1, 3, Values::kWideWithNaN), State(3)});
  }
  const TensorType small{kF32, {3, 5, 7}};
  for (Returned returned : {Returned::kQTransposedAndAmax, Returned::kQOnly}) {
    check(*QuantizeFunction(small, kE5M2, returned == Returned::kQTransposedAndAmax, returned),
          {QuantizeInput(small, 5, 1, Values::kWide), State(1)});
  }
  const TensorType empty{kBF16, {0, 8}};
  check(*QuantizeFunction(empty, kE4M3, /*transposed=*/true, Returned::kAll), {HostTensor(empty), State(-5)});
  for (bool transposed : {false, true}) {
    const TensorType x{kBF16, {257, 130}};
    const std::unique_ptr<Function> f = QuantizeUpdateFunction(x, kE5M2, transposed, 16, 1);
    check(*f, {QuantizeInput(x, 2, 0, Values::kWide), State(0, 16)});
    absl::StatusOr<CompiledProgram> program = CompileProgram(*f, {});
    ASSERT_TRUE(program.ok()) << program.status();
    EXPECT_EQ(program->plan.in_place_outputs, 1);  // the next state over the state
    EXPECT_EQ(program->num_launches, 1);
  }
  for (DType out : {kF32, kBF16, kF16}) {
    const TensorType q{kE5M2, {257, 130}};
    check(*DequantizeFunction(q, out), {EveryFp8Value(q, 1), HostTensor::FromValues({kF32, {}}, {0.1})});
  }
  for (int64_t history : {1, 16, 1024}) {
    const StateRun run{"NaN and negative history entries", kNaN, 0, 0.25, {kNaN, -8, 2}};
    check(*ScaleUpdateFunction(history, kE4M3, 1),
          {StateFor(run, history, 1), HostTensor::FromValues({kF32, {}}, {run.amax})});
  }
}

}  // namespace
}  // namespace kiln
