// OpenAI Batch API JSONL output lines (openai_batch.h): chat.completion, text_completion and
// Response bodies, error lines, written with nlohmann-json only. Every dump is inside a try block:
// nlohmann's exceptions never leave this file. Output is dumped with error_handler_t::replace, so
// invalid UTF-8 in generated text becomes U+FFFD instead of throwing.
#include <charconv>
#include <cstdlib>
#include <exception>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/batch/openai_batch.h"
#include "engine/batch/openai_batch_json.h"
#include "engine/text/harmony_output.h"
#include "nlohmann/json.hpp"

namespace moebatch {
namespace {

using openai_batch_internal::Dump;
using openai_batch_internal::Sv;
using openai_batch_internal::ValidUtf8;
// Output objects keep insertion order, so lines read id, custom_id, response, error as OpenAI's do.
using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kRequestIdPrefix = "batch_req_";

// "batch_req_X" -> "X": the suffix shared by the line's request id and the body's id.
std::string_view RequestSuffix(std::string_view request_id) {
  if (absl::StartsWith(Sv(request_id), Sv(kRequestIdPrefix))) {
    request_id.remove_prefix(kRequestIdPrefix.size());
  }
  return request_id;
}

ordered_json CustomIdOrNull(const std::string& custom_id) {
  return custom_id.empty() ? ordered_json() : ordered_json(custom_id);
}

ordered_json ParamOf(std::string_view message) {
  std::string param = ErrorParam(message);
  return param.empty() ? ordered_json() : ordered_json(std::move(param));
}

std::string LowerCodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);
  for (char& c : name) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c == ' ') c = '_';
  }
  return name;
}

// Last resort when building a line failed (out of memory): a minimal error line, or "" if even
// that cannot be made.
std::string FallbackLine(std::string_view request_id, std::string_view what) {
  try {
    ordered_json line;
    line["id"] = std::string(request_id);
    line["custom_id"] = nullptr;
    line["response"] = nullptr;
    line["error"] = {{"code", "internal"}, {"message", std::string(what)}};
    return Dump(line);
  } catch (...) {
    return std::string();
  }
}

// A token's bytes (Tokenizer::TokenBytes) as the JSON fields OpenAI gives it: "token" (the bytes as
// text, ill-formed UTF-8 replaced by U+FFFD) and "bytes" (the raw bytes, 0..255 each).
struct TokenFields {
  std::string text;
  std::vector<int> bytes;
};

TokenFields TokenOf(const Tokenizer* tokenizer, int32_t id) {
  TokenFields f;
  if (tokenizer == nullptr) return f;
  const std::string raw = tokenizer->TokenBytes(id);
  f.text = ValidUtf8(raw);
  for (unsigned char c : raw) f.bytes.push_back(c);
  return f;
}

// Unicode code points of valid UTF-8 `s` (continuation bytes not counted).
int64_t CodePoints(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// The per-token entries [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}] of a
// chat completion's logprobs.content and of a Response's output_text logprobs.
ordered_json LogprobEntries(const Completion& c, const Tokenizer* tokenizer) {
  ordered_json content = ordered_json::array();
  for (const TokenLogprob& lp : c.logprobs) {
    TokenFields t = TokenOf(tokenizer, lp.token);
    ordered_json entry;
    entry["token"] = std::move(t.text);
    entry["logprob"] = lp.logprob;
    entry["bytes"] = std::move(t.bytes);
    ordered_json top = ordered_json::array();
    for (const auto& [id, logprob] : lp.top) {
      TokenFields tt = TokenOf(tokenizer, id);
      ordered_json alt;
      alt["token"] = std::move(tt.text);
      alt["logprob"] = logprob;
      alt["bytes"] = std::move(tt.bytes);
      top.push_back(std::move(alt));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return content;
}

// choice.logprobs of a chat completion: {"content": LogprobEntries, "refusal": null}.
ordered_json ChatLogprobs(const Completion& c, const Tokenizer* tokenizer) {
  ordered_json out;
  out["content"] = LogprobEntries(c, tokenizer);
  out["refusal"] = nullptr;
  return out;
}

// choice.logprobs of a legacy completion: {"tokens", "token_logprobs", "top_logprobs": [{token:
// logprob} with the top k and the sampled token], "text_offset": code points into the
// concatenated token strings, from 0}.
ordered_json CompletionLogprobs(const Completion& c, const Tokenizer* tokenizer) {
  ordered_json tokens = ordered_json::array(), token_logprobs = ordered_json::array(),
               top_logprobs = ordered_json::array(), text_offset = ordered_json::array();
  int64_t offset = 0;
  for (const TokenLogprob& lp : c.logprobs) {
    std::string text = TokenOf(tokenizer, lp.token).text;
    text_offset.push_back(offset);
    offset += CodePoints(text);
    ordered_json top = ordered_json::object();
    for (const auto& [id, logprob] : lp.top) {
      std::string key = TokenOf(tokenizer, id).text;
      if (!top.contains(key)) top[key] = logprob;  // tokens with the same text: the likelier
    }
    if (!top.contains(text)) top[text] = lp.logprob;
    tokens.push_back(std::move(text));
    token_logprobs.push_back(lp.logprob);
    top_logprobs.push_back(std::move(top));
  }
  ordered_json out;
  out["tokens"] = std::move(tokens);
  out["token_logprobs"] = std::move(token_logprobs);
  out["top_logprobs"] = std::move(top_logprobs);
  out["text_offset"] = std::move(text_offset);
  return out;
}

// A float field echoed in JSON as the shortest decimal that reads back as that float (0.7, not
// 0.699999988079071, which is what widening it to double would write).
double EchoFloat(float v) {
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  if (r.ec != std::errc()) return v;
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

// The body of a /v1/responses request's output line: OpenAI's Response object (one output, so
// choices[0]). Its output: for a harmony model (gpt-oss) a "reasoning" item with the analysis
// channel's text, when there is one, then the assistant "message" item with the final channel's
// text (none when the reply was cut before it); for others the message item with the reply. The
// request's sampling fields are echoed, as OpenAI echoes them.
ordered_json ResponsesBody(const BatchRequest& request, std::string_view suffix,
                           const Completion& completion, int64_t created,
                           const Tokenizer* tokenizer, bool harmony) {
  const bool complete = completion.finish_reason != "length";
  const char* item_status = complete ? "completed" : "incomplete";
  ordered_json output = ordered_json::array();
  std::optional<std::string> text = completion.text;
  if (harmony) {
    HarmonyReply reply = ParseHarmonyReply(*tokenizer, completion.token_ids);
    text = std::move(reply.content);
    if (reply.reasoning_content) {
      ordered_json reasoning;
      reasoning["id"] = absl::StrCat("rs_", Sv(suffix));
      reasoning["type"] = "reasoning";
      reasoning["summary"] = ordered_json::array();
      reasoning["content"] = ordered_json::array(
          {{{"type", "reasoning_text"}, {"text", std::move(*reply.reasoning_content)}}});
      reasoning["status"] = text ? "completed" : item_status;
      output.push_back(std::move(reasoning));
    }
  }
  if (text) {
    ordered_json part;
    part["type"] = "output_text";
    part["text"] = std::move(*text);
    part["annotations"] = ordered_json::array();
    if (request.sampling.logprobs) {
      part["logprobs"] = LogprobEntries(completion, tokenizer);
    }
    ordered_json message;
    message["id"] = absl::StrCat("msg_", Sv(suffix));
    message["type"] = "message";
    message["status"] = item_status;
    message["role"] = "assistant";
    message["content"] = ordered_json::array({std::move(part)});
    output.push_back(std::move(message));
  }
  ordered_json body;
  body["id"] = absl::StrCat("resp_", Sv(suffix));
  body["object"] = "response";
  body["created_at"] = created;
  body["status"] = complete ? "completed" : "incomplete";
  body["error"] = nullptr;
  body["incomplete_details"] =
      complete ? ordered_json() : ordered_json({{"reason", "max_output_tokens"}});
  body["instructions"] =
      request.instructions ? ordered_json(*request.instructions) : ordered_json();
  body["max_output_tokens"] = request.sampling.max_tokens;
  body["model"] = request.model;
  body["output"] = std::move(output);
  body["parallel_tool_calls"] = false;
  body["temperature"] = EchoFloat(request.sampling.temperature);
  body["tool_choice"] = "none";
  body["tools"] = ordered_json::array();
  body["top_p"] = EchoFloat(request.sampling.top_p);
  body["top_logprobs"] = request.sampling.top_logprobs;
  body["text"] = {{"format", {{"type", "text"}}}};
  body["truncation"] = "disabled";
  body["usage"] = {{"input_tokens", completion.prompt_tokens},
                   {"input_tokens_details", {{"cached_tokens", 0}, {"cache_write_tokens", 0}}},
                   {"output_tokens", completion.completion_tokens},
                   {"output_tokens_details", {{"reasoning_tokens", 0}}},
                   {"total_tokens", completion.prompt_tokens + completion.completion_tokens}};
  body["metadata"] = ordered_json::object();
  body["token_ids"] = completion.token_ids;
  return body;
}

}  // namespace

std::string FormatBatchOutput(const BatchRequest& request, std::string_view request_id,
                              const Completion& completion, int64_t created) {
  return FormatBatchOutput(request, request_id, std::vector<Completion>{completion}, created,
                           nullptr);
}

std::string FormatBatchOutput(const BatchRequest& request, std::string_view request_id,
                              const std::vector<Completion>& choices, int64_t created,
                              const Tokenizer* tokenizer) {
  try {
    const std::string_view suffix = RequestSuffix(request_id);
    const bool chat = request.endpoint == Endpoint::kChatCompletions;
    const bool harmony = tokenizer != nullptr && WritesHarmony(*tokenizer);
    if (request.endpoint == Endpoint::kResponses) {
      if (choices.size() != 1) {
        return FallbackLine(request_id, absl::StrCat("a /v1/responses request has one output, got ",
                                                     choices.size()));
      }
      ordered_json line;
      line["id"] = std::string(request_id);
      line["custom_id"] = request.custom_id;
      line["response"] = {
          {"status_code", 200},
          {"request_id", absl::StrCat("req_", Sv(suffix))},
          {"body", ResponsesBody(request, suffix, choices[0], created, tokenizer, harmony)}};
      line["error"] = nullptr;
      return Dump(line);
    }

    ordered_json out_choices = ordered_json::array();
    int64_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < choices.size(); ++i) {
      const Completion& completion = choices[i];
      ordered_json choice;
      choice["index"] = i;
      if (chat && harmony) {
        // The final channel as the content, the analysis channel as reasoning_content (vLLM's
        // gpt-oss reply); both null when empty.
        const HarmonyReply reply = ParseHarmonyReply(*tokenizer, completion.token_ids);
        choice["message"] = {
            {"role", "assistant"}, {"content", nullptr}, {"reasoning_content", nullptr}};
        if (reply.content) choice["message"]["content"] = *reply.content;
        if (reply.reasoning_content) {
          choice["message"]["reasoning_content"] = *reply.reasoning_content;
        }
      } else if (chat) {
        choice["message"] = {{"role", "assistant"}, {"content", completion.text}};
      } else {
        choice["text"] = completion.text;
      }
      choice["finish_reason"] = completion.finish_reason;
      if (!request.sampling.logprobs) {
        choice["logprobs"] = nullptr;
      } else {
        choice["logprobs"] =
            chat ? ChatLogprobs(completion, tokenizer) : CompletionLogprobs(completion, tokenizer);
      }
      choice["token_ids"] = completion.token_ids;
      out_choices.push_back(std::move(choice));
      prompt_tokens = completion.prompt_tokens;  // the same prompt in every choice
      completion_tokens += completion.completion_tokens;
    }

    ordered_json body;
    body["id"] = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", Sv(suffix));
    body["object"] = chat ? "chat.completion" : "text_completion";
    body["created"] = created;
    body["model"] = request.model;
    body["choices"] = std::move(out_choices);
    body["usage"] = {{"prompt_tokens", prompt_tokens},
                     {"completion_tokens", completion_tokens},
                     {"total_tokens", prompt_tokens + completion_tokens}};

    ordered_json line;
    line["id"] = std::string(request_id);
    line["custom_id"] = request.custom_id;
    line["response"] = {{"status_code", 200},
                        {"request_id", absl::StrCat("req_", Sv(suffix))},
                        {"body", std::move(body)}};
    line["error"] = nullptr;
    return Dump(line);
  } catch (const std::exception& e) {
    return FallbackLine(request_id, absl::StrCat("formatting the output failed: ", e.what()));
  }
}

std::string FormatBatchError(const ParsedBatchLine& line, std::string_view request_id,
                             const absl::Status& status) {
  try {
    const std::string message(status.message());
    ordered_json out;
    out["id"] = std::string(request_id);
    out["custom_id"] = CustomIdOrNull(line.custom_id);
    if (!line.json_ok) {
      out["response"] = nullptr;
      out["error"] = {{"code", "invalid_json"}, {"message", message}};
      return Dump(out);
    }
    const bool client_error = status.code() == absl::StatusCode::kInvalidArgument ||
                              status.code() == absl::StatusCode::kOutOfRange;
    ordered_json error;
    error["message"] = message;
    error["type"] = client_error ? "invalid_request_error" : "server_error";
    error["param"] = ParamOf(message);
    error["code"] = LowerCodeName(status.code());
    out["response"] = {{"status_code", client_error ? 400 : 500},
                       {"request_id", absl::StrCat("req_", Sv(RequestSuffix(request_id)))},
                       {"body", {{"error", std::move(error)}}}};
    out["error"] = nullptr;
    return Dump(out);
  } catch (const std::exception& e) {
    return FallbackLine(request_id, absl::StrCat("formatting the error failed: ", e.what()));
  }
}

}  // namespace moebatch
