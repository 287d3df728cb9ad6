// Robustness of ParseModule: thousands of deterministic mutations of a real module's text
// (bytes, tokens, lines, truncations) must each give either a module that round-trips, or
// a positioned error; never a crash, a hang or an unpositioned message. Worth running
// under -fsanitize=address,undefined as well, where a wild index would show.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ir/text_format.h"
#include "tests/testing/all_ops.h"

namespace kiln {
namespace {

// Tallies what the mutated inputs turned out to be, so a test can insist that both the
// success and the error paths were exercised.
struct Outcomes {
  int ok = 0;
  int errors = 0;
};

// Parses `text`; on success the module must re-print to text that parses and prints the
// same, on failure the message must start with "<line>:<col>: ".
void CheckOne(const std::string& text, Outcomes& outcomes) {
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
  if (!parsed.ok()) {
    ++outcomes.errors;
    const std::string message(parsed.status().message());
    size_t i = 0;
    auto digits = [&] {
      const size_t begin = i;
      while (i < message.size() && message[i] >= '0' && message[i] <= '9') ++i;
      return i > begin;
    };
    bool positioned = digits() && i < message.size() && message[i++] == ':' && digits() &&
                      message.compare(i, 2, ": ") == 0;
    EXPECT_TRUE(positioned) << "unpositioned error: " << message << "\ninput:\n" << text;
    return;
  }
  ++outcomes.ok;
  const std::string printed = PrintModule(**parsed);
  absl::StatusOr<std::unique_ptr<Module>> again = ParseModule(printed);
  ASSERT_TRUE(again.ok()) << again.status() << "\nprinted:\n" << printed << "\nfrom input:\n" << text;
  EXPECT_EQ(PrintModule(**again), printed) << "from input:\n" << text;
}

// Splits text into tokens and the separators between them, so token mutations keep
// their neighbours intact: "%y = neg(%x)" -> "%", "y", " ", "=", " ", "neg", "(", ...
std::vector<std::string> SplitTokens(const std::string& text) {
  auto is_word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
           c == '-' || c == '+';
  };
  std::vector<std::string> pieces;
  for (size_t i = 0; i < text.size();) {
    size_t j = i + 1;
    if (is_word(text[i])) {
      while (j < text.size() && is_word(text[j])) ++j;
    }
    pieces.push_back(text.substr(i, j - i));
    i = j;
  }
  return pieces;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size() - 1;
    lines.push_back(text.substr(start, end + 1 - start));
    start = end + 1;
  }
  return lines;
}

template <typename T>
std::string Join(const std::vector<T>& parts) {
  std::string out;
  for (const auto& p : parts) out += p;
  return out;
}

class Mutator {
 public:
  explicit Mutator(const std::string& base) : tokens_(SplitTokens(base)), lines_(SplitLines(base)) {}

  // One random edit of `text`, of a kind chosen by `kind`.
  std::string Mutate(const std::string& text, int kind) {
    std::string s = text;
    switch (kind % 10) {
      case 0:  // delete a byte
        if (!s.empty()) s.erase(Index(s.size()), 1);
        break;
      case 1:  // insert an interesting byte
        s.insert(Index(s.size() + 1), 1, kInteresting[Index(sizeof(kInteresting) - 1)]);
        break;
      case 2:  // swap two bytes
        if (!s.empty()) std::swap(s[Index(s.size())], s[Index(s.size())]);
        break;
      case 3: {  // duplicate a short byte range
        if (s.empty()) break;
        const size_t at = Index(s.size());
        s.insert(at, s.substr(at, 1 + Index(16)));
        break;
      }
      case 4: {  // delete a token
        std::vector<std::string> t = SplitTokens(s);
        if (!t.empty()) t.erase(t.begin() + Index(t.size()));
        s = Join(t);
        break;
      }
      case 5: {  // insert a token taken from the original text
        std::vector<std::string> t = SplitTokens(s);
        t.insert(t.begin() + Index(t.size() + 1), tokens_[Index(tokens_.size())]);
        s = Join(t);
        break;
      }
      case 6: {  // swap two tokens
        std::vector<std::string> t = SplitTokens(s);
        if (!t.empty()) std::swap(t[Index(t.size())], t[Index(t.size())]);
        s = Join(t);
        break;
      }
      case 7: {  // duplicate a token
        std::vector<std::string> t = SplitTokens(s);
        if (!t.empty()) {
          const size_t at = Index(t.size());
          t.insert(t.begin() + at, t[at]);
        }
        s = Join(t);
        break;
      }
      case 8: {  // splice a line of the original text in somewhere
        std::vector<std::string> l = SplitLines(s);
        l.insert(l.begin() + Index(l.size() + 1), lines_[Index(lines_.size())]);
        s = Join(l);
        break;
      }
      case 9: {  // swap or drop lines
        std::vector<std::string> l = SplitLines(s);
        if (l.empty()) break;
        if (rng_() % 2) {
          std::swap(l[Index(l.size())], l[Index(l.size())]);
        } else {
          l.erase(l.begin() + Index(l.size()));
        }
        s = Join(l);
        break;
      }
    }
    return s;
  }

  size_t Index(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

 private:
  // Bytes that matter to the lexer, plus some that must be rejected.
  static constexpr char kInteresting[] = "%@=(){}[],:\"\\/ \n\t-+.e0179azAZ_\x01\x7f\xff";

  const std::vector<std::string> tokens_;
  const std::vector<std::string> lines_;
  std::mt19937_64 rng_{20261129};
};

std::string AllOpsText() { return PrintModule(*testing::BuildAllOpsModule()); }

TEST(IrTextMutation, RandomEditsNeverCrashAndRoundTripWhenAccepted) {
  const std::string base = AllOpsText();
  Mutator mutator(base);
  Outcomes outcomes;
  const auto start = std::chrono::steady_clock::now();
  constexpr int kCases = 3000;
  int done = 0;
  for (; done < kCases; ++done) {
    // Stack one to three edits so that errors late in the text are reached too.
    std::string text = base;
    const int edits = 1 + static_cast<int>(mutator.Index(3));
    for (int e = 0; e < edits; ++e) text = mutator.Mutate(text, static_cast<int>(mutator.Index(10)));
    CheckOne(text, outcomes);
    if (::testing::Test::HasFatalFailure()) return;
    // A guard for slow (sanitizer, debug) builds: the bound is time, not coverage.
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(8)) break;
  }
  EXPECT_GE(done, 200) << "too few cases ran in the time bound";
  EXPECT_GT(outcomes.ok, 0) << "no mutation was accepted: the success path went untested";
  EXPECT_GT(outcomes.errors, outcomes.ok) << "most random edits should be errors";
}

TEST(IrTextMutation, EveryTruncationIsAnErrorUnlessNothingIsLost) {
  const std::string base = AllOpsText();
  const size_t first_function = base.find("func");
  const size_t last_brace = base.rfind('}');
  Outcomes outcomes;
  int lossless = 0;  // cuts between the functions that lose nothing: not errors, rightly
  constexpr size_t kStep = 5;
  for (size_t cut = 0; cut <= base.size(); cut += kStep) {
    const int ok_before = outcomes.ok;
    CheckOne(base.substr(0, cut), outcomes);
    // A cut inside the module name leaves a (shorter-named) module without functions; a
    // cut after the last '}' loses only the newline; a cut right after a function's closing
    // '}' (a line of its own), or after the blank lines that follow it, leaves a module of
    // the functions before it. Any other cut loses meaning.
    const size_t kept = base.find_last_not_of('\n', cut == 0 ? 0 : cut - 1);
    const bool after_a_function =
        cut >= 2 && kept != std::string::npos && kept >= 1 && base[kept] == '}' && base[kept - 1] == '\n';
    if (outcomes.ok > ok_before) {
      lossless += cut >= first_function && cut <= last_brace && after_a_function;
      EXPECT_TRUE(cut < first_function || cut > last_brace || after_a_function) << "a cut at " << cut << " parsed: ..." << base.substr(cut > 120 ? cut - 120 : 0, std::min<size_t>(cut, 120)) << "|" << base.substr(cut, 60);
    }
  }
  EXPECT_GT(outcomes.errors + lossless, static_cast<int>((last_brace - first_function) / kStep) - 1);
}

TEST(IrTextMutation, WhitespaceAndCommentsBetweenTokensChangeNothing) {
  const std::string base = AllOpsText();
  const std::vector<std::string> tokens = SplitTokens(base);
  Mutator mutator(base);
  const char* fillers[] = {" ", "\t", "\r\n", "  // comment\n", "\n\n"};
  for (int i = 0; i < 100; ++i) {
    std::vector<std::string> t = tokens;
    for (int k = 0; k < 5; ++k) t.insert(t.begin() + mutator.Index(t.size() + 1), fillers[mutator.Index(5)]);
    const std::string text = Join(t);
    absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
    EXPECT_EQ(PrintModule(**parsed), base);
  }
}

// Inputs built to defeat a naive parser: deep brackets, endless strings, huge numbers.
TEST(IrTextMutation, PathologicalInputsFailFast) {
  const std::string header = "module @m\nfunc @f {\n  %x = parameter() {index=0, a=";
  const std::vector<std::string> inputs = {
      std::string(1 << 20, '['),
      std::string(1 << 20, '{'),
      std::string(1 << 20, '%'),
      header + std::string(1 << 20, '['),
      header + "\"" + std::string(1 << 20, 'a'),
      header + std::string(1 << 20, '9'),
      header + "[" + std::string(1 << 20, ',') + "]",
      header + std::string(1 << 20, '\\'),
      "module @m\nfunc @f {\n  %x = parameter() {index=0} : f32[" + std::string(1 << 20, '1') + "]",
      std::string(1 << 20, '\0'),
      std::string(1 << 20, '\n'),
  };
  const std::clock_t start = std::clock();
  for (const std::string& input : inputs) {
    absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(input);
    EXPECT_FALSE(parsed.ok());
  }
  // About 11 MB in all: a quadratic step anywhere would take far longer than this.
  EXPECT_LT(static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC, 10.0);
}

// A chain of `length` nodes, each using the one before.
std::string ChainText(int length) {
  std::string text = "module @m\n\nfunc @f {\n  %0 = parameter() {index=0} : f32[4]\n";
  for (int i = 1; i < length; ++i) {
    text += "  %" + std::to_string(i) + " = neg(%" + std::to_string(i - 1) + ") : f32[4]\n";
  }
  return text + "  return %" + std::to_string(length - 1) + "\n}\n";
}

// CPU seconds to parse `text` (CPU rather than wall time: the build machine is shared).
double ParseSeconds(const std::string& text) {
  const std::clock_t start = std::clock();
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
  const double seconds = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (parsed.ok()) {
    EXPECT_EQ(PrintModule(**parsed), text);
  }
  return seconds;
}

// Four times the text may take about four times as long, not sixteen.
TEST(IrTextMutation, ParseTimeGrowsLinearly) {
  const double small = ParseSeconds(ChainText(5000));
  const double large = ParseSeconds(ChainText(20000));
  EXPECT_LT(large, 8 * small + 0.05) << "5000 nodes: " << small << " s, 20000 nodes: " << large << " s";
}

}  // namespace
}  // namespace kiln
