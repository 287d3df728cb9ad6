#include "codegen/kernel_listing.h"

#include <filesystem>
#include <map>
#include <system_error>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "codegen/cubin_info.h"
#include "codegen/occupancy.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

std::string Dims(const std::array<uint32_t, 3>& d) {
  if (d[1] == 1 && d[2] == 1) return absl::StrCat(d[0]);
  return absl::StrCat(d[0], "x", d[1], "x", d[2]);
}

std::string NodeLabel(const Node& n) {
  return absl::StrCat(n.parent() != nullptr ? absl::StrCat("@", n.parent()->name(), " ") : "", "%", n.name(), " (",
                      n.op_name(), ")");
}

// How the kernel takes part in programmatic dependent launch (codegen/kernel_spec.h).
std::string LaunchOrder(const KernelSpec& k) {
  if (!k.waits_for_grid_dependency) return "stream order";
  return absl::StrCat("programmatic: waits for the kernels ahead ",
                      k.waits_itself ? "after reading step-invariant data (its weights)" : "first",
                      "; lets the next launch ", k.launches_dependents_itself ? "late, itself" : "at its start");
}

// One kernel body at one launch geometry, and the nodes that launch it so.
struct Row {
  int compiled = 0;
  const KernelSpec* spec = nullptr;
  std::vector<const Node*> nodes;
};

}  // namespace

absl::StatusOr<std::string> WriteKernelListing(const KernelCompileReport& report, const std::string& dir,
                                               const Target& target) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--kernels-dir ", dir, ": ", ec.message()));

  std::vector<Row> rows;
  std::map<std::tuple<int, std::array<uint32_t, 3>, std::array<uint32_t, 3>, uint32_t>, size_t> row_of;
  std::map<int, const KernelSpec*> source_of;  // per compiled body: the first node's kernel, the one compiled
  for (const NodeKernels& n : report.nodes) {
    for (size_t i = 0; i < n.lowered.kernels.size() && i < n.compiled.size(); ++i) {
      const KernelSpec& k = n.lowered.kernels[i];
      const auto key = std::make_tuple(n.compiled[i], k.grid, k.block, k.shared_bytes);
      auto [it, added] = row_of.emplace(key, rows.size());
      if (added) rows.push_back(Row{.compiled = n.compiled[i], .spec = &k});
      source_of.emplace(n.compiled[i], &k);
      rows[it->second].nodes.push_back(n.node);
    }
  }

  std::vector<KernelResources> resources(report.kernels.size());
  for (size_t c = 0; c < report.kernels.size(); ++c) {
    absl::StatusOr<KernelResources> r = ReadKernelResources(report.kernels[c].cubin, report.kernels[c].name);
    if (!r.ok()) return absl::InternalError(absl::StrCat("kernel ", report.kernels[c].name, ": ", r.status().message()));
    resources[c] = *r;
  }

  std::string table =
      absl::StrFormat("%-44s %8s %10s %7s %5s %7s %9s %9s %-22s  %s\n", "kernel (file: kernel.cu)", "listed", "grid",
                      "block", "regs", "frame", "static_sm", "dynamic_sm", "blocks/SM (limit)", "nodes");
  std::map<int, std::string> headers;  // per compiled body: its geometry lines
  for (const Row& row : rows) {
    const CompiledKernel& compiled = report.kernels[row.compiled];
    const KernelResources& r = resources[row.compiled];
    std::string nodes = NodeLabel(*row.nodes.front());
    if (row.nodes.size() > 1) absl::StrAppend(&nodes, " and ", row.nodes.size() - 1, " more");
    const Occupancy occupancy =
        BlocksPerSm(target, static_cast<int64_t>(row.spec->block[0]) * row.spec->block[1] * row.spec->block[2],
                    r.registers, r.static_shared_bytes + row.spec->shared_bytes);
    absl::StrAppendFormat(&table, "%-44s %8d %10s %7s %5d %7d %9d %9d %-22s  %s\n", compiled.name, row.nodes.size(),
                          Dims(row.spec->grid), Dims(row.spec->block), r.registers, r.frame_bytes,
                          r.static_shared_bytes, row.spec->shared_bytes,
                          absl::StrCat(occupancy.blocks_per_sm, " (", occupancy.limit, ")"), nodes);
    std::vector<std::string> labels;
    for (const Node* n : row.nodes) labels.push_back(NodeLabel(*n));
    absl::StrAppend(&headers[row.compiled], "// launched as grid ", Dims(row.spec->grid), ", block ",
                    Dims(row.spec->block), ", ", row.spec->shared_bytes, " bytes of dynamic shared memory, by ",
                    row.nodes.size(), row.nodes.size() == 1 ? " node: " : " nodes: ", absl::StrJoin(labels, ", "),
                    "\n//   ", LaunchOrder(*row.spec), "\n");
    absl::StrAppend(&headers[row.compiled], "//   ", occupancy.blocks_per_sm, " blocks an SM at most (limited by ",
                    occupancy.limit, ")\n");
  }
  for (const auto& [c, geometry] : headers) {
    const CompiledKernel& compiled = report.kernels[c];
    const KernelResources& r = resources[c];
    const std::string text = absl::StrCat(
        "// kiln compile --kernels-dir: ", compiled.name, " for ", target.arch, "\n", geometry, "// ptxas: ", r.registers,
        " registers a thread, ", r.frame_bytes, " bytes of local frame a thread (spills, local arrays), ",
        r.static_shared_bytes, " bytes of static shared memory a block\n",
        "// The kernels/*.cuh it includes are kiln's kernel templates (the source tree's kernels/).\n\n",
        source_of.at(c)->source);
    RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir, "/", compiled.name, ".cu"), text));
  }
  RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir, "/kernels.txt"), table));
  return table;
}

}  // namespace kiln
