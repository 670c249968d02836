// The text one generating sequence releases (OpenAI's `stop` semantics): its tokens detokenized as
// they come (StreamingDetokenizer), the text cut before the first stop string, which is not
// returned, and, until the sequence ends, a tail held back that could still become the start of a
// stop string; a release never splits a UTF-8 character.
//
// Per generated token the engine calls Add (EOS adds no text) and then Release:
//   bool stopped = text.Add(eos ? nullopt : token, /*last=*/eos || length reached);
//   text.Release(/*done=*/stopped || eos || length reached, &delta);
// The deltas' concatenation is the completion's text.
//
// Threading: one sequence's; not thread-safe. The tokenizer must outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/text/tokenizer.h"

namespace moebatch {

class OutputText {
 public:
  OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop);

  // Adds a generated token's text (`token` nullopt: a token without text, EOS); with `last` the
  // sequence ends here and the detokenizer's held-back bytes are added too. true when a stop string
  // now occurs in the text not yet released (a match may straddle released text): the text is cut
  // before it and the sequence must stop.
  bool Add(std::optional<int32_t> token, bool last);

  // Appends to *out the text that became final since the last call: all of it when `done`,
  // otherwise all but the last (longest stop string - 1) bytes, backed up to a UTF-8 character
  // boundary.
  void Release(bool done, std::string* out);

 private:
  StreamingDetokenizer detokenizer_;
  std::vector<std::string> stop_;
  size_t max_stop_len_ = 0;
  std::string text_;    // detokenized so far (cut at a stop string when one hit)
  size_t emitted_ = 0;  // bytes of text_ already released
};

}  // namespace moebatch
