// Includes sentencepiece's header and no Abseil header (see sentencepiece_model.h).
#include "engine/text/sentencepiece_model.h"

#include <cstring>
#include <exception>

#include "sentencepiece_processor.h"

namespace moebatch {

SentencePieceModel::SentencePieceModel()
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::FromSerialized(const std::string& bytes,
                                                                       std::string* error) {
  std::unique_ptr<SentencePieceModel> model(new SentencePieceModel());
  try {
    const sentencepiece::util::Status s = model->sp_->LoadFromSerializedProto(bytes);
    if (!s.ok()) {
      *error = s.ToString();
      return nullptr;
    }
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
  return model;
}

namespace {

// Protocol-buffer wire format, enough for a ModelProto (sentencepiece_model.proto).
void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void PutTag(int field, int wire_type, std::string* out) {
  PutVarint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type), out);
}
void PutBytes(int field, const std::string& bytes, std::string* out) {
  PutTag(field, 2, out);
  PutVarint(bytes.size(), out);
  out->append(bytes);
}
void PutInt(int field, int64_t v, std::string* out) {  // int32 / bool / enum (negative: 10 bytes)
  PutTag(field, 0, out);
  PutVarint(static_cast<uint64_t>(v), out);
}
void PutFloat(int field, float v, std::string* out) {
  PutTag(field, 5, out);
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

}  // namespace

std::unique_ptr<SentencePieceModel> SentencePieceModel::FromPieces(const std::vector<Piece>& pieces,
                                                                   bool add_dummy_prefix,
                                                                   bool remove_extra_whitespaces,
                                                                   std::string* error) {
  // ModelProto: 1 pieces {1 piece, 2 score, 3 type}, 2 trainer_spec {3 model_type (2 = BPE),
  // 35 byte_fallback}, 3 normalizer_spec {1 name, 3 add_dummy_prefix, 4 remove_extra_whitespaces,
  // 5 escape_whitespaces}. The trainer's special ids (unk_id 40, bos_id
  // 41, ...) keep their defaults: encoding and decoding go by the pieces' types.
  std::string proto, message;
  bool byte_fallback = false;
  for (const Piece& p : pieces) {
    message.clear();
    PutBytes(1, p.piece, &message);
    PutFloat(2, p.score, &message);
    PutInt(3, p.type, &message);
    PutBytes(1, message, &proto);
    byte_fallback = byte_fallback || p.type == 6;
  }
  message.clear();
  PutInt(3, 2, &message);
  PutInt(35, byte_fallback ? 1 : 0, &message);
  PutBytes(2, message, &proto);
  message.clear();
  PutBytes(1, "identity", &message);
  PutInt(3, add_dummy_prefix ? 1 : 0, &message);
  PutInt(4, remove_extra_whitespaces ? 1 : 0, &message);
  PutInt(5, 1, &message);
  PutBytes(3, message, &proto);
  return FromSerialized(proto, error);
}

int32_t SentencePieceModel::GetPieceSize() const { return sp_->GetPieceSize(); }
int32_t SentencePieceModel::unk_id() const { return sp_->unk_id(); }
bool SentencePieceModel::IsByte(int32_t id) const { return sp_->IsByte(id); }
bool SentencePieceModel::IsControl(int32_t id) const { return sp_->IsControl(id); }
const std::string& SentencePieceModel::IdToPiece(int32_t id) const { return sp_->IdToPiece(id); }

int32_t SentencePieceModel::PieceToId(std::string_view piece) const {
  // sentencepiece answers unk_id() for an unknown piece; "<unk>" itself is the one that is there.
  const int id = sp_->PieceToId(absl::string_view(piece.data(), piece.size()));
  return id >= 0 && id < sp_->GetPieceSize() && sp_->IdToPiece(id) == piece ? id : -1;
}

std::vector<int32_t> SentencePieceModel::Encode(std::string_view text) const {
  std::vector<int> ids;
  // absl::string_view here is sentencepiece's own class (no Abseil header in this file).
  sp_->Encode(absl::string_view(text.data(), text.size()), &ids).IgnoreError();
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceModel::DecodeIds(const std::vector<int32_t>& ids) const {
  return sp_->DecodeIds(std::vector<int>(ids.begin(), ids.end()));
}

}  // namespace moebatch
