#include "engine/text/text_unicode.h"

#include <utf8proc.h>

#include <cstdlib>

namespace moebatch {
namespace {

// How many bytes of the character that starts at s[i] are a valid prefix of a UTF-8 character
// (stopping at the first byte that cannot continue it), and the length the lead byte asks for.
// Follows Rust's core::str::from_utf8 (the ranges of the second byte after E0, ED, F0 and F4).
struct Prefix {
  size_t valid;  // 0 when s[i] cannot start a character
  size_t want;   // the full length the lead byte announces (1 to 4; 0 for an invalid lead)
};

Prefix ValidPrefix(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return {1, 1};
  size_t want;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    want = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    want = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    want = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {0, 0};
  }
  size_t k = 1;
  while (k < want && i + k < s.size()) {
    const unsigned char t = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (t < lo || t > hi) : (t & 0xC0) != 0x80) break;
    ++k;
  }
  return {k, want};
}

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

size_t Utf8CharLength(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  const Prefix p = ValidPrefix(s, i);
  return p.valid == p.want ? p.want : 0;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = Utf8CharLength(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void AppendUtf8Lossy(std::string_view bytes, std::string* out) {
  size_t i = 0, run = 0;  // bytes[run, i) is valid and not yet appended
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const Prefix p = ValidPrefix(bytes, i);
    if (p.valid != 0 && p.valid == p.want) {
      i += p.want;
      continue;
    }
    out->append(bytes.data() + run, i - run);
    out->append(kReplacement);
    // An invalid lead byte is one subpart; so is a valid prefix that a wrong byte (or the end) cut.
    i += p.valid == 0 ? 1 : p.valid;
    run = i;
  }
  out->append(bytes.data() + run, i - run);
}

size_t Utf8UnfinishedTail(std::string_view bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    const Prefix p = ValidPrefix(bytes, i);
    return p.valid == back && p.want > back ? back : 0;
  }
  return 0;
}

char32_t Utf8Decode(std::string_view s, size_t i, size_t len) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (len == 1) return c;
  char32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool IsUnicodeWhiteSpace(char32_t c) {
  // PropList.txt's White_Space (stable since Unicode 6.3).
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::string NormalizeUnicode(std::string_view text, NormalizationForm form) {
  if (form == NormalizationForm::kNfc || form == NormalizationForm::kNfkc) {
    // Lead bytes below 0xCC start characters below U+0300 (continuation bytes are 0x80-0xBF).
    bool simple = true;
    for (char ch : text) {
      if (static_cast<unsigned char>(ch) >= 0xCC) {
        simple = false;
        break;
      }
    }
    // U+0000-U+02FF are NFC_Quick_Check=Yes with combining class 0; NFKC also maps some of them
    // (U+00A0, U+00AA, ...), so the shortcut is NFC's only.
    if (simple && form == NormalizationForm::kNfc) return std::string(text);
  }
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalizationForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalizationForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalizationForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalizationForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &result,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) {  // not UTF-8 (callers pass well-formed text) or out of memory: leave it as it is
    std::free(result);
    return std::string(text);
  }
  std::string out(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
  std::free(result);
  return out;
}

}  // namespace moebatch
