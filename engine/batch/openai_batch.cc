// OpenAI Batch API JSONL input lines (openai_batch.h): parsing and validation, read with
// nlohmann-json only. Every parse is inside a try block: nlohmann's exceptions never leave this
// file. The output lines are written by openai_batch_output.cc.
#include "engine/batch/openai_batch.h"

#include <algorithm>
#include <exception>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/batch/openai_batch_json.h"
#include "nlohmann/json.hpp"

namespace moebatch {
namespace {

using json = nlohmann::json;
using openai_batch_internal::Dump;
using openai_batch_internal::Sv;
using openai_batch_internal::ValidUtf8;

constexpr std::string_view kChatUrl = "/v1/chat/completions";
constexpr std::string_view kCompletionsUrl = "/v1/completions";
constexpr std::string_view kResponsesUrl = "/v1/responses";
constexpr size_t kMaxStopStrings = 4;      // OpenAI's limit
constexpr size_t kMaxDescribedBytes = 80;  // of an offending value quoted in an error message
constexpr size_t kMaxParseErrorBytes = 200;

// The offending value for "got" clauses in error messages: a scalar as JSON text, cut short; an
// array or object by its type only (dumping recurses, and a hostile line may nest deeply).
std::string Describe(const json& j) {
  if (j.is_structured()) return j.is_array() ? "an array" : "an object";
  std::string s = Dump(j);
  if (s.size() > kMaxDescribedBytes) {
    s.resize(kMaxDescribedBytes);
    s += "...";
  }
  return s;
}

absl::Status Invalid(std::string_view path, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Sv(path), ": ", Sv(what)));
}

absl::Status Invalid(std::string_view path, std::string_view what, const json& got) {
  return absl::InvalidArgumentError(
      absl::StrCat(Sv(path), ": ", Sv(what), ", got ", Describe(got)));
}

// `*it`, or null when `it` is `obj.end()`: by reference, since copying a hostile value recurses
// once per nesting level (a 100,000-deep array as `url` would overflow the stack).
const json& Found(const json& obj, json::const_iterator it) {
  static const json kNull;
  return it == obj.end() ? kNull : *it;
}

// `obj[key]`, or nullptr when the key is absent or null (OpenAI treats an explicit null as unset).
const json* FindOptional(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// An integral JSON number that fits int64 (floats such as 1.0 are not integers here).
bool AsInt64(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  return false;
}

bool AsInt32(const json& v, int32_t* out) {
  int64_t i = 0;
  if (!AsInt64(v, &i) || i < std::numeric_limits<int32_t>::min() ||
      i > std::numeric_limits<int32_t>::max()) {
    return false;
  }
  *out = static_cast<int32_t>(i);
  return true;
}

// A message's content: a string, or an array of text parts ({"type": one of `part_types`, "text"})
// joined with "\n", as vLLM does. Chat's parts are "text"; the Responses API's "input_text" and
// "output_text".
absl::Status ParseContent(const json& content, const std::string& path,
                          std::initializer_list<std::string_view> part_types, std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return absl::OkStatus();
  }
  if (!content.is_array()) {
    return Invalid(path, "must be a string or an array of text parts", content);
  }
  std::vector<std::string> texts;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string part_path = absl::StrCat(path, "[", i, "]");
    if (!part.is_object()) return Invalid(part_path, "must be an object", part);
    auto type = part.find("type");
    const bool text_part = type != part.end() && type->is_string() &&
                           std::find(part_types.begin(), part_types.end(),
                                     type->get_ref<const std::string&>()) != part_types.end();
    if (!text_part) {
      std::vector<std::string> quoted;
      for (std::string_view t : part_types) quoted.push_back(absl::StrCat("\"", Sv(t), "\""));
      return Invalid(absl::StrCat(part_path, ".type"),
                     absl::StrCat("only ", absl::StrJoin(quoted, " and "), " parts are supported"),
                     Found(part, type));
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return Invalid(absl::StrCat(part_path, ".text"), "must be a string", Found(part, text));
    }
    texts.push_back(text->get<std::string>());
  }
  *out = absl::StrJoin(texts, "\n");
  return absl::OkStatus();
}

absl::Status ParseMessages(const json& body, std::vector<ChatMessage>* messages) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    return Invalid("body.messages", "must be a non-empty array", Found(body, it));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string path = absl::StrCat("body.messages[", i, "]");
    if (!m.is_object()) return Invalid(path, "must be an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Invalid(absl::StrCat(path, ".role"), "must be one of system, user, assistant",
                     Found(m, role));
    }
    ChatMessage message;
    message.role = role->get<std::string>();
    if (message.role != "system" && message.role != "user" && message.role != "assistant") {
      return Invalid(absl::StrCat(path, ".role"), "must be one of system, user, assistant", *role);
    }
    auto content = m.find("content");
    if (content == m.end()) {
      return Invalid(absl::StrCat(path, ".content"), "required");
    }
    absl::Status s =
        ParseContent(*content, absl::StrCat(path, ".content"), {"text"}, &message.content);
    if (!s.ok()) return s;
    messages->push_back(std::move(message));
  }
  return absl::OkStatus();
}

// /v1/responses: body.instructions (a system message first) and body.input (a string: one user
// message; or message items). A "developer" message is a system message; system messages next
// to each other (the instructions and a leading system or developer item) are joined with "\n\n"
// into one, since the chat layouts take one system message.
absl::Status ParseResponsesInput(const json& body, BatchRequest* request) {
  std::vector<ChatMessage>& messages = request->messages;
  auto add = [&](std::string role, std::string content) {
    if (role == "system" && !messages.empty() && messages.back().role == "system") {
      absl::StrAppend(&messages.back().content, "\n\n", content);
    } else {
      messages.push_back({std::move(role), std::move(content)});
    }
  };
  if (const json* instructions = FindOptional(body, "instructions")) {
    if (!instructions->is_string()) {
      return Invalid("body.instructions", "must be a string", *instructions);
    }
    request->instructions = instructions->get<std::string>();
    add("system", *request->instructions);
  }
  auto it = body.find("input");
  if (it == body.end() || it->is_null()) return Invalid("body.input", "required");
  if (it->is_string()) {
    add("user", it->get<std::string>());
    return absl::OkStatus();
  }
  if (!it->is_array() || it->empty()) {
    return Invalid("body.input", "must be a string or a non-empty array of message items", *it);
  }
  constexpr std::string_view kRoles = "must be one of user, assistant, system, developer";
  for (size_t i = 0; i < it->size(); ++i) {
    const json& item = (*it)[i];
    const std::string path = absl::StrCat("body.input[", i, "]");
    if (!item.is_object()) return Invalid(path, "must be an object", item);
    if (const json* type = FindOptional(item, "type")) {
      if (!type->is_string() || type->get_ref<const std::string&>() != "message") {
        return Invalid(absl::StrCat(path, ".type"),
                       "only message items are supported (\"message\")", *type);
      }
    }
    auto role = item.find("role");
    if (role == item.end() || !role->is_string()) {
      return Invalid(absl::StrCat(path, ".role"), kRoles, Found(item, role));
    }
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant") {
      return Invalid(absl::StrCat(path, ".role"), kRoles, *role);
    }
    auto content = item.find("content");
    if (content == item.end()) return Invalid(absl::StrCat(path, ".content"), "required");
    std::string text;
    absl::Status s = ParseContent(*content, absl::StrCat(path, ".content"),
                                  {"input_text", "output_text"}, &text);
    if (!s.ok()) return s;
    add(std::move(r), std::move(text));
  }
  return absl::OkStatus();
}

absl::Status ParseTokenIds(const json& ids, const std::string& path, std::vector<int32_t>* out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = 0;
    if (!AsInt32(ids[i], &id) || id < 0) {
      return Invalid(absl::StrCat(path, "[", i, "]"), "must be a non-negative integer token id",
                     ids[i]);
    }
    out->push_back(id);
  }
  return absl::OkStatus();
}

// `prompt`: "text", [id, ...], ["text"] or [[id, ...]]: exactly one prompt per request.
absl::Status ParsePrompt(const json& body, BatchRequest* request) {
  constexpr std::string_view kForms =
      "must be a string, an array of token ids, or a 1-element array of either";
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return Invalid("body.prompt", "required");
  const json& prompt = *it;
  if (prompt.is_string()) {
    request->prompt = prompt.get<std::string>();
    return absl::OkStatus();
  }
  if (!prompt.is_array()) return Invalid("body.prompt", kForms, prompt);
  if (prompt.empty()) return Invalid("body.prompt", "must not be an empty array");
  if (prompt[0].is_string() || prompt[0].is_array()) {
    if (prompt.size() != 1) {
      return Invalid("body.prompt",
                     absl::StrCat("only one prompt per request is supported, got ", prompt.size()));
    }
    if (prompt[0].is_string()) {
      request->prompt = prompt[0].get<std::string>();
      return absl::OkStatus();
    }
    if (prompt[0].empty()) return Invalid("body.prompt[0]", "must not be an empty array");
    std::vector<int32_t> ids;
    absl::Status s = ParseTokenIds(prompt[0], "body.prompt[0]", &ids);
    if (!s.ok()) return s;
    request->prompt_token_ids = std::move(ids);
    return absl::OkStatus();
  }
  std::vector<int32_t> ids;
  absl::Status s = ParseTokenIds(prompt, "body.prompt", &ids);
  if (!s.ok()) return s;
  request->prompt_token_ids = std::move(ids);
  return absl::OkStatus();
}

// Reads an optional int32 key; `*present` tells whether it was given.
absl::Status OptionalInt32(const json& body, const char* key, int32_t* out, bool* present) {
  *present = false;
  const json* v = FindOptional(body, key);
  if (v == nullptr) return absl::OkStatus();
  if (!AsInt32(*v, out)) {
    return Invalid(absl::StrCat("body.", key), "must be a 32-bit integer", *v);
  }
  *present = true;
  return absl::OkStatus();
}

absl::Status OptionalFloat(const json& body, const char* key, float* out) {
  const json* v = FindOptional(body, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return Invalid(absl::StrCat("body.", key), "must be a number", *v);
  *out = static_cast<float>(v->get<double>());
  return absl::OkStatus();
}

// `logprobs` / `top_logprobs`: chat takes a boolean and an integer in [0, 20] (which needs
// logprobs: true, checked by SamplingParams::Validate); completions an integer in [0, 5], the
// number of most likely tokens (the sampled token's log-probability is always given).
absl::Status ParseLogprobs(const json& body, Endpoint endpoint, SamplingParams* p) {
  if (endpoint == Endpoint::kResponses) {
    // The output text's log-probabilities when body.include asks for them or body.top_logprobs
    // is given (the sampled token's always, with that many most likely tokens per position).
    if (const json* include = FindOptional(body, "include")) {
      if (!include->is_array()) {
        return Invalid("body.include", "must be an array of strings", *include);
      }
      for (size_t i = 0; i < include->size(); ++i) {
        const json& item = (*include)[i];
        if (!item.is_string()) {
          return Invalid(absl::StrCat("body.include[", i, "]"), "must be a string", item);
        }
        if (item.get_ref<const std::string&>() == "message.output_text.logprobs") {
          p->logprobs = true;
        }
      }
    }
    if (const json* top = FindOptional(body, "top_logprobs")) {
      if (!AsInt32(*top, &p->top_logprobs)) {
        return Invalid("body.top_logprobs",
                       absl::StrCat("must be an integer in [0, ", kMaxTopLogprobs, "]"), *top);
      }
      p->logprobs = true;
    }
    return absl::OkStatus();
  }
  const json* logprobs = FindOptional(body, "logprobs");
  if (endpoint == Endpoint::kCompletions) {
    if (const json* top = FindOptional(body, "top_logprobs")) {
      return Invalid("body.top_logprobs",
                     absl::StrCat("is a chat field; /v1/completions takes body.logprobs, an "
                                  "integer in [0, ",
                                  kMaxCompletionLogprobs, "]"),
                     *top);
    }
    if (logprobs == nullptr) return absl::OkStatus();
    int32_t k = 0;
    if (!AsInt32(*logprobs, &k) || k < 0 || k > kMaxCompletionLogprobs) {
      return Invalid("body.logprobs",
                     absl::StrCat("must be an integer in [0, ", kMaxCompletionLogprobs, "]"),
                     *logprobs);
    }
    p->logprobs = true;
    p->top_logprobs = k;
    return absl::OkStatus();
  }
  if (logprobs != nullptr) {
    if (!logprobs->is_boolean()) return Invalid("body.logprobs", "must be a boolean", *logprobs);
    p->logprobs = logprobs->get<bool>();
  }
  if (const json* top = FindOptional(body, "top_logprobs")) {
    int32_t k = 0;
    if (!AsInt32(*top, &k)) {
      return Invalid("body.top_logprobs",
                     absl::StrCat("must be an integer in [0, ", kMaxTopLogprobs, "]"), *top);
    }
    if (!p->logprobs) {
      return Invalid("body.top_logprobs", "needs body.logprobs to be true", *top);
    }
    p->top_logprobs = k;
  }
  return absl::OkStatus();
}

absl::Status ParseSampling(const json& body, const BatchDefaults& defaults, Endpoint endpoint,
                           SamplingParams* p) {
  *p = SamplingParams();
  p->max_tokens = defaults.max_tokens;

  const bool responses = endpoint == Endpoint::kResponses;
  int32_t max_tokens = 0;
  int32_t max_completion_tokens = 0;
  bool has_max_tokens = false;
  bool has_max_completion_tokens = false;
  absl::Status s;
  // The name the output-length limit has in this endpoint's body, for the sampler's messages.
  const char* max_name = "max_tokens";
  if (responses) {
    // Chat's and completions' fields are not the Responses API's; a body that carries one was
    // most likely meant for another endpoint.
    static constexpr std::pair<const char*, std::string_view> kNotResponses[] = {
        {"max_tokens", "; use body.max_output_tokens"},
        {"max_completion_tokens", "; use body.max_output_tokens"},
        {"messages", "; use body.input"},
        {"prompt", "; use body.input"},
        {"logprobs", "; use body.top_logprobs or body.include [\"message.output_text.logprobs\"]"},
        {"n", " (one output per response)"}};
    for (const auto& [key, hint] : kNotResponses) {
      if (const json* v = FindOptional(body, key)) {
        return Invalid(absl::StrCat("body.", key),
                       absl::StrCat("is not a /v1/responses field", Sv(hint)), *v);
      }
    }
    if (const json* v = FindOptional(body, "previous_response_id")) {
      return Invalid("body.previous_response_id",
                     "is not supported: moebatchd stores no responses; send the whole "
                     "conversation in body.input",
                     *v);
    }
    s = OptionalInt32(body, "max_output_tokens", &max_tokens, &has_max_tokens);
    if (!s.ok()) return s;
    if (has_max_tokens) p->max_tokens = max_tokens;
    max_name = "max_output_tokens";
  } else {
    s = OptionalInt32(body, "max_tokens", &max_tokens, &has_max_tokens);
    if (!s.ok()) return s;
    s = OptionalInt32(body, "max_completion_tokens", &max_completion_tokens,
                      &has_max_completion_tokens);
    if (!s.ok()) return s;
    if (has_max_tokens && has_max_completion_tokens && max_tokens != max_completion_tokens) {
      return Invalid("body.max_completion_tokens",
                     absl::StrCat("must equal body.max_tokens when both are given, got ",
                                  max_completion_tokens, " and ", max_tokens));
    }
    if (has_max_tokens) {
      p->max_tokens = max_tokens;
    } else if (has_max_completion_tokens) {
      p->max_tokens = max_completion_tokens;
      max_name = "max_completion_tokens";
    }
  }

  s = OptionalFloat(body, "temperature", &p->temperature);
  if (!s.ok()) return s;
  s = OptionalFloat(body, "top_p", &p->top_p);
  if (!s.ok()) return s;
  bool has_top_k = false;
  s = OptionalInt32(body, "top_k", &p->top_k, &has_top_k);
  if (!s.ok()) return s;

  if (const json* seed = FindOptional(body, "seed")) {
    if (!seed->is_number_unsigned()) {
      return Invalid("body.seed", "must be a non-negative integer", *seed);
    }
    p->seed = seed->get<uint64_t>();
  }

  if (const json* stop = FindOptional(body, "stop")) {
    if (stop->is_string()) {
      if (stop->get_ref<const std::string&>().empty()) {
        return Invalid("body.stop", "must not be an empty string");
      }
      p->stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStopStrings) {
        return Invalid("body.stop", absl::StrCat("at most ", kMaxStopStrings,
                                                 " stop strings are allowed, got ", stop->size()));
      }
      for (size_t i = 0; i < stop->size(); ++i) {
        const json& item = (*stop)[i];
        if (!item.is_string() || item.get_ref<const std::string&>().empty()) {
          return Invalid(absl::StrCat("body.stop[", i, "]"), "must be a non-empty string", item);
        }
        p->stop.push_back(item.get<std::string>());
      }
    } else {
      return Invalid("body.stop", "must be a string or an array of up to 4 strings", *stop);
    }
  }

  if (const json* n = responses ? nullptr : FindOptional(body, "n")) {
    if (!AsInt32(*n, &p->n)) {
      return Invalid("body.n", absl::StrCat("must be an integer in [1, ", kMaxChoices, "]"), *n);
    }
  }
  s = ParseLogprobs(body, endpoint, p);
  if (!s.ok()) return s;

  if (const json* ignore_eos = FindOptional(body, "ignore_eos")) {
    if (!ignore_eos->is_boolean()) {
      return Invalid("body.ignore_eos", "must be a boolean", *ignore_eos);
    }
    p->ignore_eos = ignore_eos->get<bool>();
  }

  // Ranges: the sampler's own rules, its field names put under "body.".
  s = p->Validate();
  if (!s.ok()) {
    std::string message(s.message());
    if (absl::StartsWith(message, "max_tokens:")) {
      message = absl::StrCat(max_name, message.substr(sizeof("max_tokens") - 1));
    }
    return absl::InvalidArgumentError(absl::StrCat("body.", message));
  }
  return absl::OkStatus();
}

// The output format: chat's body.response_format, the Responses API's body.text.format.
// {"type": "text"} (the default) or {"type": "json_object"} (JSON mode:
// SamplingParams::json_object, the reply constrained to a JSON object, engine/text/json_output.h).
// {"type": "json_schema"} needs a schema-driven grammar, which moebatchd does not have: such a
// request is refused rather than answered with a reply that may not match the schema.
absl::Status ParseTextFormat(const json& body, Endpoint endpoint, SamplingParams* p) {
  const json* format = nullptr;
  std::string path;
  if (endpoint == Endpoint::kChatCompletions) {
    format = FindOptional(body, "response_format");
    path = "body.response_format";
  } else if (endpoint == Endpoint::kResponses) {
    if (const json* text = FindOptional(body, "text")) {
      if (!text->is_object()) return Invalid("body.text", "must be an object", *text);
      format = FindOptional(*text, "format");
      path = "body.text.format";
    }
  }
  if (format == nullptr) return absl::OkStatus();
  if (!format->is_object()) return Invalid(path, "must be an object", *format);
  auto type = format->find("type");
  if (type != format->end() && type->is_string()) {
    const std::string& t = type->get_ref<const std::string&>();
    if (t == "text") return absl::OkStatus();
    if (t == "json_object") {
      if (p->ignore_eos) {
        return Invalid("body.ignore_eos",
                       "cannot be combined with JSON mode, whose reply ends at EOS once its "
                       "object is closed");
      }
      p->json_object = true;
      return absl::OkStatus();
    }
  }
  return Invalid(absl::StrCat(path, ".type"),
                 "must be \"text\" or \"json_object\" (\"json_schema\" needs a grammar "
                 "from the schema, which moebatchd does not have)",
                 Found(*format, type));
}

absl::StatusOr<BatchRequest> ParseRequest(const json& root, const BatchDefaults& defaults) {
  BatchRequest request;

  auto custom_id = root.find("custom_id");
  if (custom_id == root.end() || !custom_id->is_string() ||
      custom_id->get_ref<const std::string&>().empty()) {
    return Invalid("custom_id", "must be a non-empty string", Found(root, custom_id));
  }
  request.custom_id = custom_id->get<std::string>();

  auto method = root.find("method");
  if (method == root.end() || !method->is_string() || method->get<std::string>() != "POST") {
    return Invalid("method", "must be POST", Found(root, method));
  }

  auto url = root.find("url");
  std::string_view url_text;
  if (url != root.end() && url->is_string()) url_text = url->get_ref<const std::string&>();
  if (url_text == kChatUrl) {
    request.endpoint = Endpoint::kChatCompletions;
  } else if (url_text == kCompletionsUrl) {
    request.endpoint = Endpoint::kCompletions;
  } else if (url_text == kResponsesUrl) {
    request.endpoint = Endpoint::kResponses;
  } else {
    return Invalid("url",
                   absl::StrCat("must be ", Sv(kChatUrl), ", ", Sv(kCompletionsUrl), " or ",
                                Sv(kResponsesUrl)),
                   Found(root, url));
  }

  auto body_it = root.find("body");
  if (body_it == root.end() || !body_it->is_object()) {
    return Invalid("body", "must be an object", Found(root, body_it));
  }
  const json& body = *body_it;

  if (const json* model = FindOptional(body, "model")) {
    if (!model->is_string()) return Invalid("body.model", "must be a string", *model);
    request.model = model->get<std::string>();
  }

  absl::Status s = request.endpoint == Endpoint::kChatCompletions
                       ? ParseMessages(body, &request.messages)
                   : request.endpoint == Endpoint::kResponses ? ParseResponsesInput(body, &request)
                                                              : ParsePrompt(body, &request);
  if (!s.ok()) return s;
  s = ParseSampling(body, defaults, request.endpoint, &request.sampling);
  if (!s.ok()) return s;
  s = ParseTextFormat(body, request.endpoint, &request.sampling);
  if (!s.ok()) return s;
  return request;
}

}  // namespace

std::string_view EndpointUrl(Endpoint endpoint) {
  switch (endpoint) {
    case Endpoint::kChatCompletions:
      return kChatUrl;
    case Endpoint::kCompletions:
      return kCompletionsUrl;
    case Endpoint::kResponses:
      return kResponsesUrl;
  }
  return kChatUrl;
}

absl::Status ChatPromptError(const BatchRequest& request, const absl::Status& status) {
  const std::string_view prefix =
      request.endpoint == Endpoint::kResponses ? "body.input: the conversation's " : "body.";
  return absl::Status(status.code(), absl::StrCat(Sv(prefix), status.message()));
}

std::string ErrorParam(std::string_view message) {
  const size_t colon = message.find(": ");
  if (colon == std::string_view::npos || colon == 0) return std::string();
  for (char c : message.substr(0, colon)) {
    const bool path_char = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '[' || c == ']';
    if (!path_char) return std::string();
  }
  return std::string(message.substr(0, colon));
}

ParsedBatchLine ParseBatchLine(std::string_view line, const BatchDefaults& defaults) {
  ParsedBatchLine parsed;
  try {
    json root;
    try {
      root = json::parse(line.begin(), line.end());
    } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e400 (no double)
      // e.what() is "[json.exception.parse_error.101] parse error at ...": keep the part after
      // the tag.
      std::string_view what = e.what();
      const size_t tag_end = what.find("] ");
      if (tag_end != std::string_view::npos) what.remove_prefix(tag_end + 2);
      if (what.size() > kMaxParseErrorBytes) what = what.substr(0, kMaxParseErrorBytes);
      // The "last read" part quotes the input, which may be ill-formed UTF-8.
      parsed.request =
          absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", ValidUtf8(std::string(what))));
      return parsed;
    }
    if (!root.is_object()) {
      parsed.request = absl::InvalidArgumentError(
          absl::StrCat("invalid JSON: a line must be a JSON object, got ", root.type_name()));
      return parsed;
    }
    parsed.json_ok = true;
    auto custom_id = root.find("custom_id");
    if (custom_id != root.end() && custom_id->is_string()) {
      parsed.custom_id = custom_id->get<std::string>();
    }
    parsed.request = ParseRequest(root, defaults);
  } catch (const std::exception& e) {
    parsed.request = absl::InternalError(absl::StrCat("parsing the line failed: ", e.what()));
  }
  return parsed;
}

}  // namespace moebatch
