// BatchServiceImpl (server/batch_service.h) called directly, over a real job store: what no
// CreateJob can store any more but an older store may hold (metadata beyond OpenAI's limits) still
// lists in replies a client can receive, and a status message never exceeds gRPC's limit.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <random>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/server_context.h"
#include "server/batch_service.h"
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

}  // namespace
}  // namespace moebatch
