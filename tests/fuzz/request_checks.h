// Shared by fuzz_jsonl_request and fuzz_proto_request: the tokenizer, two sets of daemon limits,
// and the checks made on every PrepareJob (server/job_request.h) result.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/batch/openai_batch.h"
#include "engine/text/tokenizer.h"
#include "moebatch/v1/batch.pb.h"
#include "nlohmann/json.hpp"
#include "server/job_request.h"
#include "tests/fuzz/fuzz_check.h"

namespace moebatch::fuzz {

// The tiny fixture's tokenizer.model (Mixtral 8x7B's, 32,000 pieces, fetched by
// scripts/fetch_tokenizer.sh), loaded once. MOEBATCH_FUZZ_TOKENIZER overrides the path.
inline const Tokenizer& FuzzTokenizer() {
  static const Tokenizer* const tokenizer = [] {
    const char* env = std::getenv("MOEBATCH_FUZZ_TOKENIZER");
    const std::string path =
        env != nullptr ? env : MOEBATCH_FIXTURES_DIR "/tiny-mixtral/tokenizer.model";
    auto loaded = Tokenizer::Load(path, /*bos_id=*/1, /*eos_id=*/2);
    if (!loaded.ok()) {
      std::fprintf(stderr, "fuzz: %s (scripts/fetch_tokenizer.sh fetches it)\n",
                   loaded.status().ToString().c_str());
      std::exit(2);
    }
    return loaded->release();  // reachable from a static: not a leak
  }();
  return *tokenizer;
}

// The daemon's defaults, and tight limits under which the limit checks and the prefailed
// (prompt too long for the context) path are reached by small inputs.
inline JobLimits RoomyLimits() {
  JobLimits limits;
  limits.max_context_tokens = 4096;
  limits.model_name = "mixtral";
  return limits;
}

inline JobLimits TightLimits() {
  JobLimits limits;
  limits.max_requests_per_job = 3;
  limits.max_line_bytes = 300;
  limits.default_max_tokens = 8;
  limits.max_context_tokens = 24;
  limits.model_name = "tiny";
  return limits;
}

// PrepareJob under `limits`; checks what docs/api.md promises: a refused job is INVALID_ARGUMENT;
// an accepted one has one entry per request, each stored request fits the context with the
// max_tokens its stored line states, and each prefailed one has a valid 400 result line.
inline absl::StatusOr<PreparedJob> CheckPrepareJob(const v1::CreateJobRequest& request,
                                                   const JobLimits& limits) {
  const Tokenizer& tokenizer = FuzzTokenizer();
  absl::StatusOr<PreparedJob> job = PrepareJob(request, tokenizer, limits, "fuzz");
  if (!job.ok()) {
    FUZZ_CHECK(job.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               job.status().ToString().c_str());
    return job;
  }
  const int64_t count = static_cast<int64_t>(job->requests.size() + job->prefailed.size());
  FUZZ_CHECK(count > 0 && count <= limits.max_requests_per_job, "%lld requests",
             static_cast<long long>(count));
  std::set<int64_t> indices;
  std::set<std::string> custom_ids;
  BatchDefaults other_defaults;
  other_defaults.max_tokens = limits.default_max_tokens + 1;  // stored lines must not need it
  for (const StoredRequest& r : job->requests) {
    FUZZ_CHECK(r.index >= 0 && r.index < count && indices.insert(r.index).second, "index %lld",
               static_cast<long long>(r.index));
    FUZZ_CHECK(!r.custom_id.empty() && custom_ids.insert(r.custom_id).second, "custom_id");
    const int64_t prompt_len = static_cast<int64_t>(r.prompt_token_ids.size());
    FUZZ_CHECK(prompt_len > 0 && prompt_len < limits.max_context_tokens, "prompt of %lld tokens",
               static_cast<long long>(prompt_len));
    for (const int32_t id : r.prompt_token_ids) {
      FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size(), "token id %d", id);
    }
    const ParsedBatchLine stored = ParseBatchLine(r.line, other_defaults);
    FUZZ_CHECK(stored.request.ok(), "stored line does not parse: %s: %s", r.line.c_str(),
               stored.request.status().ToString().c_str());
    FUZZ_CHECK(stored.request->custom_id == r.custom_id, "stored custom_id");
    FUZZ_CHECK(prompt_len + stored.request->sampling.max_tokens <= limits.max_context_tokens,
               "stored line's max_tokens %d with %lld prompt tokens",
               stored.request->sampling.max_tokens, static_cast<long long>(prompt_len));
    const absl::StatusOr<std::vector<int32_t>> again = TokenizeRequest(*stored.request, tokenizer);
    FUZZ_CHECK(again.ok() && *again == r.prompt_token_ids, "stored line tokenizes differently");
  }
  for (const PrefailedRequest& p : job->prefailed) {
    FUZZ_CHECK(p.index >= 0 && p.index < count && indices.insert(p.index).second, "index %lld",
               static_cast<long long>(p.index));
    FUZZ_CHECK(!p.custom_id.empty() && custom_ids.insert(p.custom_id).second, "custom_id");
    const nlohmann::json line = nlohmann::json::parse(p.result_line, nullptr, false);
    FUZZ_CHECK(line.is_object() && line.value("custom_id", "") == p.custom_id &&
                   line["response"].is_object() && line["response"]["status_code"] == 400,
               "result line %s", p.result_line.c_str());
  }
  return job;
}

}  // namespace moebatch::fuzz
