#include "codegen/compile_program.h"

#include <chrono>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "codegen/compile_function.h"
#include "codegen/kernel_cache.h"
#include "ir/gemm_slots.h"
#include "ir/node_predicates.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

std::string Context(const Node& node) { return absl::StrCat("%", node.name(), " (", node.op_name(), ")"); }

// Seconds since `*since`, which moves to now: consecutive calls time consecutive phases.
double Lap(std::chrono::steady_clock::time_point* since) {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - *since).count();
  *since = now;
  return seconds;
}

// Nodes some output depends on; only these run.
std::vector<bool> NeededNodes(const Function& f, const absl::flat_hash_map<const Node*, int64_t>& index_of) {
  std::vector<bool> needed(f.num_nodes(), false);
  for (const Node* out : f.outputs()) needed[index_of.at(out)] = true;
  for (int64_t i = f.num_nodes() - 1; i >= 0; --i) {
    if (!needed[i]) continue;
    for (const Node* o : f.nodes()[i]->operands()) needed[index_of.at(o)] = true;
  }
  return needed;
}

bool IsCublasDType(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// The FP8 slots (ir/op_table.h) as the description carries them. cuBLASLt's scale pointers
// and amax are planned for fp8 operands only (the IR gives fp8 operands scaled=1, so an fp8
// gemm is always scaled), and a non-fp8 D takes no D_SCALE_POINTER (cuBLASLt 13 answers
// CUBLAS_STATUS_INVALID_VALUE; PyTorch's _scaled_mm met the same, pytorch/pytorch#190452), so
// there d_scale must be the constant 1, which the plan then leaves out. Which fp8 GEMMs
// cuBLASLt runs (dtype combinations, layouts, C and bias) is the plan's to say
// (GemmPlan::CheckSupported in runtime/cuda/gemm.h).
absl::Status DescribeFp8Slots(const Node& gemm, const GemmSlots& slots, GemmDescription& g) {
  g.scaled = slots.a_scale >= 0;
  g.amax = slots.amax;
  const bool fp8 = IsFp8(g.a_dtype) && IsFp8(g.b_dtype);
  if (!fp8) {
    return absl::UnimplementedError(absl::StrCat(g.context, ": ", g.scaled ? "scaled=1" : "amax=1", " with ",
                                                 DTypeName(g.a_dtype), " x ", DTypeName(g.b_dtype),
                                                 " operands: cuBLASLt's scales and amax are planned for fp8 operands ",
                                                 "(f8e4m3, f8e5m2) only"));
  }
  const Node& d_scale = *gemm.operand(slots.d_scale);
  if (!IsFp8(g.d_dtype) && !IsSplatOf(d_scale, 1.0)) {
    return absl::UnimplementedError(absl::StrCat(
        g.context, ": d_scale %", d_scale.name(), " of a ", DTypeName(g.d_dtype), " result must be the constant 1: ",
        "cuBLASLt applies D_SCALE_POINTER to an fp8 D only (CUDA 13 refuses it for any other)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GemmDescription> GemmDescriptionOf(const Node& gemm) {
  if (gemm.opcode() == Opcode::kDotGeneral) {
    return absl::InvalidArgumentError(absl::StrCat(Context(gemm), " reached the GEMM planner: the lower-gemm ",
                                                   "pass (passes/lower_gemm.h) makes every dot_general a gemm first"));
  }
  if (gemm.opcode() != Opcode::kGemm) return absl::InvalidArgumentError(absl::StrCat(Context(gemm), " is not a gemm"));
  GemmDescription g;
  g.context = Context(gemm);
  ASSIGN_OR_RETURN(g.batch, gemm.attrs().GetInt("batch"));
  ASSIGN_OR_RETURN(g.m, gemm.attrs().GetInt("m"));
  ASSIGN_OR_RETURN(g.n, gemm.attrs().GetInt("n"));
  ASSIGN_OR_RETURN(g.k, gemm.attrs().GetInt("k"));
  ASSIGN_OR_RETURN(std::string a_layout, gemm.attrs().GetSymbol("a_layout"));
  ASSIGN_OR_RETURN(std::string b_layout, gemm.attrs().GetSymbol("b_layout"));
  ASSIGN_OR_RETURN(double alpha, gemm.attrs().GetFloat("alpha"));
  ASSIGN_OR_RETURN(double beta, gemm.attrs().GetFloat("beta"));
  ASSIGN_OR_RETURN(const GemmSlots slots, GemmSlotsOf(gemm.attrs()));
  if (slots.bias >= 0) {
    g.bias = true;
    g.bias_dtype = gemm.operand(slots.bias)->type().dtype;
  }
  g.a_k_inner = a_layout == "mk";
  g.b_k_inner = b_layout == "nk";
  g.alpha = static_cast<float>(alpha);
  g.beta = static_cast<float>(beta);
  g.a_dtype = gemm.operand(0)->type().dtype;
  g.b_dtype = gemm.operand(1)->type().dtype;
  g.d_dtype = gemm.result_type(0).dtype;
  if (HasFp8Slots(gemm)) {
    RETURN_IF_ERROR(DescribeFp8Slots(gemm, slots, g));
  } else if (g.a_dtype != g.b_dtype || !IsCublasDType(g.a_dtype) ||
             (g.d_dtype != DType::kF32 && g.d_dtype != g.a_dtype)) {
    return absl::UnimplementedError(absl::StrCat(g.context, ": no cuBLASLt GEMM for ",
                                                 gemm.operand(0)->type().ToString(), " x ",
                                                 gemm.operand(1)->type().ToString(), " -> ", gemm.type().ToString(),
                                                 " (operands f32, bf16 or f16 alike; the result f32 or theirs; fp8 ",
                                                 "operands take scaled=1)"));
  }
  g.max_workspace_bytes = g.batch * g.m * g.n * g.k == 0 ? 0 : kGemmWorkspaceBytes;
  return g;
}

absl::StatusOr<CompiledProgram> CompileProgram(const Function& f, const ProgramOptions& options) {
  auto phase_start = std::chrono::steady_clock::now();
  CompiledProgram program;
  program.function = &f;
  absl::flat_hash_map<const Node*, int64_t> index_of;
  for (int64_t i = 0; i < f.num_nodes(); ++i) index_of[f.nodes()[i].get()] = i;

  // 1. Kernels. The cache is an optimization: without a usable default directory kiln
  // compiles every time; a directory the caller named must work.
  absl::StatusOr<KernelCache> cache = KernelCache::Open(options.cache_dir);
  if (!cache.ok() && !options.cache_dir.empty()) return cache.status();
  CodegenOptions codegen{.target = options.target,
                         .programmatic_dependent_launch = options.programmatic_dependent_launch,
                         .reads_before_wait = options.reads_before_wait};
  codegen.paged_attention = options.paged_attention;
  codegen.small_m_gemv_shape_geometries = options.gemv_shape_geometries;
  ASSIGN_OR_RETURN(KernelCompileReport report,
                   CompileFunctionKernels(f, NvrtcOptions{.arch = options.target.arch}, cache.ok() ? &*cache : nullptr,
                                          options.compile_threads, codegen));
  if (static_cast<int64_t>(report.nodes.size()) != f.num_nodes()) {
    return absl::InternalError(absl::StrCat("codegen lowered ", report.nodes.size(), " of the ", f.num_nodes(),
                                            " nodes of @", f.name()));
  }
  program.cache_hits = report.cache_hits;
  program.phases.emplace_back(absl::StrCat("codegen + NVRTC (", report.num_distinct - report.cache_hits, " of ",
                                           report.num_distinct, " kernels compiled, the rest from the cache)"),
                              Lap(&phase_start));

  // 2 and 3. Buffer roles from the lowering, GEMM descriptions (and so their scratch), the
  // plan. A needed result needs its multi-result node (its operand); an unneeded one gets
  // no buffer, and the node's kernels are passed null for it.
  const std::vector<bool> needed = NeededNodes(f, index_of);
  BufferPlanRequest request;
  request.roles.assign(f.num_nodes(), BufferRole::kNone);
  request.scratch_bytes.assign(f.num_nodes(), 0);
  request.persistent_bytes.assign(f.num_nodes(), 0);
  request.run_step.resize(f.num_nodes());
  request.elementwise_in_place.assign(f.num_nodes(), false);
  request.in_place_operand.assign(f.num_nodes(), -1);
  request.in_place_operand_of_results.assign(f.num_nodes(), {});
  std::vector<GemmDescription> gemms(f.num_nodes());
  for (int64_t i = 0; i < f.num_nodes(); ++i) {
    const Node& node = *f.nodes()[i];
    const LoweredNode& lowered = report.nodes[i].lowered;
    request.run_step[i] = i;
    if (report.nodes[i].node != &node) return absl::InternalError("codegen reported the nodes out of order");
    if (!needed[i] && node.opcode() != Opcode::kParameter) continue;
    request.roles[i] = lowered.kind == LoweringKind::kAlias    ? BufferRole::kAlias
                       : lowered.kind == LoweringKind::kResult ? BufferRole::kResult
                       : node.has_multiple_results()          ? BufferRole::kMultiResult
                                                               : BufferRole::kOwn;
    request.elementwise_in_place[i] = lowered.elementwise_in_place;
    request.in_place_operand[i] = lowered.in_place_operand;
    request.in_place_operand_of_results[i] = lowered.in_place_operand_of_results;
    // A result is written by its node's kernels, at that node's step.
    if (lowered.kind == LoweringKind::kResult) request.run_step[i] = index_of.at(node.operand(0));
    if (lowered.kind == LoweringKind::kGemm) {
      ASSIGN_OR_RETURN(gemms[i], GemmDescriptionOf(node));
      request.scratch_bytes[i] = gemms[i].max_workspace_bytes;
    } else if (lowered.kind == LoweringKind::kKernels) {
      request.scratch_bytes[i] = lowered.scratch_bytes;
      request.persistent_bytes[i] = lowered.persistent_bytes;
    }
  }
  program.phases.emplace_back("GEMM descriptions", Lap(&phase_start));
  ASSIGN_OR_RETURN(program.plan, PlanBuffers(f, request));
  program.phases.emplace_back("memory plan", Lap(&phase_start));

  // 4. The launch list.
  for (int64_t i = 0; i < f.num_nodes(); ++i) {
    const Node& node = *f.nodes()[i];
    NodeKernels& nk = report.nodes[i];
    if (request.roles[i] == BufferRole::kNone) continue;
    bool empty = true;
    for (const TensorType& t : node.result_types()) empty &= t.num_elements() == 0;
    if (empty) continue;
    if (nk.lowered.kind == LoweringKind::kGemm) {
      ProgramStep step{.kind = ProgramStep::Kind::kGemm, .node = &node};
      ASSIGN_OR_RETURN(const GemmSlots slots, GemmSlotsOf(node.attrs()));
      auto operand = [&](int slot) { return slot >= 0 ? index_of.at(node.operand(slot)) : int64_t{-1}; };
      // With amax=1 the gemm has two results (D, amax), each a get_result node with the buffer.
      auto result = [&](int r) -> int64_t {
        if (!node.has_multiple_results()) return r == 0 ? i : -1;
        const int64_t at = index_of.at(node.result(r));
        return request.roles[at] == BufferRole::kNone ? -1 : at;
      };
      step.args.assign(ProgramStep::kGemmArgs, -1);
      step.args[ProgramStep::kGemmOut] = result(0);
      step.args[ProgramStep::kGemmA] = operand(0);
      step.args[ProgramStep::kGemmB] = operand(1);
      step.args[ProgramStep::kGemmC] = operand(slots.c);
      step.args[ProgramStep::kGemmBias] = operand(slots.bias);
      step.args[ProgramStep::kGemmAScale] = operand(slots.a_scale);
      step.args[ProgramStep::kGemmBScale] = operand(slots.b_scale);
      step.args[ProgramStep::kGemmDScale] = operand(slots.d_scale);
      if (slots.amax) step.args[ProgramStep::kGemmAmax] = result(1);
      if (step.args[ProgramStep::kGemmOut] < 0) {
        return absl::UnimplementedError(absl::StrCat(Context(node), ": only its amax is used; cuBLASLt writes D ",
                                                     "all the same, and kiln plans no buffer for an unused D"));
      }
      step.gemm = std::move(gemms[i]);
      step.scratch_buffer = program.plan.scratch_buffer[i];
      program.steps.push_back(std::move(step));
      ++program.num_gemms;
      continue;
    }
    if (nk.lowered.kind != LoweringKind::kKernels) continue;  // parameters, aliases, results do no work
    std::vector<int64_t> args;
    if (node.has_multiple_results()) {
      for (int r = 0; r < node.num_results(); ++r) {
        const int64_t result = index_of.at(node.result(r));
        args.push_back(request.roles[result] == BufferRole::kNone ? -1 : result);
      }
    } else {
      args.push_back(i);
    }
    for (const Node* input : node.operands()) args.push_back(index_of.at(input));
    // A leading copy of an in-place operand into a result is left out where the plan gave the
    // result that operand's buffer (or no buffer: nothing reads it).
    auto copy_is_a_no_op = [&](size_t k) {
      if (k >= nk.lowered.copy_kernel_results.size()) return false;
      const int r = nk.lowered.copy_kernel_results[k];
      const int operand = node.has_multiple_results()
                              ? (r < static_cast<int>(nk.lowered.in_place_operand_of_results.size())
                                     ? nk.lowered.in_place_operand_of_results[r]
                                     : -1)
                              : nk.lowered.in_place_operand;
      const int64_t result = node.has_multiple_results() ? args[r] : i;
      if (result < 0) return true;
      return operand >= 0 && operand < node.num_operands() &&
             program.plan.node_buffer[result] == program.plan.node_buffer[index_of.at(node.operand(operand))];
    };
    for (size_t k = 0; k < nk.lowered.kernels.size(); ++k) {
      if (copy_is_a_no_op(k)) continue;
      ProgramStep step{.kind = ProgramStep::Kind::kKernel, .node = &node, .kernel = nk.compiled[k]};
      step.launch = std::move(nk.lowered.kernels[k]);
      step.launch.source.clear();
      step.label = nk.lowered.label.empty() ? std::string(node.op_name()) : nk.lowered.label;
      step.args = args;
      step.scratch_buffer = program.plan.scratch_buffer[i];  // after the operands, when planned
      step.persistent_buffer = program.plan.persistent_buffer[i];  // the last kernel parameter, when planned
      program.steps.push_back(std::move(step));
      ++program.num_launches;
    }
  }
  // The finish: outputs held in parameter buffers are copied out first, then donated outputs
  // are copied into their parameters' buffers (never a source of any of these copies).
  const BufferPlan& plan = program.plan;
  for (size_t o = 0; o < f.outputs().size(); ++o) {
    if (plan.output_copy_source[o] < 0) continue;
    program.steps.push_back({.kind = ProgramStep::Kind::kCopy,
                             .dst_buffer = plan.output_buffer[o],
                             .src_buffer = plan.output_copy_source[o],
                             .bytes = f.outputs()[o]->type().num_bytes(),
                             .what = absl::StrCat("output ", o, " (%", f.outputs()[o]->name(), ")")});
  }
  const std::vector<Node*> params = f.parameters();
  for (size_t o = 0; o < f.output_aliases().size(); ++o) {
    const int64_t p = f.output_aliases()[o];
    if (p < 0) continue;
    if (p >= static_cast<int64_t>(params.size())) {
      return absl::InvalidArgumentError(absl::StrCat("@", f.name(), ": output ", o, " is donated to parameter ", p,
                                                     ", which does not exist"));
    }
    // An output computed in place (passes/buffer_plan.h) is in its parameter's buffer already.
    if (plan.node_buffer[index_of.at(params[p])] == plan.output_buffer[o]) continue;
    program.steps.push_back({.kind = ProgramStep::Kind::kCopy,
                             .dst_buffer = plan.node_buffer[index_of.at(params[p])],
                             .src_buffer = plan.output_buffer[o],
                             .bytes = f.outputs()[o]->type().num_bytes(),
                             .what = absl::StrCat("donating output ", o, " (%", f.outputs()[o]->name(),
                                                  ") to parameter %", params[p]->name(), ": ",
                                                  params[p]->type().ToString())});
  }
  program.kernels = std::move(report.kernels);
  program.phases.emplace_back("launch list", Lap(&phase_start));
  return program;
}

}  // namespace kiln
