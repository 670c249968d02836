#include "engine/text/harmony_output.h"

#include <string_view>

#include "engine/text/chat_layout.h"

namespace moebatch {
namespace {

constexpr std::string_view kChannel = "<|channel|>";

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The word of `header` that starts at `from`: up to whitespace or the next special token.
std::string_view WordAt(std::string_view header, size_t from) {
  size_t end = from;
  while (end < header.size() && !IsSpace(header[end]) && header.compare(end, 2, "<|") != 0) ++end;
  return header.substr(from, end - from);
}

struct Header {
  std::string_view channel;
  bool has_recipient = false;
};

// "assistant to=functions.f<|channel|>commentary <|constrain|>json" -> channel "commentary",
// a recipient.
Header ParseHeader(std::string_view header) {
  Header h;
  if (const size_t c = header.find(kChannel); c != header.npos) {
    h.channel = WordAt(header, c + kChannel.size());
  }
  for (size_t to = header.find("to="); to != header.npos; to = header.find("to=", to + 1)) {
    if (to == 0 || IsSpace(header[to - 1])) {
      h.has_recipient = !WordAt(header, to + 3).empty();
      break;
    }
  }
  return h;
}

void Join(std::optional<std::string>* to, const std::string& text) {
  if (*to) {
    to->value().append("\n").append(text);
  } else {
    *to = text;
  }
}

}  // namespace

HarmonyReply ParseHarmonyReply(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  const int32_t start = tokenizer.TokenToId("<|start|>");
  const int32_t message = tokenizer.TokenToId("<|message|>");
  const int32_t end = tokenizer.TokenToId("<|end|>");
  const int32_t ret = tokenizer.TokenToId("<|return|>");
  const int32_t call = tokenizer.TokenToId("<|call|>");
  auto is = [](int32_t id, int32_t special) { return special >= 0 && id == special; };

  std::optional<std::string> reasoning, content;
  enum class State { kHeader, kBody, kBetween } state = State::kHeader;
  std::vector<int32_t> header, body;
  // A message ends: its text goes to the field its channel names (analysis: reasoning; final, or
  // commentary without a recipient: content; others, e.g. tool calls, nowhere).
  auto finish = [&](bool complete) {
    const std::string text = tokenizer.Decode(body);
    const std::string header_text =
        tokenizer.bpe() != nullptr ? tokenizer.bpe()->Decode(header, /*skip_special_tokens=*/false)
                                   : tokenizer.Decode(header);
    const Header h = ParseHeader(header_text);
    if (complete || !text.empty()) {  // vLLM: a partial message only when it has text
      if (h.channel == "analysis") {
        Join(&reasoning, text);
      } else if (h.channel == "final" || (h.channel == "commentary" && !h.has_recipient)) {
        Join(&content, text);
      }
    }
    header.clear();
    body.clear();
  };
  for (int32_t id : ids) {
    switch (state) {
      case State::kHeader:
        if (is(id, message)) {
          state = State::kBody;
        } else if (is(id, start)) {
          header.clear();
        } else {
          header.push_back(id);
        }
        break;
      case State::kBody:
        if (is(id, end) || is(id, ret) || is(id, call)) {
          finish(/*complete=*/true);
          state = State::kBetween;
        } else if (is(id, start)) {
          finish(/*complete=*/true);
          state = State::kHeader;
        } else {
          body.push_back(id);
        }
        break;
      case State::kBetween:
        if (is(id, start)) state = State::kHeader;
        break;
    }
  }
  if (state == State::kBody) finish(/*complete=*/false);
  HarmonyReply reply;
  if (content && !content->empty()) reply.content = std::move(content);
  if (reasoning && !reasoning->empty()) reply.reasoning_content = std::move(reasoning);
  return reply;
}

bool WritesHarmony(const Tokenizer& tokenizer) {
  return tokenizer.chat_layout() == static_cast<int>(ChatLayout::kHarmony);
}

}  // namespace moebatch
