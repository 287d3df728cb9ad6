// The tokenizer of the kiln IR text form (ir/text_format.h); private to ir/text_parser.cc.
// One pass over the input, no backtracking, no recursion.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace kiln::text {

enum class TokenKind {
  // A run of [A-Za-z0-9_.+-]: keywords, names, op names, dtypes, numbers and symbols
  // all lex as words; the parser decides what a word means from where it stands. '+' is
  // included only so that exponents such as 1e+30 stay one token.
  kWord,
  kString,  // "..." with its escapes decoded into `value`
  kPunct,   // one of % @ = ( ) { } [ ] , :
  kStray,   // a character that starts no token; the parser reports it as unexpected
  kError,   // a malformed string; `value` holds the message
  kEnd,
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  absl::string_view text;  // the source bytes of the token
  std::string value;       // decoded string contents, or the error message for kError
  int64_t line = 1;        // 1-based
  int64_t column = 1;      // 1-based, in bytes
};

// Produces tokens on demand, so a parser that stops at the first error never lexes (or
// stores) the rest of the input. After a kEnd or kError token it keeps returning that token.
class Lexer {
 public:
  explicit Lexer(absl::string_view input) : in_(input) {}  // `input` must outlive the tokens
  Token Next();

 private:
  Token Start() const;
  void SkipSpaceAndComments();
  void LexString(Token& t);
  void Fail(Token& t, const Token& where, absl::string_view message);

  absl::string_view in_;
  size_t pos_ = 0;
  int64_t line_ = 1;
  size_t line_start_ = 0;
  bool done_ = false;  // a kEnd or kError token was returned
  Token last_;
};

// How a token reads in an error message: 'text' quoted, shortened and with unprintable
// bytes escaped, or "end of input".
std::string DescribeToken(const Token& token);

}  // namespace kiln::text
