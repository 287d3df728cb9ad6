// The arena plan (passes/buffer_plan.h): on random graphs and on llama-tiny's training
// step, no two buffers that are live at the same step share a byte, every read happens while
// its buffer is live, aliases share their root's bytes, parameters share nothing, and bytes
// are in fact reused.
#include "passes/buffer_plan.h"

#include <gtest/gtest.h>

#include "absl/container/flat_hash_map.h"
#include "frontends/llama.h"
#include "ir/builder.h"
#include "passes/training_step.h"
#include "tests/testing/random_graph.h"

namespace kiln {
namespace {

// What the GPU executable asks for: reshapes alias, nodes no output needs are skipped, and
// (here) every `scratch_every`-th computed node wants some scratch.
BufferPlanRequest RequestFor(const Function& f, int scratch_every = 0) {
  BufferPlanRequest r;
  r.roles.assign(f.num_nodes(), BufferRole::kNone);
  r.scratch_bytes.assign(f.num_nodes(), 0);
  absl::flat_hash_map<const Node*, int64_t> index_of;
  for (int64_t i = 0; i < f.num_nodes(); ++i) index_of[f.nodes()[i].get()] = i;
  std::vector<bool> needed(f.num_nodes(), false);
  for (const Node* out : f.outputs()) needed[index_of[out]] = true;
  for (int64_t i = f.num_nodes() - 1; i >= 0; --i) {
    if (!needed[i]) continue;
    for (const Node* o : f.nodes()[i]->operands()) needed[index_of[o]] = true;
  }
  for (int64_t i = 0; i < f.num_nodes(); ++i) {
    if (!needed[i]) continue;
    const Node& n = *f.nodes()[i];
    r.roles[i] = n.opcode() == Opcode::kReshape       ? BufferRole::kAlias
                 : n.opcode() == Opcode::kGetResult   ? BufferRole::kResult
                 : n.has_multiple_results()          ? BufferRole::kMultiResult
                                                      : BufferRole::kOwn;
    if (scratch_every > 0 && i % scratch_every == 0) r.scratch_bytes[i] = 100 + 37 * i;
  }
  // A result is written at its multi-result node's step.
  r.run_step.resize(f.num_nodes());
  for (int64_t i = 0; i < f.num_nodes(); ++i) {
    const Node& n = *f.nodes()[i];
    r.run_step[i] = n.opcode() == Opcode::kGetResult ? index_of[n.operand(0)] : i;
  }
  return r;
}

bool LiveAt(const PlannedBuffer& b, int64_t step) { return b.first_step <= step && step <= b.last_step; }

// Checks the plan against the function exhaustively; returns the number of buffer pairs that
// were live at once (so a caller can tell the check was not vacuous).
int64_t CheckPlan(const Function& f, const BufferPlanRequest& r, const BufferPlan& plan) {
  const int64_t n = f.num_nodes();
  absl::flat_hash_map<const Node*, int64_t> index_of;
  for (int64_t i = 0; i < n; ++i) index_of[f.nodes()[i].get()] = i;
  for (const PlannedBuffer& b : plan.buffers) {
    EXPECT_EQ(b.offset % r.alignment, 0);
    EXPECT_EQ(b.bytes % r.alignment, 0);
    EXPECT_LE(b.offset + b.bytes, plan.arena_bytes);
    if (b.kind == PlannedBuffer::Kind::kParameter) {
      EXPECT_LE(b.offset + b.bytes, plan.parameter_bytes);
      EXPECT_EQ(b.first_step, 0);
      EXPECT_EQ(b.last_step, n);
    } else {
      EXPECT_GE(b.offset, plan.parameter_bytes);
    }
  }
  // Every computed node's bytes are live from its step through every read of them.
  for (int64_t i = 0; i < n; ++i) {
    const Node& node = *f.nodes()[i];
    if (node.opcode() == Opcode::kParameter) {
      EXPECT_EQ(plan.buffers[plan.node_buffer[i]].kind, PlannedBuffer::Kind::kParameter);
      continue;
    }
    if (r.roles[i] == BufferRole::kNone) {
      EXPECT_EQ(plan.node_buffer[i], -1);
      continue;
    }
    if (r.roles[i] == BufferRole::kMultiResult) {  // no bytes of its own; reads its operands now
      EXPECT_EQ(plan.node_buffer[i], -1);
      for (const Node* o : node.operands()) {
        EXPECT_TRUE(LiveAt(plan.buffers[plan.node_buffer[index_of[o]]], i)) << node.name() << " reads " << o->name();
      }
      continue;
    }
    const PlannedBuffer& mine = plan.buffers[plan.node_buffer[i]];
    EXPECT_GE(mine.bytes, node.type().num_bytes());
    if (r.roles[i] == BufferRole::kResult) {  // written by its multi-result node, at that step
      EXPECT_EQ(mine.first_step, index_of[node.operand(0)]) << node.name();
      continue;
    }
    if (r.roles[i] == BufferRole::kAlias) {
      EXPECT_EQ(plan.node_buffer[i], plan.node_buffer[index_of[node.operand(0)]]) << node.name();
    } else if (!r.in_place_operand.empty() && r.in_place_operand[i] >= 0 &&
               plan.node_buffer[i] == plan.node_buffer[index_of[node.operand(r.in_place_operand[i])]]) {
      // Written over its operand's bytes, which are live from the operand's step.
    } else {
      EXPECT_EQ(mine.first_step, i) << node.name();
    }
    for (const Node* o : node.operands()) {
      EXPECT_TRUE(LiveAt(plan.buffers[plan.node_buffer[index_of[o]]], i)) << node.name() << " reads " << o->name();
    }
    if (r.scratch_bytes[i] > 0) {
      const PlannedBuffer& s = plan.buffers[plan.scratch_buffer[i]];
      EXPECT_GE(s.bytes, r.scratch_bytes[i]);
      EXPECT_TRUE(LiveAt(s, i));
    }
  }
  for (size_t k = 0; k < f.outputs().size(); ++k) {
    const PlannedBuffer& b = plan.buffers[plan.output_buffer[k]];
    EXPECT_TRUE(LiveAt(b, n));
    EXPECT_NE(b.kind, PlannedBuffer::Kind::kParameter) << "output " << k << " would be overwritten by donations";
  }
  // No two buffers live at the same step share a byte.
  int64_t overlapping_lifetimes = 0;
  for (size_t a = 0; a < plan.buffers.size(); ++a) {
    for (size_t b = a + 1; b < plan.buffers.size(); ++b) {
      const PlannedBuffer& x = plan.buffers[a];
      const PlannedBuffer& y = plan.buffers[b];
      if (x.bytes == 0 || y.bytes == 0) continue;
      if (x.last_step < y.first_step || y.last_step < x.first_step) continue;
      ++overlapping_lifetimes;
      EXPECT_TRUE(x.offset + x.bytes <= y.offset || y.offset + y.bytes <= x.offset)
          << "buffers " << a << " and " << b << " overlap";
    }
  }
  return overlapping_lifetimes;
}

TEST(BufferPlan, ChainReusesFreedBuffer) {
  Function f("chain");
  Builder b(&f);
  Node* x = *b.Parameter("x", {DType::kF32, {256}});   // 1 KiB
  Node* y1 = *b.Unary(Opcode::kExp, x);                 // live at steps 1..2
  Node* y2 = *b.Unary(Opcode::kExp, y1);                // 2..3
  Node* y3 = *b.Unary(Opcode::kExp, y2);                // 3..finish: may take y1's bytes
  ASSERT_TRUE(b.Return({y3}).ok());
  BufferPlanRequest r = RequestFor(f);
  absl::StatusOr<BufferPlan> plan = PlanBuffers(f, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan(f, r, *plan);
  EXPECT_EQ(plan->parameter_bytes, 1024);
  EXPECT_EQ(plan->arena_bytes, 3 * 1024);  // x, and two buffers for three values
  EXPECT_EQ(plan->total_buffer_bytes, 4 * 1024);
  EXPECT_EQ(plan->live_peak_bytes, 3 * 1024);  // x, and two values at steps 2 and 3
}

TEST(BufferPlan, ReshapeAliasesAndParameterOutputsAreCopied) {
  Function f("alias");
  Builder b(&f);
  Node* x = *b.Parameter("x", {DType::kF32, {4, 8}});
  Node* w = *b.Parameter("w", {DType::kBF16, {3}});
  Node* r1 = *b.Reshape(x, {32});
  Node* e = *b.Unary(Opcode::kExp, r1);
  Node* r2 = *b.Reshape(e, {8, 4});
  ASSERT_TRUE(b.Return({r2, w, r1}, {0, -1, -1}).ok());
  BufferPlanRequest r = RequestFor(f);
  absl::StatusOr<BufferPlan> plan = PlanBuffers(f, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan(f, r, *plan);
  EXPECT_EQ(plan->node_buffer[2], plan->node_buffer[0]);  // r1 is x's bytes
  EXPECT_EQ(plan->node_buffer[4], plan->node_buffer[3]);  // r2 is e's bytes
  EXPECT_EQ(plan->output_copy_source[0], -1);
  EXPECT_EQ(plan->output_copy_source[1], plan->node_buffer[1]);  // w: copied out of the parameter
  EXPECT_EQ(plan->output_copy_source[2], plan->node_buffer[0]);  // r1 is x's bytes: copied too
  EXPECT_EQ(plan->parameter_bytes, 2 * 256);  // 128 and 6 bytes, each rounded up to the alignment
}

// step(p, g) = p + p * g with the result donated to p, its kernel elementwise: after the
// last reader of p it takes p's buffer, and the donation needs no copy.
TEST(BufferPlan, ElementwiseDonatedOutputAfterTheLastReaderIsUpdatedInPlace) {
  for (bool later_reader : {false, true}) {
    Function f("in_place");
    Builder b(&f);
    Node* p = *b.Parameter("p", {DType::kF32, {64}});
    Node* g = *b.Parameter("g", {DType::kF32, {64}});
    Node* a = *b.Mul(p, g);
    Node* q = *b.Add(p, a);
    std::vector<Node*> outputs = {q};
    if (later_reader) outputs.push_back(*b.Unary(Opcode::kExp, p));  // reads the old p after q
    ASSERT_TRUE(b.Return(outputs, later_reader ? std::vector<int64_t>{0, -1} : std::vector<int64_t>{0}).ok());
    BufferPlanRequest r = RequestFor(f);
    r.elementwise_in_place.assign(f.num_nodes(), true);
    absl::StatusOr<BufferPlan> plan = PlanBuffers(f, r);
    ASSERT_TRUE(plan.ok()) << plan.status();
    if (!later_reader) {
      EXPECT_EQ(plan->node_buffer[3], plan->node_buffer[0]) << "q takes p's bytes";
      EXPECT_EQ(plan->output_buffer[0], plan->node_buffer[0]);
      EXPECT_EQ(plan->output_copy_source[0], -1);
      EXPECT_EQ(plan->in_place_outputs, 1);
    } else {
      EXPECT_NE(plan->node_buffer[3], plan->node_buffer[0]) << "exp(p) runs after q: p must stay";
      EXPECT_EQ(plan->in_place_outputs, 0);
    }
  }
  // Without the kernel's promise, never.
  Function f("not_elementwise");
  Builder b(&f);
  Node* p = *b.Parameter("p", {DType::kF32, {64}});
  Node* q = *b.Unary(Opcode::kExp, p);
  ASSERT_TRUE(b.Return({q}, {0}).ok());
  absl::StatusOr<BufferPlan> plan = PlanBuffers(f, RequestFor(f));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->in_place_outputs, 0);
}

// in_place_operand: a value whose kernel reads an operand element by element writes over it
// where the operand dies there (cross_entropy_grad's dlogits over the logits); never when the
// operand is read later (directly or through an alias), is an output or a parameter, or has
// another size.
TEST(BufferPlan, AValueTakesTheBufferOfTheOperandThatDiesAtIt) {
  enum class Case { kDies, kReadLater, kReadLaterThroughAnAlias, kOutput, kParameter, kOtherSize };
  for (Case c : {Case::kDies, Case::kReadLater, Case::kReadLaterThroughAnAlias, Case::kOutput, Case::kParameter,
                 Case::kOtherSize}) {
    SCOPED_TRACE(static_cast<int>(c));
    Function f("in_place_value");
    Builder b(&f);
    Node* x = *b.Parameter("x", {DType::kF32, {64}});
    Node* logits = c == Case::kParameter ? x : *b.Unary(Opcode::kExp, x);           // step 1
    Node* view = *b.Reshape(logits, {8, 8});                                          // step 2
    Node* loss = *b.ReduceSum(logits, {0});                                           // step 3
    Node* grad = c == Case::kOtherSize ? *b.Convert(logits, DType::kBF16) : *b.Unary(Opcode::kNeg, logits);  // 4
    std::vector<Node*> outputs = {loss, grad};
    if (c == Case::kReadLater) outputs.push_back(*b.Unary(Opcode::kSqrt, logits));
    if (c == Case::kReadLaterThroughAnAlias) outputs.push_back(*b.Unary(Opcode::kSqrt, view));
    if (c == Case::kOutput) outputs.push_back(logits);
    ASSERT_TRUE(b.Return(outputs).ok());
    BufferPlanRequest r = RequestFor(f);
    r.in_place_operand.assign(f.num_nodes(), -1);
    const int64_t g = std::find_if(f.nodes().begin(), f.nodes().end(), [&](const auto& n) { return n.get() == grad; }) -
                      f.nodes().begin();
    r.in_place_operand[g] = 0;
    absl::StatusOr<BufferPlan> plan = PlanBuffers(f, r);
    ASSERT_TRUE(plan.ok()) << plan.status();
    CheckPlan(f, r, *plan);
    const bool shared = plan->node_buffer[g] == plan->node_buffer[1];
    EXPECT_EQ(shared, c == Case::kDies);
    EXPECT_EQ(plan->in_place_values, c == Case::kDies ? 1 : 0);
  }
}

// The results of a multi-result node are written by its kernel: each is live from that
// node's step, so nothing live in between may share its bytes; the node itself owns none,
// and a result nobody reads gets no buffer.
TEST(BufferPlan, ResultsAreLiveFromTheirMultiResultNodesStep) {
  Function f("results");
  Builder b(&f);
  std::vector<Node*> in;
  for (const char* name : {"p", "g", "m", "v"}) in.push_back(*b.Parameter(name, {DType::kF32, {256}}));
  for (const char* name : {"step_size", "decay", "sqrt_bc2"}) in.push_back(*b.Parameter(name, {DType::kF32, {}}));
  in.push_back(in.back());  // sqrt_bc2 again as the grad_scale operand: no step of its own
  // Steps 0-6 parameters, 7 the update, 8-10 its results, 11 `between`, 12 the sum.
  std::vector<Node*> r = *b.MultiResultOp(Opcode::kAdamWUpdate, in, {{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}});
  Node* between = *b.Unary(Opcode::kNeg, r[0]);
  Node* sum = *b.Add(between, r[2]);
  ASSERT_TRUE(b.Return({sum}).ok());
  BufferPlanRequest request = RequestFor(f);
  request.roles[7] = BufferRole::kMultiResult;
  request.roles[8] = request.roles[10] = BufferRole::kResult;
  request.roles[9] = BufferRole::kNone;
  request.run_step = {0, 1, 2, 3, 4, 5, 6, 7, 7, 9, 7, 11, 12};
  absl::StatusOr<BufferPlan> plan = PlanBuffers(f, request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->node_buffer[7], -1);
  EXPECT_EQ(plan->node_buffer[9], -1);
  const PlannedBuffer& v_new = plan->buffers[plan->node_buffer[10]];
  EXPECT_EQ(v_new.first_step, 7);
  EXPECT_EQ(v_new.last_step, 12);
  for (int64_t other : {8, 11}) {
    const PlannedBuffer& o = plan->buffers[plan->node_buffer[other]];
    EXPECT_TRUE(o.offset + o.bytes <= v_new.offset || v_new.offset + v_new.bytes <= o.offset) << other;
  }
  // A multi-result node's kernels get their scratch too (the norm input gradient's dw
  // partials), live at its step alone, apart from its results' buffers.
  request.scratch_bytes[7] = 1000;
  absl::StatusOr<BufferPlan> with_scratch = PlanBuffers(f, request);
  ASSERT_TRUE(with_scratch.ok()) << with_scratch.status();
  ASSERT_GE(with_scratch->scratch_buffer[7], 0);
  const PlannedBuffer& scratch = with_scratch->buffers[with_scratch->scratch_buffer[7]];
  EXPECT_EQ(scratch.kind, PlannedBuffer::Kind::kScratch);
  EXPECT_GE(scratch.bytes, 1000);
  EXPECT_EQ(scratch.first_step, 7);
  EXPECT_EQ(scratch.last_step, 7);
  CheckPlan(f, request, *with_scratch);
  // A result written after it is defined is a malformed request.
  request.run_step[10] = 11;
  EXPECT_FALSE(PlanBuffers(f, request).ok());
}

TEST(BufferPlan, RandomGraphsHaveNoOverlapsAmongLiveBuffers) {
  int64_t checked_pairs = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    absl::StatusOr<std::unique_ptr<Module>> m =
        testing::BuildRandomGraph(seed, {.num_steps = 20 + static_cast<int>(seed % 40), .num_outputs = 4});
    ASSERT_TRUE(m.ok()) << m.status();
    const Function& f = *(*m)->functions()[0];
    BufferPlanRequest r = RequestFor(f, /*scratch_every=*/static_cast<int>(seed % 5));
    r.alignment = seed % 2 ? 256 : 64;
    absl::StatusOr<BufferPlan> plan = PlanBuffers(f, r);
    ASSERT_TRUE(plan.ok()) << "seed " << seed << ": " << plan.status();
    SCOPED_TRACE(seed);
    checked_pairs += CheckPlan(f, r, *plan);
  }
  EXPECT_GT(checked_pairs, 1000);
}

TEST(BufferPlan, LlamaTinyTrainingStepReusesMemory) {
  ModelConfig config = *PresetConfig("llama-tiny");
  std::unique_ptr<Module> m = *BuildLlamaModule(config, {.batch = 4, .seq_len = 32});
  absl::StatusOr<Function*> step = BuildTrainingStep(*m, *m->FindFunction("forward"), {});
  ASSERT_TRUE(step.ok()) << step.status();
  BufferPlanRequest r = RequestFor(**step, /*scratch_every=*/7);
  absl::StatusOr<BufferPlan> plan = PlanBuffers(**step, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(CheckPlan(**step, r, *plan), 10000);
  // Parameters, optimizer state and batch are a fixed cost; what reuse saves is the rest
  // (3.8x since AdamW scales the clipped gradients as it reads them: 4.3x while a mul per
  // gradient wrote a scaled copy, the temporaries' total counting each).
  const int64_t temporaries = plan->total_buffer_bytes - plan->parameter_bytes;
  const int64_t arena_temporaries = plan->arena_bytes - plan->parameter_bytes;
  EXPECT_LT(arena_temporaries * 3, temporaries) << plan->Summary();
  std::printf("llama-tiny train step: %s\n", plan->Summary().c_str());
}

// llama-S (batch 16, seq 1024) materializes [16,12,1024,1024] f32 attention tensors, 805 MB
// each, in every layer's forward and backward: only reuse makes the step fit on one GPU.
TEST(BufferPlan, LlamaSTrainingStepFitsOnOneGpu) {
  ModelConfig config = *PresetConfig("llama-S");
  std::unique_ptr<Module> m = *BuildLlamaModule(config);
  absl::StatusOr<Function*> step = BuildTrainingStep(*m, *m->FindFunction("forward"), {});
  ASSERT_TRUE(step.ok()) << step.status();
  BufferPlanRequest r = RequestFor(**step);
  absl::StatusOr<BufferPlan> plan = PlanBuffers(**step, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan(**step, r, *plan);
  std::printf("llama-S train step: %s\n", plan->Summary().c_str());
  EXPECT_LT(plan->arena_bytes, int64_t{100} << 30) << plan->Summary();  // an H200 has 141 GB
  EXPECT_LT(plan->arena_bytes, plan->live_peak_bytes * 5 / 4) << "placement wastes over 25%: " << plan->Summary();
  EXPECT_LT(plan->arena_bytes * 4, plan->total_buffer_bytes) << plan->Summary();
}

TEST(BufferPlan, RejectsMismatchedRequests) {
  Function f("bad");
  Builder b(&f);
  Node* x = *b.Parameter("x", {DType::kF32, {4}});
  Node* e = *b.Unary(Opcode::kExp, x);
  Node* g = *b.Unary(Opcode::kExp, e);
  ASSERT_TRUE(b.Return({g}).ok());
  BufferPlanRequest r;
  r.roles = {BufferRole::kOwn, BufferRole::kOwn};
  EXPECT_EQ(PlanBuffers(f, r).status().code(), absl::StatusCode::kInvalidArgument);
  r.roles = {BufferRole::kOwn, BufferRole::kNone, BufferRole::kOwn};
  absl::StatusOr<BufferPlan> plan = PlanBuffers(f, r);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("not computed"), absl::string_view::npos) << plan.status();
  r.roles = {BufferRole::kOwn, BufferRole::kOwn, BufferRole::kAlias};
  EXPECT_TRUE(PlanBuffers(f, r).ok());  // same byte count: an alias is allowed
}

}  // namespace
}  // namespace kiln
