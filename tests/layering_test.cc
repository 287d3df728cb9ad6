// DESIGN.md's data path, checked on the includes: frontends -> ir -> passes -> codegen ->
// runtime. A file may include its own layer and the layers before it in that flow, never a
// later one; kernels/ templates are included by codegen/ (which instantiates them) and by
// each other only; frontends/ ties everything together and may include any layer.
//
// The CPU reference backend, the oracle that passes fold constants with, lives in ir/
// (ir/reference_backend.h, ir/reference/) with the host tensors, numerics and thread pool it
// runs on, so no pass or code generator reaches into runtime/.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace kiln {
namespace {

const std::map<std::string, int>& LayerOrder() {
  static const std::map<std::string, int> order = {
      {"ir", 0}, {"passes", 1}, {"codegen", 2}, {"runtime", 3}, {"frontends", 4}};
  return order;
}

// Every `#include "dir/..."` of a project directory, as "file -> included".
std::vector<std::pair<std::string, std::string>> ProjectIncludes(const std::filesystem::path& root) {
  static const std::regex kInclude(R"re(^\s*#\s*include\s+"([a-z_]+/[^"]+)")re");
  std::vector<std::pair<std::string, std::string>> includes;
  for (const char* dir : {"ir", "passes", "codegen", "runtime", "kernels", "frontends"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / dir)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".cc" && ext != ".h" && ext != ".cuh")) continue;
      std::ifstream in(entry.path());
      std::string line;
      std::smatch m;
      while (std::getline(in, line)) {
        if (std::regex_search(line, m, kInclude)) {
          includes.emplace_back(std::filesystem::relative(entry.path(), root).string(), m[1].str());
        }
      }
    }
  }
  return includes;
}

std::string TopDir(const std::string& path) { return path.substr(0, path.find('/')); }

TEST(Layering, IncludesFollowTheDataPath) {
  const std::vector<std::pair<std::string, std::string>> includes = ProjectIncludes(KILN_SOURCE_DIR);
  ASSERT_GT(includes.size(), 500u) << "the walk found too few includes: is KILN_SOURCE_DIR the repo root?";
  for (const auto& [file, included] : includes) {
    const std::string from = TopDir(file), to = TopDir(included);
    if (LayerOrder().count(to) == 0 && to != "kernels") continue;  // generated (ir/ir.pb.h is ir), tests
    const std::string edge = file + " -> " + included;
    bool allowed;
    if (to == "kernels") {
      allowed = from == "kernels" || from == "codegen";
    } else if (from == "kernels") {
      allowed = false;  // kernel templates are self-contained CUDA C++
    } else {
      allowed = LayerOrder().at(to) <= LayerOrder().at(from);
    }
    if (allowed) continue;
    ADD_FAILURE() << edge << ": " << from << "/ may not include " << to << "/ (the data path is "
                  << "frontends -> ir -> passes -> codegen -> runtime; kernels/ only from codegen/)";
  }
}

// Compile, then run: the runtime reads codegen's product and calls nothing of codegen.
// Besides the CMake targets (kiln_cuda does not link kiln_codegen, so a call would not link),
// this says so on the includes: runtime/ may include only the program format's headers.
TEST(Layering, TheRuntimeIncludesOnlyTheProgramFormatOfCodegen) {
  // gemm_rules.h: what a GemmDescription of the format may hold for cuBLASLt (header only).
  const std::set<std::string> format = {"codegen/program.h", "codegen/kernel_spec.h", "codegen/gemm_rules.h"};
  for (const auto& [file, included] : ProjectIncludes(KILN_SOURCE_DIR)) {
    if (TopDir(file) != "runtime" || TopDir(included) != "codegen") continue;
    EXPECT_TRUE(format.count(included)) << file << " -> " << included
                                        << ": the runtime loads a CompiledProgram (codegen/program.h); compiling is "
                                        << "codegen's, and frontends/gpu_compile.h does both";
  }
}

}  // namespace
}  // namespace kiln
