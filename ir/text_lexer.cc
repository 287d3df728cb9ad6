#include "ir/text_lexer.h"

#include <cstdio>


namespace kiln::text {
namespace {

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == '-' || c == '+';
}

bool IsPunct(char c) {
  switch (c) {
    case '%': case '@': case '=': case '(': case ')': case '{': case '}': case '[': case ']': case ',': case ':':
      return true;
    default:
      return false;
  }
}

int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Token Lexer::Next() {
  if (done_) return last_;
  SkipSpaceAndComments();
  Token t = Start();
  if (pos_ >= in_.size()) {
    t.kind = TokenKind::kEnd;
  } else {
    const size_t begin = pos_;
    const char c = in_[pos_];
    if (IsWordChar(c)) {
      while (pos_ < in_.size() && IsWordChar(in_[pos_])) ++pos_;
      t.kind = TokenKind::kWord;
    } else if (IsPunct(c)) {
      ++pos_;
      t.kind = TokenKind::kPunct;
    } else if (c == '"') {
      LexString(t);
    } else {
      ++pos_;
      t.kind = TokenKind::kStray;
    }
    t.text = in_.substr(begin, pos_ - begin);
  }
  if (t.kind == TokenKind::kEnd || t.kind == TokenKind::kError) {
    done_ = true;
    last_ = t;
  }
  return t;
}

Token Lexer::Start() const {
  Token t;
  t.line = line_;
  t.column = static_cast<int64_t>(pos_ - line_start_) + 1;
  return t;
}

void Lexer::SkipSpaceAndComments() {
  while (pos_ < in_.size()) {
    const char c = in_[pos_];
    if (c == '\n') {
      ++pos_;
      ++line_;
      line_start_ = pos_;
    } else if (c == ' ' || c == '\t' || c == '\r') {
      ++pos_;
    } else if (c == '/' && pos_ + 1 < in_.size() && in_[pos_ + 1] == '/') {
      while (pos_ < in_.size() && in_[pos_] != '\n') ++pos_;
    } else {
      return;
    }
  }
}

// Decodes the escapes AttrValueToString writes. A string may not span lines: a raw newline
// means the closing quote is missing, and reporting it at the opening quote points the
// reader at the right place.
void Lexer::LexString(Token& t) {
  ++pos_;  // opening quote
  while (pos_ < in_.size()) {
    const char c = in_[pos_];
    if (c == '"') {
      ++pos_;
      t.kind = TokenKind::kString;
      return;
    }
    if (c == '\n') break;
    if (c != '\\') {
      t.value += c;
      ++pos_;
      continue;
    }
    const Token escape = Start();
    const char e = pos_ + 1 < in_.size() ? in_[pos_ + 1] : '\0';
    switch (e) {
      case '"': t.value += '"'; pos_ += 2; continue;
      case '\\': t.value += '\\'; pos_ += 2; continue;
      case 'n': t.value += '\n'; pos_ += 2; continue;
      case 't': t.value += '\t'; pos_ += 2; continue;
      case 'x': {
        const int hi = pos_ + 2 < in_.size() ? HexDigitValue(in_[pos_ + 2]) : -1;
        const int lo = pos_ + 3 < in_.size() ? HexDigitValue(in_[pos_ + 3]) : -1;
        if (hi >= 0 && lo >= 0) {
          t.value += static_cast<char>(hi * 16 + lo);
          pos_ += 4;
          continue;
        }
        Fail(t, escape, "invalid escape in string: \\x needs two hex digits");
        return;
      }
      default:
        Fail(t, escape, "invalid escape in string (expected \\\" \\\\ \\n \\t or \\xNN)");
        return;
    }
  }
  t.kind = TokenKind::kError;
  t.value = "unterminated string (a string must close on the line it opens)";
}

void Lexer::Fail(Token& t, const Token& where, absl::string_view message) {
  t.kind = TokenKind::kError;
  t.line = where.line;
  t.column = where.column;
  t.value = std::string(message);
}

std::string DescribeToken(const Token& token) {
  if (token.kind == TokenKind::kEnd) return "end of input";
  // Long tokens (a runaway string, a 10k-digit number) are cut so the message stays a line.
  constexpr size_t kMaxShown = 40;
  absl::string_view text = token.text.substr(0, kMaxShown);
  std::string out = "'";
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  if (token.text.size() > kMaxShown) out += "...";
  return out + "'";
}

}  // namespace kiln::text
