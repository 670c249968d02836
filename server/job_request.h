// Turns a CreateJob request (inline proto requests or an OpenAI-batch JSONL payload) into the
// requests the job store keeps, applying the daemon's rules for bad input (docs/api.md):
//   whole-job INVALID_ARGUMENT, naming the line: an empty job; a line that is not a JSON object or
//     has no usable custom_id; a duplicate custom_id; a field error (bad type or range, bad chat
//     roles, non-UTF-8 text, unknown endpoint, JSON nested deeper than 128 levels); a model other
//     than the daemon's; too many requests,
//     an oversized line, or max_tokens over the daemon's max_tokens_per_request (each message
//     names the limit);
//   a failed request in the results (the job still runs): a prompt longer than the context, or
//     max_tokens beyond what the context leaves.
// Thread-safe: const, uses the engine's tokenizer only.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/batch/openai_batch.h"
#include "engine/text/tokenizer.h"
#include "moebatch/v1/batch.pb.h"
#include "server/job_store.h"

namespace moebatch {

struct JobLimits {
  int64_t max_requests_per_job = 100000;
  int64_t max_line_bytes = 1 << 20;  // one request's JSON
  int32_t default_max_tokens = 256;
  int32_t max_tokens_per_request = 0;  // a request's max_tokens at most (0 = only the context)
  int64_t max_context_tokens = 0;      // the engine's
  std::string model_name;              // CreateJob.model / body.model must be empty or this
};

struct PreparedJob {
  std::vector<StoredRequest> requests;
  std::vector<PrefailedRequest> prefailed;
};

// `job_tag` names the job in result request ids ("batch_req_<tag>_<index>").
absl::StatusOr<PreparedJob> PrepareJob(const v1::CreateJobRequest& request,
                                       const Tokenizer& tokenizer, const JobLimits& limits,
                                       const std::string& job_tag);

// The OpenAI batch input line equivalent to an inline request (validation then follows the same
// path as JSONL).
std::string ToBatchLine(const v1::BatchRequest& request);

// Tokenizes a parsed request: chat through the Mixtral-Instruct format, text prompts with BOS.
absl::StatusOr<std::vector<int32_t>> TokenizeRequest(const BatchRequest& request,
                                                     const Tokenizer& tokenizer);

}  // namespace moebatch
