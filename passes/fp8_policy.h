// The FP8 training policy (Precision::kFp8, `kiln train --precision fp8`): the hybrid recipe
// of Transformer Engine, written into the training step as plain IR so that the reference
// backend defines its numerics and `kiln check --training --precision fp8` proves
// select-fp8-gemm (passes/select_fp8_gemm.h) against it.
//
// BuildTrainingStep applies it after each micro-batch's autodiff. Every GEMM of a linear
// layer (a dot_general without batch dims whose operands are bf16, the autocast model's)
// outside the scopes `skip_regex` matches reads its operands through FP8:
//   %x.fp8, %x.fp8.amax, %x.fp8.scale_inv = fp8_quantize(%x, %fp8.x) {out_dtype=f8e4m3}
//   %x.fp8.dq = fp8_dequantize(%x.fp8, %x.fp8.scale_inv) {out_dtype=bf16}
//   %y = dot_general(%x.fp8.dq, %w.fp8.dq) ...
// E4M3 for weights and activations (values not derived from the loss gradient), E5M2 for
// gradients (values that are: range matters more than precision there; `--fp8-grad-format
// e4m3` trades that range for a mantissa bit), one quantize per
// distinct operand value, shared by the forward GEMM and the backward GEMMs that read it
// (the weight by the forward and the input gradient's, the activation by the forward and
// the weight gradient's). A weight, whose GEMMs read its autocast bf16 copy, is quantized
// from the f32 master weight (one rounding instead of two, and no bf16 copy to write); an
// activation or a gradient as the GEMM read it (its producer writes bf16 where every use
// rounds to it: half the bytes of an f32 source). Accumulation stays f32; norms,
// softmax, attention, the loss and AdamW are bf16's.
//
// Delayed scaling: each FP8 tensor has a state, a step parameter `fp8.<value>` f32 [L + 2]
// (ir/op_table.h fp8_scale_update: the scale's exponent, the overflow count, the last L
// amaxes), donated to the step's output that updates it; all zero initially (scale 1, where
// e5m2 flushes gradients of 1e-6 to zero: `kiln train --fp8-calibrate` runs the first batch's
// step once and keeps only the states it measured). A
// step quantizes with the scale the earlier steps chose, each quantize kernel computing its
// tensor's amax as it reads it, and the step ends with one fp8_scale_update per tensor (the
// max over micro-batches of that tensor's amax). The scale is a power of two, so quantizing
// and dequantizing are exact scalings and the FP8 GEMM of (q, 2^-e) is the GEMM of the
// dequantized values bit for bit.
//
// Defaults (Fp8Options): history 16 with the max over it, margin 0. Transformer Engine's
// default is 1024 steps with max, Megatron's 1 (most recent). A long history reacts late
// when activations shrink (wasting range while the old max ages out: 1024 steps is a whole
// short run) and a history of 1 reacts to every spike: an overflow saturates, and one
// step's drop loses precision for the next step. 16 steps follows growth within a step
// and forgets a spike within 16; power-of-two scales already leave up to 2x headroom, so
// margin 0. The LM head stays bf16 by default (skip "lm_head"): its GEMMs are 2x the
// vocabulary-wide logits and their gradient, whose error feeds the loss directly, and FP8
// training recipes (TE, DeepSeek-V3) keep the output projection in higher precision.
#pragma once

#include <cstdint>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"

namespace kiln {

struct Fp8Options {
  int64_t history_length = 16;  // L >= 1 (see above)
  int64_t margin = 0;           // scale = 2^(e - margin): headroom against growth, in powers of two
  // GEMMs in scopes this matches (std::regex_search, ECMAScript) stay bf16.
  std::string skip_regex = "lm_head";
  // The gradients' format: e5m2 (the hybrid recipe: range) or e4m3 (one more mantissa bit,
  // 448 of range above the scale: per-tensor scaling must then cover the gradient's spread).
  DType gradient_format = DType::kF8E5M2;
};

// What the policy did to a step: its FP8 tensors, in state order.
struct Fp8Tensor {
  std::string name;       // the operand value's name in micro-batch 0
  std::string scope;      // of the first GEMM that reads it
  DType format = DType::kF8E4M3;
  int64_t num_elements = 0;
};

class Fp8Policy {
 public:
  // Fails on a history length < 1, a margin outside [0, 16] or a regex that does not compile.
  static absl::StatusOr<std::unique_ptr<Fp8Policy>> Create(const Fp8Options& options);

  // Quantizes the GEMM operands of nodes [first_node, end) of `step` (one micro-batch's
  // forward and backward; `loss_seed` is its backward's seed, the constant 1 that autodiff
  // gave the loss's cotangent). Micro-batch i > 0 must have micro-batch 0's structure: its
  // j-th FP8 tensor shares state j.
  absl::Status QuantizeMicroBatch(Function& step, int64_t first_node, const Node* loss_seed);

  // Appends one fp8_scale_update per state and returns them with their state parameters
  // (outputs[i] updates params[i]).
  struct Updates {
    std::vector<Node*> params, outputs;
  };
  absl::StatusOr<Updates> AppendScaleUpdates(Function& step);

  const std::vector<Fp8Tensor>& tensors() const { return tensors_; }
  const Fp8Options& options() const { return options_; }

 private:
  explicit Fp8Policy(Fp8Options options, std::regex skip) : options_(std::move(options)), skip_(std::move(skip)) {}

  Fp8Options options_;
  std::regex skip_;
  std::vector<Fp8Tensor> tensors_;
  std::vector<Node*> state_params_;
  std::vector<std::vector<Node*>> amaxes_;  // per state, one per micro-batch
  int64_t micro_batches_ = 0;
};

}  // namespace kiln
