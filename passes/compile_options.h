// CompileOptions: the one options struct of a compile (DESIGN.md principle 7). It is passed
// explicitly to everything that needs it; nothing reads flags or environment variables. The
// `kiln` CLI maps its flags into it, one field per flag.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ir/types.h"
#include "passes/backend_capabilities.h"
#include "passes/fp8_policy.h"
#include "passes/target.h"

namespace kiln {

// The precision policy narrowing passes implement (and are checked against, DESIGN.md
// principle 3). bf16: autocast, GEMM operands rounded to bf16 with f32 accumulation;
// fp32: nothing narrowed; fp8: bf16's model, and the training step's linear-layer GEMMs
// take FP8 operands with delayed per-tensor scaling (passes/fp8_policy.h: E4M3 weights and
// activations, E5M2 gradients, f32 accumulation; everything else as under bf16).
// The frontend builds models under it too (frontends/llama.h), so this is its one definition.
enum class Precision { kFp32, kBf16, kFp8 };

inline absl::string_view PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp8: return "fp8";
  }
  return "bf16";
}

inline absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp8") return Precision::kFp8;
  return absl::InvalidArgumentError(absl::StrCat("unknown precision '", name, "' (expected fp32, bf16 or fp8)"));
}

// The dtype a model's GEMM operands are built in (frontends/nn.h): bf16 under bf16 and fp8
// (the FP8 policy rewrites the training step's GEMMs of that model), f32 under fp32.
inline DType GemmOperandDType(Precision p) { return p == Precision::kFp32 ? DType::kF32 : DType::kBF16; }

struct CompileOptions {
  // The GPU to compile for (passes/target.h); empty: the device's, when there is one, else
  // the nominal sm_90a.
  std::optional<Target> target;
  // What the code generator's kernels take (codegen/capabilities.h); null: passes that need
  // an answer (select-flash-attention) select nothing, and say so in their decisions.
  const BackendCapabilities* capabilities = nullptr;
  Precision precision = Precision::kBf16;
  // Under Precision::kFp8: the amax history, margin and the scopes kept bf16
  // (passes/fp8_policy.h, `kiln train --fp8-history --fp8-margin --fp8-skip`).
  Fp8Options fp8;
  // chunk-lm-head (passes/chunk_lm_head.h): the most rows (tokens) of the LM head's logits one
  // chunk holds, the LM head and its loss computed chunk by chunk; 0: one chunk.
  int64_t lm_head_chunk_rows = 0;

  // Pass names to skip (a group's name skips the whole group), in whichever pipeline of the
  // compile has them. A name that none of the compile's pipelines has is an error that lists
  // theirs.
  std::vector<std::string> disabled_passes;
  // Passes that are off by default (Pass::off_by_default) to run; a name that none of the
  // compile's pipelines has is an error. disabled_passes wins over it.
  std::vector<std::string> enabled_passes;

  // When non-empty, the module is printed into this folder before the first pass
  // ("000-input.kir") and after each pass whose name matches `dump_regex` (partial match,
  // std::regex ECMAScript), numbered in execution order over the whole compile, all its
  // pipelines together: "003-after-cse.kir". A dump_regex that does not compile is an error
  // even when nothing is dumped.
  std::string dump_dir;
  std::string dump_regex = ".*";

  // Run VerifyModule after every pass that reports a change; errors read "after <pass>: ...".
  bool verify_each = true;
  // Print the module before and after every pass and fail when a pass changed it but
  // returned false. Costs two prints per pass: on in tests, off by default.
  bool check_change_reporting = false;

  // The most rounds a fixpoint group runs. Hitting the cap is an error when
  // `fixpoint_cap_is_error`, otherwise the group stops and the report carries a note.
  int fixpoint_max_rounds = 16;
  bool fixpoint_cap_is_error = false;
};

}  // namespace kiln
