// Compile, then run (codegen/compile_program.h): codegen alone turns a training step into a
// program the runtime only loads: the cubins, the launch list, the memory plan and the GEMM
// descriptions, with every argument a buffer of the plan. Needs no GPU.
#include "codegen/compile_program.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/match.h"
#include "frontends/llama.h"
#include "frontends/llama_inference.h"
#include "ir/builder.h"
#include "ir/fusion.h"
#include "ir/text_format.h"
#include "passes/default_pipeline.h"
#include "passes/training_step.h"

namespace kiln {
namespace {

TEST(CompileProgram, ATrainingStepBecomesALaunchListOverOnePlannedArena) {
  ModelConfig config = *PresetConfig("llama-tiny");
  std::unique_ptr<Module> m = *BuildLlamaModule(config, {.batch = 2, .seq_len = 16, .precision = Precision::kBf16});
  TrainingStepLayout layout;
  ASSERT_TRUE(BuildTrainingStep(*m, *m->FindFunction("forward"), {}, &layout).ok());
  ASSERT_TRUE(RunDefaultPipeline(*m, {}).ok());
  const Function& step = *m->FindFunction("train_step");
  absl::StatusOr<CompiledProgram> program = CompileProgram(step, {.target = TargetForArch("sm_90a").value()});
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_EQ(program->function, &step);
  EXPECT_GT(program->num_launches, 80);  // 100 since group-optimizer-updates (21 AdamW launches -> 2)
  EXPECT_GT(program->num_gemms, 10);
  EXPECT_GT(program->plan.arena_bytes, 0);

  std::set<const Node*> fusions_launched;
  int64_t kernels = 0, gemms = 0, copies = 0;
  for (const ProgramStep& s : program->steps) {
    switch (s.kind) {
      case ProgramStep::Kind::kKernel: {
        ++kernels;
        ASSERT_GE(s.kernel, 0);
        ASSERT_LT(s.kernel, static_cast<int>(program->kernels.size()));
        EXPECT_FALSE(program->kernels[s.kernel].cubin.empty());
        EXPECT_TRUE(s.launch.source.empty());  // the program keeps what runs, not the source
        EXPECT_GT(s.launch.grid[0], 0u);
        // Every argument is a node whose value the plan holds (or -1 for an unneeded result).
        for (int64_t arg : s.args) {
          if (arg < 0) continue;
          ASSERT_LT(arg, step.num_nodes());
          EXPECT_GE(program->plan.node_buffer[arg], 0) << s.node->name();
        }
        if (s.node->opcode() == Opcode::kFusion) {
          fusions_launched.insert(s.node);
          EXPECT_TRUE(absl::StartsWith(s.label, "fused ")) << s.label;
        }
        break;
      }
      case ProgramStep::Kind::kGemm:
        ++gemms;
        ASSERT_EQ(s.args.size(), size_t{ProgramStep::kGemmArgs});  // out, a, b, c, bias, 3 scales, amax
        EXPECT_EQ(s.args[ProgramStep::kGemmBias] >= 0, s.gemm.bias);  // a bias exactly when the epilogue adds one
        for (int arg = ProgramStep::kGemmAScale; arg <= ProgramStep::kGemmAmax; ++arg) EXPECT_EQ(s.args[arg], -1);
        EXPECT_EQ(s.gemm.max_workspace_bytes, kGemmWorkspaceBytes);
        EXPECT_GE(s.scratch_buffer, 0);
        EXPECT_GE(program->plan.buffers[s.scratch_buffer].bytes, kGemmWorkspaceBytes);
        EXPECT_GT(s.gemm.m * s.gemm.n * s.gemm.k, 0);
        break;
      case ProgramStep::Kind::kCopy:
        ++copies;
        EXPECT_GE(s.dst_buffer, 0);
        EXPECT_GE(s.src_buffer, 0);
        EXPECT_GT(s.bytes, 0);
        break;
    }
  }
  EXPECT_EQ(kernels, program->num_launches);
  EXPECT_EQ(gemms, program->num_gemms);
  EXPECT_GT(fusions_launched.size(), 20u);
  // AdamW updates p, m, v in place: no donation needs a copy at the finish.
  EXPECT_EQ(copies, static_cast<int64_t>(layout.num_params * 3 + 1) - program->plan.in_place_outputs);
  std::printf("llama-tiny step: %lld launches, %lld GEMMs, %lld copies, %zu cubins, %s\n",
              static_cast<long long>(kernels), static_cast<long long>(gemms), static_cast<long long>(copies),
              program->kernels.size(), program->plan.Summary().c_str());
}

// The loss end of a step: bf16 logits (an LM head's output) die at cross_entropy_grad, whose
// bf16 dlogits the plan writes over them (llm.c's in-place dlogits); an f32 gradient of them
// has another size and gets bytes of its own.
TEST(CompileProgram, LossGradientIsWrittenOverTheLogitsThatDieThere) {
  for (DType grad_dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(grad_dtype));
    Module m("m");
    Builder b(m.AddFunction("main"));
    Node* h = *b.Parameter("h", {DType::kF32, {64, 256}});
    Node* labels = *b.Parameter("labels", {DType::kI32, {64}});
    Node* dloss = *b.Parameter("dloss", {DType::kF32, {64}});
    Node* logits = *b.Convert(*b.Unary(Opcode::kExp, h), DType::kBF16);
    Node* loss = *b.CrossEntropy(logits, labels, 250);
    absl::StatusOr<Node*> grad =
        b.Op(Opcode::kCrossEntropyGrad, {logits, labels, dloss, loss->operand(0)->result(1)},
             AttrMap{{"classes", int64_t{250}}, {"out_dtype", Symbol{std::string(DTypeName(grad_dtype))}}});
    ASSERT_TRUE(grad.ok()) << grad.status();
    ASSERT_TRUE(b.Return({loss, *grad}).ok());
    const Function& f = *m.functions()[0];
    absl::StatusOr<CompiledProgram> program = CompileProgram(f, {.target = TargetForArch("sm_90a").value()});
    ASSERT_TRUE(program.ok()) << program.status();
    int64_t logits_at = -1, grad_at = -1;
    for (int64_t i = 0; i < f.num_nodes(); ++i) {
      if (f.nodes()[i].get() == logits) logits_at = i;
      if (f.nodes()[i].get() == *grad) grad_at = i;
    }
    ASSERT_GE(program->plan.node_buffer[logits_at], 0);
    EXPECT_EQ(program->plan.node_buffer[grad_at] == program->plan.node_buffer[logits_at],
              grad_dtype == DType::kBF16);
    EXPECT_EQ(program->plan.in_place_values, grad_dtype == DType::kBF16 ? 1 : 0);
  }
}

TEST(CompileProgram, ErrorsNameTheNode) {
  Module m("m");
  Function* f = m.AddFunction("main");
  Node* a = f->AppendNode(Opcode::kParameter, {}, AttrMap{{"index", int64_t{0}}}, {DType::kBF16, {4, 8}}, "a");
  Node* b = f->AppendNode(Opcode::kParameter, {}, AttrMap{{"index", int64_t{1}}}, {DType::kBF16, {8, 4}}, "b");
  Node* d = f->AppendNode(Opcode::kDotGeneral, {a, b},
                          AttrMap{{"lhs_batch", std::vector<int64_t>{}}, {"rhs_batch", std::vector<int64_t>{}},
                                  {"lhs_contract", std::vector<int64_t>{1}}, {"rhs_contract", std::vector<int64_t>{0}}},
                          {DType::kBF16, {4, 4}}, "d");
  f->SetOutputs({d});
  absl::StatusOr<CompiledProgram> program = CompileProgram(*f, {});
  ASSERT_FALSE(program.ok());
  EXPECT_TRUE(absl::StrContains(program.status().message(), "dot_general %d reached codegen")) << program.status();
}

// An FP8 gemm's step (codegen/program.h's GemmArg): D and amax are its two results (the
// get_result nodes, which hold the buffers), the scales its last three operands, with c and
// bias left out.
TEST(CompileProgram, AnFp8GemmStepNamesItsScalesAndItsAmax) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @main {
  %a = parameter() {index=0} : f8e4m3[48,64]
  %b = parameter() {index=1} : f8e5m2[80,64]
  %sa = parameter() {index=2} : f32[]
  %sb = parameter() {index=3} : f32[]
  %sd = parameter() {index=4} : f32[]
  %d, %amax = gemm(%a, %b, %sa, %sb, %sd) {a_layout=mk, alpha=1.0, amax=1, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=64, m=48, n=80, scaled=1} : (f8e4m3[48,80], f32[])
  return %d, %amax
})");
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& f = *(*m)->functions()[0];
  absl::StatusOr<CompiledProgram> program = CompileProgram(f, {.target = TargetForArch("sm_90a").value()});
  ASSERT_TRUE(program.ok()) << program.status();
  auto index = [&](absl::string_view name) {
    for (int64_t i = 0; i < f.num_nodes(); ++i) {
      if (f.nodes()[i]->name() == name) return i;
    }
    return int64_t{-2};
  };
  ASSERT_EQ(program->num_gemms, 1);
  const ProgramStep& s = program->steps[0];
  ASSERT_EQ(s.kind, ProgramStep::Kind::kGemm);
  EXPECT_EQ(s.args, (std::vector<int64_t>{index("d"), index("a"), index("b"), -1, -1, index("sa"), index("sb"),
                                          index("sd"), index("amax")}));
  EXPECT_GE(program->plan.node_buffer[index("d")], 0);
  EXPECT_GE(program->plan.node_buffer[index("amax")], 0);
  EXPECT_NE(program->plan.node_buffer[index("d")], program->plan.node_buffer[index("amax")]);
  EXPECT_TRUE(s.gemm.scaled && s.gemm.amax);
  EXPECT_EQ(s.gemm.b_dtype, DType::kF8E5M2);
}

// A decode step writes each layer's K and V into the pools in place: the chain of
// kv_cache_writes from each pool parameter to the output donated to it lives in that
// parameter's buffer, so no launch copies a pool (their bytes dwarf the step's) and the
// finish donates nothing by copy.
TEST(CompileProgram, TheKvPoolIsWrittenInPlaceLayerAfterLayer) {
  const ModelConfig config = *PresetConfig("llama-tiny");
  const PagedKvLayout layout{.num_blocks = 8, .block_size = 4, .max_blocks_per_sequence = 4};
  for (InferencePhase phase : {InferencePhase::kDecode, InferencePhase::kPrefill}) {
    std::unique_ptr<Module> m = *BuildLlamaInferenceModule(config, layout, Precision::kBf16, phase, 4);
    ASSERT_TRUE(CompileInferenceModule(*m, {}).ok());
    const Function& f = *m->functions()[0];
    absl::StatusOr<CompiledProgram> program = CompileProgram(f, {.target = TargetForArch("sm_90a").value()});
    ASSERT_TRUE(program.ok()) << program.status();
    int pools_written = 0, write_launches = 0;
    for (const ProgramStep& s : program->steps) {
      EXPECT_NE(s.kind, ProgramStep::Kind::kCopy) << s.what;
      if (s.kind != ProgramStep::Kind::kKernel) continue;
      // Per result, the operand whose pool it writes: a kv_cache_write's operand 0; a
      // cache_write fusion's (one kernel for a layer's K, V and q: merge-cache-write-siblings)
      // as each of its body's writes takes it. The step's args are its results, then operands.
      std::vector<std::pair<int, int64_t>> writes;  // (result, pool operand)
      if (s.node->opcode() == Opcode::kKvCacheWrite) writes.emplace_back(0, 0);
      if (s.node->opcode() == Opcode::kFusion &&
          FusionKindOf(*s.node).value_or(FusionKind::kLoop) == FusionKind::kCacheWrite) {
        const std::vector<Node*>& outs = s.node->body()->outputs();
        for (size_t r = 0; r < outs.size(); ++r) {
          if (outs[r]->opcode() != Opcode::kKvCacheWrite) continue;
          writes.emplace_back(static_cast<int>(r), *outs[r]->operand(0)->attrs().GetInt("index"));
        }
      }
      if (writes.empty()) continue;
      ++write_launches;
      EXPECT_FALSE(absl::StrContains(s.launch.name, "_copy")) << s.launch.name;
      for (const auto& [r, pool] : writes) {
        ++pools_written;
        EXPECT_EQ(program->plan.node_buffer[s.args[r]], program->plan.node_buffer[s.args[s.node->num_results() + pool]])
            << s.node->name() << " result " << r;
      }
    }
    EXPECT_EQ(pools_written, 2 * config.n_layers);  // K and V of every layer
    EXPECT_EQ(write_launches, config.n_layers);      // one launch a layer for both
    EXPECT_EQ(program->plan.in_place_outputs, 2);
    int64_t k_pool = 0;
    while (f.nodes()[k_pool].get() != f.parameters()[kInferenceKPoolParameter]) ++k_pool;
    EXPECT_EQ(program->plan.output_buffer[1], program->plan.node_buffer[k_pool]);
  }
}

}  // namespace
}  // namespace kiln
