#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/json_util.h"
#include "ir/builder.h"
#include "ir/ir.pb.h"
#include "ir/proto_io.h"
#include "ir/status_macros.h"
#include "ir/verifier.h"
#include "tests/testing/all_ops.h"

namespace kiln {
namespace {

std::vector<std::string> OperandNames(const Node& n) {
  std::vector<std::string> names;
  for (const Node* o : n.operands()) names.push_back(o->name());
  return names;
}

// Field by field, so a failure names what differs; the byte comparisons in the tests
// catch anything this misses (e.g. the sign of -0.0, which compares equal to 0.0).
void ExpectSameModule(const Module& a, const Module& b) {
  EXPECT_EQ(a.name(), b.name());
  ASSERT_EQ(a.functions().size(), b.functions().size());
  for (size_t fi = 0; fi < a.functions().size(); ++fi) {
    const Function& f = *a.functions()[fi];
    const Function& g = *b.functions()[fi];
    EXPECT_EQ(f.name(), g.name());
    ASSERT_EQ(f.num_nodes(), g.num_nodes()) << "@" << f.name();
    for (int64_t i = 0; i < f.num_nodes(); ++i) {
      const Node& n = *f.nodes()[i];
      const Node& m = *g.nodes()[i];
      SCOPED_TRACE(absl::StrCat("@", f.name(), " node ", i, " %", n.name()));
      EXPECT_EQ(n.id(), m.id());
      EXPECT_EQ(n.name(), m.name());
      EXPECT_EQ(n.opcode(), m.opcode());
      EXPECT_EQ(OperandNames(n), OperandNames(m));
      EXPECT_EQ(n.result_types(), m.result_types());
      EXPECT_TRUE(n.attrs() == m.attrs()) << n.attrs().ToString() << " vs " << m.attrs().ToString();
      EXPECT_EQ(n.scope(), m.scope());
    }
    ASSERT_EQ(f.outputs().size(), g.outputs().size());
    for (size_t i = 0; i < f.outputs().size(); ++i) EXPECT_EQ(f.outputs()[i]->name(), g.outputs()[i]->name());
    EXPECT_EQ(f.output_aliases(), g.output_aliases());
  }
}

TEST(ProtoIo, BinaryRoundTripOfAllOps) {
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  absl::StatusOr<std::string> bytes = ModuleToProtoBinary(*m);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<std::unique_ptr<Module>> back = ModuleFromProtoBinary(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameModule(*m, **back);
  EXPECT_EQ(*ModuleToProtoBinary(**back), *bytes);
}

TEST(ProtoIo, JsonRoundTripOfAllOps) {
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  absl::StatusOr<std::string> json = ModuleToProtoJson(*m);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_NE(json->find("\"operand_ids\""), std::string::npos) << "proto field names are kept";
  EXPECT_NE(json->find("\"opcode\": \"dot_general\""), std::string::npos);
  absl::StatusOr<std::unique_ptr<Module>> back = ModuleFromProtoJson(*json);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameModule(*m, **back);
  EXPECT_EQ(*ModuleToProtoJson(**back), *json);
  EXPECT_EQ(*ModuleToProtoBinary(**back), *ModuleToProtoBinary(*m));
}

TEST(ProtoIo, OutputIsDeterministic) {
  EXPECT_EQ(*ModuleToProtoBinary(*testing::BuildAllOpsModule()), *ModuleToProtoBinary(*testing::BuildAllOpsModule()));
  EXPECT_EQ(*ModuleToProtoJson(*testing::BuildAllOpsModule()), *ModuleToProtoJson(*testing::BuildAllOpsModule()));
}

// A module whose ids are not 0..n-1 (a node was deleted) and whose outputs alias inputs.
std::unique_ptr<Module> ModuleWithGapAndAliases() {
  auto m = std::make_unique<Module>("gaps");
  Builder b(m->AddFunction("step"));
  Node* x = *b.Parameter("x", {DType::kF32, {4}});
  Node* y = *b.Parameter("y", {DType::kF32, {4}});
  Node* dead = *b.Unary(Opcode::kExp, x);
  Node* sum = *b.Add(x, y);
  b.function()->RemoveNode(dead);
  Node* neg = *b.Unary(Opcode::kNeg, sum);
  if (!b.Return({neg, sum}, {-1, 1}).ok()) std::abort();
  return m;
}

TEST(ProtoIo, KeepsNonContiguousIdsAndAliases) {
  std::unique_ptr<Module> m = ModuleWithGapAndAliases();
  const Function& f = *m->functions()[0];
  std::vector<int64_t> ids;
  for (const auto& n : f.nodes()) ids.push_back(n->id());
  ASSERT_EQ(ids, (std::vector<int64_t>{0, 1, 3, 4}));
  for (bool json : {false, true}) {
    SCOPED_TRACE(json ? "json" : "binary");
    absl::StatusOr<std::unique_ptr<Module>> back =
        json ? ModuleFromProtoJson(*ModuleToProtoJson(*m)) : ModuleFromProtoBinary(*ModuleToProtoBinary(*m));
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSameModule(*m, **back);
    const Function& g = *(*back)->functions()[0];
    EXPECT_EQ(g.output_aliases(), (std::vector<int64_t>{-1, 1}));
    EXPECT_EQ(g.next_id(), 5) << "new nodes must not reuse a loaded id";
  }
}

uint64_t Bits(double v) { return std::bit_cast<uint64_t>(v); }

// JSON prints int64 as strings and doubles in its own syntax ("NaN", "-Infinity"): every
// one of these must come back with the same bits.
TEST(ProtoIo, JsonKeepsDoublesAndInt64sBitExact) {
  const std::vector<double> specials = {-0.0,
                                        0.0,
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        std::numeric_limits<double>::quiet_NaN(),
                                        1e-300,
                                        std::numeric_limits<double>::denorm_min(),
                                        std::numeric_limits<double>::max(),
                                        0.1 + 0.2,  // 0.30000000000000004: needs 17 digits
                                        1.0 / 3.0,
                                        -1.2345678901234567e+89};
  Module m("doubles");
  Function* f = m.AddFunction("main");
  int64_t big_id = (int64_t{1} << 53) + 1;  // not representable as a JSON number read as double
  Node* values = f->AppendNodeWithId(big_id, Opcode::kConstant, {}, AttrMap{{"values", specials}},
                                     {DType::kF32, {static_cast<int64_t>(specials.size())}}, "values", "");
  // "-0" inside strings must survive the reader's handling of the number -0.
  Node* splat = f->AppendNode(Opcode::kConstant, {}, AttrMap{{"value", -0.0}}, {DType::kF32, {}}, "minus-0", "s-0");
  ASSERT_NE(values, nullptr);
  ASSERT_NE(splat, nullptr);
  f->SetOutputs({values, splat});
  ASSERT_TRUE(VerifyModule(m).ok()) << VerifyModule(m);

  absl::StatusOr<std::string> json = ModuleToProtoJson(m);
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<std::unique_ptr<Module>> back = ModuleFromProtoJson(*json);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << *json;
  const Function& g = *(*back)->functions()[0];
  EXPECT_EQ(g.nodes()[0]->id(), big_id);
  std::vector<double> read = *g.nodes()[0]->attrs().GetFloats("values");
  ASSERT_EQ(read.size(), specials.size());
  for (size_t i = 0; i < specials.size(); ++i) {
    EXPECT_EQ(Bits(read[i]), Bits(specials[i])) << "value " << i << " = " << specials[i] << " in\n" << *json;
  }
  EXPECT_EQ(Bits(*g.nodes()[1]->attrs().GetFloat("value")), Bits(-0.0));
  EXPECT_EQ(*ModuleToProtoBinary(**back), *ModuleToProtoBinary(m));
}

// ---------------------------------------------------------------------------------------
// Rejection: each case corrupts a valid module in one way and names a phrase the error
// must contain, so a reader that fails for the wrong reason is caught too.

ir::ModuleProto AllOpsProto() {
  ir::ModuleProto proto;
  KILN_CHECK(proto.ParseFromString(*ModuleToProtoBinary(*testing::BuildAllOpsModule())));
  return proto;
}

std::string Serialize(const ir::ModuleProto& proto) { return proto.SerializeAsString(); }

// The first node of the all-ops "main" function with this name or, failing that, opcode
// (unnamed nodes are named by their id).
ir::NodeProto* NodeNamed(ir::ModuleProto& proto, absl::string_view name) {
  for (ir::NodeProto& n : *proto.mutable_functions(0)->mutable_nodes()) {
    if (n.name() == name) return &n;
  }
  for (ir::NodeProto& n : *proto.mutable_functions(0)->mutable_nodes()) {
    if (n.opcode() == name) return &n;
  }
  KILN_CHECK(false);
  return nullptr;
}

struct RejectCase {
  std::string name;
  std::function<std::string()> bytes;
  std::string phrase;
};

std::vector<RejectCase> RejectCases() {
  std::string valid = Serialize(AllOpsProto());
  auto edit = [](std::function<void(ir::ModuleProto&)> change) {
    return [change] {
      ir::ModuleProto proto = AllOpsProto();
      change(proto);
      return Serialize(proto);
    };
  };
  return {
      {"truncated", [valid] { return valid.substr(0, valid.size() / 2); }, "not a valid kiln ModuleProto"},
      {"garbage", [] { return std::string("this is not a protobuf"); }, "not a valid kiln ModuleProto"},
      {"random bytes",
       [] {
         std::mt19937 rng(7);
         std::string s(512, '\0');
         for (char& c : s) c = static_cast<char>(rng());
         return s;
       },
       "proto: "},
      {"version 99", edit([](auto& p) { p.set_format_version(99); }),
       "unsupported IR format version 99 (this build reads versions 2 and 3)"},
      {"no version", edit([](auto& p) { p.clear_format_version(); }), "unsupported IR format version 0"},
      {"dangling operand", edit([](auto& p) { NodeNamed(p, "neg")->set_operand_ids(0, 12345); }),
       "function @main, node id 6 (%6): operand 0 refers to id 12345, which is not defined earlier"},
      {"forward operand",
       edit([](auto& p) {
         ir::NodeProto* neg = NodeNamed(p, "neg");
         neg->set_operand_ids(0, neg->id() + 1);
       }),
       "operand 0 refers to id 7, which is not defined earlier"},
      {"duplicate id", edit([](auto& p) { NodeNamed(p, "w")->set_id(NodeNamed(p, "x")->id()); }),
       "(%w): duplicate id 0"},
      {"negative id", edit([](auto& p) { NodeNamed(p, "x")->set_id(-5); }), "node id -5 (%x): ids must be >= 0"},
      {"empty name", edit([](auto& p) { NodeNamed(p, "x")->clear_name(); }), "node has no name"},
      {"duplicate name", edit([](auto& p) { NodeNamed(p, "w")->set_name("x"); }), "(%x): duplicate name"},
      {"unknown opcode", edit([](auto& p) { NodeNamed(p, "neg")->set_opcode("frobnicate"); }),
       "unknown opcode 'frobnicate'"},
      {"unknown dtype", edit([](auto& p) { NodeNamed(p, "x")->mutable_type()->set_dtype("f33"); }),
       "unknown element type 'f33'"},
      {"missing type", edit([](auto& p) { NodeNamed(p, "x")->clear_type(); }), "node has no type"},
      {"huge dims",
       edit([](auto& p) {
         auto* dims = NodeNamed(p, "x")->mutable_type()->mutable_dims();
         dims->Set(0, int64_t{1} << 40);
         dims->Set(1, int64_t{1} << 40);
       }),
       "more than 2^40 elements"},
      // Within int64 bytes, but beyond the limit the text reader applies: one limit for all.
      {"dims beyond the shared limit", edit([](auto& p) {
         auto* dims = NodeNamed(p, "x")->mutable_type()->mutable_dims();
         dims->Set(0, int64_t{1} << 21);
         dims->Set(1, int64_t{1} << 20);
       }),
       "more than 2^40 elements"},
      {"attr without value", edit([](auto& p) { NodeNamed(p, "x")->mutable_attrs(0)->clear_value(); }),
       "attribute 'index' has no value"},
      {"attr twice", edit([](auto& p) { *NodeNamed(p, "x")->add_attrs() = NodeNamed(p, "x")->attrs(0); }),
       "attribute 'index' is given twice"},
      {"dangling output", edit([](auto& p) { p.mutable_functions(0)->set_output_ids(0, 999); }),
       "function @main: output 0 refers to node id 999, which does not exist"},
      {"function twice", edit([](auto& p) { *p.add_functions() = p.functions(0); }), "function @main is defined twice"},
      {"wrong type (verifier)", edit([](auto& p) { NodeNamed(p, "neg")->mutable_type()->set_dims(0, 7); }),
       "verifier: @main %6 = neg: written type f32[7,3,4] but operands give f32[2,3,4]"},
      {"bad alias (verifier)", edit([](auto& p) { p.mutable_functions(0)->add_output_aliases(0); }),
       "1 output aliases for 10 outputs"},
  };
}

TEST(ProtoIo, RejectsMalformedBinaryWithAClearMessage) {
  google::protobuf::LogSilencer quiet;  // protobuf logs invalid UTF-8 in random bytes
  for (const RejectCase& c : RejectCases()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<std::unique_ptr<Module>> m = ModuleFromProtoBinary(c.bytes());
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find(c.phrase), absl::string_view::npos) << m.status();
  }
}

TEST(ProtoIo, JsonReaderRejectsWithTheSameChecks) {
  for (const RejectCase& c : RejectCases()) {
    ir::ModuleProto proto;
    if (!proto.ParseFromString(c.bytes())) continue;  // byte-level corruption has no JSON form
    SCOPED_TRACE(c.name);
    std::string json;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(proto, &json).ok());
    absl::StatusOr<std::unique_ptr<Module>> m = ModuleFromProtoJson(json);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find(c.phrase), absl::string_view::npos) << m.status();
  }
  for (const char* bad : {"", "{", "[]", "{\"format_version\": 1, \"nodez\": []}", "{\"name\": 5}"}) {
    absl::StatusOr<std::unique_ptr<Module>> m = ModuleFromProtoJson(bad);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_NE(m.status().message().find("proto JSON: not a valid kiln ModuleProto"), absl::string_view::npos)
        << m.status();
  }
}

// Hostile input must give an error or a verified module, never a crash: flip every byte
// of a valid file in a few ways and read each result.
TEST(ProtoIo, SurvivesEverySingleByteCorruption) {
  google::protobuf::LogSilencer quiet;
  const std::string valid = *ModuleToProtoBinary(*testing::BuildAllOpsModule());
  int accepted = 0, rejected = 0;
  for (size_t i = 0; i < valid.size(); ++i) {
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      std::string bytes = valid;
      bytes[i] = static_cast<char>(bytes[i] ^ flip);
      absl::StatusOr<std::unique_ptr<Module>> m = ModuleFromProtoBinary(bytes);
      if (m.ok()) {
        ++accepted;
        EXPECT_TRUE(VerifyModule(**m).ok());
      } else {
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, accepted) << "most corruptions must be caught";
}

}  // namespace
}  // namespace kiln
