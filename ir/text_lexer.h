// The tokenizer of the kiln IR text form (ir/text_format.h); private to the printer's
// parser. One pass over the input, no backtracking, no recursion.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// Tokenizes `input` (which must outlive the tokens). The result always ends with a kEnd
// token, or with a kError token at the first malformed string.
std::vector<Token> Tokenize(absl::string_view input);

// How a token reads in an error message: 'text' quoted, shortened and with unprintable
// bytes escaped, or "end of input".
std::string DescribeToken(const Token& token);

}  // namespace kiln::text
