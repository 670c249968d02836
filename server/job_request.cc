#include "server/job_request.h"

#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/batch/batch_reader.h"
#include "engine/batch/openai_batch.h"
#include "nlohmann/json.hpp"

namespace moebatch {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxQuotedBytes = 200;  // of a model name quoted in an error message

// The result line of a request that cannot run (validated, but too long for the context).
PrefailedRequest Prefail(int64_t index, const ParsedBatchLine& parsed, const std::string& job_tag,
                         const absl::Status& status) {
  PrefailedRequest p;
  p.index = index;
  p.custom_id = parsed.custom_id;
  p.result_line = FormatBatchError(parsed, absl::StrCat("batch_req_", job_tag, "_", index), status);
  return p;
}

// The stored line states the max_tokens (max_output_tokens) this daemon applied, so the request
// runs the same after a restart with another --default-max-tokens, and names the daemon's model,
// which every result line then carries.
std::string FreezeDefaults(const std::string& line, const BatchRequest& req,
                           const std::string& model_name) {
  Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("body") || !j["body"].is_object()) return line;
  Json& body = j["body"];
  auto has = [&](const std::string& key) { return body.contains(key) && !body[key].is_null(); };
  const std::string field(MaxTokensField(req.endpoint));
  const bool given =
      has(field) || (req.endpoint != Endpoint::kResponses && has("max_completion_tokens"));
  if (!given) body[field] = req.sampling.max_tokens;
  if (!model_name.empty()) body["model"] = model_name;
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// OpenAI's code for a bad line of a batch input file.
std::string LineErrorCode(const BatchLineError& e) {
  if (e.param == "custom_id" && e.message.find("duplicate") != std::string::npos) {
    return "duplicate_custom_id";
  }
  if (e.message.rfind("invalid JSON", 0) == 0) {
    return "invalid_json_line";
  }
  if (e.param == "url") return "invalid_url";
  return "invalid_request";
}

// A float sampling field. nlohmann writes NaN and the infinities as null, which would read back as
// "not given" (the default); as a string they fail validation, naming the field.
Json FloatField(float value) {
  if (std::isfinite(value)) return value;
  if (std::isnan(value)) return "NaN";
  return value > 0 ? "Infinity" : "-Infinity";
}

}  // namespace

std::string ToBatchLine(const v1::BatchRequest& r) {
  Json body = Json::object();
  std::string url = "/v1/completions";
  switch (r.input_case()) {
    case v1::BatchRequest::kChat: {
      url = "/v1/chat/completions";
      Json messages = Json::array();
      for (const auto& m : r.chat().messages()) {
        messages.push_back({{"role", m.role()}, {"content", m.content()}});
      }
      body["messages"] = std::move(messages);
      break;
    }
    case v1::BatchRequest::kPrompt:
      body["prompt"] = r.prompt();
      break;
    case v1::BatchRequest::kPromptTokenIds:
      body["prompt"] = std::vector<int32_t>(r.prompt_token_ids().ids().begin(),
                                            r.prompt_token_ids().ids().end());
      break;
    case v1::BatchRequest::INPUT_NOT_SET:
      break;  // ParseBatchLine reports the missing prompt / messages
  }
  const v1::SamplingParams& s = r.sampling();
  if (s.has_temperature()) body["temperature"] = FloatField(s.temperature());
  if (s.has_top_p()) body["top_p"] = FloatField(s.top_p());
  if (s.has_top_k()) body["top_k"] = s.top_k();
  if (s.has_seed()) body["seed"] = s.seed();
  if (s.has_max_tokens()) body["max_tokens"] = s.max_tokens();
  if (s.stop_size() > 0) body["stop"] = std::vector<std::string>(s.stop().begin(), s.stop().end());
  if (s.ignore_eos()) body["ignore_eos"] = true;
  if (s.has_n()) body["n"] = s.n();
  if (r.input_case() == v1::BatchRequest::kChat) {
    if (s.has_response_format()) body["response_format"] = {{"type", s.response_format()}};
    if (s.has_logprobs()) body["logprobs"] = s.logprobs();
    if (s.has_top_logprobs()) body["top_logprobs"] = s.top_logprobs();
  } else if (s.has_logprobs() || s.has_top_logprobs()) {
    // /v1/completions' logprobs is the number of most likely tokens; top_logprobs without
    // logprobs is passed on for the parser to refuse.
    if (s.has_logprobs() && s.logprobs()) {
      body["logprobs"] = s.has_top_logprobs() ? s.top_logprobs() : 0;
    } else if (s.has_top_logprobs()) {
      body["top_logprobs"] = s.top_logprobs();
    }
  }
  Json line = {{"custom_id", r.custom_id()}, {"method", "POST"}, {"url", url}, {"body", body}};
  return line.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<std::vector<int32_t>> TokenizeRequest(const BatchRequest& request,
                                                     const Tokenizer& tokenizer,
                                                     int64_t vocab_size) {
  if (TakesMessages(request.endpoint)) {
    auto ids = tokenizer.EncodeChat(request.messages);
    if (!ids.ok()) return ChatPromptError(request, ids.status());
    return ids;
  }
  if (request.prompt_token_ids) {
    const int64_t vocab = vocab_size > 0 ? vocab_size : tokenizer.vocab_size();
    for (size_t i = 0; i < request.prompt_token_ids->size(); ++i) {
      const int32_t id = (*request.prompt_token_ids)[i];
      if (id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(
            "body.prompt[", i, "]: token id ", id, " is outside the vocabulary [0, ", vocab, ")"));
      }
    }
    return *request.prompt_token_ids;
  }
  return tokenizer.Encode(request.prompt, /*add_bos=*/true);
}

absl::Status CheckJobMetadata(const google::protobuf::Map<std::string, std::string>& metadata) {
  if (static_cast<int64_t>(metadata.size()) > kMaxMetadataPairs) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata: at most ", kMaxMetadataPairs, " pairs, got ", metadata.size()));
  }
  // Characters are Unicode code points, as OpenAI counts them (the strings are valid UTF-8:
  // protobuf checks string fields).
  auto chars = [](const std::string& s) {
    int64_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  for (const auto& [key, value] : metadata) {
    const std::string quoted = QuoteBounded(key, kMaxQuotedBytes);
    if (key.empty()) return absl::InvalidArgumentError("metadata: a key is empty");
    if (key.find('\0') != std::string::npos || value.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata[", quoted, "]: keys and values may not contain NUL"));
    }
    if (chars(key) > kMaxMetadataKeyChars) {
      return absl::InvalidArgumentError(absl::StrCat("metadata: key ", quoted, " has ", chars(key),
                                                     " characters, at most ",
                                                     kMaxMetadataKeyChars));
    }
    if (chars(value) > kMaxMetadataValueChars) {
      return absl::InvalidArgumentError(absl::StrCat("metadata[", quoted, "]: the value has ",
                                                     chars(value), " characters, at most ",
                                                     kMaxMetadataValueChars));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PreparedJob> PrepareJob(const v1::CreateJobRequest& request,
                                       const Tokenizer& tokenizer, const JobLimits& limits,
                                       const std::string& job_tag, const PrepareOptions& prepare) {
  if (!request.model().empty() && request.model() != limits.model_name) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: this daemon serves ", QuoteBounded(limits.model_name, kMaxQuotedBytes),
                     ", not ", QuoteBounded(request.model(), kMaxQuotedBytes)));
  }
  if (absl::Status st = CheckJobMetadata(request.metadata()); !st.ok()) return st;
  BatchReadOptions options;
  // Bad lines are kept to be listed below (with codes when the caller asks), then refuse the job.
  options.invalid_lines = InvalidLinePolicy::kFailRequest;
  options.model = limits.check_model ? ModelPolicy::kCheck : ModelPolicy::kAccept;
  options.model_name = limits.model_name;
  options.defaults.max_tokens = limits.default_max_tokens;
  options.max_requests = limits.max_requests_per_job;
  options.max_line_bytes = limits.max_line_bytes;
  options.max_tokens_limit = limits.max_tokens_per_request;
  // Tokenizing is the last check of a line: its errors (chat roles out of order, token ids outside
  // the vocabulary, an empty prompt) are listed with the others.
  std::vector<std::vector<int32_t>> token_ids;
  options.check_line = [&](const BatchLine& line) -> absl::Status {
    if (!prepare.endpoint.empty()) {
      const std::string url(EndpointUrl(line.parsed.request->endpoint));
      if (url != prepare.endpoint) {
        return absl::InvalidArgumentError(
            absl::StrCat("url: must be ", prepare.endpoint, ", the batch's endpoint, got ", url));
      }
    }
    if (const int32_t n = line.parsed.request->sampling.n; n > limits.max_choices) {
      return absl::InvalidArgumentError(absl::StrCat(
          "body.n: ", n, " choices, more than the ", limits.max_choices,
          " this daemon runs per request (its engine decodes at most that many sequences per "
          "pass: --max-num-seqs, --max-tokens-per-pass)"));
    }
    auto ids = TokenizeRequest(*line.parsed.request, tokenizer, limits.vocab_size);
    if (!ids.ok()) return ids.status();
    if (ids->empty()) return absl::InvalidArgumentError("body.prompt: empty");
    if (token_ids.size() <= static_cast<size_t>(line.index)) token_ids.resize(line.index + 1);
    token_ids[line.index] = *std::move(ids);
    return absl::OkStatus();
  };

  absl::StatusOr<BatchInput> input = absl::InternalError("no source");
  if (request.source_case() == v1::CreateJobRequest::kRequests) {
    std::vector<std::string> lines;
    lines.reserve(request.requests().requests_size());
    for (const auto& r : request.requests().requests()) lines.push_back(ToBatchLine(r));
    input = ReadBatchLines(std::move(lines), options);
  } else {
    input = ReadBatch(request.jsonl(), options);  // "" when no source is set
  }
  if (!input.ok()) return input.status();
  if (!input->report.ok()) {
    if (prepare.line_errors != nullptr) {
      for (const BatchLineError& e : input->report.errors) {
        prepare.line_errors->push_back(
            JobLineError{e.line_number, LineErrorCode(e), e.param, e.message});
      }
    }
    return absl::InvalidArgumentError(FormatBatchErrors(input->report));
  }
  if (input->lines.empty()) return absl::InvalidArgumentError("requests: the job has no requests");

  PreparedJob job;
  for (BatchLine& line : input->lines) {
    const BatchRequest& req = *line.parsed.request;
    std::vector<int32_t>& ids = token_ids[line.index];
    const int64_t prompt_len = static_cast<int64_t>(ids.size());
    if (prompt_len >= limits.max_context_tokens) {
      job.prefailed.push_back(
          Prefail(line.index, line.parsed, job_tag,
                  absl::InvalidArgumentError(absl::StrCat(
                      "body: the prompt has ", prompt_len, " tokens; the context holds at most ",
                      limits.max_context_tokens, " tokens including the completion"))));
      continue;
    }
    if (prompt_len + req.sampling.max_tokens > limits.max_context_tokens) {
      job.prefailed.push_back(Prefail(
          line.index, line.parsed, job_tag,
          absl::InvalidArgumentError(absl::StrCat(
              "body.max_tokens: ", req.sampling.max_tokens, " plus the prompt's ", prompt_len,
              " tokens exceeds the context of ", limits.max_context_tokens, " tokens"))));
      continue;
    }
    // The n choices share the prompt's KV blocks and each adds up to max_tokens.
    job.requests.push_back(StoredRequest{
        line.index, req.custom_id, FreezeDefaults(line.text, req, limits.model_name),
        std::move(ids), prompt_len + int64_t{req.sampling.n} * req.sampling.max_tokens});
  }
  return job;
}

}  // namespace moebatch
