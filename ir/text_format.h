// The kiln IR text form: one node per line, readable, and round-tripping:
// PrintModule(*ParseModule(text)) == text for every printed module.
//
//   module @tiny
//
//   func @forward {
//     %x = parameter() {index=0} : f32[2,8]
//     %w = parameter() {index=1} : f32[8]
//     %y = rms_norm(%x, %w) {eps=1e-05} : f32[2,8] @layers.0.attn_norm
//     %3 = reduce_sum(%y) {dims=[0,1]} : f32[]
//     return %3, %x {aliases=[-1,0]}
//   }
//
// Grammar (whitespace between tokens is free; `//` starts a comment to end of line):
//   module    := 'module' '@' NAME function*
//   function  := 'func' '@' NAME '{' node* return '}'
//   node      := results '=' OPNAME '(' [operand (',' operand)*] ')' [attrs] ':' types ['@' SCOPE]
//                [body]
//   body      := '{' node* return '}'   (a fusion's, and only a fusion's: ir/fusion.h; its
//                names are its own, and its parameter i is the node's operand i)
//   results   := '%' NAME (',' '%' NAME)*   (one name per result of the op, e.g.
//                `%o, %lse = attention(%q, %k, %v) {scale=0.125} : (f32[1,2,8,64], f32[1,2,8])`)
//   types     := type | '(' type (',' type)* ')'   (the list for an op of several results)
//   operand   := '%' NAME            (defined by an earlier line of the same function)
//   attrs     := '{' NAME '=' value (',' NAME '=' value)* '}'   (printed sorted by name)
//   value     := INT | FLOAT | '"' string '"' | IDENT | '[' [INT (',' INT)*] ']'
//              | '[' [FLOAT (',' FLOAT)*] ']'
//                FLOAT always has '.', 'e', or is inf/-inf/nan; a list holding any FLOAT
//                is a float list
//   type      := DTYPE '[' [INT (',' INT)*] ']'
//   return    := 'return' operand (',' operand)* ['{' 'aliases' '=' '[' INT,... ']' '}']
//   NAME, SCOPE := [A-Za-z0-9_.-]+
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace kiln {

std::string PrintModule(const Module& module);
std::string PrintFunction(const Function& function);
// One node's line without indentation or newline, e.g. "%y = neg(%x) : f32[2]" (a fusion's
// without its body).
std::string PrintNode(const Node& node);
// As the function prints it: the node's line and, for a fusion, its body below it, the body's
// lines indented by `indent` and two spaces, the closing `}` by `indent` (no final newline).
std::string PrintNodeWithBody(const Node& node, absl::string_view indent);

// Parses and verifies. Errors read "<line>:<column>: expected <what>, got '<token>'" for
// syntax, and carry the verifier's message (with the node's line) for meaning. Never
// crashes or hangs, whatever the input.
absl::StatusOr<std::unique_ptr<Module>> ParseModule(absl::string_view text);

}  // namespace kiln
