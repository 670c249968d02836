// Turns a CreateJob request (inline proto requests or an OpenAI-batch JSONL payload) into the
// requests the job store keeps, through the batch front end (engine/batch/batch_reader.h) with the
// daemon's policies: a bad line refuses the job (InvalidLinePolicy::kRefuseJob's rules) and
// body.model is accepted whatever it says (ModelPolicy::kAccept; JobLimits::check_model: kCheck):
// OpenAI batch files name OpenAI's models. The stored line names the daemon's model, so every
// result does. Its rules for bad input (docs/api.md):
//   whole-job INVALID_ARGUMENT listing every bad line (bounded: FormatBatchErrors): a line that is
//     not a JSON object or has no usable custom_id; a duplicate custom_id; a field error (bad type
//     or range, bad chat roles, non-UTF-8 text, unknown endpoint, JSON nested deeper than 128
//     levels); a url other than PrepareOptions::endpoint; with check_model, body.model other than
//     the daemon's; a line over max_line_bytes; max_tokens over
//     max_tokens_per_request; a prompt that does not tokenize or is empty;
//   whole-job INVALID_ARGUMENT alone: an empty job (no requests, or only blank lines); more than
//     max_requests_per_job requests; CreateJob.model other than the daemon's;
//   a failed request in the results (the job still runs): a prompt longer than the context, or
//     max_tokens beyond what the context leaves.
// Blank lines of a JSONL payload are skipped; line numbers are the payload's physical lines
// (1-based); inline requests are numbered by position (1-based). A request's index is its
// position among the job's requests (0-based).
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
  int64_t max_line_bytes = 1 << 20;  // one request's JSON, in bytes
  int32_t default_max_tokens = 256;
  int32_t max_tokens_per_request = 0;  // a request's max_tokens at most (0 = only the context)
  int64_t max_context_tokens = 0;      // the engine's
  std::string model_name;              // CreateJob.model must be empty or this
  bool check_model = false;            // body.model too (else any body.model is accepted)
  // Token ids a prompt may hold: [0, vocab_size), the model's embedding rows (config.json
  // vocab_size, as Engine::AddRequest checks); 0: the tokenizer's vocabulary.
  int64_t vocab_size = 0;
  int32_t max_choices = kMaxChoices;  // a request's n at most (Engine::max_choices())
};

// Job metadata as OpenAI limits it: at most 16 pairs, keys of 1 to 64 characters, values of up to
// 512 (Unicode code points), no NUL. InvalidArgument naming the key (a bounded prefix) otherwise.
inline constexpr int64_t kMaxMetadataPairs = 16;
inline constexpr int64_t kMaxMetadataKeyChars = 64;
inline constexpr int64_t kMaxMetadataValueChars = 512;
absl::Status CheckJobMetadata(const google::protobuf::Map<std::string, std::string>& metadata);

struct PreparedJob {
  std::vector<StoredRequest> requests;
  std::vector<PrefailedRequest> prefailed;
};

struct PrepareOptions {
  // Every line's url must be this ("/v1/chat/completions" or "/v1/completions": an HTTP batch's
  // endpoint); "" accepts either.
  std::string endpoint;
  // When set and the job is refused for bad lines: every bad line, in line order (unbounded,
  // unlike the status message), with its OpenAI error code ("invalid_json_line",
  // "duplicate_custom_id", "invalid_url", "invalid_request").
  std::vector<JobLineError>* line_errors = nullptr;
};

// `job_tag` names the job in result request ids ("batch_req_<tag>_<index>"). Errors:
// InvalidArgument only, by the rules above.
absl::StatusOr<PreparedJob> PrepareJob(const v1::CreateJobRequest& request,
                                       const Tokenizer& tokenizer, const JobLimits& limits,
                                       const std::string& job_tag,
                                       const PrepareOptions& options = {});

// The OpenAI batch input line equivalent to an inline request (validation then follows the same
// path as JSONL).
std::string ToBatchLine(const v1::BatchRequest& request);

// Tokenizes a parsed request: chat through the model's chat layout, text prompts with BOS; token
// id prompts are checked against [0, vocab_size) (0: the tokenizer's vocabulary).
absl::StatusOr<std::vector<int32_t>> TokenizeRequest(const BatchRequest& request,
                                                     const Tokenizer& tokenizer,
                                                     int64_t vocab_size = 0);

}  // namespace moebatch
