// The batch front end (engine/batch/batch_reader.h): both invalid-line policies, the model policy,
// blank lines and line numbers, duplicate custom_ids, the limits, the per-line check hook, and the
// bounded report of every bad line.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/batch/batch_reader.h"

namespace moebatch {
namespace {

using json = nlohmann::json;

std::string Good(const std::string& custom_id, const json& extra = json::object()) {
  json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  body.update(extra);
  return json{
      {"custom_id", custom_id}, {"method", "POST"}, {"url", "/v1/chat/completions"}, {"body", body}}
      .dump();
}

std::string BadTemperature(const std::string& custom_id) {
  return Good(custom_id, {{"temperature", 7000}});
}

// Ten lines, bad on lines 2, 5 and 9: a range error, not JSON, a duplicate custom_id.
std::string TenLinesThreeBad() {
  std::vector<std::string> lines;
  for (int i = 1; i <= 10; ++i) lines.push_back(Good(absl::StrCat("id-", i)));
  lines[1] = BadTemperature("a");
  lines[4] = "{not json";
  lines[8] = Good("id-4");
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  return text;
}

BatchReadOptions FailRequest() {
  BatchReadOptions options;
  options.invalid_lines = InvalidLinePolicy::kFailRequest;
  return options;
}

BatchReadOptions RefuseJob() {
  BatchReadOptions options;
  options.invalid_lines = InvalidLinePolicy::kRefuseJob;
  return options;
}

TEST_CASE("batch front end: kFailRequest keeps every line and reports every bad one") {
  auto input = ReadBatch(TenLinesThreeBad(), FailRequest());
  INFO(input.status().ToString());
  REQUIRE(input.ok());
  REQUIRE(input->lines.size() == 10);
  std::vector<int64_t> bad_lines;
  for (const BatchLine& line : input->lines) {
    CHECK(line.line_number == line.index + 1);
    if (!line.ok()) bad_lines.push_back(line.line_number);
  }
  CHECK(bad_lines == std::vector<int64_t>{2, 5, 9});

  const BatchErrorReport& report = input->report;
  CHECK(report.lines == 10);
  REQUIRE(report.errors.size() == 3);
  CHECK(report.errors[0].line_number == 2);
  CHECK(report.errors[0].custom_id == "a");
  CHECK(report.errors[0].param == "body.temperature");
  CHECK(report.errors[0].message == "body.temperature: must be in [0, 100], got 7000");
  CHECK(report.errors[1].line_number == 5);
  CHECK(report.errors[1].custom_id.empty());
  CHECK(report.errors[1].param.empty());
  CHECK(absl::StartsWith(report.errors[1].message, "invalid JSON: "));
  CHECK(report.errors[2].line_number == 9);
  CHECK(report.errors[2].custom_id == "id-4");
  CHECK(report.errors[2].param == "custom_id");
  CHECK(report.errors[2].message == "custom_id: duplicate, first used on line 4");

  // The bad lines keep what FormatBatchError needs for their output lines.
  CHECK(input->lines[1].parsed.json_ok);
  CHECK(input->lines[1].parsed.custom_id == "a");
  CHECK_FALSE(input->lines[4].parsed.json_ok);
  CHECK(input->lines[8].parsed.request.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("batch front end: kRefuseJob refuses, listing every bad line") {
  auto input = ReadBatch(TenLinesThreeBad(), RefuseJob());
  REQUIRE(input.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(input.status().message());
  INFO(message);
  CHECK(absl::StartsWith(
      message,
      "3 of 10 lines are invalid: line 2 (custom_id \"a\"): body.temperature: must be in [0, "
      "100], got 7000; line 5: invalid JSON: "));
  CHECK(absl::EndsWith(
      message, "; line 9 (custom_id \"id-4\"): custom_id: duplicate, first used on line 4"));

  // A clean input is accepted, with an empty report.
  auto clean = ReadBatch(Good("x") + "\n" + Good("y") + "\n", RefuseJob());
  REQUIRE(clean.ok());
  CHECK(clean->lines.size() == 2);
  CHECK(clean->report.ok());
  CHECK(clean->report.lines == 2);

  // One bad line of one.
  auto one = ReadBatch(BadTemperature("t"), RefuseJob());
  CHECK(one.status().message() ==
        "1 of 1 line is invalid: line 1 (custom_id \"t\"): body.temperature: must be in [0, 100], "
        "got 7000");
}

TEST_CASE("batch front end: blank lines are skipped, line numbers are the file's") {
  // Blank, spaces/tabs, a lone '\r' (CRLF files), a line of form feeds, and a trailing blank.
  const std::string text =
      "\n" + Good("a") + "\r\n  \t\n\r\n" + BadTemperature("b") + "\n\f\v\n" + Good("c") + "\n\n";
  for (const auto policy : {InvalidLinePolicy::kFailRequest, InvalidLinePolicy::kRefuseJob}) {
    BatchReadOptions options;
    options.invalid_lines = policy;
    auto input = ReadBatch(text, options);
    if (policy == InvalidLinePolicy::kRefuseJob) {
      CHECK(input.status().message() ==
            "1 of 3 lines is invalid: line 5 (custom_id \"b\"): body.temperature: must be in [0, "
            "100], got 7000");
      continue;
    }
    REQUIRE(input.ok());
    REQUIRE(input->lines.size() == 3);
    CHECK(input->lines[0].line_number == 2);
    CHECK(input->lines[1].line_number == 5);
    CHECK(input->lines[2].line_number == 7);
    CHECK(input->lines[0].index == 0);
    CHECK(input->lines[1].index == 1);
    CHECK(input->lines[2].index == 2);
    CHECK(input->lines[0].text == Good("a"));  // without its "\r"
    REQUIRE(input->report.errors.size() == 1);
    CHECK(input->report.errors[0].line_number == 5);
  }
  // Nothing but blank lines: no requests, no errors.
  auto blank = ReadBatch("\n \n\t\r\n", RefuseJob());
  REQUIRE(blank.ok());
  CHECK(blank->lines.empty());
  CHECK(blank->report.lines == 0);
  // A last line without '\n' is read too.
  auto last = ReadBatch(Good("a") + "\n" + Good("b"), RefuseJob());
  REQUIRE(last.ok());
  CHECK(last->lines.size() == 2);
}

TEST_CASE("batch front end: inline lines are numbered by position") {
  auto input = ReadBatchLines({Good("a"), "", BadTemperature("b")}, FailRequest());
  REQUIRE(input.ok());
  REQUIRE(input->lines.size() == 2);
  CHECK(input->lines[1].line_number == 3);
  CHECK(input->lines[1].index == 1);
  REQUIRE(input->report.errors.size() == 1);
  CHECK(input->report.errors[0].line_number == 3);
}

TEST_CASE("batch front end: duplicate custom_ids, whether the first line was valid or not") {
  const std::string text = BadTemperature("x") + "\n" + Good("x") + "\n" + Good("y") + "\n" +
                           Good("y") + "\n" + Good("y") + "\n";
  auto input = ReadBatch(text, FailRequest());
  REQUIRE(input.ok());
  REQUIRE(input->report.errors.size() == 4);
  CHECK(input->report.errors[0].line_number == 1);  // its own error: the temperature
  CHECK(input->report.errors[1].message == "custom_id: duplicate, first used on line 1");
  CHECK(input->report.errors[2].message == "custom_id: duplicate, first used on line 3");
  CHECK(input->report.errors[3].message == "custom_id: duplicate, first used on line 3");
  CHECK(input->lines[2].ok());
}

TEST_CASE("batch front end: the model policy") {
  const std::string text = Good("a", {{"model", "mixtral"}}) + "\n" + Good("b") + "\n" +
                           Good("c", {{"model", "gpt-4"}}) + "\n";
  BatchReadOptions accept = FailRequest();
  accept.model = ModelPolicy::kAccept;
  accept.model_name = "mixtral";
  auto accepted = ReadBatch(text, accept);
  REQUIRE(accepted.ok());
  CHECK(accepted->report.ok());
  CHECK(accepted->lines[2].parsed.request->model == "gpt-4");  // echoed back, not checked

  BatchReadOptions check = accept;
  check.model = ModelPolicy::kCheck;
  auto checked = ReadBatch(text, check);
  REQUIRE(checked.ok());
  REQUIRE(checked->report.errors.size() == 1);
  CHECK(checked->report.errors[0].line_number == 3);
  CHECK(checked->report.errors[0].param == "body.model");
  CHECK(checked->report.errors[0].message ==
        "body.model: this server runs \"mixtral\", got \"gpt-4\"");
}

TEST_CASE("batch front end: limits") {
  SECTION("max_requests refuses the whole input, whatever the policy") {
    for (const auto policy : {InvalidLinePolicy::kFailRequest, InvalidLinePolicy::kRefuseJob}) {
      BatchReadOptions options;
      options.invalid_lines = policy;
      options.max_requests = 2;
      const std::string three = Good("a") + "\n\n" + Good("b") + "\n" + Good("c") + "\n";
      auto input = ReadBatch(three, options);
      CHECK(input.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(input.status().message() ==
            "requests: 3 requests, more than the limit (max_requests_per_job) of 2 per job");
      // Blank lines do not count.
      CHECK(ReadBatch(Good("a") + "\n\n\n" + Good("b") + "\n", options).ok());
      CHECK_FALSE(ReadBatchLines({Good("a"), Good("b"), Good("c")}, options).ok());
    }
  }
  SECTION("max_line_bytes") {
    BatchReadOptions options = FailRequest();
    options.max_line_bytes = 200;
    const std::string big = Good("big", {{"stop", std::string(300, 'x')}});
    auto input = ReadBatch(Good("a") + "\n" + big + "\n", options);
    REQUIRE(input.ok());
    REQUIRE(input->report.errors.size() == 1);
    CHECK(input->report.errors[0].line_number == 2);
    CHECK(input->report.errors[0].message ==
          absl::StrCat("the line has ", big.size(),
                       " bytes, more than the limit of 200 bytes per "
                       "line"));
    CHECK(input->lines[1].parsed.json_ok);  // a 400 response, not "invalid_json"
  }
  SECTION("max_tokens_limit") {
    BatchReadOptions options = FailRequest();
    options.max_tokens_limit = 16;
    options.defaults.max_tokens = 8;
    auto input = ReadBatch(Good("a") + "\n" + Good("b", {{"max_tokens", 17}}) + "\n" +
                               Good("c", {{"max_tokens", 16}}) + "\n",
                           options);
    REQUIRE(input.ok());
    REQUIRE(input->report.errors.size() == 1);
    CHECK(input->report.errors[0].message ==
          "body.max_tokens: 17 is over the limit (max_tokens_per_request) of 16");
    CHECK(input->lines[0].parsed.request->sampling.max_tokens == 8);
    // A /v1/responses line's limit is body.max_output_tokens.
    const std::string responses =
        R"({"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": {"input": "Hi", "max_output_tokens": 17}})";
    auto r = ReadBatch(responses + "\n", options);
    REQUIRE(r.ok());
    REQUIRE(r->report.errors.size() == 1);
    CHECK(r->report.errors[0].message ==
          "body.max_output_tokens: 17 is over the limit (max_tokens_per_request) of 16");
  }
  SECTION("JSON nested deeper than 128 levels") {
    const std::string deep =
        "{\"custom_id\": \"d\", \"x\": " + std::string(200, '[') + std::string(200, ']') + "}";
    auto input = ReadBatch(deep, FailRequest());
    REQUIRE(input.ok());
    REQUIRE(input->report.errors.size() == 1);
    CHECK(input->report.errors[0].message == "invalid JSON: nested deeper than 128 levels");
    CHECK_FALSE(input->lines[0].parsed.json_ok);
  }
}

TEST_CASE("batch front end: the check hook's errors join the report") {
  BatchReadOptions options = RefuseJob();
  std::vector<int64_t> checked;
  options.check_line = [&](const BatchLine& line) -> absl::Status {
    checked.push_back(line.line_number);
    if (line.parsed.request->custom_id == "empty") {
      return absl::InvalidArgumentError("body.prompt: empty");
    }
    return absl::OkStatus();
  };
  const std::string text =
      Good("a") + "\n" + BadTemperature("b") + "\n" + Good("empty") + "\n" + Good("d") + "\n";
  auto input = ReadBatch(text, options);
  // Every line that passed the front end's own checks was checked, also after a bad line.
  CHECK(checked == std::vector<int64_t>{1, 3, 4});
  CHECK(input.status().message() ==
        "2 of 4 lines are invalid: line 2 (custom_id \"b\"): body.temperature: must be in [0, "
        "100], got 7000; line 3 (custom_id \"empty\"): body.prompt: empty");
}

TEST_CASE("batch front end: the report of a 300 KB custom_id stays bounded") {
  const std::string huge_id(300 * 1000, 'q');
  const std::string text =
      Good(huge_id) + "\n" + Good(huge_id) + "\n" + BadTemperature(huge_id + "2") + "\n";
  auto input = ReadBatch(text, RefuseJob());
  REQUIRE(input.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(input.status().message());
  CHECK(message.size() < 1024);
  const std::string quoted = "(custom_id \"" + std::string(200, 'q') + "\"...)";
  CHECK(message == "2 of 3 lines are invalid: line 2 " + quoted +
                       ": custom_id: duplicate, first used on line 1; line 3 " + quoted +
                       ": body.temperature: must be in [0, 100], got 7000");

  // Quoted values are escaped and bounded in escaped bytes too.
  const std::string controls(300, '\x01');
  const std::string escaped = QuoteBounded(controls, 200);
  CHECK(escaped.size() <= 200 + 2 + 3);
  CHECK(absl::StartsWith(escaped, "\"\\u0001"));
  CHECK(absl::EndsWith(escaped, "\"..."));
  CHECK(QuoteBounded("a\"b", 200) == "\"a\\\"b\"");
  // Cut between UTF-8 characters, and ill-formed UTF-8 replaced.
  CHECK(QuoteBounded("\xC3\xA9\xC3\xA9", 3) == "\"\xC3\xA9\"...");
  CHECK(QuoteBounded("a\xFF", 10) == "\"a\xEF\xBF\xBD\"");
}

TEST_CASE("batch front end: the report of 1,000 bad lines stays under 8 KiB") {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += BadTemperature(absl::StrCat("r", i)) + "\n";
  auto input = ReadBatch(text, FailRequest());
  REQUIRE(input.ok());
  CHECK(input->report.errors.size() == 1000);
  const std::string message = FormatBatchErrors(input->report);
  INFO(message);
  CHECK(message.size() < 8 * 1024);
  CHECK(GrpcMessageBytes(message) <= ErrorReportBounds().max_total_bytes);
  CHECK(absl::StartsWith(message, "1000 of 1000 lines are invalid: line 1 (custom_id \"r0\"): "));
  CHECK(absl::StrContains(message, "line 20 (custom_id \"r19\")"));
  CHECK_FALSE(absl::StrContains(message, "line 21 "));
  CHECK(absl::EndsWith(message, "; and 980 more"));

  // Worst case: every entry at its bounds (long escaped ids, long messages): the total bound
  // holds, counting what gRPC percent-encodes.
  BatchErrorReport worst;
  worst.lines = 1000;
  for (int i = 0; i < 1000; ++i) {
    worst.errors.push_back(BatchLineError{i + 1, std::string(5000, '\x01'), "body.x",
                                          "body.x: " + std::string(5000, '%')});
  }
  const std::string bounded = FormatBatchErrors(worst);
  CHECK(GrpcMessageBytes(bounded) <= ErrorReportBounds().max_total_bytes);
  CHECK(bounded.size() < 8 * 1024);
  CHECK(absl::StrContains(bounded, " more"));
  // A tiny budget still gives the header and the count.
  ErrorReportBounds tiny;
  tiny.max_total_bytes = 50;
  CHECK(FormatBatchErrors(worst, tiny) == "1000 of 1000 lines are invalid: and 1000 more");
  CHECK(FormatBatchErrors(BatchErrorReport{}).empty());
}

}  // namespace
}  // namespace moebatch
