// BatchServiceImpl (server/batch_service.h) called directly, over a real job store: what no
// CreateJob can store any more but an older store may hold (metadata beyond OpenAI's limits) still
// lists in replies a client can receive, and a status message never exceeds gRPC's limit. And,
// over gRPC on loopback with the engine worker on the tiny model: WatchJob's rate and elapsed time
// come from the job clock (sub-second), GetJob reports the same, and a daemon that did not run the
// job falls back to the store's whole seconds.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "server/batch_service.h"
#include "server/engine_worker.h"
#include "server/job_request.h"
#include "server/job_store.h"

namespace moebatch {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  TempDir() {
    std::random_device device;
    path = fs::temp_directory_path() / ("moebatch_batch_service_" + std::to_string(::getpid()) +
                                        "_" + std::to_string(device()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path path;
};

// A job as a store written before the metadata limits could hold it: `pairs` pairs of 64-character
// keys and `value_bytes`-byte values.
void StoreJob(JobStore& store, int pairs, size_t value_bytes) {
  JobRecord job;
  for (int i = 0; i < pairs; ++i) {
    job.metadata[std::to_string(1000 + i) + std::string(60, 'k')] = std::string(value_bytes, 'v');
  }
  StoredRequest r;
  r.index = 0;
  r.custom_id = "a";
  r.line = R"({"custom_id":"a"})";
  r.prompt_token_ids = {1, 2};
  REQUIRE(store.CreateJob(job, {r}, {}).ok());
}

TEST_CASE("ListJobs: replies stay under the message limit whatever the store holds") {
  TempDir dir;
  auto store = JobStore::Open(dir.path.string());
  REQUIRE(store.ok());
  // Nine jobs of 7 MB of metadata: one job alone is over a client's 4 MiB; and 150 jobs at the
  // limits (16 pairs of 64-character keys and 512 4-byte characters: ~34 KB each, 5 MB a page).
  for (int i = 0; i < 9; ++i) StoreJob(**store, 7, size_t{1} << 20);
  std::string wide;
  for (int i = 0; i < 512; ++i) wide += "\xF0\x9F\x98\x80";  // U+1F600, 4 bytes
  for (int i = 0; i < 150; ++i) {
    JobRecord job;
    for (int k = 0; k < 16; ++k) job.metadata[std::to_string(10 + k) + std::string(62, 'k')] = wide;
    StoredRequest r;
    r.custom_id = "a";
    r.line = R"({"custom_id":"a"})";
    r.prompt_token_ids = {1};
    REQUIRE((*store)->CreateJob(job, {r}, {}).ok());
  }
  BatchServiceImpl service(store->get(), nullptr);
  std::set<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    grpc::ServerContext context;
    v1::ListJobsRequest request;
    request.set_page_size(1000);
    request.set_page_token(token);
    v1::ListJobsResponse response;
    REQUIRE(service.ListJobs(&context, &request, &response).ok());
    CHECK(response.ByteSizeLong() < (size_t{4} << 20));
    for (const v1::Job& job : response.jobs()) {
      CHECK(seen.insert(job.id()).second);  // every job once
      CHECK(job.metadata_size() <= kMaxMetadataPairs);
      for (const auto& [key, value] : job.metadata()) CHECK(value.size() <= 4 * 512);
    }
    token = response.next_page_token();
    ++pages;
  } while (!token.empty() && pages < 20);
  CHECK(seen.size() == 159);
  CHECK(pages >= 2);  // 159 jobs of up to 34 KB do not fit one reply
}

TEST_CASE("ToGrpc: a message quoting a huge value is cut under gRPC's metadata limit") {
  const std::string huge(300000, 'x');
  const grpc::Status st = ToGrpc(absl::InvalidArgumentError("custom_id " + huge + " is bad"));
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().size() <= 8192);
  CHECK(st.error_message().find("custom_id xxx") == 0);
  CHECK(st.error_message().find("(message cut)") != std::string::npos);
  // Bytes gRPC percent-encodes count three times: 5,000 of them are cut too.
  const grpc::Status encoded = ToGrpc(absl::InvalidArgumentError(std::string(5000, '\n')));
  CHECK(encoded.error_message().size() < 5000);
  CHECK(ToGrpc(absl::NotFoundError("job x not found")).error_message() == "job x not found");
}

TEST_CASE("WatchJob: tokens, rate and elapsed time from the job clock, sub-second") {
  TempDir dir;
  auto store = JobStore::Open(dir.path.string());
  REQUIRE(store.ok());
  EngineOptions options;
  options.model_dir = std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral";
  options.kv.bytes = int64_t{32} << 20;
  auto engine = Engine::Create(options);
  INFO(engine.status().ToString() << " (run scripts/fetch_tokenizer.sh for tokenizer.model)");
  REQUIRE(engine.ok());
  EngineWorker worker(engine->get(), store->get(), WorkerOptions{});
  worker.Start();
  BatchServiceImpl service(store->get(), nullptr);
  JobLimits limits;
  limits.max_context_tokens = (*engine)->max_context_tokens();
  limits.vocab_size = (*engine)->config().vocab_size;
  service.Attach(&worker, &(*engine)->tokenizer(), limits, TenantQuota{});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  REQUIRE(port > 0);
  auto stub = v1::BatchService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));

  // 4 greedy requests of 6 tokens each (EOS ignored), and one whose prompt does not fit the
  // context: pre-failed, it is not counted in max_tokens_total.
  v1::CreateJobRequest create;
  for (int i = 0; i < 5; ++i) {
    v1::BatchRequest* r = create.mutable_requests()->add_requests();
    r->set_custom_id("r" + std::to_string(i));
    if (i < 4) {
      r->set_prompt("Hello number " + std::to_string(i));
    } else {
      r->mutable_prompt_token_ids()->mutable_ids()->Resize(
          static_cast<int>(limits.max_context_tokens) + 1, 1);
    }
    r->mutable_sampling()->set_temperature(0);
    r->mutable_sampling()->set_max_tokens(6);
    r->mutable_sampling()->set_ignore_eos(true);
  }
  v1::Job job;
  {
    grpc::ClientContext context;
    const grpc::Status st = stub->CreateJob(&context, create, &job);
    INFO(st.error_message());
    REQUIRE(st.ok());
  }
  std::vector<v1::JobProgress> seen;
  {
    grpc::ClientContext context;
    v1::WatchJobRequest watch;
    watch.set_job_id(job.id());
    auto reader = stub->WatchJob(&context, watch);
    v1::JobProgress p;
    while (reader->Read(&p)) seen.push_back(p);
    REQUIRE(reader->Finish().ok());
  }
  REQUIRE(!seen.empty());
  const v1::JobProgress& last = seen.back();
  CHECK(last.state() == v1::JOB_STATE_COMPLETED);
  CHECK(last.request_counts().completed() == 4);
  CHECK(last.request_counts().failed() == 1);
  CHECK(last.generated_tokens() == 24);
  CHECK(last.max_tokens_total() == 24);
  CHECK(last.eta_seconds() == 0);
  // The job clock: sub-second resolution (whole seconds from started_at gave 0 tok/s to a job
  // shorter than a second), and the rate is its tokens over its time.
  INFO("elapsed " << last.elapsed_seconds() << " s, " << last.tokens_per_second() << " tok/s");
  CHECK(last.elapsed_seconds() > 0);
  CHECK(last.elapsed_seconds() != std::floor(last.elapsed_seconds()));
  CHECK(last.tokens_per_second() > 0);
  CHECK(
      last.tokens_per_second() ==
      Approx(static_cast<double>(last.generated_tokens()) / last.elapsed_seconds()).epsilon(1e-9));
  for (const v1::JobProgress& p : seen) {
    CHECK(p.max_tokens_total() == 24);
    CHECK(p.generated_tokens() <= p.max_tokens_total());
  }

  // GetJob reports the same frozen reading, however often it is asked.
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext context;
    v1::GetJobRequest get;
    get.set_job_id(job.id());
    v1::Job got;
    REQUIRE(stub->GetJob(&context, get, &got).ok());
    CHECK(got.tokens_per_second() == last.tokens_per_second());
    CHECK(got.elapsed_seconds() == last.elapsed_seconds());
    CHECK(got.generated_tokens() == 24);
  }
  server->Shutdown();
  worker.Stop();

  // A daemon that did not run the job (a restart): the store's whole seconds.
  BatchServiceImpl restarted(store->get(), nullptr);
  grpc::ServerContext context;
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  v1::Job got;
  REQUIRE(restarted.GetJob(&context, &get, &got).ok());
  const double whole = static_cast<double>(got.finished_at() - got.started_at());
  CHECK(got.elapsed_seconds() == whole);
  CHECK(got.tokens_per_second() == (whole > 0 ? 24 / whole : 0.0));
}

}  // namespace
}  // namespace moebatch
