// Text <-> token ids with a sentencepiece `tokenizer.model` (Mixtral's: 32,000 pieces with byte
// fallback), the Mixtral-Instruct chat format, and streaming detokenization.
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

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace moebatch {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

class Tokenizer {
 public:
  // Loads a sentencepiece model file. `bos_id`/`eos_id` come from config.json and must be inside the
  // vocabulary. Errors: NotFound (no such file: "missing tokenizer: <path>"), InvalidArgument (not a
  // sentencepiece model, or ids out of range).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_path,
                                                         int32_t bos_id, int32_t eos_id);
  ~Tokenizer();

  // sentencepiece encoding of `text` (with its dummy-prefix space), BOS first when `add_bos`.
  // This is what transformers' LlamaTokenizer (legacy mode, the Mixtral default) gives.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;

  // The Mixtral-Instruct format, token by token, as mistral-common's v1 tokenizer and the hub chat
  // template build it:
  //   <s>[INST] {user_1} [/INST]{assistant_1}</s>[INST] {user_2} [/INST]
  // where <s>/</s> are the BOS/EOS ids (never text) and each bracketed span is encoded on its own.
  // A leading system message is prepended to the first user message followed by "\n\n". Roles must
  // alternate user/assistant starting with user and end with user. Errors: InvalidArgument naming
  // the message ("messages[2].role: expected 'user', found 'assistant'").
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const std::vector<ChatMessage>& messages) const;

  // sentencepiece's own decode of `ids` (byte-fallback pieces joined into UTF-8; the leading space
  // of the first piece dropped; BOS/EOS/control ids produce no text).
  std::string Decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const;
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }

 private:
  Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int32_t bos_id_ = 1;
  int32_t eos_id_ = 2;
};

// Turns a stream of generated ids into text deltas whose concatenation always equals
// tokenizer.Decode(all ids so far) once Finish() is called: a delta is released only when it is
// complete UTF-8 (a multi-byte character split over byte-fallback pieces is held back until its
// last byte arrives), and the leading-space rule of Decode is respected.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer);  // borrows; must outlive this
  // Appends one id; returns the text that became final (may be empty).
  std::string Add(int32_t id);
  // Returns whatever is still held back (an incomplete UTF-8 tail decodes as sentencepiece does).
  std::string Finish();
  // All text released so far.
  const std::string& text() const { return text_; }
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  const Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;
  std::string text_;
  size_t prefix_offset_ = 0;  // ids before this index are decoded into text_ for good
  size_t read_offset_ = 0;
};

}  // namespace moebatch
