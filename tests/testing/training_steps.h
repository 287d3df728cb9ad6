// Training steps compiled as kiln train compiles them, shared by the data-parallel tests
// (tests/grad_buckets_test.cc, tests/reference_data_parallel_test.cc).
#pragma once

#include <cstdint>
#include <memory>

#include "ir/graph.h"
#include "passes/compile_options.h"
#include "passes/training_step.h"

namespace kiln::testing {

struct CompiledTrainingStep {
  std::unique_ptr<Module> module;
  Function* step = nullptr;
  TrainingStepLayout layout;
};

// llama-tiny's training step (`batch` rows of `seq_len` tokens a micro-batch, `accum`
// micro-batches, clipping at `clip_norm`, 0: off) through the default pipeline, without
// merge-sibling-gemms: its merged weight-gradient GEMM writes several gradients at once,
// each then a slice that the clip's fused kernel recomputes from the merged result, so an
// all-reduce of the slices (the buckets' gradients) would not reach it. A data-parallel
// runner must all-reduce the merged result instead, or run with the pass off.
CompiledTrainingStep CompileLlamaTinyStepWithoutMergedGemms(int64_t batch, int64_t seq_len, Precision precision,
                                                            double clip_norm, int64_t accum = 1);

}  // namespace kiln::testing
