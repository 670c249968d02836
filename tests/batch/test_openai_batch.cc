// OpenAI batch JSONL input lines: parsing and validation (engine/batch/openai_batch.h), each
// endpoint's fields and every error naming its field. The output lines:
// test_openai_batch_output.cc.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "engine/batch/openai_batch.h"
#include "tests/batch/openai_batch_lines.h"

namespace moebatch {
namespace {

using json = nlohmann::json;
using test_lines::ChatLine;
using test_lines::CompletionLine;
using test_lines::Line;
using test_lines::ParseOk;
using test_lines::ResponsesLine;

TEST_CASE("A chat line with every field parses to the request") {
  const std::string line = R"({"custom_id": "job-7", "method": "POST",
      "url": "/v1/chat/completions",
      "body": {"model": "mixtral-8x7b", "messages": [
                 {"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Hello"},
                 {"role": "assistant", "content": "Hi."},
                 {"role": "user", "content": "Bye"}],
               "max_tokens": 32, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
               "seed": 1234, "stop": ["\n\n", "END"], "n": 1, "ignore_eos": true,
               "presence_penalty": 0.1, "response_format": {"type": "text"}}})";
  const BatchRequest r = ParseOk(line);
  CHECK(r.custom_id == "job-7");
  CHECK(r.endpoint == Endpoint::kChatCompletions);
  CHECK(r.model == "mixtral-8x7b");
  REQUIRE(r.messages.size() == 4);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[0].content == "Be brief.");
  CHECK(r.messages[2].role == "assistant");
  CHECK(r.messages[3].content == "Bye");
  CHECK(r.prompt.empty());
  CHECK_FALSE(r.prompt_token_ids.has_value());
  CHECK(r.sampling.max_tokens == 32);
  CHECK(r.sampling.temperature == 0.5f);
  CHECK(r.sampling.top_p == 0.9f);
  CHECK(r.sampling.top_k == 40);
  REQUIRE(r.sampling.seed.has_value());
  CHECK(*r.sampling.seed == 1234u);
  CHECK(r.sampling.stop == std::vector<std::string>{"\n\n", "END"});
  CHECK(r.sampling.ignore_eos);
}

TEST_CASE("Defaults apply when the body gives no sampling fields") {
  const std::string line =
      R"({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
          "body": {"messages": [{"role": "user", "content": "Hi"}]}})";
  const BatchRequest r = ParseOk(line);
  CHECK(r.model.empty());
  CHECK(r.sampling.max_tokens == 256);
  CHECK(r.sampling.temperature == 1.0f);
  CHECK(r.sampling.top_p == 1.0f);
  CHECK(r.sampling.top_k == 0);
  CHECK_FALSE(r.sampling.seed.has_value());
  CHECK(r.sampling.stop.empty());
  CHECK_FALSE(r.sampling.ignore_eos);

  BatchDefaults defaults;
  defaults.max_tokens = 17;
  CHECK(ParseOk(line, defaults).sampling.max_tokens == 17);
}

TEST_CASE("Explicit nulls count as unset") {
  const BatchRequest r = ParseOk(ChatLine({{"max_tokens", nullptr},
                                           {"temperature", nullptr},
                                           {"seed", nullptr},
                                           {"stop", nullptr},
                                           {"n", nullptr},
                                           {"model", nullptr}}));
  CHECK(r.sampling.max_tokens == 256);
  CHECK(r.sampling.temperature == 1.0f);
  CHECK_FALSE(r.sampling.seed.has_value());
  CHECK(r.sampling.stop.empty());
  CHECK(r.model.empty());
}

TEST_CASE("Chat content may be an array of text parts") {
  const BatchRequest r = ParseOk(ChatLine(
      {{"messages",
        {{{"role", "user"},
          {"content",
           {{{"type", "text"}, {"text", "first"}}, {{"type", "text"}, {"text", "second"}}}}}}}}));
  REQUIRE(r.messages.size() == 1);
  CHECK(r.messages[0].content == "first\nsecond");
}

TEST_CASE("max_completion_tokens is an alias of max_tokens") {
  CHECK(ParseOk(ChatLine({{"max_completion_tokens", 12}})).sampling.max_tokens == 12);
  CHECK(
      ParseOk(ChatLine({{"max_tokens", 12}, {"max_completion_tokens", 12}})).sampling.max_tokens ==
      12);
  ParsedBatchLine both =
      ParseBatchLine(ChatLine({{"max_tokens", 12}, {"max_completion_tokens", 13}}));
  REQUIRE_FALSE(both.request.ok());
  CHECK(both.request.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StartsWith(both.request.status().message(), "body.max_completion_tokens: "));
  ParsedBatchLine zero = ParseBatchLine(ChatLine({{"max_completion_tokens", 0}}));
  REQUIRE_FALSE(zero.request.ok());
  CHECK(absl::StartsWith(zero.request.status().message(), "body.max_completion_tokens: "));
}

TEST_CASE("Completion prompts: string, token ids, one-element arrays") {
  SECTION("string") {
    const BatchRequest r = ParseOk(CompletionLine({{"max_tokens", 5}, {"temperature", 0}}));
    CHECK(r.endpoint == Endpoint::kCompletions);
    CHECK(r.model == "mixtral");
    CHECK(r.prompt == "Once upon a time");
    CHECK_FALSE(r.prompt_token_ids.has_value());
    CHECK(r.messages.empty());
    CHECK(r.sampling.max_tokens == 5);
    CHECK(r.sampling.temperature == 0.0f);
  }
  SECTION("token ids") {
    const BatchRequest r = ParseOk(CompletionLine({{"prompt", {1, 415, 2936, 0}}}));
    REQUIRE(r.prompt_token_ids.has_value());
    CHECK(*r.prompt_token_ids == std::vector<int32_t>{1, 415, 2936, 0});
    CHECK(r.prompt.empty());
  }
  SECTION("one-element array of string") {
    const BatchRequest r = ParseOk(CompletionLine({{"prompt", {"Hello"}}}));
    CHECK(r.prompt == "Hello");
    CHECK_FALSE(r.prompt_token_ids.has_value());
  }
  SECTION("one-element array of token ids") {
    const BatchRequest r =
        ParseOk(CompletionLine({{"prompt", json::array({json::array({1, 2})})}}));
    REQUIRE(r.prompt_token_ids.has_value());
    CHECK(*r.prompt_token_ids == std::vector<int32_t>{1, 2});
  }
}

struct BadLine {
  std::string line;
  std::string path;  // the message must start with "<path>: "
};

TEST_CASE("Every validation error is InvalidArgument naming its field") {
  const json user = {{"role", "user"}, {"content", "Hi"}};
  const std::vector<BadLine> cases = {
      // Envelope.
      {R"({"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})", "custom_id"},
      {R"({"custom_id": "", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})",
       "custom_id"},
      {R"({"custom_id": 7, "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})",
       "custom_id"},
      {R"({"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {"prompt": "x"}})",
       "method"},
      {R"({"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "x"}})", "method"},
      {R"({"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"prompt": "x"}})",
       "url"},
      {R"({"custom_id": "a", "method": "POST", "body": {"prompt": "x"}})", "url"},
      {R"({"custom_id": "a", "method": "POST", "url": "/v1/completions"})", "body"},
      {R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": [1]})", "body"},
      // Chat messages.
      {Line({{"model", "m"}}), "body.messages"},
      {Line({{"messages", json::array()}}), "body.messages"},
      {Line({{"messages", "Hi"}}), "body.messages"},
      {Line({{"messages", {user, "oops"}}}), "body.messages[1]"},
      {Line({{"messages", {user, {{"role", "tool"}, {"content", "x"}}}}}), "body.messages[1].role"},
      {Line({{"messages", {user, {{"content", "x"}}}}}), "body.messages[1].role"},
      {Line({{"messages", {{{"role", "user"}}}}}), "body.messages[0].content"},
      {Line({{"messages", {{{"role", "user"}, {"content", 5}}}}}), "body.messages[0].content"},
      {Line({{"messages",
              {{{"role", "user"},
                {"content",
                 {{{"type", "text"}, {"text", "a"}},
                  {{"type", "image_url"}, {"image_url", {{"url", "x"}}}}}}}}}}),
       "body.messages[0].content[1].type"},
      {Line({{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", 3}}}}}}}}),
       "body.messages[0].content[0].text"},
      // Completion prompts.
      {Line({{"model", "m"}}, "/v1/completions"), "body.prompt"},
      {CompletionLine({{"prompt", 42}}), "body.prompt"},
      {CompletionLine({{"prompt", json::array()}}), "body.prompt"},
      {CompletionLine({{"prompt", {"one", "two"}}}), "body.prompt"},
      {CompletionLine({{"prompt", {1, -2}}}), "body.prompt[1]"},
      {CompletionLine({{"prompt", {1, 2.5}}}), "body.prompt[1]"},
      {CompletionLine({{"prompt", {1, "x"}}}), "body.prompt[1]"},
      {CompletionLine({{"prompt", {1, 4294967296LL}}}), "body.prompt[1]"},
      // Sampling.
      {ChatLine({{"model", 3}}), "body.model"},
      {ChatLine({{"max_tokens", "10"}}), "body.max_tokens"},
      {ChatLine({{"max_tokens", 0}}), "body.max_tokens"},
      {ChatLine({{"max_tokens", 1.5}}), "body.max_tokens"},
      {ChatLine({{"max_tokens", 4294967296LL}}), "body.max_tokens"},
      {ChatLine({{"max_completion_tokens", true}}), "body.max_completion_tokens"},
      {ChatLine({{"temperature", -0.5}}), "body.temperature"},
      {ChatLine({{"temperature", 7e3}}), "body.temperature"},
      {ChatLine({{"temperature", "hot"}}), "body.temperature"},
      {ChatLine({{"top_p", 0}}), "body.top_p"},
      {ChatLine({{"top_p", 1.5}}), "body.top_p"},
      {ChatLine({{"top_p", false}}), "body.top_p"},
      {ChatLine({{"top_k", -1}}), "body.top_k"},
      {ChatLine({{"top_k", 2.5}}), "body.top_k"},
      {ChatLine({{"seed", -1}}), "body.seed"},
      {ChatLine({{"seed", 1.5}}), "body.seed"},
      {ChatLine({{"seed", "42"}}), "body.seed"},
      {ChatLine({{"stop", 3}}), "body.stop"},
      {ChatLine({{"stop", ""}}), "body.stop"},
      {ChatLine({{"stop", {"a", "b", "c", "d", "e"}}}), "body.stop"},
      {ChatLine({{"stop", {"a", ""}}}), "body.stop[1]"},
      {ChatLine({{"stop", {"a", 2}}}), "body.stop[1]"},
      {ChatLine({{"n", 0}}), "body.n"},
      {ChatLine({{"n", 17}}), "body.n"},
      {ChatLine({{"n", "1"}}), "body.n"},
      {ChatLine({{"n", 1.5}}), "body.n"},
      {ChatLine({{"logprobs", 1}}), "body.logprobs"},
      {ChatLine({{"top_logprobs", 3}}), "body.top_logprobs"},  // without logprobs: true
      {ChatLine({{"logprobs", false}, {"top_logprobs", 3}}), "body.top_logprobs"},
      {ChatLine({{"logprobs", true}, {"top_logprobs", 21}}), "body.top_logprobs"},
      {ChatLine({{"logprobs", true}, {"top_logprobs", -1}}), "body.top_logprobs"},
      {ChatLine({{"logprobs", true}, {"top_logprobs", "2"}}), "body.top_logprobs"},
      {CompletionLine({{"logprobs", 6}}), "body.logprobs"},
      {CompletionLine({{"logprobs", -1}}), "body.logprobs"},
      {CompletionLine({{"logprobs", true}}), "body.logprobs"},
      {CompletionLine({{"logprobs", 2}, {"top_logprobs", 2}}), "body.top_logprobs"},
      {ChatLine({{"ignore_eos", 1}}), "body.ignore_eos"},
      {CompletionLine({{"temperature", 101}}), "body.temperature"},
  };
  for (const BadLine& c : cases) {
    INFO(c.line);
    ParsedBatchLine parsed = ParseBatchLine(c.line);
    CHECK(parsed.json_ok);
    REQUIRE_FALSE(parsed.request.ok());
    INFO(parsed.request.status().message());
    CHECK(parsed.request.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(parsed.request.status().message(), c.path + ": "));
  }
}

TEST_CASE("The url and method errors say what is allowed") {
  ParsedBatchLine url = ParseBatchLine(
      R"({"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}})");
  CHECK(url.request.status().message() ==
        "url: must be /v1/chat/completions, /v1/completions or /v1/responses, got "
        "\"/v1/embeddings\"");
  ParsedBatchLine n = ParseBatchLine(ChatLine({{"n", 17}}));
  CHECK(n.request.status().message() == "body.n: must be in [1, 16], got 17");
  ParsedBatchLine top = ParseBatchLine(ChatLine({{"top_logprobs", 3}}));
  CHECK(top.request.status().message() ==
        "body.top_logprobs: needs body.logprobs to be true, got 3");
  ParsedBatchLine legacy = ParseBatchLine(CompletionLine({{"logprobs", 6}}));
  CHECK(legacy.request.status().message() == "body.logprobs: must be an integer in [0, 5], got 6");
}

TEST_CASE("A line that is not a JSON object gives json_ok=false and an invalid_json error") {
  const std::vector<std::string> lines = {"not json", "",         "{\"custom_id\": \"a\",",
                                          "[1, 2]",   "\"text\"", "{\"custom_id\": \"\xff\"}"};
  for (const std::string& text : lines) {
    INFO(text);
    ParsedBatchLine parsed = ParseBatchLine(text);
    CHECK_FALSE(parsed.json_ok);
    CHECK(parsed.custom_id.empty());
    REQUIRE_FALSE(parsed.request.ok());
    CHECK(parsed.request.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(parsed.request.status().message(), "invalid JSON: "));

    const std::string out = FormatBatchError(parsed, "batch_req_9", parsed.request.status());
    CHECK(out.find('\n') == std::string::npos);
    const json j = json::parse(out);
    CHECK(j["id"] == "batch_req_9");
    CHECK(j["custom_id"].is_null());
    CHECK(j["response"].is_null());
    CHECK(j["error"]["code"] == "invalid_json");
    CHECK(j["error"]["message"] == std::string(parsed.request.status().message()));
  }
  // The parser's message quotes the bad byte; the status carries it as U+FFFD.
  ParsedBatchLine bad_utf8 = ParseBatchLine("{\"custom_id\": \"\xff\"}");
  CHECK(absl::StrContains(bad_utf8.request.status().message(), "\xEF\xBF\xBD"));
  CHECK_FALSE(absl::StrContains(bad_utf8.request.status().message(), "\xff"));
}

TEST_CASE("Deeply nested input does not crash the parser") {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  ParsedBatchLine parsed = ParseBatchLine(deep);
  CHECK_FALSE(parsed.json_ok);
  const std::string nested_body =
      R"({"custom_id": "deep", "method": "POST", "url": "/v1/completions", "body": {"x": )" + deep +
      "}}";
  ParsedBatchLine in_body = ParseBatchLine(nested_body);
  CHECK(in_body.json_ok);
  CHECK(in_body.custom_id == "deep");
  CHECK_FALSE(in_body.request.ok());
  // A deeply nested value in a known key is named by its type, not dumped.
  ParsedBatchLine as_value = ParseBatchLine(
      R"({"custom_id": "deep", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x",
          "temperature": )" +
      deep + "}}");
  REQUIRE_FALSE(as_value.request.ok());
  CHECK(as_value.request.status().message() == "body.temperature: must be a number, got an array");
}

TEST_CASE("fuzz regression: a number beyond double's range is invalid JSON, not a server error") {
  // nlohmann's parser throws out_of_range (not parse_error) for 1e400: it escaped to the catch-all
  // and became INTERNAL ("parsing the line failed"), a 500 line, and a job-level INTERNAL error.
  for (const std::string number : {"1e400", "-1e400"}) {
    ParsedBatchLine parsed = ParseBatchLine(
        R"({"custom_id": "big", "method": "POST", "url": "/v1/completions",
            "body": {"prompt": "x", "temperature": )" +
        number + "}}");
    INFO(parsed.request.status().ToString());
    CHECK_FALSE(parsed.json_ok);
    CHECK(parsed.request.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(parsed.request.status().message() ==
          "invalid JSON: number overflow parsing '" + number + "'");
  }
}

TEST_CASE("fuzz regression: a deeply nested value where a string is expected is not copied") {
  // The error for a missing or mistyped custom_id, method, url, body, role or content part copied
  // the offending value (a conditional expression with json()), and copying recurses once per
  // level: a stack overflow for this line, found by fuzzing (tests/fuzz).
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  std::string deep_object;
  for (int i = 0; i < 500000; ++i) deep_object += R"({"a":)";
  deep_object += "1" + std::string(500000, '}');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"custom_id": )" + deep + "}", "custom_id: must be a non-empty string, got an array"},
      {R"({"custom_id": "d", "method": )" + deep + "}", "method: must be POST, got an array"},
      {R"({"custom_id": "d", "method": "POST", "url": )" + deep + "}",
       "url: must be /v1/chat/completions, /v1/completions or /v1/responses, got an array"},
      {R"({"custom_id": "d", "method": "POST", "url": "/v1/completions", "body": )" + deep + "}",
       "body: must be an object, got an array"},
      {R"({"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body":
          {"messages": )" +
           deep_object + "}}",
       "body.messages: must be a non-empty array, got an object"},
      {R"({"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body":
          {"messages": [{"role": )" +
           deep + "}]}}",
       "body.messages[0].role: must be one of system, user, assistant, got an array"},
      {R"({"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body":
          {"messages": [{"role": "user", "content": [{"type": )" +
           deep + "}]}]}}",
       "body.messages[0].content[0].type: only \"text\" parts are supported, got an array"},
      {R"({"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body":
          {"messages": [{"role": "user", "content": [{"type": "text", "text": )" +
           deep + "}]}]}}",
       "body.messages[0].content[0].text: must be a string, got an array"},
  };
  for (const auto& [line, message] : cases) {
    INFO(message);
    ParsedBatchLine parsed = ParseBatchLine(line);
    CHECK(parsed.json_ok);
    REQUIRE_FALSE(parsed.request.ok());
    CHECK(parsed.request.status().message() == message);
  }
}

TEST_CASE("n, logprobs and top_logprobs parse per endpoint") {
  BatchRequest chat = ParseOk(ChatLine({{"n", 3}, {"logprobs", true}, {"top_logprobs", 20}}));
  CHECK(chat.sampling.n == 3);
  CHECK(chat.sampling.logprobs);
  CHECK(chat.sampling.top_logprobs == 20);
  chat = ParseOk(ChatLine({{"logprobs", true}}));
  CHECK(chat.sampling.logprobs);
  CHECK(chat.sampling.top_logprobs == 0);
  chat = ParseOk(ChatLine({{"logprobs", nullptr}, {"top_logprobs", nullptr}, {"n", nullptr}}));
  CHECK_FALSE(chat.sampling.logprobs);
  CHECK(chat.sampling.n == 1);
  // /v1/completions: an integer, the number of most likely tokens; 0 still gives the sampled one's.
  BatchRequest completion = ParseOk(CompletionLine({{"logprobs", 5}, {"n", 16}}));
  CHECK(completion.sampling.logprobs);
  CHECK(completion.sampling.top_logprobs == 5);
  CHECK(completion.sampling.n == 16);
  completion = ParseOk(CompletionLine({{"logprobs", 0}}));
  CHECK(completion.sampling.logprobs);
  CHECK(completion.sampling.top_logprobs == 0);
  CHECK_FALSE(ParseOk(CompletionLine({})).sampling.logprobs);
}

TEST_CASE("A /v1/responses line: input as a string or message items, instructions first") {
  SECTION("a string is one user message; max_output_tokens is the output limit") {
    const BatchRequest r = ParseOk(ResponsesLine(
        {{"max_output_tokens", 12}, {"temperature", 0.25}, {"top_p", 0.5}, {"seed", 3}}));
    CHECK(r.endpoint == Endpoint::kResponses);
    CHECK(TakesMessages(r.endpoint));
    CHECK(EndpointUrl(r.endpoint) == "/v1/responses");
    REQUIRE(r.messages.size() == 1);
    CHECK(r.messages[0].role == "user");
    CHECK(r.messages[0].content == "Hi");
    CHECK_FALSE(r.instructions.has_value());
    CHECK(r.sampling.max_tokens == 12);
    CHECK(r.sampling.temperature == 0.25f);
    CHECK(r.sampling.top_p == 0.5f);
    CHECK(r.sampling.seed == 3u);
    CHECK(r.sampling.n == 1);
    CHECK_FALSE(r.sampling.logprobs);
  }
  SECTION("items: developer is system, joined with the instructions; text parts joined") {
    const BatchRequest r = ParseOk(ResponsesLine(
        {{"instructions", "Be brief."},
         {"input",
          {{{"role", "developer"}, {"content", "Answer in French."}},
           {{"type", "message"},
            {"role", "user"},
            {"content",
             {{{"type", "input_text"}, {"text", "Hello"}},
              {{"type", "input_text"}, {"text", "there"}}}}},
           {{"role", "assistant"}, {"content", {{{"type", "output_text"}, {"text", "Bonjour."}}}}},
           {{"role", "user"}, {"content", "Bye"}}}}}));
    REQUIRE(r.messages.size() == 4);
    CHECK(r.messages[0].role == "system");
    CHECK(r.messages[0].content == "Be brief.\n\nAnswer in French.");
    CHECK(r.messages[1].role == "user");
    CHECK(r.messages[1].content == "Hello\nthere");
    CHECK(r.messages[2].role == "assistant");
    CHECK(r.messages[2].content == "Bonjour.");
    CHECK(r.messages[3].content == "Bye");
    CHECK(r.instructions == std::optional<std::string>("Be brief."));
    CHECK(r.sampling.max_tokens == BatchDefaults().max_tokens);
  }
  SECTION("include and top_logprobs ask for the output text's log-probabilities") {
    const BatchRequest inc = ParseOk(ResponsesLine(
        {{"include", {"reasoning.encrypted_content", "message.output_text.logprobs"}}}));
    CHECK(inc.sampling.logprobs);
    CHECK(inc.sampling.top_logprobs == 0);
    const BatchRequest top = ParseOk(ResponsesLine({{"top_logprobs", 3}}));
    CHECK(top.sampling.logprobs);
    CHECK(top.sampling.top_logprobs == 3);
    CHECK_FALSE(ParseOk(ResponsesLine({{"include", json::array()}})).sampling.logprobs);
  }
}

TEST_CASE("/v1/responses refuses what it does not have, naming the field") {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"input", nullptr}}, "body.input: required"},
      {{{"input", json::array()}},
       "body.input: must be a string or a non-empty array of message items, got an array"},
      {{{"input", 5}}, "body.input: must be a string or a non-empty array of message items, got 5"},
      {{{"input", {{{"type", "function_call_output"}, {"call_id", "c"}, {"output", "x"}}}}},
       "body.input[0].type: only message items are supported (\"message\"), got "
       "\"function_call_output\""},
      {{{"input", {{{"role", "tool"}, {"content", "x"}}}}},
       "body.input[0].role: must be one of user, assistant, system, developer, got \"tool\""},
      {{{"input", {{{"role", "user"}}}}}, "body.input[0].content: required"},
      {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}}}},
       "body.input[0].content[0].type: only \"input_text\" and \"output_text\" parts are "
       "supported, got \"input_image\""},
      {{{"instructions", 1}}, "body.instructions: must be a string, got 1"},
      {{{"max_tokens", 5}},
       "body.max_tokens: is not a /v1/responses field; use "
       "body.max_output_tokens, got 5"},
      {{{"max_completion_tokens", 5}},
       "body.max_completion_tokens: is not a /v1/responses "
       "field; use body.max_output_tokens, got 5"},
      {{{"messages", json::array()}},
       "body.messages: is not a /v1/responses field; use body.input, got an array"},
      {{{"n", 2}}, "body.n: is not a /v1/responses field (one output per response), got 2"},
      {{{"logprobs", true}},
       "body.logprobs: is not a /v1/responses field; use body.top_logprobs or body.include "
       "[\"message.output_text.logprobs\"], got true"},
      {{{"previous_response_id", "resp_1"}},
       "body.previous_response_id: is not supported: moebatchd stores no responses; send the "
       "whole conversation in body.input, got \"resp_1\""},
      {{{"max_output_tokens", 0}}, "body.max_output_tokens: must be >= 1, got 0"},
      {{{"max_output_tokens", 1.5}}, "body.max_output_tokens: must be a 32-bit integer, got 1.5"},
      {{{"top_logprobs", 21}}, "body.top_logprobs: must be in [0, 20], got 21"},
      {{{"include", "message.output_text.logprobs"}},
       "body.include: must be an array of strings, got \"message.output_text.logprobs\""},
      {{{"include", {7}}}, "body.include[0]: must be a string, got 7"},
  };
  for (const auto& [extra, message] : cases) {
    const ParsedBatchLine parsed = ParseBatchLine(ResponsesLine(extra));
    INFO(extra.dump());
    REQUIRE(parsed.json_ok);
    REQUIRE_FALSE(parsed.request.ok());
    CHECK(parsed.request.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(parsed.request.status().message() == message);
    CHECK(ErrorParam(std::string(parsed.request.status().message())) ==
          message.substr(0, message.find(':')));
  }
  // Chat's n and max_tokens mean what they did there.
  CHECK(ParseOk(ChatLine({{"n", 2}})).sampling.n == 2);
}

TEST_CASE("Output formats: text, or JSON mode; a JSON schema is refused, naming the field") {
  CHECK_FALSE(ParseOk(ChatLine({{"response_format", {{"type", "text"}}}})).sampling.json_object);
  CHECK(ParseOk(ChatLine({{"response_format", {{"type", "json_object"}}}})).sampling.json_object);
  CHECK(ParseOk(ResponsesLine({{"text", {{"format", {{"type", "json_object"}}}}}}))
            .sampling.json_object);
  CHECK_FALSE(
      ParseOk(ResponsesLine({{"text", {{"format", {{"type", "text"}}}, {"verbosity", "low"}}}}))
          .sampling.json_object);
  CHECK_FALSE(ParseOk(ResponsesLine({{"text", {{"verbosity", "low"}}}})).sampling.json_object);
  const std::string why =
      "must be \"text\" or \"json_object\" (\"json_schema\" needs a grammar from the schema, "
      "which moebatchd does not have)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {ChatLine({{"response_format",
                  {{"type", "json_schema"},
                   {"json_schema", {{"name", "x"}, {"schema", json::object()}}}}}}),
       "body.response_format.type: " + why + ", got \"json_schema\""},
      {ChatLine({{"response_format", "json"}}),
       "body.response_format: must be an object, got \"json\""},
      {ResponsesLine({{"text", {{"format", {{"type", "json_schema"}, {"name", "x"}}}}}}),
       "body.text.format.type: " + why + ", got \"json_schema\""},
      {ResponsesLine({{"text", {{"format", json::object()}}}}),
       "body.text.format.type: " + why + ", got null"},
      {ResponsesLine({{"text", 3}}), "body.text: must be an object, got 3"},
      {ChatLine({{"response_format", {{"type", "json_object"}}}, {"ignore_eos", true}}),
       "body.ignore_eos: cannot be combined with JSON mode, whose reply ends at EOS once its "
       "object is closed"},
  };
  for (const auto& [line, message] : cases) {
    const ParsedBatchLine parsed = ParseBatchLine(line);
    INFO(line);
    REQUIRE_FALSE(parsed.request.ok());
    CHECK(parsed.request.status().message() == message);
  }
  // /v1/completions has no output format field: a response_format there is an unknown key.
  CHECK_FALSE(ParseOk(CompletionLine({{"response_format", {{"type", "json_object"}}}}))
                  .sampling.json_object);
}

TEST_CASE("A chat layout's error names the line's field: body.messages or body.input") {
  const absl::Status refused = absl::InvalidArgumentError("messages[2].role: expected 'user'");
  CHECK(ChatPromptError(ParseOk(ChatLine(nullptr)), refused).message() ==
        "body.messages[2].role: expected 'user'");
  const absl::Status r = ChatPromptError(ParseOk(ResponsesLine(nullptr)), refused);
  CHECK(r.code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.message() == "body.input: the conversation's messages[2].role: expected 'user'");
  CHECK(ErrorParam(std::string(r.message())) == "body.input");
}

}  // namespace
}  // namespace moebatch
