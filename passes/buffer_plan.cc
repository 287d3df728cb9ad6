#include "passes/buffer_plan.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

int64_t RoundUp(int64_t bytes, int64_t alignment) { return (bytes + alignment - 1) / alignment * alignment; }

std::string NodeLabel(const Node& n) { return absl::StrCat("%", n.name(), " (", n.op_name(), ")"); }

std::string FormatBytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", bytes / double(int64_t{1} << 30));
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.1f MiB", bytes / double(int64_t{1} << 20));
  return absl::StrCat(bytes, " B");
}

// Places every buffer that is not a parameter: largest first, each at the best-fitting gap
// among the buffers already placed whose lifetimes overlap its own, else on top of them.
void PlaceMovable(std::vector<PlannedBuffer>& buffers, int64_t base) {
  std::vector<int64_t> order;
  for (int64_t i = 0; i < static_cast<int64_t>(buffers.size()); ++i) {
    if (buffers[i].kind != PlannedBuffer::Kind::kParameter) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (buffers[a].bytes != buffers[b].bytes) return buffers[a].bytes > buffers[b].bytes;
    return buffers[a].first_step < buffers[b].first_step;
  });
  std::vector<int64_t> placed;
  std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end) of overlapping placed buffers
  for (int64_t i : order) {
    PlannedBuffer& b = buffers[i];
    busy.clear();
    for (int64_t j : placed) {
      const PlannedBuffer& o = buffers[j];
      if (o.bytes > 0 && o.first_step <= b.last_step && b.first_step <= o.last_step) {
        busy.push_back({o.offset, o.offset + o.bytes});
      }
    }
    std::sort(busy.begin(), busy.end());
    int64_t best = -1, best_gap = std::numeric_limits<int64_t>::max();
    int64_t cursor = base;  // the lowest byte not covered by the busy intervals seen so far
    for (const auto& [begin, end] : busy) {
      const int64_t gap = begin - cursor;
      if (gap >= b.bytes && gap < best_gap) {
        best = cursor;
        best_gap = gap;
      }
      cursor = std::max(cursor, end);
    }
    b.offset = best >= 0 ? best : cursor;
    placed.push_back(i);
  }
}

}  // namespace

std::string BufferPlan::Summary() const {
  return absl::StrCat("arena ", FormatBytes(arena_bytes), " (parameters ", FormatBytes(parameter_bytes),
                      "; live peak ", FormatBytes(live_peak_bytes), "), ", buffers.size(), " buffers, ",
                      FormatBytes(total_buffer_bytes), " without reuse");
}

std::string BufferPlan::LargestBuffers(const Function& f, int rows) const {
  std::vector<const PlannedBuffer*> order;
  for (const PlannedBuffer& b : buffers) order.push_back(&b);
  std::stable_sort(order.begin(), order.end(),
                   [](const PlannedBuffer* a, const PlannedBuffer* b) { return a->bytes > b->bytes; });
  std::string out;
  for (int i = 0; i < rows && i < static_cast<int>(order.size()); ++i) {
    const PlannedBuffer& b = *order[i];
    static constexpr const char* kKinds[] = {"parameter", "value", "scratch", "output copy", "persistent"};
    const Node* node = b.node_index >= 0 && b.node_index < f.num_nodes() ? f.nodes()[b.node_index].get() : nullptr;
    absl::StrAppend(&out, "  ", FormatBytes(b.bytes), "  ", kKinds[static_cast<int>(b.kind)], "  ",
                    node ? absl::StrCat("%", node->name(), " = ", node->op_name(), " ", node->type().ToString(),
                                        node->scope().empty() ? "" : absl::StrCat(" [", node->scope(), "]"))
                         : "",
                    "  steps ", b.first_step, "-", b.last_step, "\n");
  }
  return out;
}

namespace {

// Whether result `result` of `writer` (node index w) is computed element by element from
// `param`, so that it may take param's buffer: param is one of writer's operands, and where the
// request names one operand per result (a grouped adamw_update), it is that one and appears
// once among the operands.
bool UpdatesOperand(const BufferPlanRequest& request, int64_t w, const Node& writer, int result, const Node* param) {
  const std::vector<Node*>& operands = writer.operands();
  const std::vector<int>* per_result =
      request.in_place_operand_of_results.empty() || request.in_place_operand_of_results[w].empty()
          ? nullptr
          : &request.in_place_operand_of_results[w];
  if (per_result == nullptr) return std::find(operands.begin(), operands.end(), param) != operands.end();
  if (result < 0 || result >= static_cast<int>(per_result->size())) return false;
  const int k = (*per_result)[result];
  return k >= 0 && k < writer.num_operands() && operands[k] == param &&
         std::count(operands.begin(), operands.end(), param) == 1;
}

// The node whose kernels write `link` (itself, or a result's multi-result node) and the operand
// of that node whose buffer `link` may take in place (in_place_operand, or for a result
// in_place_operand_of_results of its node), or {nullptr, -1}.
std::pair<const Node*, int> InPlaceLink(const BufferPlanRequest& request,
                                        const absl::flat_hash_map<const Node*, int64_t>& index_of, const Node& link) {
  const int64_t i = index_of.at(&link);
  if (request.roles[i] == BufferRole::kOwn) {
    const int k = request.in_place_operand.empty() ? -1 : request.in_place_operand[i];
    if (k >= 0 && k < link.num_operands()) return {&link, k};
  } else if (request.roles[i] == BufferRole::kResult && !request.in_place_operand_of_results.empty()) {
    const Node* writer = link.operand(0);
    const int64_t w = index_of.at(writer);
    const std::vector<int>& per_result = request.in_place_operand_of_results[w];
    const int r = link.result_index();
    if (!request.elementwise_in_place[w] && r >= 0 && r < static_cast<int>(per_result.size()) && per_result[r] >= 0 &&
        per_result[r] < writer->num_operands()) {
      return {writer, per_result[r]};
    }
  }
  return {nullptr, -1};
}

// The nodes from a parameter to the output donated to it when each takes its predecessor's
// buffer in place and so all of them may live in the parameter's buffer (kv_cache_write, or a
// cache_write fusion's result, layer after layer, into the KV pool): each link a value of its
// own or a result, of its predecessor's size, its kernels reading no other link, and run after
// every other reader of its predecessor; no link but the last returned. Empty when `out` is
// not such a chain's end.
std::vector<int64_t> UpdateChain(const BufferPlanRequest& request,
                                 const absl::flat_hash_map<const Node*, int64_t>& index_of,
                                 const absl::flat_hash_map<const Node*, int>& returned, const Node& param,
                                 const Node& out) {
  if (request.in_place_operand.empty() && request.in_place_operand_of_results.empty()) return {};
  auto step_of = [&](int64_t i) { return request.run_step.empty() ? i : request.run_step[i]; };
  std::vector<int64_t> chain;                                  // from `out` back towards `param`
  std::vector<std::pair<const Node*, int>> writers;            // each link's writer and in-place operand
  for (const Node* link = &out; link != &param;) {
    const int64_t i = index_of.at(link);
    const auto [writer, k] = InPlaceLink(request, index_of, *link);
    if (writer == nullptr) return {};
    const Node* prev = writer->operand(k);
    if (prev->type().num_bytes() != link->type().num_bytes() ||
        prev->type().num_elements() != link->type().num_elements() || (prev != &param && returned.contains(prev))) {
      return {};
    }
    for (int j = 0; j < writer->num_operands(); ++j) {
      if (j != k && writer->operand(j) == prev) return {};
    }
    for (const Node* user : prev->users()) {
      const int64_t u = index_of.at(user);
      if (user == writer || request.roles[u] == BufferRole::kNone) continue;
      if (request.roles[u] == BufferRole::kAlias || step_of(u) >= step_of(i)) return {};
    }
    chain.push_back(i);
    writers.emplace_back(writer, k);
    if (prev != &param && prev->opcode() == Opcode::kParameter) return {};
    link = prev;
  }
  // No link may be read by a later link's kernels as another operand (checked above against
  // its predecessor only): the chain's values are one buffer, overwritten link by link.
  for (const auto& [writer, k] : writers) {
    for (int j = 0; j < writer->num_operands(); ++j) {
      if (j != k && std::find(chain.begin(), chain.end(), index_of.at(writer->operand(j))) != chain.end()) return {};
    }
  }
  return chain;
}

// For each node, the index of the parameter node whose buffer it takes (an in-place
// donation), or -1. See "in place" in the header.
std::vector<int64_t> InPlaceDonations(const Function& f, const BufferPlanRequest& request,
                                      const absl::flat_hash_map<const Node*, int64_t>& index_of) {
  const int64_t num_nodes = f.num_nodes();
  std::vector<int64_t> in_place(num_nodes, -1);
  if (request.elementwise_in_place.empty() || f.output_aliases().empty()) return in_place;
  auto step_of = [&](int64_t i) { return request.run_step.empty() ? i : request.run_step[i]; };
  const std::vector<Node*> params = f.parameters();
  // Parameters returned as themselves (or through an alias) are read at the finish.
  absl::flat_hash_map<const Node*, int> returned;
  for (const Node* out : f.outputs()) {
    const Node* root = out;
    while (request.roles[index_of.at(root)] == BufferRole::kAlias) root = root->operand(0);
    ++returned[root];
  }
  for (size_t o = 0; o < f.output_aliases().size(); ++o) {
    const int64_t p = f.output_aliases()[o];
    if (p < 0 || p >= static_cast<int64_t>(params.size())) continue;
    const Node* param = params[p];
    const Node* out = f.outputs()[o];
    const int64_t n = index_of.at(out);
    const BufferRole role = request.roles[n];
    // The node whose kernel computes the output: itself, or a result's multi-result node.
    const Node* writer = role == BufferRole::kResult ? out->operand(0) : out;
    if (returned.contains(param) || returned[out] != 1) continue;
    if ((role != BufferRole::kOwn && role != BufferRole::kResult) || !request.elementwise_in_place[index_of.at(writer)] ||
        out->type().num_bytes() != param->type().num_bytes() ||
        !UpdatesOperand(request, index_of.at(writer), *writer, role == BufferRole::kResult ? out->result_index() : 0,
                        param)) {
      for (int64_t link : UpdateChain(request, index_of, returned, *param, *out)) in_place[link] = index_of.at(param);
      continue;
    }
    // Every reader of the parameter (or of an alias of it) runs before this node's kernel,
    // or is that kernel.
    bool last = true;
    std::vector<const Node*> values = {param};
    for (size_t v = 0; v < values.size() && last; ++v) {
      for (const Node* user : values[v]->users()) {
        const int64_t u = index_of.at(user);
        if (request.roles[u] == BufferRole::kNone) continue;
        if (request.roles[u] == BufferRole::kAlias) {
          values.push_back(user);
          continue;
        }
        last &= step_of(u) < step_of(n) || (step_of(u) == step_of(n) && request.elementwise_in_place[u]);
      }
    }
    if (last) in_place[n] = index_of.at(param);
  }
  return in_place;
}

// Whether node i may write its result over operand k's buffer b (see in_place_operand in the
// header): b holds a computed value (not a parameter), no node sharing b is an output, and
// every reader of a node sharing b runs before node i or is node i.
bool TakesOperandBuffer(const Function& f, const BufferPlanRequest& request, const BufferPlan& plan,
                        const std::vector<std::vector<int64_t>>& nodes_of_buffer,
                        const absl::flat_hash_map<const Node*, int64_t>& index_of, int64_t i, int64_t b) {
  auto step_of = [&](int64_t n) { return request.run_step.empty() ? n : request.run_step[n]; };
  const Node& n = *f.nodes()[i];
  const Node& operand = *n.operand(request.in_place_operand[i]);
  if (plan.buffers[b].kind != PlannedBuffer::Kind::kValue || operand.type().num_bytes() != n.type().num_bytes() ||
      operand.type().num_elements() != n.type().num_elements()) {
    return false;
  }
  for (int j = 0; j < n.num_operands(); ++j) {  // the kernel reads its other operands as it likes
    if (j != request.in_place_operand[i] && plan.node_buffer[index_of.at(n.operand(j))] == b) return false;
  }
  for (int64_t sharer : nodes_of_buffer[b]) {
    const Node* s = f.nodes()[sharer].get();
    if (std::find(f.outputs().begin(), f.outputs().end(), s) != f.outputs().end()) return false;
    for (const Node* user : s->users()) {
      const int64_t u = index_of.at(user);
      if (u == i || request.roles[u] == BufferRole::kNone) continue;
      if (step_of(u) >= step_of(i)) return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<BufferPlan> PlanBuffers(const Function& f, const BufferPlanRequest& request) {
  const int64_t num_nodes = f.num_nodes();
  const int64_t finish = num_nodes;  // step N: outputs read, donations copied
  const int64_t alignment = request.alignment;
  if (static_cast<int64_t>(request.roles.size()) != num_nodes ||
      (!request.scratch_bytes.empty() && static_cast<int64_t>(request.scratch_bytes.size()) != num_nodes) ||
      (!request.persistent_bytes.empty() && static_cast<int64_t>(request.persistent_bytes.size()) != num_nodes) ||
      (!request.run_step.empty() && static_cast<int64_t>(request.run_step.size()) != num_nodes) ||
      (!request.elementwise_in_place.empty() &&
       static_cast<int64_t>(request.elementwise_in_place.size()) != num_nodes) ||
      (!request.in_place_operand.empty() && static_cast<int64_t>(request.in_place_operand.size()) != num_nodes) ||
      (!request.in_place_operand_of_results.empty() &&
       static_cast<int64_t>(request.in_place_operand_of_results.size()) != num_nodes) ||
      alignment <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("buffer plan for @", f.name(), ": ", request.roles.size(),
                                                   " roles and ", request.scratch_bytes.size(),
                                                   " scratch sizes for ", num_nodes, " nodes, alignment ", alignment));
  }
  absl::flat_hash_map<const Node*, int64_t> index_of;
  for (int64_t i = 0; i < num_nodes; ++i) index_of[f.nodes()[i].get()] = i;

  BufferPlan plan;
  plan.node_buffer.assign(num_nodes, -1);
  plan.scratch_buffer.assign(num_nodes, -1);
  plan.persistent_buffer.assign(num_nodes, -1);
  auto add_buffer = [&](PlannedBuffer::Kind kind, int64_t node, int64_t bytes, int64_t first) {
    plan.buffers.push_back({kind, node, RoundUp(bytes, alignment), 0, first, first});
    return static_cast<int64_t>(plan.buffers.size()) - 1;
  };

  // Parameters first, in index order, packed at the bottom of the arena.
  for (const Node* p : f.parameters()) {
    const int64_t i = index_of.at(p);
    const int64_t b = add_buffer(PlannedBuffer::Kind::kParameter, i, p->type().num_bytes(), 0);
    plan.buffers[b].offset = plan.parameter_bytes;
    plan.buffers[b].last_step = finish;
    plan.parameter_bytes += plan.buffers[b].bytes;
    plan.node_buffer[i] = b;
  }

  auto step_of = [&](int64_t i) { return request.run_step.empty() ? i : request.run_step[i]; };
  const std::vector<int64_t> in_place = InPlaceDonations(f, request, index_of);
  // The nodes whose bytes each buffer holds so far (a value, its aliases, what took it in
  // place), for in_place_operand's check.
  std::vector<std::vector<int64_t>> nodes_of_buffer(plan.buffers.size());
  auto share = [&](int64_t node, int64_t b) {
    plan.node_buffer[node] = b;
    if (static_cast<int64_t>(nodes_of_buffer.size()) <= b) nodes_of_buffer.resize(b + 1);
    nodes_of_buffer[b].push_back(node);
  };

  // Values in step order; each read extends the lifetime of the buffer it reads.
  for (int64_t i = 0; i < num_nodes; ++i) {
    const Node& n = *f.nodes()[i];
    const BufferRole role = request.roles[i];
    if (n.opcode() == Opcode::kParameter || role == BufferRole::kNone) continue;
    if (role == BufferRole::kResult) {
      // Written at its multi-result node's step, which reads the operands.
      if (step_of(i) > i) {
        return absl::InvalidArgumentError(absl::StrCat("buffer plan for @", f.name(), ": result ", NodeLabel(n),
                                                       " is written at step ", step_of(i), ", after it is defined"));
      }
      share(i, in_place[i] >= 0 ? plan.node_buffer[in_place[i]]
                                : add_buffer(PlannedBuffer::Kind::kValue, i, n.type().num_bytes(), step_of(i)));
      continue;
    }
    const int64_t read_step = step_of(i);
    if (read_step < i || read_step >= num_nodes) {
      return absl::InvalidArgumentError(absl::StrCat("buffer plan for @", f.name(), ": ", NodeLabel(n),
                                                     " is run at step ", read_step, ", before it is defined"));
    }
    for (const Node* operand : n.operands()) {
      const int64_t operand_index = index_of.at(operand);
      const int64_t b = plan.node_buffer[operand_index];
      if (b < 0) {
        return absl::InvalidArgumentError(absl::StrCat("buffer plan for @", f.name(), ": ", NodeLabel(n),
                                                       " reads ", NodeLabel(*operand), ", which is not computed"));
      }
      plan.buffers[b].last_step = std::max(plan.buffers[b].last_step, read_step);
    }
    // A node's scratch, its results' buffers or not (a multi-result node's get_results own
    // those; its kernels may still need scratch: the norm input gradient with dw's partials).
    if (!request.scratch_bytes.empty() && request.scratch_bytes[i] > 0) {
      plan.scratch_buffer[i] = add_buffer(PlannedBuffer::Kind::kScratch, i, request.scratch_bytes[i], i);
    }
    // Live from the first step to the finish: no other buffer overlaps it, in this run or
    // between runs.
    if (!request.persistent_bytes.empty() && request.persistent_bytes[i] > 0) {
      plan.persistent_buffer[i] = add_buffer(PlannedBuffer::Kind::kPersistent, i, request.persistent_bytes[i], 0);
      plan.buffers[plan.persistent_buffer[i]].last_step = finish;
    }
    if (role == BufferRole::kMultiResult) continue;
    if (role == BufferRole::kAlias) {
      if (n.num_operands() < 1 || n.operand(0)->type().num_bytes() != n.type().num_bytes()) {
        return absl::InvalidArgumentError(absl::StrCat("buffer plan for @", f.name(), ": ", NodeLabel(n),
                                                       " cannot alias its operand: ", n.type().ToString(), " vs ",
                                                       n.num_operands() ? n.operand(0)->type().ToString() : "none"));
      }
      share(i, plan.node_buffer[index_of.at(n.operand(0))]);
    } else if (in_place[i] >= 0) {
      share(i, plan.node_buffer[in_place[i]]);
    } else if (const int k = request.in_place_operand.empty() ? -1 : request.in_place_operand[i];
               k >= 0 && k < n.num_operands() &&
               TakesOperandBuffer(f, request, plan, nodes_of_buffer, index_of, i,
                                  plan.node_buffer[index_of.at(n.operand(k))])) {
      share(i, plan.node_buffer[index_of.at(n.operand(k))]);
      ++plan.in_place_values;
    } else {
      share(i, add_buffer(PlannedBuffer::Kind::kValue, i, n.type().num_bytes(), i));
    }
  }

  // Outputs live to the finish; those whose bytes are a parameter's get a copy of their own.
  for (const Node* out : f.outputs()) {
    const int64_t i = index_of.at(out);
    const int64_t b = plan.node_buffer[i];
    if (b < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("buffer plan for @", f.name(), ": output ", NodeLabel(*out), " is not computed"));
    }
    plan.buffers[b].last_step = finish;
    if (in_place[i] >= 0) {  // already in the parameter it is donated to
      ++plan.in_place_outputs;
      plan.output_copy_source.push_back(-1);
      plan.output_buffer.push_back(b);
    } else if (plan.buffers[b].kind == PlannedBuffer::Kind::kParameter) {
      plan.output_copy_source.push_back(b);
      plan.output_buffer.push_back(add_buffer(PlannedBuffer::Kind::kOutputCopy, i, out->type().num_bytes(), finish));
    } else {
      plan.output_copy_source.push_back(-1);
      plan.output_buffer.push_back(b);
    }
  }

  PlaceMovable(plan.buffers, plan.parameter_bytes);
  std::vector<int64_t> live_delta(finish + 2, 0);  // bytes that become live (+) or dead (-) at each step
  for (const PlannedBuffer& b : plan.buffers) {
    plan.arena_bytes = std::max(plan.arena_bytes, b.offset + b.bytes);
    plan.total_buffer_bytes += b.bytes;
    live_delta[b.first_step] += b.bytes;
    live_delta[b.last_step + 1] -= b.bytes;
  }
  for (int64_t step = 0, live = 0; step <= finish; ++step) {
    live += live_delta[step];
    plan.live_peak_bytes = std::max(plan.live_peak_bytes, live);
  }
  return plan;
}

}  // namespace kiln
