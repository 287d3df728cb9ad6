// The static memory plan of one Function (DESIGN.md principle 6): every tensor the GPU
// executable keeps gets a byte offset in ONE arena, chosen at compile time from liveness so
// that buffers whose lifetimes do not overlap share bytes.
//
// Steps: node k of f.nodes() runs at step k; step N = f.num_nodes() is the finish, where
// outputs are read and donated outputs are copied into their parameters' buffers.
//
//   parameters   fixed buffers at the start of the arena, in parameter-index order, never
//                shared (inputs are written before a run, donated state stays between runs)
//   kOwn         a buffer live from its node's step to its last reader's step (an output's
//                to step N)
//   kAlias       no buffer of its own: operand 0's bytes (a reshape); the root buffer lives
//                until the last reader of any alias of it
//   scratch      bytes a node needs only while it runs (GEMM workspace, transposed GEMM
//                operands): live at that node's step alone
//   persistent   bytes a node keeps between runs (LoweredNode::persistent_bytes): live at
//                every step, so never shared; the executable zeroes them once
//   output copy  an output whose bytes are a parameter's (the parameter itself, or an alias
//                of it) is copied at step N into a buffer of its own, so that donations,
//                which overwrite parameters at step N, cannot change what it reads
//   in place     a donated output computed element by element from its parameter, after
//                every other reader of that parameter, takes the parameter's buffer: the
//                donation then needs no copy (AdamW's p', m', v'). And a value whose kernel
//                reads one operand element by element (in_place_operand), computed after
//                every other reader of that operand's buffer, of the same size, neither a
//                parameter nor an output, takes that buffer: cross_entropy_grad's dlogits
//                over the logits, which die there (llm.c's classifier does the same).
//                And a chain of such values from a parameter to the output donated to
//                it, each the last reader of the one before, all take the parameter's
//                buffer: the KV pool, written by each layer's kv_cache_write in turn
//
// Placement is greedy by size (largest first) with best fit among the gaps left by the
// already placed buffers whose lifetimes overlap; every offset and size is a multiple of
// `alignment`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"

namespace kiln {

enum class BufferRole : uint8_t {
  kNone,   // not computed (no output depends on it): no buffer
  kOwn,    // writes a buffer of its own (parameters always get their fixed one)
  kAlias,  // reinterprets operand 0's buffer
  kMultiResult,  // a node of several results (ir/graph.h): reads its operands at its step and
                 // writes its get_result nodes' buffers; no buffer of its own
  kResult,  // a get_result: a buffer of its own, written by its multi-result node's kernel at
            // that node's step (run_step); reads nothing itself
};

struct BufferPlanRequest {
  std::vector<BufferRole> roles;       // one per node, in f.nodes() order
  std::vector<int64_t> scratch_bytes;  // one per node, or empty for none
  std::vector<int64_t> persistent_bytes;  // one per node, or empty for none
  // One per node, or empty: the step at which the node runs, when that is not its own (a
  // kResult's: its multi-result node's step, which is earlier).
  std::vector<int64_t> run_step;
  // One per node, or empty: the node's kernel reads each operand element only to write the
  // same element of its result, before writing it. A donated output of such a node is then
  // placed in its parameter's buffer (updated in place, no copy at the finish) when no other
  // reader of the parameter runs after it.
  std::vector<bool> elementwise_in_place;
  // One per node, or empty: >= 0 when the node's kernel reads element i of that operand only to
  // write element i of its one result, before writing it, and nothing else of it. The result
  // then takes the operand's buffer when no other reader of that buffer runs after the node,
  // the sizes agree and the buffer is a computed value that is no output.
  std::vector<int> in_place_operand;
  // One per node, or empty: for an elementwise_in_place node of several results, one entry per
  // result, the operand whose buffer that result may take when donated (-1: none); empty for
  // any operand. A grouped adamw_update's result 3i+j may take only group i's p, m or v
  // (operand 4i+{0,2,3}), which that parameter must be exactly once among the node's operands.
  std::vector<std::vector<int>> in_place_operand_of_results;
  int64_t alignment = 256;
};

struct PlannedBuffer {
  enum class Kind : uint8_t { kParameter, kValue, kScratch, kOutputCopy, kPersistent };
  Kind kind = Kind::kValue;
  int64_t node_index = -1;  // the node whose value (or scratch) it holds; for an output copy, the output's node
  int64_t bytes = 0;        // rounded up to the alignment
  int64_t offset = 0;
  int64_t first_step = 0, last_step = 0;  // inclusive; parameters span [0, N]
};

struct BufferPlan {
  std::vector<PlannedBuffer> buffers;
  std::vector<int64_t> node_buffer;     // per node: index into `buffers` of its bytes (alias: the root's), -1 for kNone
  std::vector<int64_t> scratch_buffer;  // per node: index into `buffers`, or -1
  std::vector<int64_t> persistent_buffer;  // per node: index into `buffers`, or -1
  std::vector<int64_t> output_buffer;   // per output: where its value is read after step N
  std::vector<int64_t> output_copy_source;  // per output: the buffer copied from at step N, or -1
  int64_t parameter_bytes = 0;          // parameters occupy [0, parameter_bytes)
  int64_t arena_bytes = 0;              // the peak: every offset + bytes fits below it
  int64_t total_buffer_bytes = 0;       // the sum of all sizes: what no reuse would need
  int64_t live_peak_bytes = 0;          // the most bytes live at one step: no placement needs less
  int64_t in_place_outputs = 0;         // donated outputs written straight into their parameters
  int64_t in_place_values = 0;          // values written over an operand that dies there

  int64_t offset_of_node(int64_t node_index) const { return buffers[node_buffer[node_index]].offset; }
  // "arena 1.20 GiB (parameters 500.0 MiB; live peak 1.10 GiB), 812 buffers, 6.10 GiB without reuse".
  std::string Summary() const;
  // The `rows` largest buffers of f's plan, one line each: bytes, kind, node, live steps.
  std::string LargestBuffers(const Function& f, int rows) const;
};

// Fails (InvalidArgument) when the request does not match f (sizes), or a computed node reads
// a node marked kNone, or a kAlias node's bytes differ from its operand's.
absl::StatusOr<BufferPlan> PlanBuffers(const Function& f, const BufferPlanRequest& request);

}  // namespace kiln
