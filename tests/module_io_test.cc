#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ir/module_io.h"
#include "ir/proto_io.h"
#include "ir/text_format.h"
#include "tests/testing/all_ops.h"

namespace kiln {
namespace {

std::string TempPath(absl::string_view name) { return absl::StrCat(::testing::TempDir(), "kiln_module_io_", name); }

void WriteFile(const std::string& path, absl::string_view contents) {
  std::ofstream(path, std::ios::binary) << contents;
}

TEST(ModuleIo, ParsesFormatNames) {
  EXPECT_EQ(*ParseModuleFormat("text"), ModuleFormat::kText);
  EXPECT_EQ(*ParseModuleFormat("proto"), ModuleFormat::kProtoBinary);
  EXPECT_EQ(*ParseModuleFormat("json"), ModuleFormat::kProtoJson);
  EXPECT_EQ(*ParseModuleFormat("dot"), ModuleFormat::kDot);
  absl::StatusOr<ModuleFormat> bad = ParseModuleFormat("yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "unknown module format 'yaml'")) << bad.status();
}

TEST(ModuleIo, DetectsFormatFromContent) {
  std::string binary = *ModuleToProtoBinary(*testing::BuildAllOpsModule());
  struct Case {
    std::string content;
    ModuleFormat format;
  };
  for (const Case& c : std::vector<Case>{
           {"module @m\n", ModuleFormat::kText},
           {"\n\n// saved by kiln\n  // another comment\n\tmodule @m", ModuleFormat::kText},
           {"{\"format_version\": 1}", ModuleFormat::kProtoJson},
           {" \r\n {", ModuleFormat::kProtoJson},
           {"digraph \"m\" {}", ModuleFormat::kDot},
           {binary, ModuleFormat::kProtoBinary},
           {"// a comment, then binary\n\x08\x01", ModuleFormat::kProtoBinary},
       }) {
    EXPECT_EQ(DetectModuleFormat(c.content), c.format) << c.content;
  }
}

// Every writable-and-readable form gives back the same module: compared through the
// binary proto (which holds ids, names, ops, operands, types, attrs, scopes and outputs)
// and through the text form.
TEST(ModuleIo, RoundTripsEveryReadableFormat) {
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  std::string want_binary = *ModuleToProtoBinary(*m);
  for (ModuleFormat format : {ModuleFormat::kText, ModuleFormat::kProtoBinary, ModuleFormat::kProtoJson}) {
    SCOPED_TRACE(static_cast<int>(format));
    absl::StatusOr<std::string> written = WriteModule(*m, format);
    ASSERT_TRUE(written.ok()) << written.status();
    EXPECT_EQ(DetectModuleFormat(*written), format);
    absl::StatusOr<std::unique_ptr<Module>> back = ReadModule(*written);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(PrintModule(**back), PrintModule(*m));
    if (format != ModuleFormat::kText) {  // the text form identifies nodes by name, not id
      EXPECT_EQ(*ModuleToProtoBinary(**back), want_binary);
    }
  }
}

TEST(ModuleIo, DotIsWriteOnly) {
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  absl::StatusOr<std::string> dot = WriteModule(*m, ModuleFormat::kDot);
  ASSERT_TRUE(dot.ok()) << dot.status();
  EXPECT_TRUE(absl::StartsWith(*dot, "digraph \"all_ops\" {")) << dot->substr(0, 40);
  absl::StatusOr<std::unique_ptr<Module>> back = ReadModule(*dot);
  ASSERT_FALSE(back.ok());
  EXPECT_TRUE(absl::StrContains(back.status().message(), "Graphviz output, which cannot be read back"))
      << back.status();
}

TEST(ModuleIo, ReadErrorsSayWhatWasExpected) {
  struct Case {
    std::string content;
    std::string phrase;
  };
  for (const Case& c : std::vector<Case>{
           {"", "empty input"},
           {"\n  // only a comment\n", "empty input"},
           {"hello world", "read as binary protobuf (the input starts with neither 'module' nor '{')"},
           {"{\"format_version\": 7}", "unsupported IR format version 7"},
           {"module @m\nfunc @f {\n", "3:1: expected"},  // the text parser's line:column
       }) {
    absl::StatusOr<std::unique_ptr<Module>> m = ReadModule(c.content);
    ASSERT_FALSE(m.ok()) << c.content;
    EXPECT_TRUE(absl::StrContains(m.status().message(), c.phrase)) << c.content << " -> " << m.status();
  }
}

TEST(ModuleIo, ReadsFilesOfEveryFormat) {
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  for (auto [name, format] : {std::pair{"text", ModuleFormat::kText}, std::pair{"proto", ModuleFormat::kProtoBinary},
                              std::pair{"json", ModuleFormat::kProtoJson}}) {
    std::string path = TempPath(absl::StrCat("all_ops.", name));
    WriteFile(path, *WriteModule(*m, format));
    absl::StatusOr<std::unique_ptr<Module>> back = ReadModuleFile(path);
    ASSERT_TRUE(back.ok()) << name << ": " << back.status();
    EXPECT_EQ(PrintModule(**back), PrintModule(*m)) << name;
  }
}

TEST(ModuleIo, FileErrorsNameThePath) {
  std::string missing = TempPath("does_not_exist.kiln");
  absl::StatusOr<std::unique_ptr<Module>> m = ReadModuleFile(missing);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(m.status().message(), missing)) << m.status();

  m = ReadModuleFile(::testing::TempDir());
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "is a directory")) << m.status();

  std::string corrupt = TempPath("corrupt.pb");
  std::string bytes = *ModuleToProtoBinary(*testing::BuildAllOpsModule());
  WriteFile(corrupt, bytes.substr(0, bytes.size() / 2));
  m = ReadModuleFile(corrupt);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StartsWith(m.status().message(), corrupt + ": read as binary protobuf")) << m.status();
  EXPECT_TRUE(absl::StrContains(m.status().message(), "not a valid kiln ModuleProto")) << m.status();
}

}  // namespace
}  // namespace kiln
