// Batch input lines for the tests of engine/batch/openai_batch.h (test_openai_batch.cc: input
// lines; test_openai_batch_output.cc: output lines): a body under a valid envelope, per endpoint,
// and the request a valid line parses to.
#pragma once

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/batch/openai_batch.h"

namespace moebatch {
namespace test_lines {

using json = nlohmann::json;

// An input line: the given body under a valid envelope.
inline std::string Line(const json& body, const std::string& url = "/v1/chat/completions") {
  json line = {{"custom_id", "req-1"}, {"method", "POST"}, {"url", url}, {"body", body}};
  return line.dump();
}

inline std::string ChatLine(json body_extra) {
  json body = {{"model", "mixtral"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  if (!body_extra.is_null()) body.update(body_extra);
  return Line(body);
}

inline std::string CompletionLine(json body_extra) {
  json body = {{"model", "mixtral"}, {"prompt", "Once upon a time"}};
  if (!body_extra.is_null()) body.update(body_extra);
  return Line(body, "/v1/completions");
}

inline BatchRequest ParseOk(const std::string& line, const BatchDefaults& defaults = {}) {
  ParsedBatchLine parsed = ParseBatchLine(line, defaults);
  INFO(line);
  REQUIRE(parsed.json_ok);
  INFO(parsed.request.status().ToString());
  REQUIRE(parsed.request.ok());
  return *parsed.request;
}

inline std::string ResponsesLine(json body_extra) {
  json body = {{"model", "mixtral"}, {"input", "Hi"}};
  if (!body_extra.is_null()) body.update(body_extra);
  return Line(body, "/v1/responses");
}

}  // namespace test_lines
}  // namespace moebatch
