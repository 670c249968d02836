// A thin wrapper around sentencepiece::SentencePieceProcessor with only standard-library types in
// its interface.
//
// Why it exists: sentencepiece_processor.h (0.1.97) declares its own class absl::string_view, and
// Debian's Abseil has another (absl::debian3::string_view); a translation unit that sees both
// cannot name either. sentencepiece_model.cc is the only file that includes the sentencepiece
// header, and it includes no Abseil header, so each library is called with the types it was built
// with. Thread-safety: const methods may be called concurrently (sentencepiece's are const).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace moebatch {

class SentencePieceModel {
 public:
  // Parses a serialized sentencepiece ModelProto (the bytes of a tokenizer.model file). On failure
  // returns nullptr and sets *error to sentencepiece's reason.
  static std::unique_ptr<SentencePieceModel> FromSerialized(const std::string& bytes,
                                                            std::string* error);

  // One piece of a model given piece by piece (a GGUF file's tokenizer.ggml.tokens, .scores and
  // .token_type): sentencepiece's ModelProto.SentencePiece.
  struct Piece {
    std::string piece;  // non-empty UTF-8
    float score = 0;
    // sentencepiece's type, which GGUF's token types number alike: 1 normal, 2 unknown,
    // 3 control, 4 user-defined, 5 unused, 6 byte ("<0xNN>").
    int type = 1;
  };
  // A BPE model of these pieces, as a tokenizer.model trained by sentencepiece with
  // model_type=BPE holds them (Llama, Mistral): byte fallback when any piece has the byte type,
  // the "identity" normalizer (no character map) escaping spaces as "▁", with `add_dummy_prefix`
  // and `remove_extra_whitespaces` as given. Built as a serialized ModelProto and loaded as
  // FromSerialized does; on failure (sentencepiece's checks: no or two unknown pieces, an empty or
  // repeated piece, a missing byte piece, ...) returns nullptr and sets *error to its reason.
  static std::unique_ptr<SentencePieceModel> FromPieces(const std::vector<Piece>& pieces,
                                                        bool add_dummy_prefix,
                                                        bool remove_extra_whitespaces,
                                                        std::string* error);
  ~SentencePieceModel();

  int32_t GetPieceSize() const;
  int32_t unk_id() const;
  bool IsByte(int32_t id) const;
  bool IsControl(int32_t id) const;
  const std::string& IdToPiece(int32_t id) const;
  // The id of `piece`, or -1 when the vocabulary has no such piece.
  int32_t PieceToId(std::string_view piece) const;
  std::vector<int32_t> Encode(std::string_view text) const;  // ids, no BOS
  std::string DecodeIds(const std::vector<int32_t>& ids) const;

 private:
  SentencePieceModel();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace moebatch
