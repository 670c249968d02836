// JSON mode: generation constrained to a JSON object (OpenAI's response_format {"type":
// "json_object"}, the Responses API's text.format of that type). Each step, the tokens whose bytes
// would not continue the text as a prefix of a JSON text (RFC 8259) whose top-level value is an
// object are masked out of the logits before sampling; once the object is closed only EOS is left,
// so a reply that ends at EOS is one JSON object (with whitespace around it at most). A reply cut
// by max_tokens or a stop string is a prefix of one.
//
// JsonPrefix is the byte-level recognizer; JsonTokenMask applies it to a tokenizer's vocabulary.
// Limits (so that a model cannot spin forever where JSON allows unbounded repetition): at most
// kMaxJsonDepth nested objects and arrays, and at most kMaxJsonWhitespace whitespace bytes in a
// row. Strings may hold any byte >= 0x20 except '"' and '\' unescaped (bytes >= 0x80 unchecked
// for UTF-8: a character may be split over several tokens).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/tokenizer.h"

namespace moebatch {

inline constexpr int kMaxJsonDepth = 32;
inline constexpr int kMaxJsonWhitespace = 16;

// A recognizer of prefixes of a JSON text whose top-level value is an object. Copyable (a few
// bytes): the mask tries each token on a copy.
class JsonPrefix {
 public:
  // Feeds one byte: true if the text so far is still a JSON-object prefix (the state advanced);
  // false if not (the state is then unspecified: feed a copy when probing).
  bool Feed(uint8_t c);
  // Feeds every byte of `bytes`, stopping at the first refused one.
  bool Feed(std::string_view bytes);
  // The top-level object is closed: only whitespace may follow.
  bool complete() const { return mode_ == Mode::kDone; }
  // Inside a string, not in an escape: any byte >= 0x20 but '"' and '\' leaves the state as it is.
  bool in_string() const { return mode_ == Mode::kString; }

 private:
  enum class Mode : uint8_t {
    kValue,        // a value (at depth 0: only '{')
    kArrayFirst,   // after '[': a value or ']'
    kObjectFirst,  // after '{': a key or '}'
    kKey,          // after ',' in an object: a key
    kColon,        // after a key
    kAfterValue,   // ',' or the container's close
    kString,
    kStringEscape,
    kStringHex,
    kNumber,
    kLiteral,
    kDone,
  };
  bool Close(bool array);      // pops the container; false if the top is not of that kind
  bool Open(bool array);       // pushes a container; false past kMaxJsonDepth
  bool StartValue(uint8_t c);  // the first byte of a value
  bool top_is_array() const { return (stack_ >> (depth_ - 1)) & 1; }

  Mode mode_ = Mode::kValue;
  uint8_t depth_ = 0;
  uint8_t sub_ = 0;      // kNumber: its grammar state; kLiteral: bytes matched; kStringHex: digits
  uint8_t literal_ = 0;  // kLiteral: 0 true, 1 false, 2 null
  uint8_t ws_ = 0;       // whitespace bytes in a row
  bool key_ = false;     // kString: the string is an object's key
  uint64_t stack_ = 0;   // bit d: the container at depth d + 1 is an array
};

// A tokenizer's vocabulary as JsonPrefix sees it: each token's bytes (Tokenizer::TokenBytes), or
// none for a token that is not text (a control or special token: BOS, EOS, [INST], <|im_end|>, ...,
// which Decode drops). Built once per tokenizer (O(vocab)); Apply is const and thread-safe.
class JsonTokenMask {
 public:
  // `eos_ids`: the tokens that end generation, allowed once the object is complete (and only
  // then). The tokenizer is read here only.
  JsonTokenMask(const Tokenizer& tokenizer, std::vector<int32_t> eos_ids);

  // Sets logits[v] to -inf for every token v of [0, vocab_size) that `state` does not allow
  // (tokens past the tokenizer's vocabulary included). Returns how many are left. O(vocab): a
  // token whose first byte the state refuses is not tried further, and inside a string a token of
  // plain string bytes is taken without trying it.
  int64_t Apply(const JsonPrefix& state, float* logits, int64_t vocab_size) const;
  // Advances `state` by `token`'s bytes (nothing for an EOS token). False if the token was not
  // allowed.
  bool Advance(JsonPrefix* state, int32_t token) const;
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }

 private:
  std::vector<std::string> bytes_;  // per token; empty: not text
  std::vector<bool> plain_;         // per token: bytes >= 0x20, none '"' or '\\' (string-safe)
  std::vector<int32_t> eos_ids_;
};

}  // namespace moebatch
