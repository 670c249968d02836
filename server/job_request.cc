#include "server/job_request.h"

#include <cmath>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/batch/json_depth.h"
#include "engine/batch/openai_batch.h"
#include "nlohmann/json.hpp"

namespace moebatch {
namespace {

using Json = nlohmann::json;

absl::Status LineError(int64_t line, const absl::Status& st) {
  return absl::Status(st.code(), absl::StrCat("line ", line, ": ", st.message()));
}

// The result line of a request that cannot run (validated, but too long for the context).
PrefailedRequest Prefail(int64_t index, const ParsedBatchLine& parsed, const std::string& job_tag,
                         const absl::Status& status) {
  PrefailedRequest p;
  p.index = index;
  p.custom_id = parsed.custom_id;
  p.result_line = FormatBatchError(parsed, absl::StrCat("batch_req_", job_tag, "_", index), status);
  return p;
}

// The stored line states the max_tokens this daemon applied, so the request runs the same after a
// restart with another --default-max-tokens.
std::string FreezeDefaults(const std::string& line, const BatchRequest& req) {
  Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("body") || !j["body"].is_object()) return line;
  Json& body = j["body"];
  const bool given =
      (body.contains("max_tokens") && !body["max_tokens"].is_null()) ||
      (body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null());
  if (given) return line;
  body["max_tokens"] = req.sampling.max_tokens;
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
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
  Json line = {{"custom_id", r.custom_id()}, {"method", "POST"}, {"url", url}, {"body", body}};
  return line.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<std::vector<int32_t>> TokenizeRequest(const BatchRequest& request,
                                                     const Tokenizer& tokenizer) {
  if (request.endpoint == Endpoint::kChatCompletions) {
    auto ids = tokenizer.EncodeChat(request.messages);
    if (!ids.ok()) {
      return absl::Status(ids.status().code(), absl::StrCat("body.", ids.status().message()));
    }
    return ids;
  }
  if (request.prompt_token_ids) {
    for (size_t i = 0; i < request.prompt_token_ids->size(); ++i) {
      const int32_t id = (*request.prompt_token_ids)[i];
      if (id < 0 || id >= tokenizer.vocab_size()) {
        return absl::InvalidArgumentError(absl::StrCat("body.prompt[", i, "]: token id ", id,
                                                       " is outside the vocabulary [0, ",
                                                       tokenizer.vocab_size(), ")"));
      }
    }
    return *request.prompt_token_ids;
  }
  return tokenizer.Encode(request.prompt, /*add_bos=*/true);
}

absl::StatusOr<PreparedJob> PrepareJob(const v1::CreateJobRequest& request,
                                       const Tokenizer& tokenizer, const JobLimits& limits,
                                       const std::string& job_tag) {
  if (!request.model().empty() && request.model() != limits.model_name) {
    return absl::InvalidArgumentError(absl::StrCat("model: this daemon serves '", limits.model_name,
                                                   "', not '", request.model(), "'"));
  }
  // Every request as an OpenAI batch line, with its 1-based line number for messages.
  std::vector<std::string> lines;
  if (request.source_case() == v1::CreateJobRequest::kRequests) {
    for (const auto& r : request.requests().requests()) lines.push_back(ToBatchLine(r));
  } else if (request.source_case() == v1::CreateJobRequest::kJsonl) {
    const std::string& text = request.jsonl();
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(start, end - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(std::move(line));
      start = end + 1;
    }
    // Trailing blank lines are not requests.
    while (!lines.empty() && lines.back().find_first_not_of(" \t") == std::string::npos) {
      lines.pop_back();
    }
  }
  if (lines.empty()) return absl::InvalidArgumentError("requests: the job has no requests");
  if (static_cast<int64_t>(lines.size()) > limits.max_requests_per_job) {
    return absl::InvalidArgumentError(absl::StrCat("requests: ", lines.size(),
                                                   " requests, more than the limit "
                                                   "(max_requests_per_job) of ",
                                                   limits.max_requests_per_job, " per job"));
  }

  BatchDefaults defaults;
  defaults.max_tokens = limits.default_max_tokens;
  PreparedJob job;
  std::set<std::string> seen;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int64_t line_no = static_cast<int64_t>(i) + 1;
    if (static_cast<int64_t>(lines[i].size()) > limits.max_line_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": ", lines[i].size(),
                                                     " bytes, more than the limit of ",
                                                     limits.max_line_bytes));
    }
    // FreezeDefaults re-serializes the line, which recurses once per nesting level.
    if (JsonNestsDeeperThan(lines[i], kMaxJsonDepth)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_no, ": invalid JSON: nested deeper than ", kMaxJsonDepth, " levels"));
    }
    ParsedBatchLine parsed = ParseBatchLine(lines[i], defaults);
    if (!parsed.request.ok()) return LineError(line_no, parsed.request.status());
    const BatchRequest& req = *parsed.request;
    if (limits.max_tokens_per_request > 0 &&
        req.sampling.max_tokens > limits.max_tokens_per_request) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": body.max_tokens: ", req.sampling.max_tokens,
                       " is over this daemon's limit (max_tokens_per_request) of ",
                       limits.max_tokens_per_request));
    }
    if (!seen.insert(req.custom_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": custom_id: '", req.custom_id, "' is used twice"));
    }
    if (!req.model.empty() && req.model != limits.model_name) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": body.model: this daemon serves '", limits.model_name,
                       "', not '", req.model, "'"));
    }
    auto ids = TokenizeRequest(req, tokenizer);
    if (!ids.ok()) return LineError(line_no, ids.status());
    const int64_t index = static_cast<int64_t>(i);
    const int64_t prompt_len = static_cast<int64_t>(ids->size());
    if (prompt_len == 0) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": body.prompt: empty"));
    }
    if (prompt_len >= limits.max_context_tokens) {
      job.prefailed.push_back(
          Prefail(index, parsed, job_tag,
                  absl::InvalidArgumentError(absl::StrCat(
                      "body: the prompt has ", prompt_len, " tokens; the context holds at most ",
                      limits.max_context_tokens, " tokens including the completion"))));
      continue;
    }
    if (prompt_len + req.sampling.max_tokens > limits.max_context_tokens) {
      job.prefailed.push_back(Prefail(
          index, parsed, job_tag,
          absl::InvalidArgumentError(absl::StrCat(
              "body.max_tokens: ", req.sampling.max_tokens, " plus the prompt's ", prompt_len,
              " tokens exceeds the context of ", limits.max_context_tokens, " tokens"))));
      continue;
    }
    job.requests.push_back(StoredRequest{index, req.custom_id, FreezeDefaults(lines[i], req),
                                         *std::move(ids), prompt_len + req.sampling.max_tokens});
  }
  return job;
}

}  // namespace moebatch
