// UTF-8 and Unicode helpers shared by the tokenizers: validity, Rust's lossy UTF-8 conversion (what
// Hugging Face tokenizers' decoders produce), the Unicode normalization forms (utf8proc) and the
// White_Space property.
//
// Thread-safety: every function is pure and may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moebatch {

// The byte length of the well-formed UTF-8 character at s[i], or 0 when the bytes there are not
// one (an invalid lead byte, a bad continuation byte, an overlong form, a surrogate, a code point
// above U+10FFFF, or a character cut off by the end of s).
size_t Utf8CharLength(std::string_view s, size_t i);

// true when s is well-formed UTF-8.
bool IsValidUtf8(std::string_view s);

// Appends bytes to *out as Rust's String::from_utf8_lossy converts them: each maximal invalid
// subpart (a lead byte and the continuation bytes that still fit it, or one stray byte) becomes
// one U+FFFD, and so does an unfinished character at the end.
void AppendUtf8Lossy(std::string_view bytes, std::string* out);

// The length of the longest suffix of `bytes` that is an unfinished but so far valid UTF-8
// character (0 to 3 bytes): what more bytes could still complete. from_utf8_lossy's output for
// bytes[0, size - tail) is final: a prefix of its output for every continuation.
size_t Utf8UnfinishedTail(std::string_view bytes);

// The code point of the well-formed character of `len` bytes at s[i] (see Utf8CharLength).
char32_t Utf8Decode(std::string_view s, size_t i, size_t len);

// Appends the UTF-8 encoding of `c` (a Unicode scalar value) to *out.
void AppendUtf8(char32_t c, std::string* out);

// Unicode's White_Space property (what the Rust regex crate's \s and char::is_whitespace match).
bool IsUnicodeWhiteSpace(char32_t c);

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };

// The normalization form `form` of the well-formed UTF-8 text (utf8proc, Unicode 15; NUL bytes are
// kept). Text made only of characters below U+0300 is returned unchanged without calling utf8proc
// for NFC/NFKC when it is already NFC (its characters all have NFC_Quick_Check=Yes and combining
// class 0).
std::string NormalizeUnicode(std::string_view text, NormalizationForm form);

}  // namespace moebatch
