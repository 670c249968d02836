// The daemon's request validation (server/job_request.h, PrepareJob): regression tests for what
// fuzzing (tests/fuzz/fuzz_jsonl_request, fuzz_proto_request) found. The rest of PrepareJob's rules
// are covered end to end by tests/integration/test_daemon.py.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "absl/status/status.h"
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

absl::StatusOr<PreparedJob> PrepareJsonl(const std::string& jsonl) {
  v1::CreateJobRequest request;
  request.set_jsonl(jsonl);
  return PrepareJob(request, MixtralTokenizer(), Limits(), "test");
}

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST_CASE("fuzz regression: a line nested deeper than 128 levels is refused, not re-serialized") {
  // The line is valid (unknown body keys are ignored), and PrepareJob stores it with max_tokens
  // added (FreezeDefaults dumps it): dumping recursed once per level, a stack overflow.
  const std::string head =
      R"({"custom_id": "deep", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Hi", "x": )";
  auto deep = PrepareJsonl(head + Nested(300000) + "}}\n");  // 600 kB: under the line limit
  CHECK(deep.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(deep.status().message() == "line 1: invalid JSON: nested deeper than 128 levels");

  // The line's object, the body and 126 arrays: at the limit, stored with max_tokens frozen.
  auto at_limit = PrepareJsonl(head + Nested(126) + "}}\n");
  INFO(at_limit.status().ToString());
  REQUIRE(at_limit.ok());
  REQUIRE(at_limit->requests.size() == 1);
  const auto stored = nlohmann::json::parse(at_limit->requests[0].line);
  CHECK(stored["body"]["max_tokens"] == 256);
  CHECK(PrepareJsonl(head + Nested(127) + "}}\n").status().message() ==
        "line 1: invalid JSON: nested deeper than 128 levels");
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
  for (const Case& c :
       {Case{nan, 1.0f, "line 1: body.temperature: must be a number, got \"NaN\""},
        Case{inf, 1.0f, "line 1: body.temperature: must be a number, got \"Infinity\""},
        Case{1.0f, -inf, "line 1: body.top_p: must be a number, got \"-Infinity\""}}) {
    v1::CreateJobRequest request;
    v1::BatchRequest* r = request.mutable_requests()->add_requests();
    r->set_custom_id("a");
    r->set_prompt("Hello");
    r->mutable_sampling()->set_temperature(c.temperature);
    r->mutable_sampling()->set_top_p(c.top_p);
    auto job = PrepareJob(request, MixtralTokenizer(), Limits(), "test");
    CHECK(job.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(job.status().message() == c.message);
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

}  // namespace
}  // namespace moebatch
