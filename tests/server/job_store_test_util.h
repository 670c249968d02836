// The job store tests' helpers (tests/server/test_job_store*.cc): a store opened or the test
// fails, requests and results with predictable contents, and the calls that must succeed.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/job_store.h"

namespace moebatch {
namespace testing {

inline std::unique_ptr<JobStore> OpenOk(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  return *std::move(store);
}

inline StoredRequest Request(int64_t index, std::vector<int32_t> ids = {1, 2, 3}) {
  StoredRequest r;
  r.index = index;
  r.custom_id = "req-" + std::to_string(index);
  r.line = R"({"custom_id":"req-)" + std::to_string(index) + R"(","method":"POST"})";
  r.prompt_token_ids = std::move(ids);
  return r;
}

// Requests 0 .. n-1.
inline std::vector<StoredRequest> Requests(int64_t n) {
  std::vector<StoredRequest> requests;
  for (int64_t i = 0; i < n; ++i) requests.push_back(Request(i, {int32_t(i), -1, 32000}));
  return requests;
}

inline StoredResult Result(int64_t index, bool failed = false) {
  StoredResult r;
  r.index = index;
  r.custom_id = "req-" + std::to_string(index);
  r.line = R"({"custom_id":"req-)" + std::to_string(index) + R"(","response":{"n":)" +
           std::to_string(index) + "}}";
  r.failed = failed;
  return r;
}

// A job record of `tenant`, for CreateOk.
inline JobRecord OfTenant(const std::string& tenant) {
  JobRecord job;
  job.tenant = tenant;
  return job;
}

inline JobRecord CreateOk(JobStore& store, int64_t n, JobRecord job = {}) {
  absl::StatusOr<JobRecord> created = store.CreateJob(job, Requests(n), {});
  INFO(created.status().ToString());
  REQUIRE(created.ok());
  return *created;
}

inline JobRecord GetOk(JobStore& store, const std::string& id) {
  absl::StatusOr<JobRecord> job = store.GetJob(id);
  INFO(job.status().ToString());
  REQUIRE(job.ok());
  return *job;
}

inline bool CommitOk(JobStore& store, const std::string& id, const StoredResult& r,
                     int64_t prompt = 0, int64_t generated = 0) {
  absl::StatusOr<bool> stored = store.CommitResult(id, r, prompt, generated);
  INFO(stored.status().ToString());
  REQUIRE(stored.ok());
  return *stored;
}

}  // namespace testing
}  // namespace moebatch
