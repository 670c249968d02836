// BpeTokenizer: Hugging Face tokenizer.json BPE tokenizers (the header lists what is followed).
//
// Layout of this file: loading (JSON -> normalizer, pre-tokenizer, model, added tokens,
// post-processor, decoder steps, tokenizer_config.json), then encoding (added-token split,
// normalization, pre-tokenization, the BPE merge loop), then the decode stream.
//
// Byte-level shortcut: when the last pre-tokenizer step is ByteLevel, the pieces are not mapped to
// the byte-level alphabet (Ġ for a space, ...) as HF does: the BPE model starts from each byte's
// single-character token and the merges work on ids, which gives the same ids. The mapped text is
// built only where the model needs a string (ignore_merges' whole-word lookup, and a byte whose
// character is missing from the vocabulary, which then takes HF's general path).

#include "engine/text/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <system_error>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/text/text_regex.h"
#include "engine/text/text_unicode.h"
#include "nlohmann/json.hpp"

namespace moebatch {
namespace {

using json = nlohmann::json;

constexpr uint8_t kIdUsed = 1;
constexpr uint8_t kIdSpecial = 2;

// tokenizers/src/pre_tokenizers/byte_level.rs: the GPT-2 pre-tokenization regex.
constexpr char kGpt2Regex[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The Rust regex crate's \w (Unicode): what AddedVocabulary's single_word test uses.
constexpr char kWordCharRegex[] = R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])";

// bytes_char(): byte -> the code point GPT-2's byte-level alphabet uses for it.
std::array<char32_t, 256> MakeBytesChar() {
  std::array<char32_t, 256> table{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  char32_t n = 0;
  for (int b = 0; b < 256; ++b) table[b] = direct[b] ? static_cast<char32_t>(b) : 256 + n++;
  return table;
}

const std::array<char32_t, 256>& BytesChar() {
  static const std::array<char32_t, 256> table = MakeBytesChar();
  return table;
}

// The UTF-8 of each byte's byte-level character.
const std::array<std::string, 256>& BytesCharUtf8() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    for (int b = 0; b < 256; ++b) AppendUtf8(BytesChar()[b], &t[b]);
    return t;
  }();
  return table;
}

// The byte a byte-level character stands for, or -1.
int CharByte(char32_t c) {
  static const absl::flat_hash_map<char32_t, int> inverse = [] {
    absl::flat_hash_map<char32_t, int> m;
    for (int b = 0; b < 256; ++b) m[BytesChar()[b]] = b;
    return m;
  }();
  const auto it = inverse.find(c);
  return it == inverse.end() ? -1 : it->second;
}

std::string MapToByteLevel(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char ch : raw) out += BytesCharUtf8()[static_cast<unsigned char>(ch)];
  return out;
}

// Calls f(char_start, char_length, code_point) for each character of well-formed UTF-8 text.
template <typename F>
void ForEachChar(std::string_view s, F f) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len = Utf8CharLength(s, i);
    if (len == 0) len = 1;  // (not reached for well-formed text)
    f(i, len, Utf8Decode(s, i, len));
    i += len;
  }
}

absl::Status Bad(const std::string& file, const std::string& field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", field, ": ", message));
}

// The member `key` of an object, or nullptr when it is absent or null.
const json* Member(const json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<bool> GetBool(const json& object, const char* key, bool fallback,
                             const std::string& file, const std::string& field) {
  const json* v = Member(object, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return Bad(file, absl::StrCat(field, ".", key), "expected true or false");
  return v->get<bool>();
}

absl::StatusOr<std::string> GetString(const json& object, const char* key, const std::string& file,
                                      const std::string& field) {
  const json* v = Member(object, key);
  if (v == nullptr) return Bad(file, absl::StrCat(field, ".", key), "missing");
  if (!v->is_string()) return Bad(file, absl::StrCat(field, ".", key), "expected a string");
  return v->get<std::string>();
}

// A single character given as a JSON string (Metaspace's replacement, Strip's content).
absl::StatusOr<char32_t> GetChar(const json& object, const char* key, const std::string& file,
                                 const std::string& field) {
  absl::StatusOr<std::string> s = GetString(object, key, file, field);
  if (!s.ok()) return s.status();
  const size_t len = Utf8CharLength(*s, 0);
  if (s->empty() || len != s->size()) {
    return Bad(file, absl::StrCat(field, ".", key), "expected exactly one character");
  }
  return Utf8Decode(*s, 0, len);
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st))
    return absl::NotFoundError(absl::StrCat("missing ", what, ": ", path));
  if (!std::filesystem::is_regular_file(st)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("cannot open ", what, ": ", path));
  return std::string{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

absl::StatusOr<json> ParseJson(const std::string& text, const std::string& path) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    // Parse again with exceptions for nlohmann's message (the byte offset of the error).
    try {
      const json again = json::parse(text);
      (void)again;
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  }
  if (!doc.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a JSON object"));
  return doc;
}

// A {"String": s} or {"Regex": r} pattern (tokenizers' SplitPattern / ReplacePattern).
absl::StatusOr<TextRegex> GetPattern(const json& object, const std::string& file,
                                     const std::string& field) {
  const json* p = Member(object, "pattern");
  const std::string name = absl::StrCat(field, ".pattern");
  if (p == nullptr || !p->is_object())
    return Bad(file, name, "expected {\"String\": ...} or {\"Regex\": ...}");
  bool literal;
  const json* v;
  if ((v = Member(*p, "String")) != nullptr) {
    literal = true;
  } else if ((v = Member(*p, "Regex")) != nullptr) {
    literal = false;
  } else {
    return Bad(file, name, "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  if (!v->is_string()) return Bad(file, name, "expected a string");
  absl::StatusOr<TextRegex> regex = TextRegex::Compile(v->get<std::string>(), literal);
  if (!regex.ok()) {
    return Bad(file, absl::StrCat(name, literal ? ".String" : ".Regex"), regex.status().message());
  }
  return regex;
}

// ---- the pieces of a loaded tokenizer --------------------------------------------------------

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct NormalizerStep {
  enum Kind { kUnicode, kPrepend, kReplace } kind;
  NormalizationForm form = NormalizationForm::kNfc;
  std::string text;  // Prepend's prefix, Replace's content
  TextRegex regex;   // Replace's pattern
};

struct PreTokenizerStep {
  enum Kind { kSplit, kByteLevel, kMetaspace } kind;
  TextRegex regex;  // Split's pattern; ByteLevel's GPT-2 regex when use_regex; Digits: \p{N}
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool use_regex = true;                                       // ByteLevel
  bool add_prefix_space = false;                               // ByteLevel
  std::string replacement;                                     // Metaspace (UTF-8 of the character)
  enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;  // Metaspace
  bool split = true;                                           // Metaspace
};

struct DecoderStep {
  enum Kind { kByteLevel, kByteFallback, kFuse, kReplace, kStrip, kMetaspace, kJoinSpace } kind;
  bool fused = false;  // an earlier step joined all tokens: this step sees one token, in chunks
  TextRegex regex;     // Replace
  bool literal = false;
  std::string pattern;  // Replace's literal pattern
  std::string content;  // Replace's content
  char32_t strip = 0;   // Strip's content character
  size_t start = 0, stop = 0;
  std::string replacement;  // Metaspace
  bool prepend_never = false;
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Byte trie over added-token strings, for leftmost-longest matching.
class TokenTrie {
 public:
  void Insert(std::string_view s, int32_t value) {
    if (s.empty()) return;
    if (terminal_.empty()) terminal_.push_back(-1);
    int node = 0;
    for (char ch : s) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(ch);
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        it = edges_.emplace(key, static_cast<int>(terminal_.size())).first;
        terminal_.push_back(-1);
      }
      node = it->second;
    }
    terminal_[node] = value;
    first_[static_cast<unsigned char>(s[0])] = true;
  }
  bool empty() const { return terminal_.empty(); }
  // The leftmost-longest match in text[from, size): (start, end, value), or nullopt.
  std::optional<std::tuple<size_t, size_t, int32_t>> Find(std::string_view text,
                                                          size_t from) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!first_[static_cast<unsigned char>(text[i])]) continue;
      int node = 0;
      size_t best_end = 0;
      int32_t best = -1;
      for (size_t j = i; j < text.size(); ++j) {
        const uint64_t key =
            (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[j]);
        const auto it = edges_.find(key);
        if (it == edges_.end()) break;
        node = it->second;
        if (terminal_[node] >= 0) {
          best = terminal_[node];
          best_end = j + 1;
        }
      }
      if (best >= 0) return std::make_tuple(i, best_end, best);
    }
    return std::nullopt;
  }

 private:
  absl::flat_hash_map<uint64_t, int> edges_;
  std::vector<int32_t> terminal_;  // per node: index of the added token ending there, or -1
  std::array<bool, 256> first_{};
};

// A piece of text on its way through pre-tokenization.
struct Piece {
  std::string text;
  bool at_origin = false;    // starts at offset 0 of the input (Metaspace's prepend_scheme first)
  bool byte_mapped = false;  // stands for its byte-level mapping (see the file comment)
};

struct Segment {
  size_t start, end;
  int32_t id;  // an added token's id, or -1 for text
};

}  // namespace

struct BpeTokenizer::Impl {
  // model
  absl::flat_hash_map<std::string, int32_t> vocab;
  absl::flat_hash_map<uint64_t, std::pair<uint32_t, int32_t>> merges;  // (a, b) -> (rank, new id)
  std::optional<std::string> unk_token;
  int32_t unk_id = -1;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string continuing_subword_prefix, end_of_word_suffix;
  std::array<int32_t, 256> byte_token{};    // id of "<0xNN>" (byte_fallback), or -1
  std::array<int32_t, 256> byte_char_id{};  // id of each byte's byte-level character, or -1

  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  bool last_step_byte_level = false;
  std::vector<DecoderStep> decoder;

  std::vector<AddedToken> added;                        // by index
  absl::flat_hash_map<std::string, int32_t> added_ids;  // content -> index in `added`
  absl::flat_hash_set<std::string> special_contents;
  TokenTrie raw_trie, normalized_trie;
  TextRegex word_char;  // kWordCharRegex

  // Per-word cache of the model's ids (HF keeps one per thread; this one is shared).
  mutable absl::Mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache ABSL_GUARDED_BY(cache_mu);
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kCacheMaxWordBytes = 256;

  std::string Normalize(std::string_view text) const;
  void SplitAdded(std::string_view text, const TokenTrie& trie, bool parse_special,
                  std::vector<Segment>* out) const;
  void PreTokenize(Piece piece, std::vector<Piece>* out) const;
  void Tokenize(const Piece& piece, std::vector<int32_t>* out) const;
  void MergeWord(std::string_view word, std::vector<int32_t>* out) const;
  void MergeSymbols(std::vector<int32_t>* ids) const;
};

// ---- loading ----------------------------------------------------------------------------------

namespace {

absl::Status ParseNormalizer(const json& node, const std::string& file, const std::string& field,
                             std::vector<NormalizerStep>* out) {
  absl::StatusOr<std::string> type = GetString(node, "type", file, field);
  if (!type.ok()) return type.status();
  NormalizerStep step;
  if (*type == "Sequence") {
    const json* list = Member(node, "normalizers");
    if (list == nullptr || !list->is_array())
      return Bad(file, field + ".normalizers", "expected a list");
    for (size_t i = 0; i < list->size(); ++i) {
      absl::Status s =
          ParseNormalizer((*list)[i], file, absl::StrCat(field, ".normalizers[", i, "]"), out);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  } else if (*type == "NFC" || *type == "NFD" || *type == "NFKC" || *type == "NFKD") {
    step.kind = NormalizerStep::kUnicode;
    step.form = *type == "NFC"    ? NormalizationForm::kNfc
                : *type == "NFD"  ? NormalizationForm::kNfd
                : *type == "NFKC" ? NormalizationForm::kNfkc
                                  : NormalizationForm::kNfkd;
  } else if (*type == "Prepend") {
    absl::StatusOr<std::string> prepend = GetString(node, "prepend", file, field);
    if (!prepend.ok()) return prepend.status();
    step.kind = NormalizerStep::kPrepend;
    step.text = *prepend;
  } else if (*type == "Replace") {
    absl::StatusOr<TextRegex> regex = GetPattern(node, file, field);
    if (!regex.ok()) return regex.status();
    absl::StatusOr<std::string> content = GetString(node, "content", file, field);
    if (!content.ok()) return content.status();
    step.kind = NormalizerStep::kReplace;
    step.regex = *std::move(regex);
    step.text = *content;
  } else {
    return Bad(
        file, field + ".type",
        absl::StrCat("normalizer '", *type,
                     "' is not supported (NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence)"));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

absl::StatusOr<Behavior> ParseBehavior(const json& node, const std::string& file,
                                       const std::string& field) {
  absl::StatusOr<std::string> b = GetString(node, "behavior", file, field);
  if (!b.ok()) return b.status();
  if (*b == "Removed") return Behavior::kRemoved;
  if (*b == "Isolated") return Behavior::kIsolated;
  if (*b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (*b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (*b == "Contiguous") return Behavior::kContiguous;
  return Bad(file, field + ".behavior", absl::StrCat("unknown behavior '", *b, "'"));
}

absl::Status ParsePreTokenizer(const json& node, const std::string& file, const std::string& field,
                               std::vector<PreTokenizerStep>* out) {
  absl::StatusOr<std::string> type = GetString(node, "type", file, field);
  if (!type.ok()) return type.status();
  PreTokenizerStep step;
  if (*type == "Sequence") {
    const json* list = Member(node, "pretokenizers");
    if (list == nullptr || !list->is_array())
      return Bad(file, field + ".pretokenizers", "expected a list");
    for (size_t i = 0; i < list->size(); ++i) {
      absl::Status s =
          ParsePreTokenizer((*list)[i], file, absl::StrCat(field, ".pretokenizers[", i, "]"), out);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  } else if (*type == "Split") {
    absl::StatusOr<TextRegex> regex = GetPattern(node, file, field);
    if (!regex.ok()) return regex.status();
    absl::StatusOr<Behavior> behavior = ParseBehavior(node, file, field);
    if (!behavior.ok()) return behavior.status();
    absl::StatusOr<bool> invert = GetBool(node, "invert", false, file, field);
    if (!invert.ok()) return invert.status();
    step.kind = PreTokenizerStep::kSplit;
    step.regex = *std::move(regex);
    step.behavior = *behavior;
    step.invert = *invert;
  } else if (*type == "ByteLevel") {
    absl::StatusOr<bool> prefix = GetBool(node, "add_prefix_space", true, file, field);
    if (!prefix.ok()) return prefix.status();
    absl::StatusOr<bool> use_regex = GetBool(node, "use_regex", true, file, field);
    if (!use_regex.ok()) return use_regex.status();
    step.kind = PreTokenizerStep::kByteLevel;
    step.add_prefix_space = *prefix;
    step.use_regex = *use_regex;
    if (step.use_regex) step.regex = *TextRegex::Compile(kGpt2Regex);
  } else if (*type == "Digits") {
    absl::StatusOr<bool> individual = GetBool(node, "individual_digits", false, file, field);
    if (!individual.ok()) return individual.status();
    // char::is_numeric (categories Nd, Nl, No), each character its own match.
    step.kind = PreTokenizerStep::kSplit;
    step.regex = *TextRegex::Compile(R"(\p{N})");
    step.behavior = *individual ? Behavior::kIsolated : Behavior::kContiguous;
  } else if (*type == "Metaspace") {
    absl::StatusOr<char32_t> replacement = GetChar(node, "replacement", file, field);
    if (!replacement.ok()) return replacement.status();
    step.kind = PreTokenizerStep::kMetaspace;
    AppendUtf8(*replacement, &step.replacement);
    step.prepend = PreTokenizerStep::kAlways;
    if (const json* scheme = Member(node, "prepend_scheme")) {
      const std::string s = scheme->is_string() ? scheme->get<std::string>() : "";
      if (s == "always")
        step.prepend = PreTokenizerStep::kAlways;
      else if (s == "first")
        step.prepend = PreTokenizerStep::kFirst;
      else if (s == "never")
        step.prepend = PreTokenizerStep::kNever;
      else
        return Bad(file, field + ".prepend_scheme", "expected \"always\", \"first\" or \"never\"");
    }
    // The older add_prefix_space: false means prepend_scheme never.
    absl::StatusOr<bool> prefix = GetBool(node, "add_prefix_space", true, file, field);
    if (!prefix.ok()) return prefix.status();
    if (!*prefix) step.prepend = PreTokenizerStep::kNever;
    absl::StatusOr<bool> split = GetBool(node, "split", true, file, field);
    if (!split.ok()) return split.status();
    step.split = *split;
    step.behavior = Behavior::kMergedWithNext;
    step.regex = *TextRegex::Compile(step.replacement, /*literal=*/true);
  } else {
    return Bad(file, field + ".type",
               absl::StrCat("pre_tokenizer '", *type,
                            "' is not supported (Split, ByteLevel, Digits, Metaspace, Sequence)"));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParseDecoder(const json& node, const std::string& file, const std::string& field,
                          std::vector<DecoderStep>* out) {
  absl::StatusOr<std::string> type = GetString(node, "type", file, field);
  if (!type.ok()) return type.status();
  DecoderStep step;
  if (*type == "Sequence") {
    const json* list = Member(node, "decoders");
    if (list == nullptr || !list->is_array())
      return Bad(file, field + ".decoders", "expected a list");
    for (size_t i = 0; i < list->size(); ++i) {
      absl::Status s =
          ParseDecoder((*list)[i], file, absl::StrCat(field, ".decoders[", i, "]"), out);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  } else if (*type == "ByteLevel") {
    step.kind = DecoderStep::kByteLevel;
  } else if (*type == "ByteFallback") {
    step.kind = DecoderStep::kByteFallback;
  } else if (*type == "Fuse") {
    step.kind = DecoderStep::kFuse;
  } else if (*type == "Replace") {
    absl::StatusOr<TextRegex> regex = GetPattern(node, file, field);
    if (!regex.ok()) return regex.status();
    absl::StatusOr<std::string> content = GetString(node, "content", file, field);
    if (!content.ok()) return content.status();
    step.kind = DecoderStep::kReplace;
    const json& pattern = node["pattern"];
    step.literal = Member(pattern, "String") != nullptr;
    if (step.literal) step.pattern = pattern["String"].get<std::string>();
    step.regex = *std::move(regex);
    step.content = *content;
  } else if (*type == "Strip") {
    absl::StatusOr<char32_t> content = GetChar(node, "content", file, field);
    if (!content.ok()) return content.status();
    const json* start = Member(node, "start");
    const json* stop = Member(node, "stop");
    if (start == nullptr || !start->is_number_unsigned() || stop == nullptr ||
        !stop->is_number_unsigned()) {
      return Bad(file, field, "Strip needs unsigned integers start and stop");
    }
    step.kind = DecoderStep::kStrip;
    step.strip = *content;
    step.start = start->get<size_t>();
    step.stop = stop->get<size_t>();
  } else if (*type == "Metaspace") {
    absl::StatusOr<char32_t> replacement = GetChar(node, "replacement", file, field);
    if (!replacement.ok()) return replacement.status();
    step.kind = DecoderStep::kMetaspace;
    AppendUtf8(*replacement, &step.replacement);
    std::string scheme = "always";
    if (const json* s = Member(node, "prepend_scheme"); s != nullptr && s->is_string()) {
      scheme = s->get<std::string>();
    }
    absl::StatusOr<bool> prefix = GetBool(node, "add_prefix_space", true, file, field);
    if (!prefix.ok()) return prefix.status();
    step.prepend_never = scheme == "never" || !*prefix;
  } else {
    return Bad(file, field + ".type",
               absl::StrCat("decoder '", *type,
                            "' is not supported (ByteLevel, ByteFallback, Fuse, Replace, Strip, "
                            "Metaspace, Sequence)"));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

// The ids one post-processor puts before and after a single sequence.
absl::Status ParsePostProcessor(const json& node, const std::string& file, const std::string& field,
                                std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) {
  absl::StatusOr<std::string> type = GetString(node, "type", file, field);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    const json* list = Member(node, "processors");
    if (list == nullptr || !list->is_array())
      return Bad(file, field + ".processors", "expected a list");
    for (size_t i = 0; i < list->size(); ++i) {
      // Each processor wraps what the previous ones produced.
      std::vector<int32_t> p, s;
      absl::Status st =
          ParsePostProcessor((*list)[i], file, absl::StrCat(field, ".processors[", i, "]"), &p, &s);
      if (!st.ok()) return st;
      prefix->insert(prefix->begin(), p.begin(), p.end());
      suffix->insert(suffix->end(), s.begin(), s.end());
    }
    return absl::OkStatus();
  }
  if (*type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (*type == "RobertaProcessing" || *type == "BertProcessing") {
    // "cls": ["<s>", 0], "sep": ["</s>", 2]
    for (const char* key : {"cls", "sep"}) {
      const json* v = Member(node, key);
      if (v == nullptr || !v->is_array() || v->size() != 2 || !(*v)[1].is_number_integer()) {
        return Bad(file, absl::StrCat(field, ".", key), "expected [token, id]");
      }
      (std::string(key) == "cls" ? prefix : suffix)->push_back((*v)[1].get<int32_t>());
    }
    return absl::OkStatus();
  }
  if (*type == "TemplateProcessing") {
    const json* single = Member(node, "single");
    if (single == nullptr || !single->is_array())
      return Bad(file, field + ".single", "expected a list");
    const json* specials = Member(node, "special_tokens");
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& item = (*single)[i];
      const std::string item_field = absl::StrCat(field, ".single[", i, "]");
      if (Member(item, "Sequence") != nullptr) {
        if (seen_sequence) return Bad(file, item_field, "a second sequence in the single template");
        seen_sequence = true;
        continue;
      }
      const json* special = Member(item, "SpecialToken");
      if (special == nullptr) return Bad(file, item_field, "expected SpecialToken or Sequence");
      absl::StatusOr<std::string> name =
          GetString(*special, "id", file, item_field + ".SpecialToken");
      if (!name.ok()) return name.status();
      const json* entry = specials != nullptr ? Member(*specials, name->c_str()) : nullptr;
      const json* ids = entry != nullptr ? Member(*entry, "ids") : nullptr;
      if (ids == nullptr || !ids->is_array()) {
        return Bad(file, absl::StrCat(field, ".special_tokens"),
                   absl::StrCat("no ids for '", *name, "'"));
      }
      for (const json& id : *ids) {
        if (!id.is_number_integer())
          return Bad(file, absl::StrCat(field, ".special_tokens.", *name), "ids must be integers");
        (seen_sequence ? suffix : prefix)->push_back(id.get<int32_t>());
      }
    }
    return absl::OkStatus();
  }
  return Bad(file, field + ".type",
             absl::StrCat("post_processor '", *type,
                          "' is not supported (TemplateProcessing, RobertaProcessing, "
                          "BertProcessing, ByteLevel, Sequence)"));
}

// A token given as a string or an AddedToken object ({"content": ...}) in tokenizer_config.json.
absl::StatusOr<std::string> ConfigToken(const json& config, const char* key,
                                        const std::string& file) {
  const json* v = Member(config, key);
  if (v == nullptr) return std::string();
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object()) {
    const json* content = Member(*v, "content");
    if (content != nullptr && content->is_string()) return content->get<std::string>();
  }
  return Bad(file, key, "expected a string or an object with \"content\"");
}

}  // namespace

BpeTokenizer::BpeTokenizer() : impl_(std::make_unique<Impl>()) {}
BpeTokenizer::~BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::LoadFromDirectory(
    const std::string& dir) {
  const std::string config = dir + "/tokenizer_config.json";
  std::error_code ec;
  return Load(dir + "/tokenizer.json",
              std::filesystem::exists(config, ec) ? config : std::string());
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Load(
    const std::string& tokenizer_json_path, const std::string& tokenizer_config_path) {
  const std::string& file = tokenizer_json_path;
  absl::StatusOr<std::string> text = ReadFile(file, "tokenizer.json");
  if (!text.ok()) return text.status();
  absl::StatusOr<json> parsed = ParseJson(*text, file);
  if (!parsed.ok()) return parsed.status();
  const json& doc = *parsed;
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  Impl& m = *tok->impl_;
  m.word_char = *TextRegex::Compile(kWordCharRegex);

  // ---- model
  const json* model = Member(doc, "model");
  if (model == nullptr || !model->is_object()) return Bad(file, "model", "missing");
  absl::StatusOr<std::string> type = GetString(*model, "type", file, "model");
  if (!type.ok()) return type.status();
  if (*type != "BPE") {
    return Bad(
        file, "model.type",
        absl::StrCat("'", *type, "' is not supported (moebatch reads BPE tokenizer.json files)"));
  }
  if (const json* dropout = Member(*model, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return Bad(file, "model.dropout", "BPE dropout is not supported (expected null)");
  }
  const json* vocab = Member(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object())
    return Bad(file, "model.vocab", "expected an object of token: id");
  int32_t max_id = -1;
  m.vocab.reserve(vocab->size());
  std::vector<std::pair<int32_t, const std::string*>> by_id;
  by_id.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > (1 << 30)) {
      return Bad(file, absl::StrCat("model.vocab[\"", it.key(), "\"]"), "expected an id >= 0");
    }
    const int32_t id = it.value().get<int32_t>();
    m.vocab[it.key()] = id;
    max_id = std::max(max_id, id);
    by_id.emplace_back(id, &it.key());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json* v = Member(*model, key)) {
      if (!v->is_string())
        return Bad(file, absl::StrCat("model.", key), "expected a string or null");
      (std::string(key) == "continuing_subword_prefix" ? m.continuing_subword_prefix
                                                       : m.end_of_word_suffix) =
          v->get<std::string>();
    }
  }
  for (auto [key, flag] : {std::pair<const char*, bool*>{"fuse_unk", &m.fuse_unk},
                           {"byte_fallback", &m.byte_fallback},
                           {"ignore_merges", &m.ignore_merges}}) {
    absl::StatusOr<bool> v = GetBool(*model, key, false, file, "model");
    if (!v.ok()) return v.status();
    *flag = *v;
  }
  if (const json* unk = Member(*model, "unk_token")) {
    if (!unk->is_string()) return Bad(file, "model.unk_token", "expected a string or null");
    m.unk_token = unk->get<std::string>();
    const auto it = m.vocab.find(*m.unk_token);
    if (it == m.vocab.end()) {
      return Bad(file, "model.unk_token",
                 absl::StrCat("'", *m.unk_token, "' is not in model.vocab"));
    }
    m.unk_id = it->second;
  }
  // merges: ["a b", ...] (legacy; "#version" lines skipped) or [["a", "b"], ...]
  const json* merges = Member(*model, "merges");
  if (merges == nullptr || !merges->is_array()) return Bad(file, "model.merges", "expected a list");
  const size_t prefix_len = m.continuing_subword_prefix.size();
  uint32_t rank = 0;
  std::string merged;
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& entry = (*merges)[i];
    const std::string field = absl::StrCat("model.merges[", i, "]");
    std::string a, b;
    if (entry.is_string()) {
      const std::string& line = entry.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return Bad(file, field,
                   absl::StrCat("'", line, "' is not two tokens separated by one space"));
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      a = entry[0].get<std::string>();
      b = entry[1].get<std::string>();
    } else {
      return Bad(file, field, "expected \"a b\" or [\"a\", \"b\"]");
    }
    const auto ia = m.vocab.find(a);
    if (ia == m.vocab.end())
      return Bad(file, field, absl::StrCat("'", a, "' is not in model.vocab"));
    const auto ib = m.vocab.find(b);
    if (ib == m.vocab.end())
      return Bad(file, field, absl::StrCat("'", b, "' is not in model.vocab"));
    merged = a;
    merged.append(b, std::min(prefix_len, b.size()), std::string::npos);
    const auto in = m.vocab.find(merged);
    if (in == m.vocab.end()) {
      return Bad(file, field,
                 absl::StrCat("the merged token '", merged, "' is not in model.vocab"));
    }
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                         static_cast<uint32_t>(ib->second);
    m.merges[key] = {rank++, in->second};  // a later duplicate takes its rank, as HF's HashMap
  }
  for (int b = 0; b < 256; ++b) {
    char code[8];
    std::snprintf(code, sizeof(code), "<0x%02X>", b);
    const auto it = m.vocab.find(code);
    m.byte_token[b] = it == m.vocab.end() ? -1 : it->second;
    const auto jt = m.vocab.find(BytesCharUtf8()[b]);
    m.byte_char_id[b] = jt == m.vocab.end() ? -1 : jt->second;
  }

  // ---- normalizer, pre-tokenizer, decoder
  if (const json* n = Member(doc, "normalizer")) {
    absl::Status s = ParseNormalizer(*n, file, "normalizer", &m.normalizer);
    if (!s.ok()) return s;
  }
  if (const json* p = Member(doc, "pre_tokenizer")) {
    absl::Status s = ParsePreTokenizer(*p, file, "pre_tokenizer", &m.pre_tokenizer);
    if (!s.ok()) return s;
  }
  m.last_step_byte_level = !m.pre_tokenizer.empty() &&
                           m.pre_tokenizer.back().kind == PreTokenizerStep::kByteLevel &&
                           prefix_len == 0 && m.end_of_word_suffix.empty();
  if (const json* d = Member(doc, "decoder")) {
    absl::Status s = ParseDecoder(*d, file, "decoder", &m.decoder);
    if (!s.ok()) return s;
  } else {
    DecoderStep join;
    join.kind = DecoderStep::kJoinSpace;
    m.decoder.push_back(std::move(join));
  }
  bool fused = false;
  for (DecoderStep& step : m.decoder) {
    step.fused = fused;
    if (step.kind == DecoderStep::kByteLevel || step.kind == DecoderStep::kFuse ||
        step.kind == DecoderStep::kJoinSpace) {
      fused = true;
    }
  }

  // ---- added tokens (ids as AddedVocabulary::add_tokens assigns them: the vocabulary's id when
  // the content is in it, else the next id after the model's vocabulary)
  int32_t next_id = static_cast<int32_t>(m.vocab.size());
  if (const json* added = Member(doc, "added_tokens")) {
    if (!added->is_array()) return Bad(file, "added_tokens", "expected a list");
    for (size_t i = 0; i < added->size(); ++i) {
      const json& t = (*added)[i];
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      AddedToken token;
      absl::StatusOr<std::string> content = GetString(t, "content", file, field);
      if (!content.ok()) return content.status();
      token.content = *content;
      if (token.content.empty()) continue;
      for (auto [key, flag, fallback] :
           {std::tuple<const char*, bool*, bool>{"single_word", &token.single_word, false},
            {"lstrip", &token.lstrip, false},
            {"rstrip", &token.rstrip, false},
            {"special", &token.special, false}}) {
        absl::StatusOr<bool> v = GetBool(t, key, fallback, file, field);
        if (!v.ok()) return v.status();
        *flag = *v;
      }
      absl::StatusOr<bool> normalized = GetBool(t, "normalized", !token.special, file, field);
      if (!normalized.ok()) return normalized.status();
      token.normalized = *normalized;
      if (const auto it = m.added_ids.find(token.content); it != m.added_ids.end()) {
        token.id = m.added[it->second].id;
        m.added[it->second] = token;  // the later entry's flags win
        continue;
      }
      if (const auto it = m.vocab.find(token.content); it != m.vocab.end()) {
        token.id = it->second;
      } else {
        token.id = next_id++;
      }
      m.added_ids[token.content] = static_cast<int32_t>(m.added.size());
      m.added.push_back(token);
    }
  }
  for (const AddedToken& t : m.added) max_id = std::max(max_id, t.id);

  // Per-id strings: the model's vocabulary, then the added tokens (an added token's decode
  // string is its normalized content when it is normalized, as HF's normalized_cache).
  tok->id_text_.assign(static_cast<size_t>(max_id + 1), std::string());
  tok->id_flags_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [id, token] : by_id) {
    tok->id_text_[id] = *token;
    tok->id_flags_[id] = kIdUsed;
  }
  for (size_t i = 0; i < m.added.size(); ++i) {
    const AddedToken& t = m.added[i];
    std::string surface = t.content;
    if (t.normalized) surface = m.Normalize(t.content);
    (t.normalized ? m.normalized_trie : m.raw_trie).Insert(surface, static_cast<int32_t>(i));
    tok->id_text_[t.id] = surface;
    tok->id_flags_[t.id] |= kIdUsed;
    if (t.special) m.special_contents.insert(t.content);
  }
  for (size_t id = 0; id < tok->id_text_.size(); ++id) {
    if ((tok->id_flags_[id] & kIdUsed) && m.special_contents.contains(tok->id_text_[id])) {
      tok->id_flags_[id] |= kIdSpecial;
    }
  }

  // ---- post-processor
  if (const json* p = Member(doc, "post_processor")) {
    absl::Status s =
        ParsePostProcessor(*p, file, "post_processor", &tok->prefix_ids_, &tok->suffix_ids_);
    if (!s.ok()) return s;
  }

  // ---- tokenizer_config.json
  if (!tokenizer_config_path.empty()) {
    const std::string& cfile = tokenizer_config_path;
    absl::StatusOr<std::string> ctext = ReadFile(cfile, "tokenizer_config.json");
    if (!ctext.ok()) return ctext.status();
    absl::StatusOr<json> config = ParseJson(*ctext, cfile);
    if (!config.ok()) return config.status();
    absl::StatusOr<std::string> bos = ConfigToken(*config, "bos_token", cfile);
    if (!bos.ok()) return bos.status();
    absl::StatusOr<std::string> eos = ConfigToken(*config, "eos_token", cfile);
    if (!eos.ok()) return eos.status();
    tok->bos_token_ = *bos;
    tok->eos_token_ = *eos;
    absl::StatusOr<bool> split =
        GetBool(*config, "split_special_tokens", false, cfile, "tokenizer_config");
    if (!split.ok()) return split.status();
    tok->split_special_tokens_ = *split;
    if (const json* tmpl = Member(*config, "chat_template")) {
      if (tmpl->is_string()) {
        tok->chat_template_ = tmpl->get<std::string>();
        tok->chat_template_file_ = cfile;
      } else if (tmpl->is_array()) {
        for (const json& entry : *tmpl) {
          const json* name = Member(entry, "name");
          const json* body = Member(entry, "template");
          if (name != nullptr && name->is_string() && name->get<std::string>() == "default" &&
              body != nullptr && body->is_string()) {
            tok->chat_template_ = body->get<std::string>();
            tok->chat_template_file_ = cfile;
          }
        }
      } else {
        return Bad(cfile, "chat_template", "expected a string or a list of {name, template}");
      }
    }
    const bool has_add_bos = Member(*config, "add_bos_token") != nullptr;
    const bool has_add_eos = Member(*config, "add_eos_token") != nullptr;
    if (has_add_bos || has_add_eos) {
      absl::StatusOr<bool> add_bos =
          GetBool(*config, "add_bos_token", false, cfile, "tokenizer_config");
      if (!add_bos.ok()) return add_bos.status();
      absl::StatusOr<bool> add_eos =
          GetBool(*config, "add_eos_token", false, cfile, "tokenizer_config");
      if (!add_eos.ok()) return add_eos.status();
      tok->prefix_ids_.clear();
      tok->suffix_ids_.clear();
      for (auto [flag, token, list, key] :
           {std::tuple<bool, const std::string*, std::vector<int32_t>*, const char*>{
                *add_bos, &tok->bos_token_, &tok->prefix_ids_, "bos_token"},
            {*add_eos, &tok->eos_token_, &tok->suffix_ids_, "eos_token"}}) {
        if (!flag || token->empty()) continue;
        const int32_t id = tok->TokenToId(*token);
        if (id < 0) return Bad(cfile, key, absl::StrCat("'", *token, "' is not a token of ", file));
        list->push_back(id);
      }
    }
  }
  for (const std::vector<int32_t>* list : {&tok->prefix_ids_, &tok->suffix_ids_}) {
    for (int32_t id : *list) {
      if (id < 0 || id >= tok->vocab_size()) {
        return Bad(file, "post_processor", absl::StrCat("id ", id, " is outside the vocabulary"));
      }
    }
  }
  if (tok->chat_template_.empty()) {
    const std::string jinja =
        (std::filesystem::path(file).parent_path() / "chat_template.jinja").string();
    std::error_code jec;
    if (std::filesystem::is_regular_file(jinja, jec)) {
      absl::StatusOr<std::string> t = ReadFile(jinja, "chat_template.jinja");
      if (!t.ok()) return t.status();
      tok->chat_template_ = *t;
      tok->chat_template_file_ = jinja;
    }
  }
  return tok;
}

int32_t BpeTokenizer::TokenToId(std::string_view token) const {
  if (token.empty()) return -1;
  const std::string key(token);
  if (const auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) {
    return impl_->added[it->second].id;
  }
  const auto it = impl_->vocab.find(key);
  return it == impl_->vocab.end() ? -1 : it->second;
}

const std::string* BpeTokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !(id_flags_[id] & kIdUsed)) return nullptr;
  return &id_text_[id];
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && (id_flags_[id] & kIdSpecial);
}

// ---- encoding --------------------------------------------------------------------------------

std::string BpeTokenizer::Impl::Normalize(std::string_view text) const {
  std::string s(text);
  std::vector<TextRegex::Span> spans;
  for (const NormalizerStep& step : normalizer) {
    switch (step.kind) {
      case NormalizerStep::kUnicode:
        s = NormalizeUnicode(s, step.form);
        break;
      case NormalizerStep::kPrepend:
        if (!s.empty()) s = step.text + s;
        break;
      case NormalizerStep::kReplace: {
        step.regex.FindMatches(s, &spans);
        std::string out;
        out.reserve(s.size());
        for (const TextRegex::Span& sp : spans) {
          if (sp.match)
            out += step.text;
          else
            out.append(s, sp.start, sp.end - sp.start);
        }
        s = std::move(out);
        break;
      }
    }
  }
  return s;
}

// AddedVocabulary::find_matches: the text cut into added tokens and the text between them.
void BpeTokenizer::Impl::SplitAdded(std::string_view text, const TokenTrie& trie,
                                    bool parse_special, std::vector<Segment>* out) const {
  out->clear();
  if (trie.empty()) {
    out->push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0, from = 0;
  while (auto m = trie.Find(text, from)) {
    auto [start, stop, index] = *m;
    from = stop;
    const AddedToken& t = added[index];
    if (!parse_special && t.special) continue;
    if (t.single_word) {
      // The character before must not be a word character, nor the one after.
      bool start_space = true, stop_space = true;
      if (start > 0) {
        size_t p = start - 1;
        while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        start_space = !word_char.MatchesAt(text, p);
      }
      if (stop < text.size()) stop_space = !word_char.MatchesAt(text, stop);
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {  // swallow the white space before it (not before start_offset)
      size_t p = start;
      while (p > start_offset) {
        size_t q = p - 1;
        while (q > 0 && (static_cast<unsigned char>(text[q]) & 0xC0) == 0x80) --q;
        const size_t len = Utf8CharLength(text, q);
        if (len == 0 || !IsUnicodeWhiteSpace(Utf8Decode(text, q, len))) break;
        p = q;
      }
      start = std::max(p, start_offset);
    }
    if (t.rstrip) {  // and after it
      while (stop < text.size()) {
        const size_t len = Utf8CharLength(text, stop);
        if (len == 0 || !IsUnicodeWhiteSpace(Utf8Decode(text, stop, len))) break;
        stop += len;
      }
      from = stop;
    }
    if (start_offset < start) out->push_back({start_offset, start, -1});
    out->push_back({start, stop, t.id});
    start_offset = stop;
  }
  if (start_offset != text.size()) out->push_back({start_offset, text.size(), -1});
}

namespace {

// NormalizedString::split's handling of the spans a pattern found (tokenizers/src/tokenizer/
// normalizer.rs): which [start, end) pieces remain.
void ApplyBehavior(const std::vector<TextRegex::Span>& spans, Behavior behavior,
                   std::vector<std::pair<size_t, size_t>>* pieces) {
  pieces->clear();
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& s : spans) pieces->emplace_back(s.start, s.end);
      return;
    case Behavior::kRemoved:
      for (const auto& s : spans) {
        if (!s.match) pieces->emplace_back(s.start, s.end);
      }
      return;
    case Behavior::kContiguous: {
      bool previous = false;
      for (size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && spans[i].match == previous) {
          pieces->back().second = spans[i].end;
        } else {
          pieces->emplace_back(spans[i].start, spans[i].end);
        }
        previous = spans[i].match;
      }
      return;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const auto& s : spans) {
        if (s.match && !previous && !pieces->empty()) {
          pieces->back().second = s.end;
        } else {
          pieces->emplace_back(s.start, s.end);
        }
        previous = s.match;
      }
      return;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;  // whether the span to the right matched
      for (size_t k = spans.size(); k-- > 0;) {
        const auto& s = spans[k];
        if (s.match && !previous && !pieces->empty()) {
          pieces->back().first = s.start;
        } else {
          pieces->emplace_back(s.start, s.end);
        }
        previous = s.match;
      }
      std::reverse(pieces->begin(), pieces->end());
      return;
    }
  }
}

}  // namespace

void BpeTokenizer::Impl::PreTokenize(Piece first, std::vector<Piece>* out) const {
  out->clear();
  out->push_back(std::move(first));
  std::vector<Piece> next;
  std::vector<TextRegex::Span> spans;
  std::vector<std::pair<size_t, size_t>> cuts;
  for (size_t k = 0; k < pre_tokenizer.size(); ++k) {
    const PreTokenizerStep& step = pre_tokenizer[k];
    const bool last = k + 1 == pre_tokenizer.size();
    next.clear();
    for (Piece& piece : *out) {
      if (step.kind == PreTokenizerStep::kMetaspace) {
        std::string s;
        s.reserve(piece.text.size() + 3);
        for (char ch : piece.text) {
          if (ch == ' ')
            s += step.replacement;
          else
            s.push_back(ch);
        }
        const bool starts = s.compare(0, step.replacement.size(), step.replacement) == 0;
        if (!starts && (step.prepend == PreTokenizerStep::kAlways ||
                        (step.prepend == PreTokenizerStep::kFirst && piece.at_origin))) {
          s.insert(0, step.replacement);
        }
        piece.text = std::move(s);
        if (!step.split) {
          if (!piece.text.empty()) next.push_back(std::move(piece));
          continue;
        }
      } else if (step.kind == PreTokenizerStep::kByteLevel) {
        if (step.add_prefix_space && (piece.text.empty() || piece.text[0] != ' ')) {
          piece.text.insert(0, " ");
        }
        if (!step.use_regex) {
          if (!piece.text.empty()) next.push_back(std::move(piece));
          continue;
        }
      }
      const std::string& s = piece.text;
      step.regex.FindMatches(s, &spans);
      if (step.invert) {
        for (auto& sp : spans) sp.match = !sp.match;
      }
      ApplyBehavior(spans, step.behavior, &cuts);
      for (const auto& [a, b] : cuts) {
        if (a == b) continue;  // empty splits are dropped
        next.push_back(Piece{s.substr(a, b - a), piece.at_origin && a == 0, false});
      }
    }
    if (step.kind == PreTokenizerStep::kByteLevel) {
      for (Piece& p : next) {
        if (last && last_step_byte_level) {
          p.byte_mapped = true;
        } else {
          p.text = MapToByteLevel(p.text);
        }
      }
    }
    out->swap(next);
  }
}

// Word::merge_all: the min-heap of (rank, position) over the symbols, stale entries skipped.
void BpeTokenizer::Impl::MergeSymbols(std::vector<int32_t>* ids) const {
  const size_t n = ids->size();
  if (n < 2 || merges.empty()) return;
  struct Symbol {
    int32_t c;
    int32_t prev, next;
    bool alive;
  };
  struct Merge {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
    bool operator<(const Merge& o) const {  // the heap's top is the smallest (rank, pos)
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Merge> heap;
  symbols.resize(n);
  heap.clear();
  auto find = [&](int32_t a, int32_t b) -> const std::pair<uint32_t, int32_t>* {
    const auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
                                static_cast<uint32_t>(b));
    return it == merges.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i < n; ++i) {
    symbols[i] = {(*ids)[i], static_cast<int32_t>(i) - 1,
                  i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
    if (i + 1 < n) {
      if (const auto* m = find((*ids)[i], (*ids)[i + 1])) {
        heap.push_back({m->first, static_cast<uint32_t>(i), m->second});
      }
    }
  }
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Merge top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    const Symbol right = symbols[left.next];
    const auto* m = find(left.c, right.c);
    if (m == nullptr || m->second != top.new_id) continue;  // an expired entry
    symbols[left.next].alive = false;
    left.c = top.new_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = static_cast<int32_t>(top.pos);
    if (left.prev >= 0) {
      if (const auto* pm = find(symbols[left.prev].c, left.c)) {
        heap.push_back({pm->first, static_cast<uint32_t>(left.prev), pm->second});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (left.next >= 0) {
      if (const auto* nm = find(left.c, symbols[left.next].c)) {
        heap.push_back({nm->first, top.pos, nm->second});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  ids->clear();
  for (size_t i = 0; i < n; ++i) {
    if (symbols[i].alive) ids->push_back(symbols[i].c);
  }
}

// BPE::merge_word on the characters of `word` (text in the vocabulary's alphabet).
void BpeTokenizer::Impl::MergeWord(std::string_view word, std::vector<int32_t>* out) const {
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  // An unknown character's <unk> waits until a known character (or the end) follows, as HF's
  // `unk` variable: byte-fallback bytes may come before it, and with fuse_unk one <unk> stands
  // for a run of unknown characters.
  bool unk_pending = false;
  std::string s;
  ForEachChar(word, [&](size_t i, size_t len, char32_t) {
    const bool is_first = i == 0, is_last = i + len == word.size();
    s.assign(word.substr(i, len));
    if (!is_first && !continuing_subword_prefix.empty()) s.insert(0, continuing_subword_prefix);
    if (is_last && !end_of_word_suffix.empty()) s += end_of_word_suffix;
    if (const auto it = vocab.find(s); it != vocab.end()) {
      if (unk_pending) ids.push_back(unk_id);
      unk_pending = false;
      ids.push_back(it->second);
      return;
    }
    if (byte_fallback) {
      bool all = true;
      for (char ch : s) all = all && byte_token[static_cast<unsigned char>(ch)] >= 0;
      if (all) {
        for (char ch : s) ids.push_back(byte_token[static_cast<unsigned char>(ch)]);
        return;
      }
    }
    if (unk_id >= 0) {
      if (unk_pending && !fuse_unk) ids.push_back(unk_id);
      unk_pending = true;
    }
  });
  if (unk_pending) ids.push_back(unk_id);
  MergeSymbols(&ids);
  out->insert(out->end(), ids.begin(), ids.end());
}

void BpeTokenizer::Impl::Tokenize(const Piece& piece, std::vector<int32_t>* out) const {
  const std::string& w = piece.text;
  if (w.empty()) return;
  const bool cacheable = w.size() < kCacheMaxWordBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu);
    const auto it = cache.find(w);
    if (it != cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  if (piece.byte_mapped) {
    bool direct = true;
    if (ignore_merges) {
      const auto it = vocab.find(MapToByteLevel(w));
      if (it != vocab.end()) {
        ids.push_back(it->second);
        direct = false;
      }
    }
    if (direct) {
      for (char ch : w) {
        const int32_t id = byte_char_id[static_cast<unsigned char>(ch)];
        if (id < 0) {
          direct = false;
          break;
        }
        ids.push_back(id);
      }
      if (direct) {
        MergeSymbols(&ids);
      } else {
        ids.clear();
        MergeWord(MapToByteLevel(w), &ids);
      }
    }
  } else {
    const auto it = ignore_merges ? vocab.find(w) : vocab.end();
    if (it != vocab.end()) {
      ids.push_back(it->second);
    } else {
      MergeWord(w, &ids);
    }
  }
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu);
    if (cache.size() < kCacheCapacity) cache.emplace(w, std::move(ids));
  }
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view input,
                                          const BpeEncodeOptions& options) const {
  const Impl& m = *impl_;
  std::string repaired;
  std::string_view text = input;
  if (!IsValidUtf8(input)) {
    AppendUtf8Lossy(input, &repaired);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (options.add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
  std::vector<Segment> raw, normalized;
  std::vector<Piece> pieces;
  m.SplitAdded(text, m.raw_trie, options.parse_special, &raw);
  for (const Segment& seg : raw) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    if (seg.start == seg.end) continue;
    const std::string norm = m.Normalize(text.substr(seg.start, seg.end - seg.start));
    m.SplitAdded(norm, m.normalized_trie, options.parse_special, &normalized);
    for (const Segment& sub : normalized) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      if (sub.start == sub.end) continue;
      m.PreTokenize(Piece{norm.substr(sub.start, sub.end - sub.start),
                          seg.start == 0 && sub.start == 0, false},
                    &pieces);
      for (const Piece& p : pieces) m.Tokenize(p, &ids);
    }
  }
  if (options.add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  BpeDecodeStream stream(*this, skip_special_tokens);
  std::string text;
  for (int32_t id : ids) text += stream.Add(id);
  text += stream.Finish();
  return text;
}

// ---- decoding --------------------------------------------------------------------------------

namespace {

// ByteFallback's test: a token that is exactly "<0xNN>" (hex digits in either case).
int FallbackByte(std::string_view t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int value = 0;
  for (size_t k = 3; k < 5; ++k) {
    const char h = t[k];
    const int d = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                         : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

// The byte-level decoder's bytes for one token: each character's byte when every character is in
// the byte-level alphabet, else the token's own UTF-8.
void AppendTokenBytes(std::string_view token, std::string* bytes) {
  const size_t before = bytes->size();
  bool all = true;
  ForEachChar(token, [&](size_t, size_t, char32_t c) {
    if (!all) return;
    const int b = CharByte(c);
    if (b < 0) {
      all = false;
      return;
    }
    bytes->push_back(static_cast<char>(b));
  });
  if (!all) {
    bytes->resize(before);
    bytes->append(token);
  }
}

std::string ApplyReplace(const DecoderStep& step, std::string_view token) {
  std::vector<TextRegex::Span> spans;
  step.regex.FindMatches(token, &spans);
  std::string out;
  for (const auto& sp : spans) {
    if (sp.match)
      out += step.content;
    else
      out.append(token.substr(sp.start, sp.end - sp.start));
  }
  return out;
}

// Strip::decode_chain on one whole token.
std::string ApplyStrip(const DecoderStep& step, std::string_view token) {
  std::vector<std::pair<size_t, size_t>> chars;  // (offset, length)
  std::vector<char32_t> cps;
  ForEachChar(token, [&](size_t i, size_t len, char32_t c) {
    chars.emplace_back(i, len);
    cps.push_back(c);
  });
  size_t start_cut = 0;
  for (size_t i = 0; i < step.start && i < cps.size(); ++i) {
    if (cps[i] != step.strip) break;
    start_cut = i + 1;
  }
  size_t stop_cut = cps.size();
  for (size_t i = 0; i < step.stop && i < cps.size(); ++i) {
    const size_t index = cps.size() - i - 1;
    if (cps[index] != step.strip) break;
    stop_cut = index;
  }
  if (stop_cut <= start_cut) return std::string();
  const size_t a = chars[start_cut].first;
  const size_t b = stop_cut == cps.size() ? token.size() : chars[stop_cut].first;
  return std::string(token.substr(a, b - a));
}

std::string ApplyMetaspace(const DecoderStep& step, std::string_view token, bool first) {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  const std::string& r = step.replacement;
  while (i < token.size()) {
    if (token.compare(i, r.size(), r) == 0) {
      if (!(first && !step.prepend_never)) out.push_back(' ');
      i += r.size();
    } else {
      out.push_back(token[i++]);
    }
  }
  return out;
}

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";

}  // namespace

BpeDecodeStream::BpeDecodeStream(const BpeTokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer),
      skip_special_(skip_special_tokens),
      states_(tokenizer.impl_->decoder.size()) {}

std::string BpeDecodeStream::Add(int32_t id) {
  const BpeTokenizer& t = *tokenizer_;
  if (id < 0 || id >= t.vocab_size() || !(t.id_flags_[id] & kIdUsed)) return std::string();
  if (skip_special_ && (t.id_flags_[id] & kIdSpecial)) return std::string();
  std::string out;
  Push(0, t.id_text_[id], &out);
  return out;
}

std::string BpeDecodeStream::Finish() {
  std::string out;
  FinishFrom(0, &out);
  return out;
}

// Feeds `item` (a token, or a chunk of the one fused token) to decoder step `k`.
void BpeDecodeStream::Push(size_t k, std::string_view item, std::string* out) {
  const std::vector<DecoderStep>& steps = tokenizer_->impl_->decoder;
  if (k == steps.size()) {
    out->append(item);
    return;
  }
  const DecoderStep& step = steps[k];
  BpeDecodeStepState& st = states_[k];
  switch (step.kind) {
    case DecoderStep::kByteLevel: {
      if (step.fused) {  // a byte-level step after a fusing one: decided only by the whole token
        st.pending.append(item);
        return;
      }
      AppendTokenBytes(item, &st.pending);
      const size_t keep = Utf8UnfinishedTail(st.pending);
      if (keep == st.pending.size()) return;
      std::string text;
      AppendUtf8Lossy(std::string_view(st.pending).substr(0, st.pending.size() - keep), &text);
      st.pending.erase(0, st.pending.size() - keep);
      Push(k + 1, text, out);
      return;
    }
    case DecoderStep::kByteFallback: {
      if (step.fused) {
        st.pending.append(item);
        return;
      }
      const int b = FallbackByte(item);
      if (b >= 0) {
        st.pending.push_back(static_cast<char>(b));
        return;
      }
      if (!st.pending.empty()) {
        std::string run;
        run.swap(st.pending);
        if (IsValidUtf8(run)) {
          Push(k + 1, run, out);
        } else {
          for (size_t i = 0; i < run.size(); ++i) Push(k + 1, kReplacementChar, out);
        }
      }
      Push(k + 1, item, out);
      return;
    }
    case DecoderStep::kFuse:
    case DecoderStep::kJoinSpace:
      if (step.kind == DecoderStep::kJoinSpace && !step.fused && st.count++ > 0) {
        Push(k + 1, " ", out);
      }
      Push(k + 1, item, out);
      return;
    case DecoderStep::kReplace: {
      if (!step.fused) {
        Push(k + 1, ApplyReplace(step, item), out);
        return;
      }
      st.pending.append(item);
      if (!step.literal || step.pattern.empty()) return;  // a regex sees the whole token
      // Replace every complete occurrence; hold back a tail that could start one.
      std::string text;
      size_t pos = 0;
      for (size_t f; (f = st.pending.find(step.pattern, pos)) != std::string::npos;
           pos = f + step.pattern.size()) {
        text.append(st.pending, pos, f - pos);
        text += step.content;
      }
      size_t hold = 0;
      const size_t rest = st.pending.size() - pos;
      for (size_t h = std::min(rest, step.pattern.size() - 1); h > 0; --h) {
        if (st.pending.compare(st.pending.size() - h, h, step.pattern, 0, h) == 0) {
          hold = h;
          break;
        }
      }
      text.append(st.pending, pos, rest - hold);
      st.pending.erase(0, st.pending.size() - hold);
      if (!text.empty()) Push(k + 1, text, out);
      return;
    }
    case DecoderStep::kStrip: {
      if (!step.fused) {
        Push(k + 1, ApplyStrip(step, item), out);
        return;
      }
      // One token in chunks: drop up to `start` leading content characters; hold back a run of
      // content characters at the end (up to `stop` of them are dropped at Finish).
      std::string text;
      ForEachChar(item, [&](size_t i, size_t len, char32_t c) {
        if (!st.done) {
          if (c == step.strip && st.count < step.start) {
            ++st.count;
            return;
          }
          st.done = true;
        }
        if (step.stop > 0 && c == step.strip) {
          st.pending.append(item.substr(i, len));
          return;
        }
        text += st.pending;
        st.pending.clear();
        text.append(item.substr(i, len));
      });
      if (!text.empty()) Push(k + 1, text, out);
      return;
    }
    case DecoderStep::kMetaspace: {
      const bool first = step.fused || st.count == 0;
      ++st.count;
      Push(k + 1, ApplyMetaspace(step, item, first), out);
      return;
    }
  }
}

void BpeDecodeStream::FinishFrom(size_t k, std::string* out) {
  const std::vector<DecoderStep>& steps = tokenizer_->impl_->decoder;
  if (k == steps.size()) return;
  const DecoderStep& step = steps[k];
  BpeDecodeStepState& st = states_[k];
  std::string pending;
  pending.swap(st.pending);
  switch (step.kind) {
    case DecoderStep::kByteLevel:
      if (!pending.empty()) {
        std::string bytes, text;
        if (step.fused) {
          AppendTokenBytes(pending, &bytes);
        } else {
          bytes = std::move(pending);
        }
        AppendUtf8Lossy(bytes, &text);
        Push(k + 1, text, out);
      }
      break;
    case DecoderStep::kByteFallback:
      if (step.fused) {
        const int b = FallbackByte(pending);
        if (b < 0) {
          Push(k + 1, pending, out);
        } else {
          const std::string one(1, static_cast<char>(b));
          Push(k + 1, IsValidUtf8(one) ? std::string_view(one) : std::string_view(kReplacementChar),
               out);
        }
      } else if (!pending.empty()) {
        if (IsValidUtf8(pending)) {
          Push(k + 1, pending, out);
        } else {
          for (size_t i = 0; i < pending.size(); ++i) Push(k + 1, kReplacementChar, out);
        }
      }
      break;
    case DecoderStep::kReplace:
      if (!pending.empty()) {
        Push(k + 1, step.literal && !step.pattern.empty() ? pending : ApplyReplace(step, pending),
             out);
      }
      break;
    case DecoderStep::kStrip:
      if (!pending.empty()) {  // a run of content characters at the very end
        std::vector<size_t> starts;
        ForEachChar(pending, [&](size_t i, size_t, char32_t) { starts.push_back(i); });
        const size_t drop = std::min(step.stop, starts.size());
        pending.resize(drop == 0 ? pending.size() : starts[starts.size() - drop]);
        if (!pending.empty()) Push(k + 1, pending, out);
      }
      break;
    default:
      break;
  }
  FinishFrom(k + 1, out);
}

}  // namespace moebatch
