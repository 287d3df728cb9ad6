#include "ir/proto_io.h"

#include <climits>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/json_util.h"
#include "ir/ir.pb.h"
#include "ir/proto_wire_diagnosis.h"
#include "ir/status_macros.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------------------
// Module -> proto

void TypeToProto(const TensorType& type, ir::TensorTypeProto* proto) {
  proto->set_dtype(std::string(DTypeName(type.dtype)));
  for (int64_t d : type.dims) proto->add_dims(d);
}

void AttrValueToProto(const AttrValue& value, ir::AttrValueProto* proto) {
  if (const auto* i = std::get_if<int64_t>(&value)) {
    proto->set_i(*i);
  } else if (const auto* f = std::get_if<double>(&value)) {
    proto->set_f(*f);
  } else if (const auto* s = std::get_if<std::string>(&value)) {
    proto->set_s(*s);
  } else if (const auto* sym = std::get_if<Symbol>(&value)) {
    proto->set_symbol(sym->name);
  } else if (const auto* ints = std::get_if<std::vector<int64_t>>(&value)) {
    // mutable_ints() marks the oneof even for an empty list, so [] stays an int list.
    ir::IntList* list = proto->mutable_ints();
    for (int64_t v : *ints) list->add_values(v);
  } else {
    ir::FloatList* list = proto->mutable_floats();
    for (double v : std::get<std::vector<double>>(value)) list->add_values(v);
  }
}

void FunctionToProto(const Function& function, ir::FunctionProto* fp) {
  fp->set_name(function.name());
  for (const auto& node : function.nodes()) {
    ir::NodeProto* np = fp->add_nodes();
    np->set_id(node->id());
    np->set_name(node->name());
    np->set_opcode(std::string(node->op_name()));
    for (const Node* operand : node->operands()) np->add_operand_ids(operand->id());
    if (node->has_multiple_results()) {
      for (const TensorType& t : node->result_types()) TypeToProto(t, np->add_result_types());
    } else {
      TypeToProto(node->type(), np->mutable_type());
    }
    // AttrMap is a std::map, so attributes come out sorted by name.
    for (const auto& [name, value] : node->attrs().entries()) {
      ir::AttrProto* attr = np->add_attrs();
      attr->set_name(name);
      AttrValueToProto(value, attr->mutable_value());
    }
    np->set_scope(node->scope());
    if (node->body() != nullptr) FunctionToProto(*node->body(), np->mutable_body());
  }
  for (const Node* output : function.outputs()) fp->add_output_ids(output->id());
  for (int64_t alias : function.output_aliases()) fp->add_output_aliases(alias);
}

ir::ModuleProto ModuleToProto(const Module& module) {
  ir::ModuleProto proto;
  proto.set_format_version(kIrFormatVersion);
  proto.set_name(module.name());
  for (const auto& function : module.functions()) FunctionToProto(*function, proto.add_functions());
  return proto;
}

// ---------------------------------------------------------------------------------------
// proto -> Module. Every check here guards something the Function API or the verifier
// would otherwise trip over (a dangling pointer, an id clash, an overflowing shape); what
// the verifier checks itself (types, parameter indices, aliases) is left to it.

// "function @f, node id 7 (%y)": names come from untrusted bytes, so they are escaped.
std::string NodeWhere(const ir::FunctionProto& fp, const ir::NodeProto& np) {
  return absl::StrCat("function @", absl::CHexEscape(fp.name()), ", node id ", np.id(), " (%",
                      absl::CHexEscape(np.name()), ")");
}

absl::Status NodeError(const ir::FunctionProto& fp, const ir::NodeProto& np, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("proto: ", NodeWhere(fp, np), ": ", why));
}

absl::StatusOr<TensorType> TypeFromProto(const ir::TensorTypeProto& proto) {
  ASSIGN_OR_RETURN(DType dtype, ParseDType(proto.dtype()));
  if (proto.dims_size() > kMaxTensorRank) {
    return absl::InvalidArgumentError(absl::StrCat("type has ", proto.dims_size(), " dimensions, more than ",
                                                   kMaxTensorRank, " (kiln's limit)"));
  }
  TensorType type{dtype, {proto.dims().begin(), proto.dims().end()}};
  // Shapes feed element and byte counts all over the compiler: the limit every reader
  // shares (ir/types.h) keeps hostile input from reaching overflowing arithmetic.
  RETURN_IF_ERROR(CheckTensorSizeLimit(type.dtype, type.dims));
  return type;
}

absl::StatusOr<AttrValue> AttrValueFromProto(const ir::AttrValueProto& proto) {
  switch (proto.kind_case()) {
    case ir::AttrValueProto::kI:
      return AttrValue(proto.i());
    case ir::AttrValueProto::kF:
      return AttrValue(proto.f());
    case ir::AttrValueProto::kS:
      return AttrValue(proto.s());
    case ir::AttrValueProto::kSymbol:
      return AttrValue(Symbol{proto.symbol()});
    case ir::AttrValueProto::kInts:
      return AttrValue(std::vector<int64_t>(proto.ints().values().begin(), proto.ints().values().end()));
    case ir::AttrValueProto::kFloats:
      return AttrValue(std::vector<double>(proto.floats().values().begin(), proto.floats().values().end()));
    case ir::AttrValueProto::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("has no value");
}

absl::StatusOr<AttrMap> AttrsFromProto(const ir::NodeProto& np) {
  AttrMap attrs;
  for (const ir::AttrProto& attr : np.attrs()) {
    if (attrs.Has(attr.name())) {
      return absl::InvalidArgumentError(absl::StrCat("attribute '", absl::CHexEscape(attr.name()), "' is given twice"));
    }
    absl::StatusOr<AttrValue> value = AttrValueFromProto(attr.value());
    if (!value.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute '", absl::CHexEscape(attr.name()), "' ", value.status().message()));
    }
    attrs.Set(attr.name(), *std::move(value));
  }
  return attrs;
}

// Reads `fp`'s nodes and outputs into the empty `function`. A fusion's body is read the same
// way, once: a body inside a body is rejected here (bodies do not nest), so hostile input
// cannot make this recurse deeply.
absl::Status FillFunction(const ir::FunctionProto& fp, Function* function, bool is_body) {
  absl::flat_hash_map<int64_t, Node*> by_id;
  for (const ir::NodeProto& np : fp.nodes()) {
    if (np.id() < 0) return NodeError(fp, np, "ids must be >= 0");
    if (by_id.contains(np.id())) return NodeError(fp, np, absl::StrCat("duplicate id ", np.id()));
    if (np.name().empty()) return NodeError(fp, np, "node has no name");
    const OpInfo* op = FindOpByName(np.opcode());
    if (op == nullptr) return NodeError(fp, np, absl::StrCat("unknown opcode '", absl::CHexEscape(np.opcode()), "'"));
    std::vector<TensorType> types;
    const bool many = op->num_results > 1 || (op->num_results == kVariableResults && np.result_types_size() > 0);
    if (np.has_body() != (op->opcode == Opcode::kFusion)) {
      return NodeError(fp, np, np.has_body() ? "only a fusion has a body" : "a fusion needs a body");
    }
    if (np.has_body() && is_body) return NodeError(fp, np, "a fusion inside a fusion's body (bodies do not nest)");
    if (many) {
      if (np.has_type()) return NodeError(fp, np, "a multi-result node has result_types, not a type");
      if (op->num_results == kVariableResults && np.result_types_size() < 2) {
        return NodeError(fp, np, "a node of several results lists two or more result types");
      }
      if (op->num_results != kVariableResults && np.result_types_size() != op->num_results) {
        return NodeError(fp, np, absl::StrCat(op->name, " has ", op->num_results, " results, but ",
                                              np.result_types_size(), " result types are given"));
      }
      for (const ir::TensorTypeProto& t : np.result_types()) {
        absl::StatusOr<TensorType> type = TypeFromProto(t);
        if (!type.ok()) return NodeError(fp, np, type.status().message());
        types.push_back(*std::move(type));
      }
    } else {
      if (!np.has_type()) return NodeError(fp, np, "node has no type");
      if (np.result_types_size() != 0) return NodeError(fp, np, "a node of one result has no result_types");
      absl::StatusOr<TensorType> type = TypeFromProto(np.type());
      if (!type.ok()) return NodeError(fp, np, type.status().message());
      types.push_back(*std::move(type));
    }
    absl::StatusOr<AttrMap> attrs = AttrsFromProto(np);
    if (!attrs.ok()) return NodeError(fp, np, attrs.status().message());
    std::vector<Node*> operands;
    operands.reserve(np.operand_ids_size());
    for (int i = 0; i < np.operand_ids_size(); ++i) {
      auto it = by_id.find(np.operand_ids(i));
      if (it == by_id.end()) {
        return NodeError(fp, np, absl::StrCat("operand ", i, " refers to id ", np.operand_ids(i),
                                              ", which is not defined earlier in the function"));
      }
      operands.push_back(it->second);
    }
    Node* node = function->AppendNodeWithTypes(np.id(), op->opcode, std::move(operands), *std::move(attrs),
                                               std::move(types), np.name(), np.scope());
    if (node == nullptr) return NodeError(fp, np, "duplicate name");  // the id was checked above
    if (np.has_body()) {
      auto body = std::make_unique<Function>(np.body().name());
      RETURN_IF_ERROR(FillFunction(np.body(), body.get(), /*is_body=*/true));
      node->set_body(std::move(body));
    }
    by_id[np.id()] = node;
  }
  std::vector<Node*> outputs;
  for (int i = 0; i < fp.output_ids_size(); ++i) {
    auto it = by_id.find(fp.output_ids(i));
    if (it == by_id.end()) {
      return absl::InvalidArgumentError(absl::StrCat("proto: function @", absl::CHexEscape(fp.name()), ": output ", i,
                                                     " refers to node id ", fp.output_ids(i),
                                                     ", which does not exist"));
    }
    outputs.push_back(it->second);
  }
  function->SetOutputs(std::move(outputs), {fp.output_aliases().begin(), fp.output_aliases().end()});
  return absl::OkStatus();
}

absl::Status FunctionFromProto(const ir::FunctionProto& fp, Module& module) {
  Function* function = module.AddFunction(fp.name());
  if (function == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("proto: function @", absl::CHexEscape(fp.name()), " is defined twice"));
  }
  return FillFunction(fp, function, /*is_body=*/false);
}

absl::StatusOr<std::unique_ptr<Module>> ModuleFromProto(const ir::ModuleProto& proto) {
  // Version 2 is version 3 without fusion bodies, so it reads as it is.
  if (proto.format_version() != kIrFormatVersion && proto.format_version() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("proto: unsupported IR format version ", proto.format_version(),
                                                   " (this build reads versions 2 and ", kIrFormatVersion, ")"));
  }
  auto module = std::make_unique<Module>(proto.name());
  for (const ir::FunctionProto& fp : proto.functions()) RETURN_IF_ERROR(FunctionFromProto(fp, *module));
  RETURN_IF_ERROR(VerifyModule(*module));
  return module;
}

// protobuf 3.21 prints the double -0.0 as the JSON number `-0` but parses `-0` as the
// integer 0, losing the sign. Outside strings a '-' can only start a number, so rewriting
// each bare `-0` token to `-0.0` makes the parser take its floating-point path. (The only
// integer-typed number in our JSON is format_version; int64s are quoted strings.)
std::string KeepNegativeZeros(absl::string_view json) {
  std::string out;
  out.reserve(json.size());
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    char c = json[i];
    out.push_back(c);
    if (in_string) {
      if (c == '\\' && i + 1 < json.size()) {
        out.push_back(json[++i]);
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '-' && i + 1 < json.size() && json[i + 1] == '0') {
      char after = i + 2 < json.size() ? json[i + 2] : ' ';
      bool bare_zero = !(after >= '0' && after <= '9') && after != '.' && after != 'e' && after != 'E';
      if (bare_zero) {
        out += "0.0";
        ++i;
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> ModuleToProtoBinary(const Module& module) {
  ir::ModuleProto proto = ModuleToProto(module);
  size_t size = proto.ByteSizeLong();
  if (size > static_cast<size_t>(INT_MAX)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("proto: module @", module.name(), " needs ", size, " bytes; protobuf's limit is 2 GiB"));
  }
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    // No maps in ir.proto, but ask anyway so that adding one cannot make saves differ.
    coded.SetSerializationDeterministic(true);
    if (!proto.SerializeToCodedStream(&coded)) {
      return absl::InternalError(absl::StrCat("proto: cannot serialize module @", module.name()));
    }
  }
  return bytes;
}

absl::StatusOr<std::string> ModuleToProtoJson(const Module& module) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;                 // the JSON form is for people and diffs
  options.always_print_primitive_fields = true;  // the same keys on every node
  options.preserve_proto_field_names = true;     // "operand_ids", as in ir.proto
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(ModuleToProto(module), &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("proto JSON: cannot print module @", module.name(), ": ",
                                            std::string(status.message())));
  }
  return json;
}

absl::StatusOr<std::unique_ptr<Module>> ModuleFromProtoBinary(absl::string_view bytes) {
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("proto: ", bytes.size(), " bytes is over protobuf's 2 GiB limit"));
  }
  ir::ModuleProto proto;
  SilenceProtobufLogging();  // the error below says what protobuf's log line would
  if (!proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    std::string where = DiagnoseProtoWireFault(bytes, *ir::ModuleProto::descriptor());
    if (where.empty()) where = "the fields are well framed, so a value is invalid (a string that is not UTF-8?)";
    return absl::InvalidArgumentError(absl::StrCat("proto: the ", bytes.size(),
                                                   " bytes are not a valid kiln ModuleProto (truncated or corrupt): ",
                                                   where));
  }
  return ModuleFromProto(proto);
}

absl::StatusOr<std::unique_ptr<Module>> ModuleFromProtoJson(absl::string_view json) {
  ir::ModuleProto proto;
  SilenceProtobufLogging();
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;  // a misspelt key is an error, not a silent default
  auto status = google::protobuf::util::JsonStringToMessage(KeepNegativeZeros(json), &proto, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("proto JSON: not a valid kiln ModuleProto: ", std::string(status.message())));
  }
  return ModuleFromProto(proto);
}

}  // namespace kiln
