// libFuzzer target: bytes parsed as a moebatch.v1.CreateJobRequest (what gRPC hands CreateJob),
// then the daemon's request validation, PrepareJob (server/job_request.h), with the real Mixtral
// tokenizer, under the daemon's default limits and under tight ones. For inline requests
// (RequestList), an accepted request must be stored with the sampling parameters the client sent.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/batch/openai_batch.h"
#include "google/protobuf/stubs/logging.h"
#include "moebatch/v1/batch.pb.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/request_checks.h"

namespace moebatch::fuzz {
namespace {

void CheckSampling(const v1::SamplingParams& sent, const SamplingParams& stored) {
  if (sent.has_temperature()) {
    FUZZ_CHECK(stored.temperature == sent.temperature(), "temperature %g stored as %g",
               sent.temperature(), stored.temperature);
  }
  if (sent.has_top_p()) {
    FUZZ_CHECK(stored.top_p == sent.top_p(), "top_p %g stored as %g", sent.top_p(), stored.top_p);
  }
  if (sent.has_top_k()) FUZZ_CHECK(stored.top_k == sent.top_k(), "top_k");
  if (sent.has_seed()) FUZZ_CHECK(stored.seed && *stored.seed == sent.seed(), "seed");
  if (sent.has_max_tokens()) FUZZ_CHECK(stored.max_tokens == sent.max_tokens(), "max_tokens");
  FUZZ_CHECK(static_cast<int>(stored.stop.size()) == sent.stop_size(), "stop");
  FUZZ_CHECK(stored.ignore_eos == sent.ignore_eos(), "ignore_eos");
  if (sent.has_n()) FUZZ_CHECK(stored.n == sent.n(), "n");
  // logprobs: a chat request's flag, or a completion's number of top tokens.
  if (sent.has_logprobs() && sent.logprobs()) FUZZ_CHECK(stored.logprobs, "logprobs");
}

void Check(const v1::CreateJobRequest& request, const JobLimits& limits) {
  const absl::StatusOr<PreparedJob> job = CheckPrepareJob(request, limits);
  if (!job.ok() || request.source_case() != v1::CreateJobRequest::kRequests) return;
  for (const StoredRequest& r : job->requests) {
    const v1::BatchRequest& sent = request.requests().requests(static_cast<int>(r.index));
    FUZZ_CHECK(r.custom_id == sent.custom_id(), "custom_id");
    const ParsedBatchLine stored = ParseBatchLine(r.line);
    FUZZ_CHECK(stored.request.ok(), "stored line");
    CheckSampling(sent.sampling(), stored.request->sampling);
  }
}

}  // namespace
}  // namespace moebatch::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // protobuf logs every string field that is not UTF-8 (a parse failure here): keep runs quiet.
  google::protobuf::SetLogHandler(nullptr);
  moebatch::fuzz::FuzzTokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moebatch;
  v1::CreateJobRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  fuzz::Check(request, fuzz::RoomyLimits());
  fuzz::Check(request, fuzz::TightLimits());
  return 0;
}
