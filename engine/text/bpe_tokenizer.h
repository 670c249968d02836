// Byte-level BPE tokenizers stored as Hugging Face `tokenizer.json` (+ `tokenizer_config.json`):
// GPT-2, Llama 3, Qwen2/3, SmolLM2, OLMoE, gpt-oss (o200k_harmony: the o200k regex's case
// classes and (?i:'s|...) contractions run on PCRE2 as they are), and sentencepiece-style BPE
// files (Llama 2 / Mistral conversions: byte fallback, Metaspace). Encode and Decode follow Hugging
// Face `tokenizers` 0.23 (tokenizers/src/tokenizer/mod.rs: Tokenizer::encode and Tokenizer::decode)
// step by step:
//
//   1. added tokens (AddedVocabulary::extract_and_normalize): the tokens with normalized=false are
//      found in the raw text first, then the text between them is normalized and the tokens with
//      normalized=true are found in it; leftmost-longest matching, honouring single_word, lstrip
//      and rstrip; special tokens are skipped when special-token parsing is off (HF's
//      encode_special_tokens). A matched added token is never split.
//   2. normalizer: NFC, NFD, NFKC, NFKD (utf8proc), Prepend, Replace, Sequence.
//   3. pre_tokenizer: Split (String or Regex pattern, every SplitDelimiterBehavior, invert),
//      ByteLevel (add_prefix_space, use_regex: the GPT-2 regex), Digits (individual_digits),
//      Metaspace (replacement, prepend_scheme, split), Sequence. Regexes run on PCRE2
//      (engine/text/text_regex.h).
//   4. model BPE (models/bpe/model.rs, word.rs): vocab, merges in both formats ("a b" strings and
//      ["a", "b"] pairs; a later duplicate of a pair takes its rank), ignore_merges, byte_fallback,
//      unk_token, fuse_unk, continuing_subword_prefix, end_of_word_suffix; dropout must be null or
//      0. Merging is HF's: a min-heap of (rank, position) over the symbol list, stale entries
//      skipped.
//   5. post_processor (only with add_special_tokens): TemplateProcessing (the "single" template),
//      RobertaProcessing, BertProcessing, ByteLevel (no tokens), Sequence. When
//      tokenizer_config.json sets add_bos_token or add_eos_token, the post-processor is replaced as
//      transformers 5's TokenizersBackend.update_post_processor does: [bos_token if add_bos_token]
//      $A [eos_token if add_eos_token] (the flag not given counts as false).
//   Truncation and padding in tokenizer.json are not applied.
//
// Decode: ids -> token strings (added tokens first, then the model's vocabulary; unknown ids are
// dropped; with skip_special_tokens every token whose string is a special added token is dropped),
// then the decoder chain: ByteLevel (bytes joined, invalid UTF-8 replaced as Rust's
// String::from_utf8_lossy does), ByteFallback, Fuse, Replace, Strip, Metaspace, Sequence; no
// decoder joins the tokens with spaces. Decode is a BpeDecodeStream fed every id, so streaming and
// whole decoding agree by construction.
//
// Input text that is not UTF-8 is first converted as from_utf8_lossy does (Python strings, HF's
// input, are always Unicode).
//
// Thread-safety: a loaded BpeTokenizer is immutable; its const methods may be called from any
// number of threads at once. A BpeDecodeStream belongs to one sequence and is not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace moebatch {

struct BpeEncodeOptions {
  // HF add_special_tokens: the post-processor's tokens (BOS/EOS as the files say).
  bool add_special_tokens = true;
  // Special added tokens written in the text are matched as tokens (HF's default). false is HF's
  // `encode_special_tokens = True`: their text is tokenized like any other text (non-special
  // added tokens are still matched).
  bool parse_special = true;
};

class BpeDecodeStream;

class BpeTokenizer {
 public:
  // Loads `<dir>/tokenizer.json` and, when present, `<dir>/tokenizer_config.json`; a
  // `<dir>/chat_template.jinja` is the chat template when tokenizer_config.json has none.
  // Errors: NotFound ("missing tokenizer.json: <path>"), PermissionDenied (unreadable),
  // InvalidArgument naming the file and the field (not JSON, model.type other than "BPE", a merge
  // naming a token that is not in model.vocab, an unsupported normalizer / pre_tokenizer /
  // decoder / post_processor type, a bad regex, ...).
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> LoadFromDirectory(const std::string& dir);
  // The same from explicit paths; `tokenizer_config_path` may be empty (no config).
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Load(
      const std::string& tokenizer_json_path, const std::string& tokenizer_config_path);
  ~BpeTokenizer();

  // HF `tokenizer.encode(text, add_special_tokens=...)` ids.
  std::vector<int32_t> Encode(std::string_view text, const BpeEncodeOptions& options = {}) const;
  // HF `tokenizer.decode(ids, skip_special_tokens=...)`.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;

  // 1 + the largest id of the model vocabulary and the added tokens.
  int32_t vocab_size() const { return static_cast<int32_t>(id_text_.size()); }
  // The id of a token string (added tokens first, then the vocabulary), or -1.
  int32_t TokenToId(std::string_view token) const;
  // The token string of `id` (an added token's content, else the vocabulary's), or nullptr.
  const std::string* IdToToken(int32_t id) const;
  // true for an added token marked special (and any token whose string is one).
  bool IsSpecial(int32_t id) const;
  // The bytes of one token alone (Tokenizer::TokenBytes): its string through the decoder's
  // per-token steps, raw (a partial UTF-8 character stays partial); a special token's content;
  // "" for an unused id.
  std::string TokenBytes(int32_t id) const;

  // From tokenizer_config.json (strings or AddedToken objects); empty / -1 when not given.
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  int32_t bos_token_id() const { return TokenToId(bos_token_); }
  int32_t eos_token_id() const { return TokenToId(eos_token_); }
  // tokenizer_config.json's chat_template (a string, or the entry named "default" of a list), else
  // chat_template.jinja beside it; empty when there is none. The raw Jinja source.
  const std::string& chat_template() const { return chat_template_; }
  // The file chat_template() came from (its path); empty when there is none.
  const std::string& chat_template_file() const { return chat_template_file_; }
  // tokenizer_config.json's split_special_tokens (false when absent): true means HF encodes
  // special-token text as plain text by default.
  bool split_special_tokens() const { return split_special_tokens_; }
  // The ids the post-processor puts around a single sequence with add_special_tokens.
  const std::vector<int32_t>& special_prefix() const { return prefix_ids_; }
  const std::vector<int32_t>& special_suffix() const { return suffix_ids_; }

 private:
  friend class BpeDecodeStream;
  friend struct BpeTokenizerLoader;  // bpe_tokenizer_internal.h: the loader's steps
  struct Impl;
  BpeTokenizer();

  std::unique_ptr<Impl> impl_;
  std::vector<std::string> id_text_;  // token string per id ("" for an unused id)
  std::vector<uint8_t> id_flags_;     // kIdUsed | kIdSpecial
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  std::string bos_token_, eos_token_, chat_template_, chat_template_file_;
  bool split_special_tokens_ = false;
};

// One step's state in a BpeDecodeStream (an implementation detail, declared here so that the
// stream is a copyable value).
struct BpeDecodeStepState {
  std::string pending;  // bytes or text held back until more tokens decide them
  uint64_t count = 0;   // tokens seen (per-token steps) or leading characters stripped (Strip)
  bool done = false;    // Strip on a fused token: the leading characters are decided
};

// Incremental Decode: Add(id) returns the text that became final, which is always complete UTF-8
// (a character whose bytes are spread over byte-level or <0xNN> tokens is held back until its
// last byte, and an unfinished byte run until it ends); Finish() returns the rest. The
// concatenation of all returned text equals tokenizer.Decode(ids, skip_special_tokens). Work per
// Add is proportional to the token's length. Copyable; the tokenizer must outlive it.
class BpeDecodeStream {
 public:
  explicit BpeDecodeStream(const BpeTokenizer& tokenizer, bool skip_special_tokens = true);
  std::string Add(int32_t id);
  // Call once, after the last Add.
  std::string Finish();

 private:
  void Push(size_t step, std::string_view item, std::string* out);
  void FinishFrom(size_t step, std::string* out);

  const BpeTokenizer* tokenizer_;
  bool skip_special_;
  std::vector<BpeDecodeStepState> states_;
};

}  // namespace moebatch
