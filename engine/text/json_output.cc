// JSON mode's recognizer and vocabulary mask (json_output.h). The grammar is RFC 8259's: value =
// object / array / string / number / true / false / null, with whitespace (space, tab, LF, CR)
// between tokens; number = [ "-" ] ( "0" / [1-9] *DIGIT ) [ "." 1*DIGIT ] [ ( "e" / "E" ) [ "+" /
// "-" ] 1*DIGIT ]; string escapes \" \\ \/ \b \f \n \r \t \uXXXX.
#include "engine/text/json_output.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace moebatch {
namespace {

// Number grammar states: which bytes may follow, and whether the number may end here.
enum NumberState : uint8_t {
  kNumMinus,      // after '-': a digit
  kNumZero,       // a leading 0: '.', 'e', or the end
  kNumInt,        // [1-9] digits: a digit, '.', 'e', or the end
  kNumDot,        // after '.': a digit
  kNumFrac,       // fraction digits: a digit, 'e', or the end
  kNumExp,        // after 'e': a sign or a digit
  kNumExpSign,    // after the exponent's sign: a digit
  kNumExpDigits,  // exponent digits: a digit or the end
};

constexpr std::string_view kLiterals[] = {"true", "false", "null"};

bool IsWhitespace(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
bool IsHex(uint8_t c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

bool JsonPrefix::Open(bool array) {
  if (depth_ >= kMaxJsonDepth) return false;
  if (array) {
    stack_ |= uint64_t{1} << depth_;
  } else {
    stack_ &= ~(uint64_t{1} << depth_);
  }
  ++depth_;
  mode_ = array ? Mode::kArrayFirst : Mode::kObjectFirst;
  return true;
}

bool JsonPrefix::Close(bool array) {
  if (depth_ == 0 || top_is_array() != array) return false;
  --depth_;
  mode_ = depth_ == 0 ? Mode::kDone : Mode::kAfterValue;
  return true;
}

bool JsonPrefix::StartValue(uint8_t c) {
  if (depth_ == 0) return c == '{' && Open(false);  // the top-level value is an object
  switch (c) {
    case '{':
      return Open(false);
    case '[':
      return Open(true);
    case '"':
      mode_ = Mode::kString;
      key_ = false;
      return true;
    case '-':
      mode_ = Mode::kNumber;
      sub_ = kNumMinus;
      return true;
    case 't':
    case 'f':
    case 'n':
      mode_ = Mode::kLiteral;
      literal_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      sub_ = 1;
      return true;
    default:
      if (!IsDigit(c)) return false;
      mode_ = Mode::kNumber;
      sub_ = c == '0' ? kNumZero : kNumInt;
      return true;
  }
}

bool JsonPrefix::Feed(uint8_t c) {
  switch (mode_) {
    case Mode::kString:
      if (c == '"') {
        mode_ = key_ ? Mode::kColon : Mode::kAfterValue;
        ws_ = 0;
        return true;
      }
      if (c == '\\') mode_ = Mode::kStringEscape;
      return c >= 0x20;
    case Mode::kStringEscape:
      if (c == 'u') {
        mode_ = Mode::kStringHex;
        sub_ = 0;
        return true;
      }
      mode_ = Mode::kString;
      return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
             c == 't';
    case Mode::kStringHex:
      if (!IsHex(c)) return false;
      if (++sub_ == 4) mode_ = Mode::kString;
      return true;
    case Mode::kLiteral: {
      const std::string_view word = kLiterals[literal_];
      if (c != static_cast<uint8_t>(word[sub_])) return false;
      if (++sub_ == word.size()) {
        mode_ = Mode::kAfterValue;
        ws_ = 0;
      }
      return true;
    }
    case Mode::kNumber: {
      const bool digit = IsDigit(c);
      switch (sub_) {
        case kNumMinus:
          if (!digit) return false;
          sub_ = c == '0' ? kNumZero : kNumInt;
          return true;
        case kNumZero:
        case kNumInt:
          if (digit && sub_ == kNumInt) return true;
          if (c == '.') {
            sub_ = kNumDot;
            return true;
          }
          if (c == 'e' || c == 'E') {
            sub_ = kNumExp;
            return true;
          }
          break;  // the number ends before c
        case kNumDot:
          if (!digit) return false;
          sub_ = kNumFrac;
          return true;
        case kNumFrac:
          if (digit) return true;
          if (c == 'e' || c == 'E') {
            sub_ = kNumExp;
            return true;
          }
          break;
        case kNumExp:
          if (c == '+' || c == '-') {
            sub_ = kNumExpSign;
            return true;
          }
          if (!digit) return false;
          sub_ = kNumExpDigits;
          return true;
        case kNumExpSign:
          if (!digit) return false;
          sub_ = kNumExpDigits;
          return true;
        case kNumExpDigits:
          if (digit) return true;
          break;
        default:
          return false;
      }
      mode_ = Mode::kAfterValue;  // the number ended; c is the next token's
      ws_ = 0;
      return Feed(c);
    }
    default:
      break;
  }
  // Between tokens.
  if (IsWhitespace(c)) return ++ws_ <= kMaxJsonWhitespace;
  ws_ = 0;
  switch (mode_) {
    case Mode::kValue:
      return StartValue(c);
    case Mode::kArrayFirst:
      if (c == ']') return Close(true);
      return StartValue(c);
    case Mode::kObjectFirst:
      if (c == '}') return Close(false);
      [[fallthrough]];
    case Mode::kKey:
      if (c != '"') return false;
      mode_ = Mode::kString;
      key_ = true;
      return true;
    case Mode::kColon:
      if (c != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kAfterValue:
      if (c == ',') {
        mode_ = top_is_array() ? Mode::kValue : Mode::kKey;
        return true;
      }
      if (c == ']' || c == '}') return Close(c == ']');
      return false;
    default:  // kDone: whitespace only
      return false;
  }
}

bool JsonPrefix::Feed(std::string_view bytes) {
  for (char c : bytes) {
    if (!Feed(static_cast<uint8_t>(c))) return false;
  }
  return true;
}

JsonTokenMask::JsonTokenMask(const Tokenizer& tokenizer, std::vector<int32_t> eos_ids)
    : eos_ids_(std::move(eos_ids)) {
  const int32_t vocab = tokenizer.vocab_size();
  bytes_.resize(static_cast<size_t>(std::max(vocab, 0)));
  for (int32_t v = 0; v < vocab; ++v) {
    if (std::find(eos_ids_.begin(), eos_ids_.end(), v) != eos_ids_.end()) continue;
    std::string b = tokenizer.TokenBytes(v);
    // A control or special token (BOS, [INST], <|im_end|>, ...) is not text: Decode drops it,
    // while TokenBytes gives its name. A token of whitespace alone may decode to nothing (a
    // sentencepiece "▁" at the start of a text) and is text.
    const bool whitespace = std::all_of(
        b.begin(), b.end(), [](char c) { return IsWhitespace(static_cast<uint8_t>(c)); });
    if (!whitespace && tokenizer.Decode({v}).empty()) continue;
    bytes_[static_cast<size_t>(v)] = std::move(b);
  }
  plain_.resize(bytes_.size());
  for (size_t v = 0; v < bytes_.size(); ++v) {
    const std::string& b = bytes_[v];
    plain_[v] = !b.empty() && std::all_of(b.begin(), b.end(), [](char c) {
      const auto u = static_cast<uint8_t>(c);
      return u >= 0x20 && u != '"' && u != '\\';
    });
  }
}

int64_t JsonTokenMask::Apply(const JsonPrefix& state, float* logits, int64_t vocab_size) const {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  if (state.complete()) {  // EOS alone
    int64_t left = 0;
    for (int64_t v = 0; v < vocab_size; ++v) {
      if (std::find(eos_ids_.begin(), eos_ids_.end(), v) != eos_ids_.end()) {
        ++left;
      } else {
        logits[v] = kMasked;
      }
    }
    return left;
  }
  bool first_ok[256];
  for (int c = 0; c < 256; ++c) {
    JsonPrefix probe = state;
    first_ok[c] = probe.Feed(static_cast<uint8_t>(c));
  }
  const bool in_string = state.in_string();
  int64_t left = 0;
  for (int64_t v = 0; v < vocab_size; ++v) {
    bool allowed = false;
    if (v < static_cast<int64_t>(bytes_.size()) && !bytes_[static_cast<size_t>(v)].empty()) {
      const std::string& b = bytes_[static_cast<size_t>(v)];
      if (!first_ok[static_cast<uint8_t>(b[0])]) {
        allowed = false;
      } else if (in_string && plain_[static_cast<size_t>(v)]) {
        allowed = true;
      } else {
        JsonPrefix probe = state;
        allowed = probe.Feed(b);
      }
    }
    if (allowed) {
      ++left;
    } else {
      logits[v] = kMasked;
    }
  }
  return left;
}

bool JsonTokenMask::Advance(JsonPrefix* state, int32_t token) const {
  if (std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) {
    return state->complete();
  }
  if (token < 0 || token >= static_cast<int32_t>(bytes_.size()) ||
      bytes_[static_cast<size_t>(token)].empty()) {
    return false;
  }
  return state->Feed(bytes_[static_cast<size_t>(token)]);
}

}  // namespace moebatch
