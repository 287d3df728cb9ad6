// ReadKernelResources against ptxas's own report (NVRTC's --ptxas-options=-v log) for kernels
// NVRTC compiles here without a GPU, and against files that are not whole cubins.
#include "codegen/cubin_info.h"

#include <cstring>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

#ifdef KILN_WITH_CUDA
#include "codegen/nvrtc_compiler.h"
#endif

namespace kiln {
namespace {

#ifdef KILN_WITH_CUDA

// ptxas's "Used N registers", "N bytes stack frame" and "N bytes smem" in an NVRTC log.
struct PtxasReport {
  int registers = -1;
  int64_t frame_bytes = -1;
  int64_t shared_bytes = 0;  // ptxas leaves "bytes smem" out where there is none
};

PtxasReport ParsePtxasLog(const std::string& log) {
  PtxasReport report;
  std::smatch m;
  if (std::regex_search(log, m, std::regex("Used ([0-9]+) registers"))) report.registers = std::stoi(m[1]);
  if (std::regex_search(log, m, std::regex("([0-9]+) bytes stack frame"))) report.frame_bytes = std::stoll(m[1]);
  if (std::regex_search(log, m, std::regex("([0-9]+) bytes smem"))) report.shared_bytes = std::stoll(m[1]);
  return report;
}

KernelSpec Kernel(const std::string& name, const std::string& body) {
  KernelSpec spec;
  spec.name = name;
  spec.source = "extern \"C\" __global__ void " + name + body;
  return spec;
}

// Three kernels that differ where the reader looks: a few registers and no shared memory;
// a 3 KB __shared__ array; a local array indexed by a runtime value (a stack frame).
std::vector<KernelSpec> Kernels() {
  return {
      Kernel("k_axpy", "(float* y, const float* x, float a, int n) {\n"
                       "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                       "  if (i < n) y[i] = a * x[i] + y[i];\n}\n"),
      Kernel("k_shared_sum", "(float* out, const float* x) {\n"
                             "  __shared__ float tile[768];\n"
                             "  for (int i = threadIdx.x; i < 768; i += blockDim.x) tile[i] = x[blockIdx.x * 768 + i];\n"
                             "  __syncthreads();\n"
                             "  if (threadIdx.x == 0) { float s = 0; for (int i = 0; i < 768; ++i) s += tile[i]; out[blockIdx.x] = s; }\n}\n"),
      Kernel("k_local_array", "(float* out, const float* x, const int* index) {\n"
                              "  float local[64] = {};\n"
                              "  for (int i = 0; i < 256; ++i) local[index[i] & 63] += x[i * 32 + threadIdx.x];\n"
                              "  out[threadIdx.x] = local[index[threadIdx.x] & 63];\n}\n"),
  };
}

// sm_90a and sm_80: their cubins lay static shared memory out differently (cubin_info.cc).
TEST(CubinInfo, MatchesPtxasReport) {
  for (const char* arch : {"sm_90a", "sm_80"}) {
    for (const KernelSpec& spec : Kernels()) {
      SCOPED_TRACE(absl::StrCat(spec.name, " for ", arch));
      absl::StatusOr<CompiledKernel> compiled = CompileKernel(spec, NvrtcOptions{.arch = arch, .ptxas_info = true});
      ASSERT_TRUE(compiled.ok()) << compiled.status();
      const PtxasReport ptxas = ParsePtxasLog(compiled->log);
      ASSERT_GT(ptxas.registers, 0) << "no register count in ptxas's log:\n" << compiled->log;
      ASSERT_GE(ptxas.frame_bytes, 0) << "no stack frame in ptxas's log:\n" << compiled->log;
      absl::StatusOr<KernelResources> read = ReadKernelResources(compiled->cubin, spec.name);
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(read->registers, ptxas.registers) << compiled->log;
      EXPECT_EQ(read->frame_bytes, ptxas.frame_bytes) << compiled->log;
      EXPECT_EQ(read->static_shared_bytes, ptxas.shared_bytes) << compiled->log;
      EXPECT_EQ(read->static_shared_bytes, spec.name == "k_shared_sum" ? 768 * 4 : 0);
      if (spec.name == "k_local_array") {
        EXPECT_GE(read->frame_bytes, 64 * 4) << "the local array lives in a frame";
      }
    }
  }
}

TEST(CubinInfo, UnknownKernelIsNotFound) {
  absl::StatusOr<CompiledKernel> compiled = CompileKernel(Kernels()[0], NvrtcOptions{});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  absl::StatusOr<KernelResources> read = ReadKernelResources(compiled->cubin, "k_not_there");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound) << read.status();
  EXPECT_NE(read.status().message().find("k_not_there"), std::string::npos);
}

// Every prefix of a real cubin, and a copy with any byte of its ELF or section headers flipped,
// is an error or a result: never a read past the end, nor a loop over a size the file lacks.
TEST(CubinInfo, CutOrDamagedCubinIsAnErrorNotACrash) {
  absl::StatusOr<CompiledKernel> compiled = CompileKernel(Kernels()[1], NvrtcOptions{});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const std::string& cubin = compiled->cubin;
  int errors = 0;
  for (size_t length = 0; length < cubin.size(); length += 1 + length / 64) {
    absl::StatusOr<KernelResources> read = ReadKernelResources(cubin.substr(0, length), "k_shared_sum");
    errors += !read.ok();
  }
  EXPECT_GT(errors, 0);
  EXPECT_FALSE(ReadKernelResources(cubin.substr(0, 63), "k_shared_sum").ok()) << "a header cut short";
  // The ELF header, then every byte of the section headers (offsets, sizes, types, links).
  uint64_t section_headers = 0;
  std::memcpy(&section_headers, cubin.data() + 0x28, sizeof(section_headers));
  ASSERT_LT(section_headers, cubin.size());
  for (size_t at = 0; at < cubin.size(); at = at + 1 == 64 ? section_headers : at + 1) {
    std::string damaged = cubin;
    damaged[at] = static_cast<char>(damaged[at] ^ 0xff);
    (void)ReadKernelResources(damaged, "k_shared_sum");
  }
  absl::StatusOr<KernelResources> text = ReadKernelResources("not a cubin at all", "k_shared_sum");
  EXPECT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("not an ELF file"), std::string::npos) << text.status();
}

#else
TEST(CubinInfo, NeedsTheCudaToolkit) { GTEST_SKIP() << "built without the CUDA toolkit: no NVRTC to make a cubin"; }
#endif  // KILN_WITH_CUDA

}  // namespace
}  // namespace kiln
