#include "engine/text/text_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moebatch {

struct TextRegex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// Per-thread match data (one ovector pair: only the whole match is read) and a JIT stack large
// enough for look-aheads after long runs (32 KiB grown to at most 8 MiB).
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  ThreadMatchState() {
    if (context != nullptr && stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& State() {
  thread_local ThreadMatchState state;
  return state;
}

// One search of `code` in text from `start`: the match [first, second), or nullopt for no match
// (or an error such as a resource limit, which ends the caller's iteration).
std::optional<std::pair<size_t, size_t>> Search(const pcre2_code* code, bool jit,
                                                std::string_view text, size_t start,
                                                uint32_t options) {
  ThreadMatchState& st = State();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc;
  if (jit && options == 0) {  // pcre2_jit_match takes no PCRE2_ANCHORED; it skips UTF checks
    rc = pcre2_jit_match(code, subject, text.size(), start, 0, st.data, st.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // retry with the interpreter (heap frames)
      rc = pcre2_match(code, subject, text.size(), start,
                       options | PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, st.data, nullptr);
    }
  } else {
    rc = pcre2_match(code, subject, text.size(), start, options | PCRE2_NO_UTF_CHECK, st.data,
                     nullptr);
  }
  if (rc < 0) return std::nullopt;  // PCRE2_ERROR_NOMATCH or a limit: no (further) match
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  return std::make_pair(static_cast<size_t>(ov[0]), static_cast<size_t>(ov[1]));
}

// Oniguruma's (Ruby syntax, UTF-8) classes where PCRE2_UCP's differ: \s is White_Space (PCRE2's
// also holds U+180E), \w is L|M|N|Pc (PCRE2 10.42's is L|N|_). \S likewise; \W outside classes
// only (a negated union has no spelling inside a class: kept as PCRE2's there). \Q...\E is copied
// as it is.
std::string TranslateOnigurumaEscapes(std::string_view p) {
  constexpr char kWord[] = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[++i];
      if (d == 's') {
        out += "\\p{White_Space}";
      } else if (d == 'S') {
        out += "\\P{White_Space}";
      } else if (d == 'w') {
        out += in_class ? std::string(kWord) : absl::StrCat("[", kWord, "]");
      } else if (d == 'W' && !in_class) {
        out += absl::StrCat("[^", kWord, "]");
      } else if (d == 'Q') {
        const size_t end = p.find("\\E", i + 1);
        const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i - 1, stop - (i - 1)));
        i = stop - 1;
      } else {
        out.push_back(c);
        out.push_back(d);
      }
    } else if (c == '[' && !in_class) {
      in_class = true;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);  // a literal ']' first
    } else if (c == '[' && in_class && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t end = p.find(":]", i + 2);  // a POSIX class [:alpha:]
      const size_t stop = end == std::string_view::npos ? i + 1 : end + 2;
      out.append(p.substr(i, stop - i));
      i = stop - 1;
    } else {
      if (c == ']' && in_class) in_class = false;
      out.push_back(c);
    }
  }
  return out;
}

size_t NextCharLength(std::string_view text, size_t i) {
  if (i >= text.size()) return 1;
  const unsigned char c = static_cast<unsigned char>(text[i]);
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

}  // namespace

absl::StatusOr<TextRegex> TextRegex::Compile(std::string_view pattern, bool literal) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // (PCRE2_LITERAL admits no PCRE2_UCP; a literal needs no character classes.)
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  const std::string translated =
      literal ? std::string(pattern) : TranslateOnigurumaEscapes(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), options, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(
        "bad regex at offset ", offset, translated == pattern ? "" : " (as PCRE2 reads it)", ": ",
        reinterpret_cast<const char*>(message)));
  }
  auto compiled = std::make_shared<Code>();
  compiled->code = code;
  compiled->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  TextRegex regex;
  regex.code_ = std::move(compiled);
  regex.pattern_ = std::string(pattern);
  return regex;
}

void TextRegex::ForEachMatch(std::string_view text,
                             const std::function<void(size_t, size_t)>& f) const {
  if (code_ == nullptr) return;
  // onig's FindMatches: an empty match right where the previous match ended is skipped by
  // searching again one character later.
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    const auto m = Search(code_->code, code_->jit, text, last_end, 0);
    if (!m) return;
    const auto [s, e] = *m;
    if (s == e && have_last && last_match_end == e) {
      last_end += NextCharLength(text, last_end);
      continue;
    }
    last_end = e;
    last_match_end = e;
    have_last = true;
    f(s, e);
  }
}

void TextRegex::FindMatches(std::string_view text, std::vector<Span>* spans) const {
  spans->clear();
  if (text.empty()) {
    spans->push_back({0, 0, false});
    return;
  }
  size_t prev = 0;
  ForEachMatch(text, [&](size_t s, size_t e) {
    if (prev != s) spans->push_back({prev, s, false});
    spans->push_back({s, e, true});
    prev = e;
  });
  if (prev != text.size()) spans->push_back({prev, text.size(), false});
}

bool TextRegex::MatchesAt(std::string_view text, size_t offset) const {
  if (code_ == nullptr || offset > text.size()) return false;
  return Search(code_->code, code_->jit, text, offset, PCRE2_ANCHORED).has_value();
}

}  // namespace moebatch
