// The OpenAI Batch API's JSONL format: input lines (one request each) and output lines.
//
// Input line: {"custom_id": str, "method": "POST", "url": "/v1/chat/completions" |
// "/v1/completions", "body": {"model"?, "messages" | "prompt", "max_tokens" |
// "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n" (1..16),
// "logprobs" (chat: bool; completions: 0..5), "top_logprobs" (chat: 0..20), "ignore_eos"
// (extension), "response_format" (chat: {"type": "text" | "json_object"})}}. `prompt` may be a
// string or an array of token ids (as OpenAI allows). JSON mode (chat's response_format, the
// Responses API's text.format, of type "json_object") sets SamplingParams::json_object; a
// "json_schema" format is an error naming the field (no grammar is built from schemas).
// Or "url": "/v1/responses" (OpenAI's Responses API), "body": {"model"?, "input" (a string: one
// user message; or an array of message items {"type"?: "message", "role": user | assistant |
// system | developer, "content": a string or input_text / output_text parts}), "instructions"
// (a system message before the input), "max_output_tokens", "temperature", "top_p",
// "top_logprobs" (0..20) and "include" (["message.output_text.logprobs"]: the output text's
// log-probabilities), and the extensions "top_k", "seed", "stop", "ignore_eos"}; it is encoded with
// the chat layout, as chat messages are. The chat and completions fields it does not have
// (max_tokens, max_completion_tokens, n, logprobs, messages, prompt) and previous_response_id (no
// response is stored) are errors there, naming the field.
//
// Output line: {"id": "batch_req_...", "custom_id", "response": {"status_code": 200, "request_id",
// "body": {chat.completion or text_completion object with "choices" and "usage"}}, "error": null}.
// With n > 1, "choices" has n entries (index 0..n-1) and usage.completion_tokens sums them. With
// logprobs, choice.logprobs is OpenAI's object for the endpoint (chat: {"content": [{token,
// logprob, bytes, top_logprobs}], "refusal": null}; completions: {tokens, token_logprobs,
// top_logprobs, text_offset}), else null.
// Extension: every choice also carries "token_ids", the generated token ids (stop-string and EOS
// tokens included when they were generated; see docs/api.md).
// A chat reply of a model whose chat layout is harmony (gpt-oss) is split as vLLM splits it
// (engine/text/harmony_output.h): message.content is the final channel's text and
// message.reasoning_content the analysis channel's, each null when empty. They are parsed from the
// token ids; a stop string ends generation but does not cut them (the text it is matched in is
// the reply decoded with the special tokens dropped, channel names included).
// A /v1/responses request's body is a Response object ("object": "response"; "status"
// "completed", or "incomplete" with "incomplete_details": {"reason": "max_output_tokens"};
// "output": [a "reasoning" item for harmony's analysis channel (gpt-oss), then the assistant
// "message" item with one "output_text" part, "logprobs" in it when asked for]; "usage":
// {"input_tokens", "output_tokens", "total_tokens", and their details}; "token_ids" (extension)).
// A request that fails validation gets "response": {"status_code": 400, "body": {"error": {...}}};
// a line that is not JSON at all gets "response": null, "error": {"code", "message"}.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/sampler.h"
#include "engine/text/tokenizer.h"

namespace moebatch {

enum class Endpoint { kChatCompletions, kCompletions, kResponses };

// The request line's "url" of an endpoint: "/v1/chat/completions", "/v1/completions" or
// "/v1/responses".
std::string_view EndpointUrl(Endpoint endpoint);
// Whether the endpoint's prompt is a list of chat messages (BatchRequest::messages, encoded with
// the model's chat layout): /v1/chat/completions and /v1/responses.
inline bool TakesMessages(Endpoint endpoint) { return endpoint != Endpoint::kCompletions; }
// The body field that limits the generated tokens: "max_output_tokens" for /v1/responses, else
// "max_tokens" (chat's "max_completion_tokens" is its alias).
inline std::string_view MaxTokensField(Endpoint endpoint) {
  return endpoint == Endpoint::kResponses ? "max_output_tokens" : "max_tokens";
}

// /v1/completions' `logprobs` at most (OpenAI's limit); chat's top_logprobs: kMaxTopLogprobs.
constexpr int32_t kMaxCompletionLogprobs = 5;

struct BatchRequest {
  std::string custom_id;
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string model;                                     // body.model, echoed back; may be empty
  std::vector<ChatMessage> messages;                     // chat and responses
  std::optional<std::string> instructions;               // responses: body.instructions, echoed
  std::string prompt;                                    // completions, text prompt
  std::optional<std::vector<int32_t>> prompt_token_ids;  // completions, prompt given as ids
  SamplingParams sampling;
};

struct ParsedBatchLine {
  std::string custom_id;  // as far as it could be read (empty when the line is not JSON)
  bool json_ok = false;   // false: not a JSON object at all (FormatBatchError then writes a
                          // top-level "invalid_json" error instead of a 400 response)
  absl::StatusOr<BatchRequest> request;  // InvalidArgument naming the field, e.g.
                                         // "body.temperature: must be in [0, 100], got 7000"
};

struct BatchDefaults {
  int32_t max_tokens = 256;  // when the body gives neither max_tokens nor max_completion_tokens
};

// Parses one input line. Never throws; every problem is in `request`'s status.
ParsedBatchLine ParseBatchLine(std::string_view line, const BatchDefaults& defaults = {});

// One choice of a request's output.
struct Completion {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;  // one per token id when the request asked for logprobs
  std::string finish_reason;           // "stop" (EOS or stop string) or "length"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// Formats a successful output line (no trailing newline) of a request with one choice and no
// logprobs. `request_id` is unique per request ("batch_req_<...>"); `created` is Unix seconds.
std::string FormatBatchOutput(const BatchRequest& request, std::string_view request_id,
                              const Completion& completion, int64_t created);
// The same with every choice of the request (choices[i] is choice i; usage.completion_tokens sums
// them, prompt_tokens is theirs); `tokenizer` (borrowed; may be null when the request asked for no
// logprobs) gives the tokens' text and bytes in choice.logprobs, and its chat layout decides
// whether a chat reply is harmony (content and reasoning_content from the token ids).
std::string FormatBatchOutput(const BatchRequest& request, std::string_view request_id,
                              const std::vector<Completion>& choices, int64_t created,
                              const Tokenizer* tokenizer);

// An error of Tokenizer::EncodeChat on request.messages (it names "messages[i]"), named as the
// request line names the field: "body.messages[2].role: ..." for chat; for /v1/responses, whose
// messages are made from body.instructions and body.input, "body.input: the conversation's
// messages[2].role: ...". The status code is kept.
absl::Status ChatPromptError(const BatchRequest& request, const absl::Status& status);

// The field path a validation message starts with ("body.messages[1].role" of
// "body.messages[1].role: must be one of ..."), or "" when the message names no field: the
// output line's error.param.
std::string ErrorParam(std::string_view message);

// Formats a failed request's line: status_code 400 for InvalidArgument/OutOfRange, else 500, with
// body.error {message, type, param, code}; or, when !json_ok, "response": null and
// "error": {"code": "invalid_json", "message"}.
std::string FormatBatchError(const ParsedBatchLine& line, std::string_view request_id,
                             const absl::Status& status);

}  // namespace moebatch
