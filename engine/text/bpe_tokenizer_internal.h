// The insides of BpeTokenizer (engine/text/bpe_tokenizer.h), shared by its two source files:
// bpe_tokenizer_config.cc reads tokenizer.json and tokenizer_config.json into these structures,
// bpe_tokenizer.cc encodes and decodes with them. Not part of moebatch's interface: only
// engine/text/ includes it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/text/bpe_tokenizer.h"
#include "engine/text/text_regex.h"
#include "engine/text/text_unicode.h"
#include "nlohmann/json_fwd.hpp"

namespace moebatch {
namespace bpe_internal {

constexpr uint8_t kIdUsed = 1;
constexpr uint8_t kIdSpecial = 2;

// tokenizers/src/pre_tokenizers/byte_level.rs: the GPT-2 pre-tokenization regex.
inline constexpr char kGpt2Regex[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The Rust regex crate's \w (Unicode): what AddedVocabulary's single_word test uses.
inline constexpr char kWordCharRegex[] = R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])";

// bytes_char(): byte -> the code point GPT-2's byte-level alphabet uses for it.
const std::array<char32_t, 256>& BytesChar();
// The UTF-8 of each byte's byte-level character.
const std::array<std::string, 256>& BytesCharUtf8();
// The byte a byte-level character stands for, or -1.
int CharByte(char32_t c);
// `raw`'s bytes written in the byte-level alphabet.
std::string MapToByteLevel(std::string_view raw);

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

}  // namespace bpe_internal

struct BpeTokenizer::Impl {
  using NormalizerStep = bpe_internal::NormalizerStep;
  using PreTokenizerStep = bpe_internal::PreTokenizerStep;
  using DecoderStep = bpe_internal::DecoderStep;
  using AddedToken = bpe_internal::AddedToken;
  using TokenTrie = bpe_internal::TokenTrie;
  using Piece = bpe_internal::Piece;
  using Segment = bpe_internal::Segment;

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

// The loader's steps, also called on documents that were not read from files (a GGUF file's
// tokenizer metadata, engine/text/gguf_tokenizer.cc). `file` and `config_file` name the
// documents' origin in error messages (the paths, for files).
struct BpeTokenizerLoader {
  // Everything tokenizer.json says (model, normalizer, pre-tokenizer, decoder, added tokens,
  // post-processor). InvalidArgument naming `file` and the field.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromTokenizerJson(const nlohmann::json& doc,
                                                                         const std::string& file);
  // What tokenizer_config.json says (bos_token, eos_token, split_special_tokens, chat_template,
  // add_bos_token / add_eos_token), applied to `tok`; the chat template's file is `config_file`.
  static absl::Status ApplyConfig(const nlohmann::json& config, const std::string& config_file,
                                  const std::string& file, BpeTokenizer* tok);
  // The last check of Load: the post-processor's ids are inside the vocabulary.
  static absl::Status CheckSpecialIds(const BpeTokenizer& tok, const std::string& file);
  // Sets the chat template and the name of where it came from.
  static void SetChatTemplate(std::string text, std::string source, BpeTokenizer* tok);
};

}  // namespace moebatch
