// Text <-> token ids behind one facade, for two kinds of tokenizer files:
//   - a sentencepiece `tokenizer.model` (Mixtral-8x7B's: 32,000 pieces with byte fallback;
//     Mixtral-8x22B-Instruct's: 32,768 with instruct control pieces), with the Mistral instruct
//     chat layouts of mistral-common v1 and v3;
//   - a Hugging Face `tokenizer.json` BPE tokenizer (+ tokenizer_config.json): GPT-2, Llama 3,
//     Qwen2/3, SmolLM2, OLMoE, gpt-oss (engine/text/bpe_tokenizer.h, which follows HF
//     `tokenizers`).
// and streaming detokenization for both. A GGUF file's tokenizer metadata loads as one of the two
// (LoadFromGguf; engine/text/gguf_tokenizer.h).
//
// Thread-safety: a loaded Tokenizer is immutable; all const methods may be called concurrently.
// A StreamingDetokenizer belongs to one sequence and is not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/text/bpe_tokenizer.h"
#include "engine/text/sentencepiece_model.h"

namespace moebatch {

class GgufFile;  // engine/model/gguf.h

// The instruct chat layouts EncodeChat writes (see there).
enum class ChatFormat {
  kMistralV1,  // "[INST]" as text (Mixtral-8x7B-Instruct)
  kMistralV3,  // [INST]/[/INST] control tokens (Mixtral-8x22B-Instruct-v0.1)
  kNone,       // no built-in layout (a tokenizer.json tokenizer: see chat_template())
};
// "mistral-v1", "mistral-v3" or "none".
const char* ChatFormatName(ChatFormat format);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// Which file a Tokenizer was loaded from.
enum class TokenizerKind {
  kSentencePiece,  // tokenizer.model
  kBpe,            // tokenizer.json
};

struct EncodeOptions {
  // tokenizer.json: HF add_special_tokens (the post-processor's BOS/EOS, as tokenizer.json and
  // tokenizer_config.json say). tokenizer.model: BOS first.
  bool add_special_tokens = true;
  // tokenizer.json only: special added tokens written in the text ("<|im_start|>") are matched
  // as tokens, HF's default; false encodes their text as plain text (HF's
  // encode_special_tokens=True; non-special added tokens are still matched). sentencepiece never
  // matches control pieces in text.
  bool parse_special_tokens = true;
};

class Tokenizer {
 public:
  // Loads the tokenizer of a model directory: `<dir>/tokenizer.json` (a Hugging Face BPE
  // tokenizer, with `<dir>/tokenizer_config.json` when present) when that file exists, else
  // `<dir>/tokenizer.model` (sentencepiece, exactly as Load below).
  // bos_id / eos_id (config.json's, as the engine passes them) win when given; otherwise they come
  // from tokenizer_config.json's bos_token / eos_token (tokenizer.json), then from
  // `<dir>/config.json`'s bos_token_id / eos_token_id (the first of a list), then (sentencepiece)
  // the pieces "<s>" / "</s>"; -1 when none says (tokenizer.json only: BOS insertion follows the
  // post-processor, not bos_id). Given ids must be inside the vocabulary.
  // Errors: NotFound ("missing model directory: <dir>", or "no tokenizer in <dir>: expected
  // tokenizer.json or tokenizer.model"), and those of Load / BpeTokenizer::LoadFromDirectory
  // (InvalidArgument naming the file and the field).
  // The chat layout of a tokenizer.json model: `chat_template_name` (a name of
  // engine/text/chat_layout.h's ChatLayoutFromName: the --chat_template override) when given, else
  // the one RecogniseChatTemplate finds in chat_template(); InvalidArgument naming --chat_template
  // for a name that is not a layout. A model whose template is absent or not recognised has no
  // layout: it loads (prompts run) and EncodeChat refuses with the reason. sentencepiece models
  // keep their Mistral layouts; a name other than mistral-v1/-v3 there is InvalidArgument.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFromModelDir(
      const std::string& model_dir, std::optional<int32_t> bos_id = std::nullopt,
      std::optional<int32_t> eos_id = std::nullopt, const std::string& chat_template_name = "");

  // Loads the tokenizer a GGUF file's tokenizer.ggml.* metadata describes (gguf_tokenizer.h says
  // how): tokenizer.ggml.model "gpt2" is a byte-level BPE tokenizer (kind() kBpe, bpe() set),
  // "llama" a sentencepiece one (kSentencePiece). Ids and chat layout as LoadFromModelDir:
  // bos_id / eos_id win when given (and must be inside the vocabulary), else
  // tokenizer.ggml.bos_token_id / eos_token_id, else (sentencepiece) the pieces "<s>" / "</s>";
  // a "gpt2" model's chat layout is `chat_template_name` when given, else the one
  // RecogniseChatTemplate finds in tokenizer.chat_template (chat_template()); a "llama" model
  // keeps the Mistral layout its vocabulary implies, and only mistral-v1/-v3 are accepted as
  // `chat_template_name`. Encode(text, add_bos=true) adds BOS / EOS as tokenizer.ggml.add_bos_token
  // / add_eos_token say (defaults as llama.cpp's: BOS for "llama", and for "gpt2" with the llama3
  // and tekken pre-tokenizers; no EOS).
  // Errors: NotFound "<path>: tokenizer.ggml.model: missing (...)" for a file without a
  // tokenizer; InvalidArgument "<path>: tokenizer.ggml.model: '<value>' is not supported (gpt2,
  // llama)", those of gguf_tokenizer.h (naming the file and the key at fault), given ids outside
  // the vocabulary, a --chat_template name that is not a layout.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFromGguf(
      const GgufFile& file, std::optional<int32_t> bos_id = std::nullopt,
      std::optional<int32_t> eos_id = std::nullopt, const std::string& chat_template_name = "");

  // Loads a sentencepiece model file. `bos_id`/`eos_id` come from config.json and must be inside
  // the vocabulary. Errors: NotFound (no such file: "missing tokenizer: <path>"), InvalidArgument
  // (not a sentencepiece model, a directory, or ids out of range), PermissionDenied (unreadable).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_path,
                                                         int32_t bos_id, int32_t eos_id);
  ~Tokenizer();

  // sentencepiece: the encoding of `text` (with its dummy-prefix space), BOS first when `add_bos`:
  // what transformers' LlamaTokenizer (legacy mode, the Mixtral default) gives. (From a GGUF file:
  // BOS and EOS as its add_bos_token / add_eos_token say, when `add_bos`.)
  // tokenizer.json: HF `tokenizer(text, add_special_tokens=add_bos)`: the post-processor's BOS/EOS
  // when `add_bos`, special tokens in the text matched (unless tokenizer_config.json sets
  // split_special_tokens).
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;
  // The same with every choice explicit (see EncodeOptions).
  std::vector<int32_t> Encode(std::string_view text, const EncodeOptions& options) const;

  // The Mistral instruct chat layout that this tokenizer's vocabulary implies, token by token, as
  // mistral-common (checked against 1.13.1) builds it for a plain conversation (no tools):
  //
  // kMistralV1 (a vocabulary without [INST] control pieces: Mixtral-8x7B-Instruct; mistral-common's
  // v1 instruct tokenizer, MistralTokenizer.v1()):
  //   <s>[INST] {user_1} [/INST]{assistant_1}</s>[INST] {user_2} [/INST]
  // where <s>/</s> are the BOS/EOS ids (never text), each "[INST] {user} [/INST]" is one
  // sentencepiece encoding (it starts with the dummy-prefix piece "▁[") and each assistant content
  // is another (it starts with "▁"; no text space follows [/INST]). A system message's content is
  // prepended to the FIRST user message as "{system}\n\n{user_1}".
  //
  // kMistralV3 (a vocabulary whose "[INST]" and "[/INST]" are control pieces: Mixtral-8x22B-
  // Instruct-v0.1's 32,768-piece tokenizer, which mistral-common maps to its v3 instruct tokenizer;
  // v2 lays out plain conversations the same way):
  //   <s> [INST] {user_1} [/INST] {assistant_1} </s> [INST] {user_2} [/INST]
  // where [INST]/[/INST] are their control ids, each user and assistant content is one
  // sentencepiece encoding of its own (starting with "▁"), and a system message's content is
  // prepended to the LAST user message as "{system}\n\n{user_n}". A vocabulary that also has a
  // "[SYSTEM_PROMPT]" control piece (mistral-common v7) encodes system prompts as tokens of their
  // own, which is not implemented: a system message is refused there.
  //
  // Both: a system message is allowed only as messages[0]; an empty system content adds nothing
  // (mistral-common skips it). Then roles alternate user/assistant, starting and ending with user;
  // assistant content must not be empty (mistral-common rejects it too). Layouts mistral-common
  // quietly repairs (consecutive same-role messages merged, later system messages merged, a
  // leading assistant given an empty user turn) are rejected here.
  // Hub chat template of Mixtral-8x7B-Instruct: the "v1" template (system message first; the
  // layout above written as text "<s> [INST] {user} [/INST] {assistant}</s> [INST] ...") gives the
  // same ids through transformers 4.57's LlamaTokenizerFast built from this model, but the slow
  // LlamaTokenizer(legacy=True) turns each " [INST]" after <s>/</s> into an extra "▁" (28705) +
  // "▁[", and for an empty system content the template still adds "\n\n"; we follow
  // mistral-common. The original (Dec 2023) hub template rejected system messages.
  // Errors: InvalidArgument naming the message ("messages[2].role: expected 'user', found
  // 'assistant'"; "messages[0]: missing ..." for an empty list; content that is not UTF-8; a system
  // message under a v7 vocabulary); Unimplemented for a tokenizer.json tokenizer (chat_format()
  // kNone: its layout comes from chat_template(), engine/text/chat_layout.h).
  // tokenizer.json: the text of its chat layout (RenderChat with the generation prompt, as
  // transformers' apply_chat_template(add_generation_prompt=True)) encoded without adding special
  // tokens and with the added tokens matched (the template writes them as text);
  // InvalidArgument "messages: ..." when the model has no chat layout.
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const std::vector<ChatMessage>& messages) const;
  // The chat layout's name for logs: "mistral-v1", "mistral-v3", a ChatLayoutName, or "none".
  std::string chat_layout_name() const;
  // tokenizer.json: the chat layout chat requests are rendered with, as the int value of
  // engine/text/chat_layout.h's ChatLayout (which includes this header); nullopt when the model
  // has none (and always for sentencepiece, whose layout is chat_format()).
  std::optional<int> chat_layout() const { return chat_layout_; }

  // sentencepiece's own decode of `ids` (byte-fallback pieces joined into UTF-8, each byte that
  // forms no character becoming U+FFFD; the leading space of the first non-control piece dropped;
  // BOS/EOS/control ids produce no text; <unk> gives " ⁇ "). Ids outside [0, vocab_size()) decode
  // as <unk>.
  // tokenizer.json: HF `tokenizer.decode(ids, skip_special_tokens=True)` (special tokens and ids
  // outside the vocabulary produce no text; invalid UTF-8 from byte-level tokens becomes U+FFFD as
  // Rust's from_utf8_lossy makes it). tokenizer_config.json's clean_up_tokenization_spaces is not
  // applied (as HF tokenizers' decode and its DecodeStream do not).
  std::string Decode(const std::vector<int32_t>& ids) const;

  // The bytes one token stands for, as the logprobs of an OpenAI response show a token (its
  // "bytes"; a character split over several tokens gives each its own bytes, not valid UTF-8
  // alone). sentencepiece: a byte piece <0xNN> gives that byte, a control piece (<s>, </s>) and
  // <unk> their piece text, any other piece its text with each "▁" (U+2581) as a space (kept at the
  // start: no leading-space rule). tokenizer.json: the token's string through the decoder chain
  // (byte-level characters to their bytes, <0xNN> to its byte, Replace, Metaspace; Strip and the
  // joining steps apply to whole texts, not tokens, and are skipped); a special added token gives
  // its content. "" for an id outside the vocabulary.
  std::string TokenBytes(int32_t id) const;

  TokenizerKind kind() const {
    return bpe_ != nullptr ? TokenizerKind::kBpe : TokenizerKind::kSentencePiece;
  }
  // The tokenizer.json tokenizer itself (Decode with special tokens, token lookups, the
  // post-processor's ids), or nullptr for sentencepiece.
  const BpeTokenizer* bpe() const { return bpe_.get(); }
  int32_t vocab_size() const;
  // The id of a token / piece string, or -1.
  int32_t TokenToId(std::string_view token) const;
  // tokenizer.json: the raw Jinja chat template (tokenizer_config.json's chat_template, else
  // chat_template.jinja; a GGUF file's tokenizer.chat_template); empty for sentencepiece or when
  // the files have none.
  const std::string& chat_template() const;
  // sentencepiece: detected at Load from the vocabulary (the control pieces "[INST]" and
  // "[/INST]"). tokenizer.json: kNone.
  ChatFormat chat_format() const { return chat_format_; }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }

 private:
  friend class StreamingDetokenizer;  // reads sp_, bpe_ and unk_surface_
  Tokenizer();
  // The tail of LoadFromModelDir / LoadFromGguf for a BPE tokenizer: ids (given, else the
  // tokenizer's bos/eos tokens, else `model_dir`'s config.json when not empty) and the chat layout.
  // `source` names the tokenizer in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromBpe(std::unique_ptr<BpeTokenizer> bpe,
                                                            std::optional<int32_t> bos_id,
                                                            std::optional<int32_t> eos_id,
                                                            const std::string& chat_template_name,
                                                            const std::string& source,
                                                            const std::string& model_dir);
  // The tail of Load: ids checked, the Mistral layout chosen from the vocabulary.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromSentencePiece(
      std::unique_ptr<SentencePieceModel> sp, int32_t bos_id, int32_t eos_id,
      const std::string& source);
  std::unique_ptr<SentencePieceModel> sp_;  // exactly one of sp_ and bpe_ is set
  std::unique_ptr<BpeTokenizer> bpe_;
  std::string unk_surface_;  // Decode({unk id})
  int32_t bos_id_ = 1;
  int32_t eos_id_ = 2;
  ChatFormat chat_format_ = ChatFormat::kMistralV1;
  std::optional<int> chat_layout_;  // tokenizer.json: a ChatLayout (engine/text/chat_layout.h)
  std::string chat_layout_error_;   // why the model's chat template was not recognised
  int32_t inst_id_ = -1, end_inst_id_ = -1;      // the control pieces of kMistralV3
  bool system_prompt_tokens_ = false;            // a "[SYSTEM_PROMPT]" control piece (v7): refused
  bool sp_add_bos_ = true, sp_add_eos_ = false;  // sentencepiece: Encode's add_bos adds these
};

// Turns a stream of generated ids into text deltas whose concatenation always equals
// tokenizer.Decode(all ids so far) once Finish() is called: a delta is released only when it is
// complete UTF-8. sentencepiece: a multi-byte character split over byte-fallback pieces is held
// back until its last byte arrives (at most 3 ids), and the leading-space rule of Decode is
// respected; each Add() decodes only the ids not yet released (plus one stand-in piece), so its
// cost does not grow with the sequence; tokenizer.cc explains the method. tokenizer.json: a
// BpeDecodeStream (byte-level tokens' bytes are held until they complete a character; a run of
// <0xNN> byte-fallback tokens until it ends); each Add() costs the token's length.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer);  // borrows; must outlive this
  // Appends one id; returns the text that became final (may be empty).
  std::string Add(int32_t id);
  // Returns whatever is still held back (an incomplete UTF-8 tail decodes as Decode does:
  // U+FFFD per byte for sentencepiece, per unfinished character for byte-level BPE). Call once,
  // after the last Add().
  std::string Finish();
  // All text released so far.
  const std::string& text() const { return text_; }
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  const Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;
  std::string text_;
  size_t read_offset_ = 0;  // ids_[0, read_offset_) are decoded into text_ for good
  bool started_ = false;    // ids_[0, read_offset_) holds a non-control id (whose leading space
                            // Decode dropped; later pieces keep theirs)
  std::optional<BpeDecodeStream> bpe_;  // tokenizer.json tokenizers
};

}  // namespace moebatch
