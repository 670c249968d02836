// The reply of a model that writes OpenAI's harmony format (gpt-oss; the chat layout "harmony" of
// engine/text/chat_layout.h), split as vLLM splits it for its OpenAI chat completions
// (vllm/entrypoints/harmony_utils.py parse_chat_output, over openai_harmony's StreamableParser
// for the assistant role): the analysis channel is the reasoning, the final channel (and
// commentary without a recipient: preambles) the content.
//
// The generated ids continue the prompt's "<|start|>assistant", so they read as
//   <|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant<|channel|>final
//   <|message|>{answer}<|return|>
// Each message is a header (up to <|message|>: the role, optionally " to={recipient}",
// "<|channel|>{channel}", a content type or "<|constrain|>..."), then its text up to <|end|>,
// <|return|> or <|call|>; the next message starts at <|start|>. A message the ids end inside
// (max_tokens reached) counts with the text it has. Message texts are decoded as Tokenizer::Decode
// (special tokens dropped). Tokens outside any message (another EOS, <|endoftext|>) are ignored; a
// <|start|> inside a message's text ends that message (openai_harmony raises there; vLLM then
// returns nothing).
//
// Thread-safety: a pure function of its arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/text/tokenizer.h"

namespace moebatch {

struct HarmonyReply {
  // The final channel's texts (and commentary messages without a recipient), joined by "\n";
  // nullopt when that is empty (vLLM's content null).
  std::optional<std::string> content;
  // The analysis channel's texts joined by "\n"; nullopt when empty (reasoning_content null).
  std::optional<std::string> reasoning_content;
};

// Splits the generated `ids` of a harmony model (the special tokens are looked up by their text
// in `tokenizer`: <|start|>, <|channel|>, <|message|>, <|end|>, <|return|>, <|call|>; a
// vocabulary without them gives messages that never begin: both fields nullopt).
HarmonyReply ParseHarmonyReply(const Tokenizer& tokenizer, const std::vector<int32_t>& ids);

// Whether chat replies of this tokenizer's model are harmony text (its chat layout is harmony).
bool WritesHarmony(const Tokenizer& tokenizer);

}  // namespace moebatch
