// Text <-> token ids with a sentencepiece `tokenizer.model` (Mixtral-8x7B's: 32,000 pieces with
// byte fallback; Mixtral-8x22B-Instruct's: 32,768 with instruct control pieces), the Mistral
// instruct chat layouts of mistral-common v1 and v3, and streaming detokenization.
//
// Thread-safety: a loaded Tokenizer is immutable; all const methods may be called concurrently.
// A StreamingDetokenizer belongs to one sequence and is not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/text/sentencepiece_model.h"

namespace moebatch {

// The instruct chat layouts EncodeChat writes (see there).
enum class ChatFormat {
  kMistralV1,  // "[INST]" as text (Mixtral-8x7B-Instruct)
  kMistralV3,  // [INST]/[/INST] control tokens (Mixtral-8x22B-Instruct-v0.1)
};
// "mistral-v1" or "mistral-v3".
const char* ChatFormatName(ChatFormat format);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

class Tokenizer {
 public:
  // Loads a sentencepiece model file. `bos_id`/`eos_id` come from config.json and must be inside
  // the vocabulary. Errors: NotFound (no such file: "missing tokenizer: <path>"), InvalidArgument
  // (not a sentencepiece model, a directory, or ids out of range), PermissionDenied (unreadable).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_path,
                                                         int32_t bos_id, int32_t eos_id);
  ~Tokenizer();

  // sentencepiece encoding of `text` (with its dummy-prefix space), BOS first when `add_bos`.
  // This is what transformers' LlamaTokenizer (legacy mode, the Mixtral default) gives.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;

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
  // message under a v7 vocabulary).
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const std::vector<ChatMessage>& messages) const;

  // sentencepiece's own decode of `ids` (byte-fallback pieces joined into UTF-8, each byte that
  // forms no character becoming U+FFFD; the leading space of the first non-control piece dropped;
  // BOS/EOS/control ids produce no text; <unk> gives " ⁇ "). Ids outside [0, vocab_size()) decode
  // as <unk>.
  std::string Decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const;
  // Detected at Load from the vocabulary (the control pieces "[INST]" and "[/INST]").
  ChatFormat chat_format() const { return chat_format_; }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }

 private:
  friend class StreamingDetokenizer;  // reads sp_ and unk_surface_
  Tokenizer();
  std::unique_ptr<SentencePieceModel> sp_;
  std::string unk_surface_;  // Decode({unk id})
  int32_t bos_id_ = 1;
  int32_t eos_id_ = 2;
  ChatFormat chat_format_ = ChatFormat::kMistralV1;
  int32_t inst_id_ = -1, end_inst_id_ = -1;  // the control pieces of kMistralV3
  bool system_prompt_tokens_ = false;        // a "[SYSTEM_PROMPT]" control piece (v7): refused
};

// Turns a stream of generated ids into text deltas whose concatenation always equals
// tokenizer.Decode(all ids so far) once Finish() is called: a delta is released only when it is
// complete UTF-8 (a multi-byte character split over byte-fallback pieces is held back until its
// last byte arrives, at most 3 ids), and the leading-space rule of Decode is respected. Each Add()
// decodes only the ids not yet released (plus one stand-in piece), so its cost does not grow with
// the sequence; tokenizer.cc explains the method.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer);  // borrows; must outlive this
  // Appends one id; returns the text that became final (may be empty).
  std::string Add(int32_t id);
  // Returns whatever is still held back (an incomplete UTF-8 tail decodes as sentencepiece does:
  // U+FFFD per byte). Call once, after the last Add().
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
};

}  // namespace moebatch
