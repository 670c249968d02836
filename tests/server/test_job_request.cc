// The daemon's request validation (server/job_request.h, PrepareJob): the batch front end under
// the daemon's policies (every bad line listed, blank lines skipped, line numbers as the user
// counts them), and regression tests for what fuzzing (tests/fuzz/fuzz_jsonl_request,
// fuzz_proto_request) found. The rest of PrepareJob's rules are covered end to end by
// tests/integration/test_daemon.py.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/batch/openai_batch.h"
#include "engine/text/tokenizer.h"
#include "moebatch/v1/batch.pb.h"
#include "nlohmann/json.hpp"
#include "server/job_request.h"

namespace moebatch {
namespace {

const Tokenizer& MixtralTokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    auto t = Tokenizer::Load(std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral/tokenizer.model",
                             /*bos_id=*/1, /*eos_id=*/2);
    if (!t.ok()) {
      FAIL("cannot load the Mixtral tokenizer (" << t.status().ToString()
                                                 << "); scripts/fetch_tokenizer.sh fetches it");
    }
    return *std::move(t);
  }();
  return *tokenizer;
}

JobLimits Limits() {
  JobLimits limits;
  limits.max_context_tokens = 4096;
  limits.model_name = "mixtral";
  return limits;
}

absl::StatusOr<PreparedJob> PrepareJsonl(const std::string& jsonl,
                                         const JobLimits& limits = Limits(),
                                         const PrepareOptions& options = {}) {
  v1::CreateJobRequest request;
  request.set_jsonl(jsonl);
  return PrepareJob(request, MixtralTokenizer(), limits, "test", options);
}

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST_CASE("fuzz regression: a line nested deeper than 128 levels is refused, not re-serialized") {
  // The line is valid (unknown body keys are ignored), and PrepareJob stores it with max_tokens
  // added (FreezeDefaults dumps it): dumping recursed once per level, a stack overflow.
  const std::string head =
      R"({"custom_id": "deep", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Hi", "x": )";
  auto deep = PrepareJsonl(head + Nested(300000) + "}}\n");  // 600 kB: under the line limit
  CHECK(deep.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(deep.status().message() ==
        "1 of 1 line is invalid: line 1: invalid JSON: nested deeper than 128 levels");

  // The line's object, the body and 126 arrays: at the limit, stored with max_tokens frozen.
  auto at_limit = PrepareJsonl(head + Nested(126) + "}}\n");
  INFO(at_limit.status().ToString());
  REQUIRE(at_limit.ok());
  REQUIRE(at_limit->requests.size() == 1);
  const auto stored = nlohmann::json::parse(at_limit->requests[0].line);
  CHECK(stored["body"]["max_tokens"] == 256);
  CHECK(PrepareJsonl(head + Nested(127) + "}}\n").status().message() ==
        "1 of 1 line is invalid: line 1: invalid JSON: nested deeper than 128 levels");
}

TEST_CASE(
    "fuzz regression: NaN or infinite temperature and top_p are refused, not taken as unset") {
  // ToBatchLine wrote them into the JSON line, where nlohmann writes NaN and infinities as null,
  // and null reads as "not given": the request ran with the default instead of being refused.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    float temperature;
    float top_p;
    std::string message;
  };
  for (const Case& c : {Case{nan, 1.0f, "body.temperature: must be a number, got \"NaN\""},
                        Case{inf, 1.0f, "body.temperature: must be a number, got \"Infinity\""},
                        Case{1.0f, -inf, "body.top_p: must be a number, got \"-Infinity\""}}) {
    v1::CreateJobRequest request;
    v1::BatchRequest* r = request.mutable_requests()->add_requests();
    r->set_custom_id("a");
    r->set_prompt("Hello");
    r->mutable_sampling()->set_temperature(c.temperature);
    r->mutable_sampling()->set_top_p(c.top_p);
    auto job = PrepareJob(request, MixtralTokenizer(), Limits(), "test");
    CHECK(job.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(job.status().message() ==
          "1 of 1 line is invalid: line 1 (custom_id \"a\"): " + c.message);
  }
  // Finite values still go through unchanged.
  v1::CreateJobRequest request;
  v1::BatchRequest* r = request.mutable_requests()->add_requests();
  r->set_custom_id("a");
  r->set_prompt("Hello");
  r->mutable_sampling()->set_temperature(0.25f);
  auto job = PrepareJob(request, MixtralTokenizer(), Limits(), "test");
  INFO(job.status().ToString());
  REQUIRE(job.ok());
  REQUIRE(job->requests.size() == 1);
  const ParsedBatchLine stored = ParseBatchLine(job->requests[0].line);
  REQUIRE(stored.request.ok());
  CHECK(stored.request->sampling.temperature == 0.25f);
}

std::string CompletionLine(const std::string& custom_id, const nlohmann::json& extra = {}) {
  nlohmann::json body = {{"prompt", "Hello there"}};
  if (extra.is_object()) body.update(extra);
  return nlohmann::json{
      {"custom_id", custom_id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}}
      .dump();
}

std::string ChatLine(const std::string& custom_id, const std::string& role) {
  return nlohmann::json{{"custom_id", custom_id},
                        {"method", "POST"},
                        {"url", "/v1/chat/completions"},
                        {"body", {{"messages", {{{"role", role}, {"content", "Hi"}}}}}}}
      .dump();
}

TEST_CASE("PrepareJob refuses a job listing every bad line, not only the first") {
  // Physical lines: 1 good, 2 blank, 3 bad range, 4 good, 5 not JSON, 6 whitespace, 7 duplicate,
  // 8 chat roles the tokenizer refuses, 9 another model, 10 good.
  const std::string jsonl =
      CompletionLine("a") + "\n\n" + CompletionLine("b", {{"temperature", 7000}}) + "\n" +
      CompletionLine("c") + "\n{not json\n \t\n" + CompletionLine("a") + "\n" +
      ChatLine("d", "assistant") + "\n" + CompletionLine("e", {{"model", "gpt-9"}}) + "\n" +
      CompletionLine("f") + "\n";
  JobLimits limits = Limits();
  limits.check_model = true;
  std::vector<JobLineError> errors;
  PrepareOptions options;
  options.line_errors = &errors;
  auto job = PrepareJsonl(jsonl, limits, options);
  REQUIRE(job.status().code() == absl::StatusCode::kInvalidArgument);
  // Every bad line, with its line, OpenAI code and param (the batch object's errors.data).
  REQUIRE(errors.size() == 5);
  CHECK(errors[0].line == 3);
  CHECK(errors[0].param == "body.temperature");
  CHECK(errors[0].code == "invalid_request");
  CHECK(errors[1].line == 5);
  CHECK(errors[1].code == "invalid_json_line");
  CHECK(errors[2].line == 7);
  CHECK(errors[2].code == "duplicate_custom_id");
  CHECK(errors[2].param == "custom_id");
  CHECK(errors[3].line == 8);
  CHECK(errors[4].line == 9);
  CHECK(errors[4].param == "body.model");
  const std::string message(job.status().message());
  INFO(message);
  CHECK(absl::StartsWith(
      message,
      "5 of 8 lines are invalid: line 3 (custom_id \"b\"): body.temperature: must be in [0, 100], "
      "got 7000; line 5: invalid JSON: "));
  CHECK(absl::StrContains(message,
                          "; line 7 (custom_id \"a\"): custom_id: duplicate, first used on line 1; "
                          "line 8 (custom_id \"d\"): body.messages"));
  CHECK(absl::EndsWith(message,
                       "; line 9 (custom_id \"e\"): body.model: this server runs \"mixtral\", got "
                       "\"gpt-9\""));
}

TEST_CASE("PrepareJob skips blank lines inside the payload; indices count requests") {
  PreparedJob job;
  {
    JobLimits limits = Limits();
    limits.max_context_tokens = 64;
    v1::CreateJobRequest request;
    // The second request's prompt is longer than the context: a prefailed request; the job runs.
    std::string long_prompt;
    for (int i = 0; i < 100; ++i) long_prompt += "word ";
    request.set_jsonl("\n" + CompletionLine("a", {{"max_tokens", 4}}) + "\r\n   \n" +
                      CompletionLine("long", {{"prompt", long_prompt}}) + "\n\n" +
                      CompletionLine("c", {{"max_tokens", 4}}) + "\n\n");
    auto prepared = PrepareJob(request, MixtralTokenizer(), limits, "t");
    INFO(prepared.status().ToString());
    REQUIRE(prepared.ok());
    job = *std::move(prepared);
  }
  REQUIRE(job.requests.size() == 2);
  REQUIRE(job.prefailed.size() == 1);
  CHECK(job.requests[0].index == 0);
  CHECK(job.requests[0].custom_id == "a");
  CHECK(job.prefailed[0].index == 1);
  CHECK(job.prefailed[0].custom_id == "long");
  CHECK(absl::StrContains(job.prefailed[0].result_line, "batch_req_t_1"));
  CHECK(job.requests[1].index == 2);
  CHECK(job.requests[1].custom_id == "c");
  CHECK(job.requests[1].budget_tokens ==
        static_cast<int64_t>(job.requests[1].prompt_token_ids.size()) + 4);
}

TEST_CASE("PrepareJob: whole-job refusals") {
  CHECK(PrepareJsonl("").status().message() == "requests: the job has no requests");
  CHECK(PrepareJsonl("\n  \n\r\n").status().message() == "requests: the job has no requests");
  CHECK(PrepareJob(v1::CreateJobRequest(), MixtralTokenizer(), Limits(), "t").status().message() ==
        "requests: the job has no requests");

  JobLimits limits = Limits();
  limits.max_requests_per_job = 2;
  v1::CreateJobRequest three;
  three.set_jsonl(CompletionLine("a") + "\n" + CompletionLine("b") + "\n\n" +
                  CompletionLine("{bad") + "\n");
  CHECK(PrepareJob(three, MixtralTokenizer(), limits, "t").status().message() ==
        "requests: 3 requests, more than the limit (max_requests_per_job) of 2 per job");

  // CreateJob.model, quoted and bounded whatever its length.
  v1::CreateJobRequest other_model;
  other_model.set_jsonl(CompletionLine("a"));
  other_model.set_model(std::string(100000, 'm'));
  auto refused = PrepareJob(other_model, MixtralTokenizer(), Limits(), "t");
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(
      absl::StartsWith(refused.status().message(), "model: this daemon serves \"mixtral\", not "));
  CHECK(refused.status().message().size() < 300);
}

TEST_CASE("PrepareJob: inline requests are numbered by position; limits name themselves") {
  JobLimits limits = Limits();
  limits.max_tokens_per_request = 16;
  v1::CreateJobRequest request;
  for (const char* id : {"ok", "big", "ok"}) {
    v1::BatchRequest* r = request.mutable_requests()->add_requests();
    r->set_custom_id(id);
    r->set_prompt("Hello");
    r->mutable_sampling()->set_max_tokens(std::string(id) == "big" ? 17 : 8);
  }
  v1::BatchRequest* empty = request.mutable_requests()->add_requests();
  empty->set_custom_id("empty");
  empty->mutable_prompt_token_ids();  // an empty list of ids: an empty prompt
  auto job = PrepareJob(request, MixtralTokenizer(), limits, "t");
  CHECK(job.status().message() ==
        "3 of 4 lines are invalid: line 2 (custom_id \"big\"): body.max_tokens: 17 is over the "
        "limit (max_tokens_per_request) of 16; line 3 (custom_id \"ok\"): custom_id: duplicate, "
        "first used on line 1; line 4 (custom_id \"empty\"): body.prompt: must not be an empty "
        "array");
}

TEST_CASE("PrepareJob: a 300 KB custom_id and 1,000 bad lines give a bounded message") {
  const std::string huge_id(300 * 1000, 'q');
  auto dup = PrepareJsonl(CompletionLine(huge_id) + "\n" + CompletionLine(huge_id) + "\n");
  REQUIRE(dup.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(dup.status().message().size() < 1024);
  CHECK(absl::StrContains(dup.status().message(), "line 2 (custom_id \"qqqq"));

  std::string many;
  for (int i = 0; i < 1000; ++i) {
    many += CompletionLine(absl::StrCat("r", i), {{"top_p", 5}}) + "\n";
  }
  auto refused = PrepareJsonl(many);
  REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(refused.status().message());
  CHECK(message.size() < 8 * 1024);
  CHECK(absl::StartsWith(message,
                         "1000 of 1000 lines are invalid: line 1 (custom_id \"r0\"): "
                         "body.top_p: must be in (0, 1], got 5"));
  CHECK(absl::EndsWith(message, "; and 980 more"));
}

TEST_CASE("PrepareJob accepts any body.model by default and stores the daemon's model name") {
  const std::string jsonl =
      CompletionLine("a", {{"model", "gpt-4o-mini"}}) + "\n" + CompletionLine("b") + "\n";
  auto job = PrepareJsonl(jsonl);
  INFO(job.status().ToString());
  REQUIRE(job.ok());
  REQUIRE(job->requests.size() == 2);
  for (const StoredRequest& r : job->requests) {
    const ParsedBatchLine stored = ParseBatchLine(r.line);
    REQUIRE(stored.request.ok());
    CHECK(stored.request->model == Limits().model_name);
  }
}

TEST_CASE("PrepareJob with an endpoint refuses lines of the other url, naming url") {
  const std::string jsonl = CompletionLine("a") + "\n" + ChatLine("b", "user") + "\n";
  std::vector<JobLineError> errors;
  PrepareOptions options;
  options.endpoint = "/v1/chat/completions";
  options.line_errors = &errors;
  auto job = PrepareJsonl(jsonl, Limits(), options);
  REQUIRE(job.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].line == 1);
  CHECK(errors[0].param == "url");
  CHECK(errors[0].code == "invalid_url");
  options.endpoint = "";
  CHECK(PrepareJsonl(jsonl, Limits(), options).ok());
}

TEST_CASE("PrepareJob stores a /v1/responses line with max_output_tokens frozen, chat-encoded") {
  const std::string line =
      R"({"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": {"input": "Hi", "instructions": "Be brief."}})";
  PrepareOptions options;
  options.endpoint = "/v1/responses";
  auto job = PrepareJsonl(line + "\n", Limits(), options);
  INFO(job.status().ToString());
  REQUIRE(job.ok());
  REQUIRE(job->requests.size() == 1);
  const auto stored = nlohmann::json::parse(job->requests[0].line);
  CHECK(stored["body"]["max_output_tokens"] == 256);
  CHECK_FALSE(stored["body"].contains("max_tokens"));
  // The stored line parses back (as the engine worker reads it) to the same request.
  const ParsedBatchLine again = ParseBatchLine(job->requests[0].line);
  REQUIRE(again.request.ok());
  CHECK(again.request->endpoint == Endpoint::kResponses);
  CHECK(again.request->sampling.max_tokens == 256);
  // Its prompt is the chat encoding of the same messages.
  auto chat = MixtralTokenizer().EncodeChat({{"system", "Be brief."}, {"user", "Hi"}});
  REQUIRE(chat.ok());
  CHECK(job->requests[0].prompt_token_ids == *chat);
  // A conversation the chat layout refuses names body.input.
  const std::string bad =
      R"({"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": {"input": [{"role": "assistant", "content": "Hi"}]}})";
  std::vector<JobLineError> errors;
  options.line_errors = &errors;
  CHECK_FALSE(PrepareJsonl(bad + "\n", Limits(), options).ok());
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].param == "body.input");
}

// An inline chat request of one user message, added to `request`.
v1::BatchRequest* AddUserChat(v1::CreateJobRequest* request, const std::string& custom_id,
                              const std::string& content) {
  v1::BatchRequest* chat = request->mutable_requests()->add_requests();
  chat->set_custom_id(custom_id);
  v1::ChatMessage* m = chat->mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content(content);
  return chat;
}

TEST_CASE("PrepareJob: n, logprobs and top_logprobs from inline requests; n in the KV budget") {
  v1::CreateJobRequest request;
  v1::BatchRequest* chat = AddUserChat(&request, "chat", "Hi");
  chat->mutable_sampling()->set_n(3);
  chat->mutable_sampling()->set_max_tokens(10);
  chat->mutable_sampling()->set_logprobs(true);
  chat->mutable_sampling()->set_top_logprobs(4);
  v1::BatchRequest* completion = request.mutable_requests()->add_requests();
  completion->set_custom_id("completion");
  completion->set_prompt("Once");
  completion->mutable_sampling()->set_max_tokens(5);
  completion->mutable_sampling()->set_logprobs(true);
  completion->mutable_sampling()->set_top_logprobs(2);
  auto job = PrepareJob(request, MixtralTokenizer(), Limits(), "test");
  INFO(job.status().ToString());
  REQUIRE(job.ok());
  REQUIRE(job->requests.size() == 2);
  const auto chat_line = nlohmann::json::parse(job->requests[0].line);
  CHECK(chat_line["body"]["n"] == 3);
  CHECK(chat_line["body"]["logprobs"] == true);
  CHECK(chat_line["body"]["top_logprobs"] == 4);
  const int64_t prompt = static_cast<int64_t>(job->requests[0].prompt_token_ids.size());
  CHECK(job->requests[0].budget_tokens == prompt + 3 * 10);
  // /v1/completions takes logprobs as the number of most likely tokens.
  const auto completion_line = nlohmann::json::parse(job->requests[1].line);
  CHECK(completion_line["body"]["logprobs"] == 2);
  CHECK_FALSE(completion_line["body"].contains("top_logprobs"));

  // n above the daemon's engine limit: the line is refused, naming body.n.
  JobLimits narrow = Limits();
  narrow.max_choices = 2;
  auto refused = PrepareJob(request, MixtralTokenizer(), narrow, "test");
  REQUIRE_FALSE(refused.ok());
  CHECK(absl::StrContains(refused.status().message(), "line 1 (custom_id \"chat\"): body.n: 3"));
}

TEST_CASE("PrepareJob: an inline chat request's response_format is its body's; JSON mode") {
  v1::CreateJobRequest request;
  v1::BatchRequest* chat = AddUserChat(&request, "json", "Give me JSON");
  chat->mutable_sampling()->set_response_format("json_object");
  auto job = PrepareJob(request, MixtralTokenizer(), Limits(), "test");
  INFO(job.status().ToString());
  REQUIRE(job.ok());
  const auto line = nlohmann::json::parse(job->requests[0].line);
  CHECK(line["body"]["response_format"] == nlohmann::json({{"type", "json_object"}}));
  const ParsedBatchLine parsed = ParseBatchLine(job->requests[0].line);
  REQUIRE(parsed.request.ok());
  CHECK(parsed.request->sampling.json_object);

  chat->mutable_sampling()->set_response_format("xml");
  auto refused = PrepareJob(request, MixtralTokenizer(), Limits(), "test");
  REQUIRE_FALSE(refused.ok());
  CHECK(absl::StrContains(refused.status().message(),
                          "line 1 (custom_id \"json\"): body.response_format.type: must be"));
}

}  // namespace
}  // namespace moebatch
