// libFuzzer target: an OpenAI batch JSONL payload (CreateJobRequest.jsonl, raw bytes as a client
// may send them) through the daemon's request validation, PrepareJob (server/job_request.h), with
// the real Mixtral tokenizer, under the daemon's default limits and under tight ones. Then each
// line as moebatch-run handles it: ParseBatchLine, and the output or error line it would write
// (engine/batch/openai_batch.h), which must be one valid JSON object.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/batch/openai_batch.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/request_checks.h"

namespace moebatch::fuzz {
namespace {

void CheckOutputLine(const std::string& line, const std::string& custom_id) {
  FUZZ_CHECK(line.find('\n') == std::string::npos, "output line holds a newline");
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(j.is_object() && j.value("id", "") == "batch_req_fuzz_0", "output line %s",
             line.c_str());
  FUZZ_CHECK(custom_id.empty() ? j["custom_id"].is_null() : j["custom_id"] == custom_id,
             "output custom_id in %s", line.c_str());
}

// One input line as moebatch-run reads it.
void CheckRunLine(std::string_view text) {
  if (text.find_first_not_of(" \t\r") == std::string_view::npos) return;  // blank line
  BatchDefaults defaults;
  const ParsedBatchLine parsed = ParseBatchLine(text, defaults);
  if (!parsed.request.ok()) {
    FUZZ_CHECK(parsed.request.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               parsed.request.status().ToString().c_str());
    CheckOutputLine(FormatBatchError(parsed, "batch_req_fuzz_0", parsed.request.status()),
                    parsed.custom_id);
    return;
  }
  const BatchRequest& request = *parsed.request;
  FUZZ_CHECK(!request.custom_id.empty() && request.custom_id == parsed.custom_id, "custom_id");
  FUZZ_CHECK(request.sampling.Validate().ok(), "sampling");
  const absl::StatusOr<std::vector<int32_t>> ids = TokenizeRequest(request, FuzzTokenizer());
  if (!ids.ok()) {
    CheckOutputLine(FormatBatchError(parsed, "batch_req_fuzz_0", ids.status()), parsed.custom_id);
    return;
  }
  // A completion that repeats the prompt: decoding arbitrary ids (out-of-vocabulary ones too).
  Completion completion;
  completion.token_ids = *ids;
  completion.text = FuzzTokenizer().Decode(*ids);
  completion.finish_reason = "length";
  completion.prompt_tokens = static_cast<int64_t>(ids->size());
  completion.completion_tokens = completion.prompt_tokens;
  CheckOutputLine(FormatBatchOutput(request, "batch_req_fuzz_0", completion, 1700000000),
                  request.custom_id);
}

}  // namespace
}  // namespace moebatch::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moebatch;
  const std::string payload(reinterpret_cast<const char*>(data), size);
  v1::CreateJobRequest request;
  request.set_jsonl(payload);
  (void)fuzz::CheckPrepareJob(request, fuzz::RoomyLimits());
  (void)fuzz::CheckPrepareJob(request, fuzz::TightLimits());

  size_t start = 0;
  while (start < payload.size()) {
    size_t end = payload.find('\n', start);
    if (end == std::string::npos) end = payload.size();
    fuzz::CheckRunLine(std::string_view(payload).substr(start, end - start));
    start = end + 1;
  }
  return 0;
}
