// The parsing half of ir/text_format.h: recursive descent with one token of lookahead over
// ir/text_lexer.h. The grammar's only nesting is a fusion's body, which holds no fusion
// (lists hold only numbers), so the parser recurses at most once and its stack depth does
// not depend on the input.
//
// Every node is type-checked as soon as its line is read, so a meaning error carries the
// exact line:column of the node; function-level checks (parameter indices, outputs,
// aliases) come from the verifier when the function closes, positioned at its `return`.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/fusion.h"
#include "ir/shape_inference.h"
#include "ir/status_macros.h"
#include "ir/text_format.h"
#include "ir/text_lexer.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

using text::Token;
using text::TokenKind;

// Limits that keep a hostile type from overflowing int64 element counts (and byte counts,
// at 8 bytes per element) anywhere downstream. Real models stay far below both.
constexpr int kMaxRank = kMaxTensorRank;             // ir/types.h: one limit for every reader
constexpr int64_t kMaxElements = kMaxTensorElements;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == '-';
}

bool IsName(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsNameChar(c)) return false;
  }
  return true;
}

// A symbol attribute value (`lt`, `bf16`): a name that starts like an identifier.
bool IsSymbol(absl::string_view s) {
  return IsName(s) && ((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') || s[0] == '_') && s != "inf" &&
         s != "nan";
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Words that can only be numbers; whether a number is well formed is decided later, so
// that "1.2.3" reads as a bad number rather than as something else.
bool LooksNumeric(absl::string_view s) {
  return !s.empty() && (IsDigit(s[0]) || s[0] == '-' || s[0] == '.' || s == "inf" || s == "nan");
}

// FLOAT in the grammar: has '.', 'e' or 'E', or is inf/-inf/nan.
bool IsFloatSpelling(absl::string_view s) {
  return s.find_first_of(".eE") != absl::string_view::npos || s == "inf" || s == "-inf" || s == "nan";
}

bool IsIntegerSpelling(absl::string_view s) {
  if (!s.empty() && s[0] == '-') s.remove_prefix(1);
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsDigit(c)) return false;
  }
  return true;
}

using Number = std::variant<int64_t, double>;

class Parser {
 public:
  explicit Parser(absl::string_view input) : lexer_(input), current_(lexer_.Next()) {}

  absl::StatusOr<std::unique_ptr<Module>> ParseModule() {
    RETURN_IF_ERROR(ExpectKeyword("module"));
    RETURN_IF_ERROR(ExpectPunct('@'));
    ASSIGN_OR_RETURN(std::string name, ParseName("module name"));
    auto module = std::make_unique<Module>(std::move(name));
    while (PeekKeyword("func")) RETURN_IF_ERROR(ParseFunction(*module));
    if (Peek().kind != TokenKind::kEnd) return Expected("'func' or end of input");
    RETURN_IF_ERROR(VerifyModule(*module));
    return module;
  }

 private:
  // The line of each node of the function being parsed, for "first defined on line N".
  struct Defined {
    Node* node;
    int64_t line;
  };

  // --- Tokens -------------------------------------------------------------------------

  const Token& Peek() const { return current_; }
  // Consumes the current token; a kEnd or kError token is never passed.
  Token Next() {
    if (current_.kind == TokenKind::kEnd || current_.kind == TokenKind::kError) return current_;
    Token t = std::move(current_);
    current_ = lexer_.Next();
    return t;
  }
  bool PeekPunct(char c) const {
    return Peek().kind == TokenKind::kPunct && Peek().text[0] == c;
  }
  bool PeekKeyword(absl::string_view word) const {
    return Peek().kind == TokenKind::kWord && Peek().text == word;
  }

  static absl::Status ErrorAt(const Token& t, absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(t.line, ":", t.column, ": ", message));
  }
  // The syntax error at the current token; a malformed string reports its own problem.
  absl::Status Expected(absl::string_view what) const {
    const Token& t = Peek();
    if (t.kind == TokenKind::kError) return ErrorAt(t, t.value);
    return ErrorAt(t, absl::StrCat("expected ", what, ", got ", text::DescribeToken(t)));
  }
  absl::Status ExpectPunct(char c) {
    if (!PeekPunct(c)) return Expected(absl::StrCat("'", std::string(1, c), "'"));
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectKeyword(absl::string_view word) {
    if (!PeekKeyword(word)) return Expected(absl::StrCat("'", word, "'"));
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ParseName(absl::string_view what) {
    if (Peek().kind != TokenKind::kWord || !IsName(Peek().text)) return Expected(what);
    return std::string(Next().text);
  }

  // --- Numbers ------------------------------------------------------------------------

  static absl::StatusOr<int64_t> ToInt(const Token& t) {
    int64_t v = 0;
    const char* end = t.text.data() + t.text.size();
    auto [ptr, ec] = std::from_chars(t.text.data(), end, v);
    if (ec == std::errc::result_out_of_range) {
      return ErrorAt(t, absl::StrCat("integer overflow: ", text::DescribeToken(t), " does not fit in 64 bits"));
    }
    if (ec != std::errc() || ptr != end) return ErrorAt(t, absl::StrCat("bad number ", text::DescribeToken(t)));
    return v;
  }

  static absl::StatusOr<double> ToDouble(const Token& t) {
    if (t.text == "inf") return std::numeric_limits<double>::infinity();
    if (t.text == "-inf") return -std::numeric_limits<double>::infinity();
    if (t.text == "nan") return std::numeric_limits<double>::quiet_NaN();
    double v = 0;
    const char* end = t.text.data() + t.text.size();
    auto [ptr, ec] = std::from_chars(t.text.data(), end, v, std::chars_format::general);
    if (ec == std::errc::result_out_of_range) {
      return ErrorAt(t, absl::StrCat("number ", text::DescribeToken(t), " is out of range for a double"));
    }
    if (ec != std::errc() || ptr != end || std::isnan(v) || std::isinf(v)) {
      // inf and nan have exactly one spelling each, so that printing is canonical.
      return ErrorAt(t, absl::StrCat("bad number ", text::DescribeToken(t)));
    }
    return v;
  }

  // An INT or FLOAT at the current token; `what` names it in the syntax error.
  absl::StatusOr<Number> ParseNumber(absl::string_view what) {
    if (Peek().kind != TokenKind::kWord || !LooksNumeric(Peek().text)) return Expected(what);
    const Token t = Next();
    if (IsFloatSpelling(t.text)) return ToDouble(t);
    if (!IsIntegerSpelling(t.text)) return ErrorAt(t, absl::StrCat("bad number ", text::DescribeToken(t)));
    return ToInt(t);
  }

  absl::StatusOr<int64_t> ParseInt(absl::string_view what) {
    if (Peek().kind != TokenKind::kWord || !IsIntegerSpelling(Peek().text)) return Expected(what);
    return ToInt(Next());
  }

  // --- Attributes ---------------------------------------------------------------------

  // '[' [number (',' number)*] ']'; any FLOAT makes it a float list, `[]` is an int list.
  absl::StatusOr<AttrValue> ParseList() {
    RETURN_IF_ERROR(ExpectPunct('['));
    std::vector<Number> items;
    bool any_float = false;
    if (!PeekPunct(']')) {
      while (true) {
        ASSIGN_OR_RETURN(Number n, ParseNumber("number"));
        any_float |= std::holds_alternative<double>(n);
        items.push_back(n);
        if (!PeekPunct(',')) break;
        Next();
      }
    }
    RETURN_IF_ERROR(ExpectPunct(']'));
    if (!any_float) {
      std::vector<int64_t> ints;
      ints.reserve(items.size());
      for (const Number& n : items) ints.push_back(std::get<int64_t>(n));
      return AttrValue(std::move(ints));
    }
    std::vector<double> doubles;
    doubles.reserve(items.size());
    for (const Number& n : items) {
      doubles.push_back(std::holds_alternative<double>(n) ? std::get<double>(n)
                                                          : static_cast<double>(std::get<int64_t>(n)));
    }
    return AttrValue(std::move(doubles));
  }

  absl::StatusOr<AttrValue> ParseAttrValue() {
    const Token& t = Peek();
    if (t.kind == TokenKind::kString) return AttrValue(Next().value);
    if (PeekPunct('[')) return ParseList();
    if (t.kind == TokenKind::kWord && LooksNumeric(t.text)) {
      ASSIGN_OR_RETURN(Number n, ParseNumber("number"));
      return std::visit([](auto v) { return AttrValue(v); }, n);
    }
    if (t.kind == TokenKind::kWord && IsSymbol(t.text)) return AttrValue(Symbol{std::string(Next().text)});
    return Expected("attribute value");
  }

  // '{' NAME '=' value (',' NAME '=' value)* '}'
  absl::StatusOr<AttrMap> ParseAttrs() {
    RETURN_IF_ERROR(ExpectPunct('{'));
    AttrMap attrs;
    while (true) {
      const Token name_token = Peek();
      ASSIGN_OR_RETURN(std::string name, ParseName("attribute name"));
      if (attrs.Has(name)) return ErrorAt(name_token, absl::StrCat("duplicate attribute '", name, "'"));
      RETURN_IF_ERROR(ExpectPunct('='));
      ASSIGN_OR_RETURN(AttrValue value, ParseAttrValue());
      attrs.Set(std::move(name), std::move(value));
      if (!PeekPunct(',')) break;
      Next();
    }
    RETURN_IF_ERROR(ExpectPunct('}'));
    return attrs;
  }

  // --- Types --------------------------------------------------------------------------

  // DTYPE '[' [INT (',' INT)*] ']', with dims that are non-negative and whose product
  // (zeros left out, so no dim can hide a huge neighbour) stays within kMaxElements.
  absl::StatusOr<TensorType> ParseType() {
    const Token dtype_token = Peek();
    if (dtype_token.kind != TokenKind::kWord || !IsName(dtype_token.text)) return Expected("element type");
    absl::StatusOr<DType> dtype = ParseDType(dtype_token.text);
    if (!dtype.ok()) return ErrorAt(dtype_token, dtype.status().message());
    Next();
    TensorType type{*dtype, {}};
    RETURN_IF_ERROR(ExpectPunct('['));
    int64_t elements = 1;
    if (!PeekPunct(']')) {
      while (true) {
        const Token dim_token = Peek();
        ASSIGN_OR_RETURN(int64_t dim, ParseInt("dimension"));
        if (dim < 0) return ErrorAt(dim_token, absl::StrCat("negative dimension ", dim));
        if (type.rank() == kMaxRank) {
          return ErrorAt(dim_token, absl::StrCat("a type may have at most ", kMaxRank, " dimensions"));
        }
        if (dim > 0 && elements > kMaxElements / dim) {
          return ErrorAt(dim_token, "type has more than 2^40 elements");
        }
        if (dim > 0) elements *= dim;
        type.dims.push_back(dim);
        if (!PeekPunct(',')) break;
        Next();
      }
    }
    RETURN_IF_ERROR(ExpectPunct(']'));
    return type;
  }

  // --- Functions ----------------------------------------------------------------------

  // '%' NAME, naming a node defined earlier in this function.
  absl::StatusOr<Node*> ParseOperand() {
    const Token sigil = Peek();
    RETURN_IF_ERROR(ExpectPunct('%'));
    ASSIGN_OR_RETURN(std::string name, ParseName("operand name"));
    auto it = defined_.find(name);
    if (it == defined_.end()) {
      return ErrorAt(sigil, absl::StrCat("undefined operand %", name, " (operands must be defined on an earlier line)"));
    }
    return it->second.node;
  }

  // results '=' OPNAME '(' [operand (',' operand)*] ')' [attrs] ':' types ['@' SCOPE]
  absl::Status ParseNode(Function& function) {
    const Token start = Peek();
    std::vector<std::string> names;
    while (true) {
      const Token sigil = Peek();
      RETURN_IF_ERROR(ExpectPunct('%'));
      ASSIGN_OR_RETURN(std::string name, ParseName("node name"));
      if (auto it = defined_.find(name); it != defined_.end()) {
        return ErrorAt(sigil, absl::StrCat("duplicate name %", name, " (first defined on line ", it->second.line, ")"));
      }
      if (std::find(names.begin(), names.end(), name) != names.end()) {
        return ErrorAt(sigil, absl::StrCat("duplicate name %", name, " on one line"));
      }
      if (function.FindNode(name) != nullptr) {  // a multi-result node's own (unprinted) name
        return ErrorAt(sigil, absl::StrCat("name %", name, " is taken by the multi-result node of an earlier line"));
      }
      names.push_back(std::move(name));
      if (!PeekPunct(',')) break;
      Next();
    }
    RETURN_IF_ERROR(ExpectPunct('='));
    const Token op_token = Peek();
    if (op_token.kind != TokenKind::kWord) return Expected("op name");
    const OpInfo* op = FindOpByName(op_token.text);
    if (op == nullptr) return ErrorAt(op_token, absl::StrCat("unknown op ", text::DescribeToken(op_token)));
    if (op->opcode == Opcode::kGetResult) {
      return ErrorAt(op_token, "get_result is written as the results of its node (%a, %b = op(...))");
    }
    if (op->opcode == Opcode::kFusion && in_body_) {
      return ErrorAt(op_token, "a fusion body cannot hold a fusion (bodies do not nest)");
    }
    if (op->num_results != kVariableResults && static_cast<int>(names.size()) != op->num_results) {
      return ErrorAt(start, absl::StrCat(op->name, " has ", op->num_results, " result(s), but ", names.size(),
                                         " name(s) are written"));
    }
    Next();
    RETURN_IF_ERROR(ExpectPunct('('));
    std::vector<Node*> operands;
    if (!PeekPunct(')')) {
      while (true) {
        ASSIGN_OR_RETURN(Node* operand, ParseOperand());
        operands.push_back(operand);
        if (!PeekPunct(',')) break;
        Next();
      }
    }
    RETURN_IF_ERROR(ExpectPunct(')'));
    AttrMap attrs;
    if (PeekPunct('{')) {
      ASSIGN_OR_RETURN(attrs, ParseAttrs());
    }
    RETURN_IF_ERROR(ExpectPunct(':'));
    std::vector<TensorType> types;
    if (names.size() > 1) {  // '(' type (',' type)* ')'
      RETURN_IF_ERROR(ExpectPunct('('));
      while (true) {
        ASSIGN_OR_RETURN(TensorType type, ParseType());
        types.push_back(std::move(type));
        if (!PeekPunct(',')) break;
        Next();
      }
      RETURN_IF_ERROR(ExpectPunct(')'));
      // One type per written name: the node's results are named and typed in one order.
      if (types.size() != names.size()) {
        return ErrorAt(start, absl::StrCat(names.size(), " result name(s) are written, but ", types.size(),
                                           " result type(s)"));
      }
    } else {
      ASSIGN_OR_RETURN(TensorType type, ParseType());
      types.push_back(std::move(type));
    }
    std::string scope;
    if (PeekPunct('@')) {
      Next();
      ASSIGN_OR_RETURN(scope, ParseName("scope"));
    }
    std::unique_ptr<Function> body;
    if (op->opcode == Opcode::kFusion) {
      ASSIGN_OR_RETURN(body, ParseFusionBody(names[0]));
    }
    RETURN_IF_ERROR(CheckNode(start, names, *op, operands, attrs, types, body.get()));

    if (names.size() == 1) {
      Node* node = function.AppendNode(op->opcode, std::move(operands), std::move(attrs), std::move(types[0]),
                                       names[0], std::move(scope));
      if (node == nullptr) return absl::InternalError(absl::StrCat("text parser: could not append %", names[0]));
      node->set_body(std::move(body));
      defined_[names[0]] = Defined{node, start.line};
      return absl::OkStatus();
    }
    std::vector<Node*> results = function.AppendMultiResultNode(op->opcode, std::move(operands), std::move(attrs),
                                                                std::move(types), names, std::move(scope));
    if (results.empty()) return absl::InternalError(absl::StrCat("text parser: could not append %", names[0]));
    results[0]->operand(0)->set_body(std::move(body));
    for (size_t i = 0; i < names.size(); ++i) defined_[names[i]] = Defined{results[i], start.line};
    return absl::OkStatus();
  }

  // What the verifier would say about this node, said now so the position is exact.
  absl::Status CheckNode(const Token& start, const std::vector<std::string>& names, const OpInfo& op,
                         const std::vector<Node*>& operands, const AttrMap& attrs,
                         const std::vector<TensorType>& types, const Function* body) {
    const std::string what = absl::StrCat("%", absl::StrJoin(names, ", %"), " = ", op.name, ": ");
    absl::StatusOr<std::vector<TensorType>> operand_types = OperandTypes(op.opcode, operands);
    if (!operand_types.ok()) return ErrorAt(start, absl::StrCat(what, operand_types.status().message()));
    const TensorType* declared = &types[0];  // the first result's, for an op that declares it
    absl::StatusOr<std::vector<TensorType>> inferred;
    if (op.opcode == Opcode::kFusion) {
      if (absl::Status body_ok = CheckFusionBody(attrs, body); !body_ok.ok()) {
        return ErrorAt(start, absl::StrCat(what, body_ok.message()));
      }
      inferred = FusionResultTypes(*operand_types, *body);
    } else {
      inferred = InferResultTypes(op.opcode, *operand_types, attrs, declared);
    }
    auto show = [](const std::vector<TensorType>& ts) {
      std::vector<std::string> shown;
      for (const TensorType& t : ts) shown.push_back(t.ToString());
      return absl::StrJoin(shown, ", ");
    };
    if (!inferred.ok()) {
      return ErrorAt(start, absl::StrCat(what, "operands (", TypeListToString(*operand_types), "): ", inferred.status().message()));
    }
    if (*inferred != types) {
      return ErrorAt(start, absl::StrCat(what, "written type ", types.size() == 1 ? show(types) : "(" + show(types) + ")",
                                         " but operands give ",
                                         types.size() == 1 ? show(*inferred) : "(" + show(*inferred) + ")"));
    }
    if (op.opcode == Opcode::kParameter) {
      const int64_t index = *attrs.GetInt("index");  // inference has checked it
      auto [it, inserted] = parameter_lines_.emplace(index, start.line);
      if (!inserted) {
        return ErrorAt(start, absl::StrCat(what, "parameter index ", index, " is already used on line ", it->second));
      }
    }
    return absl::OkStatus();
  }

  // 'return' operand (',' operand)* ['{' 'aliases' '=' '[' INT,... ']' '}']
  absl::Status ParseReturn(Function& function) {
    RETURN_IF_ERROR(ExpectKeyword("return"));
    std::vector<Node*> outputs;
    while (true) {
      ASSIGN_OR_RETURN(Node* output, ParseOperand());
      outputs.push_back(output);
      if (!PeekPunct(',')) break;
      Next();
    }
    std::vector<int64_t> aliases;
    if (PeekPunct('{')) {
      Next();
      RETURN_IF_ERROR(ExpectKeyword("aliases"));
      RETURN_IF_ERROR(ExpectPunct('='));
      RETURN_IF_ERROR(ExpectPunct('['));
      if (!PeekPunct(']')) {
        while (true) {
          ASSIGN_OR_RETURN(int64_t alias, ParseInt("integer"));
          aliases.push_back(alias);
          if (!PeekPunct(',')) break;
          Next();
        }
      }
      RETURN_IF_ERROR(ExpectPunct(']'));
      RETURN_IF_ERROR(ExpectPunct('}'));
    }
    function.SetOutputs(std::move(outputs), std::move(aliases));
    return absl::OkStatus();
  }

  // '{' node* return '}' after a fusion's line: its body, a function with names of its own.
  // Bodies do not nest, so this recurses once at most.
  absl::StatusOr<std::unique_ptr<Function>> ParseFusionBody(absl::string_view first_result) {
    RETURN_IF_ERROR(ExpectPunct('{'));
    auto body = std::make_unique<Function>(FusionBodyName(first_result));
    absl::flat_hash_map<std::string, Defined> outer_defined = std::move(defined_);
    absl::flat_hash_map<int64_t, int64_t> outer_parameter_lines = std::move(parameter_lines_);
    defined_.clear();
    parameter_lines_.clear();
    in_body_ = true;
    absl::Status parsed = ParseFunctionBody(*body);
    in_body_ = false;
    defined_ = std::move(outer_defined);
    parameter_lines_ = std::move(outer_parameter_lines);
    RETURN_IF_ERROR(parsed);
    return body;
  }

  // node* return '}', then the function-level checks.
  absl::Status ParseFunctionBody(Function& function) {
    while (PeekPunct('%')) RETURN_IF_ERROR(ParseNode(function));
    if (!PeekKeyword("return")) return Expected("'%' or 'return'");
    const Token return_token = Peek();
    RETURN_IF_ERROR(ParseReturn(function));
    RETURN_IF_ERROR(ExpectPunct('}'));
    // Nodes are already checked; what is left concerns the function as a whole (parameter
    // indices, outputs, aliases), which the return line completes.
    absl::Status verified = VerifyFunction(function);
    if (!verified.ok()) return ErrorAt(return_token, verified.message());
    return absl::OkStatus();
  }

  // 'func' '@' NAME '{' node* return '}'
  absl::Status ParseFunction(Module& module) {
    RETURN_IF_ERROR(ExpectKeyword("func"));
    RETURN_IF_ERROR(ExpectPunct('@'));
    const Token name_token = Peek();
    ASSIGN_OR_RETURN(std::string name, ParseName("function name"));
    // Module::FindFunction is a linear scan; this set keeps many functions linear too.
    if (!function_names_.insert(name).second) {
      return ErrorAt(name_token, absl::StrCat("duplicate function @", name));
    }
    Function* function = module.AddFunction(name);
    if (function == nullptr) return absl::InternalError(absl::StrCat("text parser: could not add @", name));
    RETURN_IF_ERROR(ExpectPunct('{'));
    defined_.clear();
    parameter_lines_.clear();
    return ParseFunctionBody(*function);
  }

  text::Lexer lexer_;
  Token current_;  // the one token of lookahead
  absl::flat_hash_set<std::string> function_names_;
  absl::flat_hash_map<std::string, Defined> defined_;
  absl::flat_hash_map<int64_t, int64_t> parameter_lines_;  // index -> line
  bool in_body_ = false;  // parsing a fusion's body
};

}  // namespace

absl::StatusOr<std::unique_ptr<Module>> ParseModule(absl::string_view text) { return Parser(text).ParseModule(); }

}  // namespace kiln
