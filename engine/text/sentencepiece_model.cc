// Includes sentencepiece's header and no Abseil header (see sentencepiece_model.h).
#include "engine/text/sentencepiece_model.h"

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
