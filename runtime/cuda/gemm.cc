#include "runtime/cuda/gemm.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/lower_node.h"
#include "ir/builder.h"
#include "ir/status_macros.h"
#include "runtime/cuda/cuda_status.h"

namespace kiln {
namespace {

constexpr int64_t kAlignment = 256;
// What cuBLASLt may use for its split-K and stream-K variants (NVIDIA suggests 32 MiB on
// Hopper). The heuristic reports how much its chosen algorithm needs; only that is planned.
constexpr uint64_t kMaxWorkspaceBytes = 32u << 20;

int64_t RoundUp(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// How an operand's non-unit dims sit in memory, if they form [batch, free, contract] or
// [batch, contract, free] runs.
struct OperandView {
  bool fits = false;
  bool k_inner = true;
  std::vector<int64_t> contract_order;  // positions in the contract list, in memory order
};

OperandView ViewOperand(const std::vector<int64_t>& dims, const std::vector<int64_t>& batch,
                        const std::vector<int64_t>& contract) {
  OperandView view;
  std::string runs;  // one letter per run of dims: B(atch), F(ree), C(ontract)
  int64_t last_batch = -1;
  bool batch_in_order = true;
  for (int64_t d = 0; d < static_cast<int64_t>(dims.size()); ++d) {
    if (dims[d] == 1) continue;
    char group = 'F';
    if (auto it = std::find(batch.begin(), batch.end(), d); it != batch.end()) {
      group = 'B';
      const int64_t j = it - batch.begin();
      batch_in_order &= j > last_batch;
      last_batch = j;
    } else if (auto it = std::find(contract.begin(), contract.end(), d); it != contract.end()) {
      group = 'C';
      view.contract_order.push_back(it - contract.begin());
    }
    if (runs.empty() || runs.back() != group) runs.push_back(group);
  }
  static const char* const kFitting[] = {"", "B", "F", "C", "BF", "BC", "FC", "CF", "BFC", "BCF"};
  view.fits = batch_in_order && std::find(std::begin(kFitting), std::end(kFitting), runs) != std::end(kFitting);
  view.k_inner = runs.find("CF") == std::string::npos;
  return view;
}

// The transpose that makes an operand [batch (listed order), free, contract (in `order`,
// then any contract dims of size 1)].
std::vector<int64_t> CanonicalPermutation(int64_t rank, const std::vector<int64_t>& batch,
                                          const std::vector<int64_t>& contract, const std::vector<int64_t>& order) {
  std::vector<int64_t> perm = batch;
  for (int64_t d = 0; d < rank; ++d) {
    if (std::find(batch.begin(), batch.end(), d) == batch.end() &&
        std::find(contract.begin(), contract.end(), d) == contract.end()) {
      perm.push_back(d);
    }
  }
  for (int64_t j : order) perm.push_back(contract[j]);
  for (int64_t j = 0; j < static_cast<int64_t>(contract.size()); ++j) {
    if (std::find(order.begin(), order.end(), j) == order.end()) perm.push_back(contract[j]);
  }
  return perm;
}

int64_t Product(const std::vector<int64_t>& dims, const std::vector<int64_t>& which) {
  int64_t p = 1;
  for (int64_t d : which) p *= dims[d];
  return p;
}

absl::StatusOr<cudaDataType_t> CudaDataType(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: return absl::UnimplementedError(absl::StrCat(DTypeName(t), " GEMMs are not supported"));
  }
}

}  // namespace

absl::StatusOr<GemmLayout> AnalyzeDotGeneral(const Node& dot) {
  if (dot.opcode() != Opcode::kDotGeneral || dot.num_operands() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(NodeContext(dot), " is not a dot_general"));
  }
  const std::vector<int64_t>& a_dims = dot.operand(0)->type().dims;
  const std::vector<int64_t>& b_dims = dot.operand(1)->type().dims;
  ASSIGN_OR_RETURN(std::vector<int64_t> a_batch, dot.attrs().GetInts("lhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> b_batch, dot.attrs().GetInts("rhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> a_contract, dot.attrs().GetInts("lhs_contract"));
  ASSIGN_OR_RETURN(std::vector<int64_t> b_contract, dot.attrs().GetInts("rhs_contract"));
  auto in_range = [](const std::vector<int64_t>& ds, size_t rank) {
    return std::all_of(ds.begin(), ds.end(), [&](int64_t d) { return d >= 0 && d < static_cast<int64_t>(rank); });
  };
  if (a_batch.size() != b_batch.size() || a_contract.size() != b_contract.size() || !in_range(a_batch, a_dims.size()) ||
      !in_range(a_contract, a_dims.size()) || !in_range(b_batch, b_dims.size()) || !in_range(b_contract, b_dims.size())) {
    return absl::InvalidArgumentError(absl::StrCat(NodeContext(dot), ": malformed dot_general dims ", dot.attrs().ToString()));
  }

  GemmLayout layout;
  layout.batch = Product(a_dims, a_batch);
  layout.k = Product(a_dims, a_contract);
  layout.m = dot.operand(0)->type().num_elements() / std::max<int64_t>(1, layout.batch * layout.k);
  layout.n = dot.operand(1)->type().num_elements() / std::max<int64_t>(1, layout.batch * layout.k);
  if (layout.batch * layout.k == 0) {  // no elements to multiply: m and n come from the dims
    layout.m = layout.n = 1;
    for (int64_t d = 0; d < static_cast<int64_t>(a_dims.size()); ++d) {
      if (!std::count(a_batch.begin(), a_batch.end(), d) && !std::count(a_contract.begin(), a_contract.end(), d)) layout.m *= a_dims[d];
    }
    for (int64_t d = 0; d < static_cast<int64_t>(b_dims.size()); ++d) {
      if (!std::count(b_batch.begin(), b_batch.end(), d) && !std::count(b_contract.begin(), b_contract.end(), d)) layout.n *= b_dims[d];
    }
  }

  const OperandView a = ViewOperand(a_dims, a_batch, a_contract);
  const OperandView b = ViewOperand(b_dims, b_batch, b_contract);
  layout.a_k_inner = a.k_inner;
  layout.b_k_inner = b.k_inner;
  auto permute_a = [&](const std::vector<int64_t>& order) {
    layout.a_permutation = CanonicalPermutation(a_dims.size(), a_batch, a_contract, order);
    layout.a_k_inner = true;
  };
  auto permute_b = [&](const std::vector<int64_t>& order) {
    layout.b_permutation = CanonicalPermutation(b_dims.size(), b_batch, b_contract, order);
    layout.b_k_inner = true;
  };
  if (a.fits && b.fits) {
    if (a.contract_order != b.contract_order) {  // copy the smaller operand
      if (dot.operand(1)->type().num_elements() <= dot.operand(0)->type().num_elements()) {
        permute_b(a.contract_order);
      } else {
        permute_a(b.contract_order);
      }
    }
  } else if (a.fits) {
    permute_b(a.contract_order);
  } else if (b.fits) {
    permute_a(b.contract_order);
  } else {
    std::vector<int64_t> listed(a_contract.size());
    for (size_t j = 0; j < listed.size(); ++j) listed[j] = static_cast<int64_t>(j);
    permute_a(listed);
    permute_b(listed);
  }
  return layout;
}

GemmPlan::~GemmPlan() {
  if (c_desc_ != nullptr) cublasLtMatrixLayoutDestroy(c_desc_);
  if (b_desc_ != nullptr) cublasLtMatrixLayoutDestroy(b_desc_);
  if (a_desc_ != nullptr) cublasLtMatrixLayoutDestroy(a_desc_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
}

absl::StatusOr<std::vector<GemmPlan::Transpose>> GemmPlan::BuildTranspose(const Node& dot, int operand,
                                                                          const std::vector<int64_t>& perm,
                                                                          const CudaDevice& device,
                                                                          const NvrtcOptions& nvrtc,
                                                                          KernelCache* cache) {
  // The transpose op's own lowering, on a one-node function: one definition of a transpose.
  Function f(absl::StrCat("gemm_operand_", dot.name()));
  Builder builder(&f);
  ASSIGN_OR_RETURN(Node * x, builder.Parameter("x", dot.operand(operand)->type()));
  ASSIGN_OR_RETURN(Node * t, builder.Named(absl::StrCat(dot.name(), operand == 0 ? "_lhs" : "_rhs")).Transpose(x, perm));
  ASSIGN_OR_RETURN(LoweredNode lowered, LowerNode(*t));
  std::vector<Transpose> kernels;
  for (const KernelSpec& spec : lowered.kernels) {
    ASSIGN_OR_RETURN(CompiledKernel compiled, CompileKernel(spec, nvrtc, cache));
    Transpose tr;
    ASSIGN_OR_RETURN(tr.library, KernelLibrary::Load(compiled));
    ASSIGN_OR_RETURN(tr.launch, PrepareLaunch(*tr.library, spec, device.ordinal()));
    kernels.push_back(std::move(tr));
  }
  return kernels;
}

absl::StatusOr<std::unique_ptr<GemmPlan>> GemmPlan::Create(const Node& dot, const CudaDevice& device,
                                                           const NvrtcOptions& nvrtc, KernelCache* cache) {
  std::unique_ptr<GemmPlan> plan(new GemmPlan());
  plan->context_ = NodeContext(dot);
  const std::string& ctx = plan->context_;
  ASSIGN_OR_RETURN(plan->layout_, AnalyzeDotGeneral(dot));
  const GemmLayout& g = plan->layout_;
  const DType in_dtype = dot.operand(0)->type().dtype;
  const DType out_dtype = dot.type().dtype;
  if (dot.operand(1)->type().dtype != in_dtype || (out_dtype != DType::kF32 && out_dtype != in_dtype)) {
    return absl::UnimplementedError(absl::StrCat(ctx, ": no cuBLASLt GEMM for ", dot.operand(0)->type().ToString(),
                                                 " x ", dot.operand(1)->type().ToString(), " -> ", dot.type().ToString()));
  }
  absl::StatusOr<cudaDataType_t> in_type = CudaDataType(in_dtype);
  absl::StatusOr<cudaDataType_t> out_type = CudaDataType(out_dtype);
  if (!in_type.ok() || !out_type.ok()) {
    return absl::UnimplementedError(absl::StrCat(ctx, ": no cuBLASLt GEMM for ", dot.operand(0)->type().ToString(),
                                                 " operands (f32, bf16 and f16 are supported)"));
  }
  plan->handle_ = device.cublas();
  plan->out_bytes_ = dot.type().num_bytes();

  // Scratch: [a transposed][b transposed][workspace], each 256-byte aligned.
  int64_t scratch = 0;
  if (!g.a_permutation.empty()) {
    ASSIGN_OR_RETURN(plan->a_transpose_, BuildTranspose(dot, 0, g.a_permutation, device, nvrtc, cache));
    plan->a_copy_offset_ = scratch;
    scratch += RoundUp(dot.operand(0)->type().num_bytes());
  }
  if (!g.b_permutation.empty()) {
    ASSIGN_OR_RETURN(plan->b_transpose_, BuildTranspose(dot, 1, g.b_permutation, device, nvrtc, cache));
    plan->b_copy_offset_ = scratch;
    scratch += RoundUp(dot.operand(1)->type().num_bytes());
  }
  plan->workspace_offset_ = scratch;
  if (g.batch * g.m * g.n * g.k == 0) {  // nothing to multiply: Enqueue zero-fills or does nothing
    plan->scratch_bytes_ = scratch;
    return plan;
  }

  const cublasComputeType_t compute = in_dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescCreate(&plan->desc_, compute, CUDA_R_32F), ctx);
  // cuBLAS's A is the IR's b, its B the IR's a (see the header).
  const cublasOperation_t op_a = g.b_k_inner ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.a_k_inner ? CUBLAS_OP_N : CUBLAS_OP_T;
  KILN_RETURN_IF_CUBLAS_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), ctx);
  KILN_RETURN_IF_CUBLAS_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), ctx);

  auto make_layout = [&](cublasLtMatrixLayout_t* desc, cudaDataType_t type, int64_t rows, int64_t cols,
                         int64_t batch_stride) -> absl::Status {
    KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutCreate(desc, type, rows, cols, rows), ctx);
    if (g.batch > 1) {
      const int32_t count = static_cast<int32_t>(g.batch);
      KILN_RETURN_IF_CUBLAS_ERROR(
          cublasLtMatrixLayoutSetAttribute(*desc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), ctx);
      KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutSetAttribute(*desc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                                   &batch_stride, sizeof(batch_stride)),
                                  ctx);
    }
    return absl::OkStatus();
  };
  // Stored (column-major) shapes; ld is always the row count since each matrix is dense.
  RETURN_IF_ERROR(make_layout(&plan->a_desc_, *in_type, g.b_k_inner ? g.k : g.n, g.b_k_inner ? g.n : g.k, g.n * g.k));
  RETURN_IF_ERROR(make_layout(&plan->b_desc_, *in_type, g.a_k_inner ? g.k : g.m, g.a_k_inner ? g.m : g.k, g.m * g.k));
  RETURN_IF_ERROR(make_layout(&plan->c_desc_, *out_type, g.n, g.m, g.m * g.n));

  cublasLtMatmulPreference_t preference = nullptr;
  KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulPreferenceCreate(&preference), ctx);
  const uint64_t max_workspace = kMaxWorkspaceBytes;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &max_workspace, sizeof(max_workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(plan->handle_, plan->desc_, plan->a_desc_, plan->b_desc_, plan->c_desc_,
                                            plan->c_desc_, preference, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  KILN_RETURN_IF_CUBLAS_ERROR(status, ctx);
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat(ctx, ": cuBLASLt has no algorithm for batch ", g.batch, ", M ", g.m,
                                                 ", N ", g.n, ", K ", g.k, " (", DTypeName(in_dtype), " -> ",
                                                 DTypeName(out_dtype), ")"));
  }
  plan->algo_ = result.algo;
  plan->workspace_bytes_ = static_cast<int64_t>(result.workspaceSize);
  plan->scratch_bytes_ = scratch + RoundUp(plan->workspace_bytes_);
  return plan;
}

absl::Status GemmPlan::Enqueue(void* out, const void* a, const void* b, void* scratch, cudaStream_t stream) const {
  const GemmLayout& g = layout_;
  if (g.batch * g.m * g.n == 0) return absl::OkStatus();
  if (g.k == 0) {  // an empty sum
    KILN_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(out, 0, out_bytes_, stream), context_);
    return absl::OkStatus();
  }
  char* scratch_bytes = static_cast<char*>(scratch);
  for (const Transpose& t : a_transpose_) {
    void* const pointers[] = {scratch_bytes + a_copy_offset_, const_cast<void*>(a)};
    RETURN_IF_ERROR(EnqueueLaunch(t.launch, pointers, stream, context_));
  }
  for (const Transpose& t : b_transpose_) {
    void* const pointers[] = {scratch_bytes + b_copy_offset_, const_cast<void*>(b)};
    RETURN_IF_ERROR(EnqueueLaunch(t.launch, pointers, stream, context_));
  }
  const void* lhs = a_transpose_.empty() ? a : scratch_bytes + a_copy_offset_;
  const void* rhs = b_transpose_.empty() ? b : scratch_bytes + b_copy_offset_;
  void* workspace = workspace_bytes_ > 0 ? scratch_bytes + workspace_offset_ : nullptr;
  KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmul(handle_, desc_, &alpha_, rhs, a_desc_, lhs, b_desc_, &beta_, out, c_desc_,
                                             out, c_desc_, &algo_, workspace, workspace_bytes_, stream),
                              context_);
  return absl::OkStatus();
}

}  // namespace kiln
