#include "engine/text/output_text.h"

#include <algorithm>
#include <utility>

namespace moebatch {

OutputText::OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop)
    : detokenizer_(tokenizer), stop_(std::move(stop)) {
  for (const std::string& s : stop_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

bool OutputText::Add(std::optional<int32_t> token, bool last) {
  if (token) text_ += detokenizer_.Add(*token);
  if (last) text_ += detokenizer_.Finish();
  if (max_stop_len_ == 0) return false;
  // Nothing before emitted_ can start a match: that much was released, and the tail that could
  // was held back.
  size_t cut = std::string::npos;
  for (const std::string& stop : stop_) cut = std::min(cut, text_.find(stop, emitted_));
  if (cut == std::string::npos) return false;
  text_.resize(cut);
  return true;
}

void OutputText::Release(bool done, std::string* out) {
  size_t release = text_.size();
  if (!done && max_stop_len_ > 1) {
    release = text_.size() > max_stop_len_ - 1 ? text_.size() - (max_stop_len_ - 1) : 0;
    release = std::max(release, emitted_);
    while (release > emitted_ && (static_cast<uint8_t>(text_[release]) & 0xC0) == 0x80) {
      --release;  // never split a UTF-8 character
    }
  }
  out->append(text_, emitted_, release - emitted_);
  emitted_ = release;
}

}  // namespace moebatch
