// A compiled PCRE2 regular expression over UTF-8 text (PCRE2_UTF | PCRE2_UCP: \p{L}, \p{N}, \s and
// case-insensitive matching follow Unicode; JIT-compiled when PCRE2 has a JIT), iterated the way
// Hugging Face tokenizers iterates its Oniguruma regexes (tokenizers/src/utils/onig.rs): left to
// right, each search starting where the previous match ended, an empty match advancing one
// character.
//
// The pattern is first rewritten where Oniguruma's classes (what tokenizers compiles with) and
// PCRE2_UCP's differ: \s and \S become \p{White_Space} / \P{White_Space} (PCRE2's \s also
// matches U+180E), \w becomes L|M|N|Pc (PCRE2 10.42's \w is L|N|_), and \W likewise outside
// character classes (inside one it stays PCRE2's). Nested character classes, which Oniguruma
// allows and PCRE2 does not, are not translated.
//
// Thread-safety: a TextRegex is immutable after Compile; Find*/ForEachMatch may be called from
// any number of threads at once (each thread uses its own match data and JIT stack).
// Copying shares the compiled code.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace moebatch {

class TextRegex {
 public:
  // One piece of a text: [start, end) in bytes, and whether the regex matched it.
  struct Span {
    size_t start, end;
    bool match;
  };

  // Compiles `pattern`; with `literal` the pattern is a plain string (PCRE2_LITERAL; what
  // tokenizers does with regex::escape for a {"String": ...} pattern). Errors: InvalidArgument
  // with PCRE2's message and the offset in the pattern.
  static absl::StatusOr<TextRegex> Compile(std::string_view pattern, bool literal = false);

  TextRegex() = default;

  // Calls f(start, end) for each match in `text` (well-formed UTF-8), left to right. A match
  // failure other than "no match" (a resource limit) ends the iteration.
  void ForEachMatch(std::string_view text,
                    const std::function<void(size_t start, size_t end)>& f) const;

  // The spans covering `text` in order, matches and the text between them, as tokenizers'
  // Pattern::find_matches: an empty text gives one empty non-match span; empty matches are kept.
  void FindMatches(std::string_view text, std::vector<Span>* spans) const;

  // true when the regex matches `text` at exactly `offset` (an anchored match).
  bool MatchesAt(std::string_view text, size_t offset) const;

  bool valid() const { return code_ != nullptr; }
  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
};

}  // namespace moebatch
