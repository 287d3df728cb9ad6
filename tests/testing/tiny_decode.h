// llama-tiny's @decode function compiled as kiln generate compiles it (the inference
// pipeline, some passes disabled), and arguments for a batch of four: the shared fixture of
// the decode passes' tests (tests/fuse_cache_write_test.cc, tests/fuse_gemv_glu_test.cc,
// tests/merge_cache_write_siblings_test.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/fusion.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"

namespace kiln::testing {

// Blocks of 4 tokens, 8 of them, 4 a sequence at most; `batch` sequences a call. With
// `enabled_passes`, passes that are off by default run too.
std::unique_ptr<Module> TinyDecode(int64_t batch, const std::vector<std::string>& disabled_passes,
                                   const std::vector<std::string>& enabled_passes = {});

// Four sequences, one of them padding (position and slot -1), one whose slot is in the
// second block of its table; random weights and pools (a decode function of batch 4).
std::vector<HostTensor> TinyDecodeArgs(const Function& f);

// `f`'s fusion nodes of `kind`, in order.
std::vector<const Node*> FusionsOfKind(const Function& f, FusionKind kind);

// A test failure for each output of `got` whose type or any element differs from `want`'s.
void ExpectSameBits(const std::vector<HostTensor>& got, const std::vector<HostTensor>& want);

// Evaluates `fused` and `plain` (one decode function of batch 4 with a pass and without it) on
// TinyDecodeArgs with the reference backend: a failure unless every output has the same bits.
// `fused_outputs`, when given, receives `fused`'s outputs.
void ExpectSameDecode(const Function& fused, const Function& plain, std::vector<HostTensor>* fused_outputs = nullptr);

// A failure unless `m` printed, parsed and printed again is the same text.
void ExpectTextRoundTrips(const Module& m);

}  // namespace kiln::testing
