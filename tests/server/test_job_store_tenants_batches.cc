// server/job_store.h: tenants (ownership, opaque page tokens, round-robin feeding, quotas) and the
// OpenAI batch semantics (cancelled lines, deletion and retention, validation errors stored with
// the job, ListJobsAfter), against a real SQLite file in a temporary directory.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "server/job_store.h"
#include "tests/server/job_store_test_util.h"
#include "tests/support/temp_dir.h"

namespace moebatch {
namespace {

namespace fs = std::filesystem;

// TempDir and the helpers of job_store_test_util.h.
using namespace testing;  // NOLINT(build/namespaces)

TEST_CASE("JobStore: jobs belong to a tenant; ListJobs filters by tenant", "[job_store][tenant]") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  JobRecord a;
  a.tenant = "team-a";
  JobRecord b;
  b.tenant = "team-b";
  const JobRecord a1 = CreateOk(*store, 2, a);
  const JobRecord b1 = CreateOk(*store, 3, b);
  const JobRecord a2 = CreateOk(*store, 1, a);
  CHECK(GetOk(*store, a1.id).tenant == "team-a");
  CHECK(GetOk(*store, b1.id).tenant == "team-b");
  CHECK(JobRecord{}.tenant == "local");

  auto ids = [&](const std::string& tenant) {
    absl::StatusOr<JobStore::Page> page = store->ListJobs(100, "", std::nullopt, tenant);
    REQUIRE(page.ok());
    std::vector<std::string> out;
    for (const JobRecord& j : page->jobs) out.push_back(j.id);
    return out;
  };
  CHECK(ids("team-a") == std::vector<std::string>{a2.id, a1.id});
  CHECK(ids("team-b") == std::vector<std::string>{b1.id});
  CHECK(ids("nobody").empty());
  CHECK(ids("").size() == 3);
  // Paging within a tenant.
  absl::StatusOr<JobStore::Page> first = store->ListJobs(1, "", std::nullopt, "team-a");
  REQUIRE(first.ok());
  REQUIRE(first->jobs.size() == 1);
  absl::StatusOr<JobStore::Page> second =
      store->ListJobs(1, first->next_page_token, std::nullopt, "team-a");
  REQUIRE(second.ok());
  REQUIRE(second->jobs.size() == 1);
  CHECK(second->jobs[0].id == a1.id);
  CHECK(second->next_page_token.empty());
}

TEST_CASE("JobStore: page tokens are opaque and bound to their tenant", "[job_store][tenant]") {
  TempDir dir;
  JobRecord a, b;
  a.tenant = "team-a";
  b.tenant = "team-b";
  std::string token_a, token_b;
  {
    std::unique_ptr<JobStore> store = OpenOk(dir.str());
    for (int i = 0; i < 3; ++i) CreateOk(*store, 1, a);
    for (int i = 0; i < 3; ++i) CreateOk(*store, 1, b);
    absl::StatusOr<JobStore::Page> pa = store->ListJobs(1, "", std::nullopt, "team-a");
    absl::StatusOr<JobStore::Page> pb = store->ListJobs(1, "", std::nullopt, "team-b");
    REQUIRE((pa.ok() && pb.ok()));
    token_a = pa->next_page_token;
    token_b = pb->next_page_token;
    // The same position listed twice gives two different tokens (a fresh nonce each): nothing in
    // a token counts jobs.
    CHECK(store->ListJobs(1, "", std::nullopt, "team-a")->next_page_token != token_a);
    // Another tenant's token, a token with one digit changed, and a made-up one are refused.
    for (const std::string& bad :
         {token_b, token_a.substr(0, token_a.size() - 1) + (token_a.back() == '0' ? "1" : "0"),
          std::string(token_a.size(), '0')}) {
      absl::StatusOr<JobStore::Page> refused = store->ListJobs(1, bad, std::nullopt, "team-a");
      CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    }
  }
  // The key lives in the data dir: tokens outlive a restart.
  std::unique_ptr<JobStore> reopened = OpenOk(dir.str());
  absl::StatusOr<JobStore::Page> next = reopened->ListJobs(1, token_a, std::nullopt, "team-a");
  REQUIRE(next.ok());
  REQUIRE(next->jobs.size() == 1);
  CHECK(next->jobs[0].tenant == "team-a");
  CHECK((fs::status(fs::path(dir.str()) / "page_token.key").permissions() &
         fs::perms::others_read) == fs::perms::none);
}

TEST_CASE("JobStore: pending requests take turns across tenants", "[job_store][tenant]") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  JobRecord a, b, c;
  a.tenant = "team-a";
  b.tenant = "team-b";
  c.tenant = "team-c";
  const std::string c1 = CreateOk(*store, 1, c).id;
  const std::string a1 = CreateOk(*store, 5, a).id;  // a large job
  const std::string a2 = CreateOk(*store, 1, a).id;
  const std::string b1 = CreateOk(*store, 2, b).id;
  CHECK(CommitOk(*store, a1, Result(0)));
  auto order = [&](int64_t limit, const std::string& after) {
    absl::StatusOr<std::vector<PendingRequest>> pending = store->PendingRequests(limit, after);
    REQUIRE(pending.ok());
    std::vector<std::string> out;
    for (const PendingRequest& p : *pending) {
      out.push_back(p.tenant + ":" + p.job_id + "/" + std::to_string(p.request.index));
    }
    return out;
  };
  auto at = [](const std::string& tenant, const std::string& job, int index) {
    return tenant + ":" + job + "/" + std::to_string(index);
  };
  // Round robin a, b, c (by name); each tenant's own requests in job order then index.
  CHECK(order(0, "") == std::vector<std::string>{at("team-a", a1, 1), at("team-b", b1, 0),
                                                 at("team-c", c1, 0), at("team-a", a1, 2),
                                                 at("team-b", b1, 1), at("team-a", a1, 3),
                                                 at("team-a", a1, 4), at("team-a", a2, 0)});
  CHECK(order(4, "") == std::vector<std::string>{at("team-a", a1, 1), at("team-b", b1, 0),
                                                 at("team-c", c1, 0), at("team-a", a1, 2)});
  // The turn starts after the tenant fed last, wrapping around.
  CHECK(order(1, "team-a") == std::vector<std::string>{at("team-b", b1, 0)});
  CHECK(order(3, "team-b") ==
        std::vector<std::string>{at("team-c", c1, 0), at("team-a", a1, 1), at("team-b", b1, 0)});
  CHECK(order(1, "team-c") == std::vector<std::string>{at("team-a", a1, 1)});
  CHECK(order(1, "gone") == std::vector<std::string>{at("team-a", a1, 1)});
  // Skipped requests (the engine's in flight) are left out and do not count toward the limit.
  {
    absl::StatusOr<std::vector<PendingRequest>> pending =
        store->PendingRequests(3, "", [&](const std::string& job, int64_t index) {
          return (job == a1 && index == 1) || (job == b1 && index == 0);
        });
    REQUIRE(pending.ok());
    std::vector<std::string> got;
    for (const PendingRequest& p : *pending) {
      got.push_back(p.tenant + ":" + p.job_id + "/" + std::to_string(p.request.index));
    }
    CHECK(got ==
          std::vector<std::string>{at("team-a", a1, 2), at("team-b", b1, 1), at("team-c", c1, 0)});
  }
  // A tenant whose jobs are all done or cancelled drops out of the turns.
  REQUIRE(store->SetJobState(b1, JobState::kCancelling).ok());
  CHECK(order(3, "team-a") ==
        std::vector<std::string>{at("team-c", c1, 0), at("team-a", a1, 1), at("team-a", a1, 2)});
}

TEST_CASE("JobStore: per-tenant quotas refuse a job atomically and name the limit",
          "[job_store][tenant]") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  JobRecord a;
  a.tenant = "team-a";
  std::vector<StoredRequest> requests = Requests(3);
  for (StoredRequest& r : requests) r.budget_tokens = 100;  // 300 per job

  SECTION("pending jobs") {
    const TenantQuota quota{/*max_pending_jobs=*/2, /*max_queued_tokens=*/0};
    REQUIRE(store->CreateJob(a, requests, {}, quota).ok());
    absl::StatusOr<JobRecord> second = store->CreateJob(a, requests, {}, quota);
    REQUIRE(second.ok());
    absl::StatusOr<JobRecord> third = store->CreateJob(a, requests, {}, quota);
    CHECK(third.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(third.status().message(), "max_pending_jobs_per_tenant"));
    CHECK(absl::StrContains(third.status().message(), "team-a"));
    // Another tenant is not affected; nothing of the refused job was stored.
    JobRecord b;
    b.tenant = "team-b";
    CHECK(store->CreateJob(b, requests, {}, quota).ok());
    absl::StatusOr<JobStore::Page> page = store->ListJobs(100, "", std::nullopt, "team-a");
    REQUIRE(page.ok());
    CHECK(page->jobs.size() == 2);
    // A finished job frees its slot.
    for (int64_t i = 0; i < 3; ++i) CommitOk(*store, second->id, Result(i));
    CHECK(GetOk(*store, second->id).state == JobState::kCompleted);
    CHECK(store->CreateJob(a, requests, {}, quota).ok());
  }
  SECTION("queued tokens count requests without a result") {
    const TenantQuota quota{/*max_pending_jobs=*/0, /*max_queued_tokens=*/700};
    absl::StatusOr<JobRecord> first = store->CreateJob(a, requests, {}, quota);
    REQUIRE(first.ok());
    REQUIRE(store->CreateJob(a, requests, {}, quota).ok());  // 600 queued
    absl::StatusOr<TenantUsage> usage = store->Usage("team-a");
    REQUIRE(usage.ok());
    CHECK(usage->pending_jobs == 2);
    CHECK(usage->queued_tokens == 600);
    absl::StatusOr<JobRecord> refused = store->CreateJob(a, requests, {}, quota);
    CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(absl::StrContains(refused.status().message(), "max_queued_tokens_per_tenant"));
    CHECK(absl::StrContains(refused.status().message(), "600"));
    // Two results of the first job free 200 tokens: 400 queued + 300 fits.
    CommitOk(*store, first->id, Result(0));
    CommitOk(*store, first->id, Result(1));
    usage = store->Usage("team-a");
    REQUIRE(usage.ok());
    CHECK(usage->queued_tokens == 400);
    CHECK(store->CreateJob(a, requests, {}, quota).ok());
    // A cancelled job's requests no longer count.
    REQUIRE(store->SetJobState(first->id, JobState::kCancelled).ok());
    usage = store->Usage("team-a");
    REQUIRE(usage.ok());
    CHECK(usage->queued_tokens == 600);
    CHECK(usage->pending_jobs == 2);
  }
  SECTION("pending requests carry their budget") {
    REQUIRE(store->CreateJob(a, requests, {}).ok());
    absl::StatusOr<std::vector<PendingRequest>> pending = store->PendingRequests();
    REQUIRE(pending.ok());
    REQUIRE(pending->size() == 3);
    CHECK((*pending)[2].request.budget_tokens == 100);
  }
}

TEST_CASE("JobStore: a cancel gives every request without a result a batch_cancelled line") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  std::vector<StoredRequest> requests = Requests(4);
  requests[2].custom_id = "quote\"and\\backslash";  // escaped by SQLite's json_object
  absl::StatusOr<JobRecord> created = store->CreateJob(JobRecord{}, requests, {});
  REQUIRE(created.ok());
  const std::string id = created->id;
  REQUIRE(CommitOk(*store, id, Result(0), 3, 5));
  REQUIRE(store->SetJobState(id, JobState::kCancelling).ok());
  const JobRecord cancelling = GetOk(*store, id);
  CHECK(cancelling.cancelling_at > 0);
  CHECK(cancelling.cancelled == 0);
  REQUIRE(store->SetJobState(id, JobState::kCancelled).ok());
  const JobRecord job = GetOk(*store, id);
  CHECK(job.state == JobState::kCancelled);
  CHECK(job.completed == 1);
  CHECK(job.failed == 0);
  CHECK(job.cancelled == 3);
  CHECK(job.completed + job.failed + job.cancelled == job.total);
  CHECK(job.cancelling_at == cancelling.cancelling_at);
  absl::StatusOr<std::vector<StoredResult>> failed = store->Results(id, 0, 0, /*failed=*/true);
  REQUIRE(failed.ok());
  REQUIRE(failed->size() == 3);
  for (const StoredResult& r : *failed) {
    const nlohmann::json line = nlohmann::json::parse(r.line);
    CHECK(line["custom_id"] == requests[r.index].custom_id);
    CHECK(line["response"].is_null());
    CHECK(line["error"]["code"] == "batch_cancelled");
    CHECK(line["id"] == "batch_req_" + id + "_" + std::to_string(r.index));
  }
  // Cancelling again changes nothing; a late result of a dropped request is not stored.
  REQUIRE(store->SetJobState(id, JobState::kCancelled).ok());
  CHECK(GetOk(*store, id).cancelled == 3);
  CHECK_FALSE(CommitOk(*store, id, Result(1)));
  // The sizes of the output and error files: each line and its newline, in bytes.
  absl::StatusOr<JobStore::ResultStats> sizes = store->ResultSizes(id);
  REQUIRE(sizes.ok());
  CHECK(sizes->ok_lines == 1);
  CHECK(sizes->ok_bytes == static_cast<int64_t>(Result(0).line.size() + 1));
  CHECK(sizes->failed_lines == 3);
  int64_t bytes = 0;
  for (const StoredResult& r : *failed) bytes += static_cast<int64_t>(r.line.size() + 1);
  CHECK(sizes->failed_bytes == bytes);
}

TEST_CASE("JobStore: deleting results, jobs, and jobs past retention") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  const JobRecord running = CreateOk(*store, 2);
  CHECK(store->DeleteJob(running.id).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(store->DeleteJob("job_nope").code() == absl::StatusCode::kNotFound);
  REQUIRE(CommitOk(*store, running.id, Result(0)));
  REQUIRE(CommitOk(*store, running.id, Result(1, /*failed=*/true)));
  absl::StatusOr<int64_t> deleted = store->DeleteResults(running.id, /*failed=*/false);
  REQUIRE(deleted.ok());
  CHECK(*deleted == 1);
  absl::StatusOr<std::vector<StoredResult>> left = store->Results(running.id, 0);
  REQUIRE(left.ok());
  REQUIRE(left->size() == 1);
  CHECK(left->front().failed);
  CHECK(GetOk(*store, running.id).completed == 1);  // the counters stay
  REQUIRE(store->DeleteJob(running.id).ok());
  CHECK(store->GetJob(running.id).status().code() == absl::StatusCode::kNotFound);
  CHECK(store->Results(running.id, 0).status().code() == absl::StatusCode::kNotFound);

  const JobRecord done = CreateOk(*store, 1);
  REQUIRE(CommitOk(*store, done.id, Result(0)));
  const JobRecord unfinished = CreateOk(*store, 1);
  const int64_t finished_at = GetOk(*store, done.id).finished_at;
  absl::StatusOr<int64_t> none = store->DeleteJobsFinishedBefore(finished_at);
  REQUIRE(none.ok());
  CHECK(*none == 0);
  absl::StatusOr<int64_t> one = store->DeleteJobsFinishedBefore(finished_at + 1);
  REQUIRE(one.ok());
  CHECK(*one == 1);
  CHECK(store->GetJob(done.id).status().code() == absl::StatusCode::kNotFound);
  CHECK(store->GetJob(unfinished.id).ok());
}

TEST_CASE("JobStore: a batch that failed validation is stored with its line errors") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  JobRecord job;
  job.state = JobState::kFailed;
  job.endpoint = "/v1/chat/completions";
  job.completion_window = "24h";
  job.input_file_id = "file-0123456789abcdef01234567";
  job.expires_at = 4102444800;
  job.errors = {{3, "invalid_request", "body.temperature", "body.temperature: must be in [0, 100]"},
                {5, "invalid_json_line", "", "invalid JSON: \xff"}};
  absl::StatusOr<JobRecord> created = store->CreateJob(job, {}, {});
  INFO(created.status().ToString());
  REQUIRE(created.ok());
  const JobRecord read = GetOk(*store, created->id);
  CHECK(read.state == JobState::kFailed);
  CHECK(read.total == 0);
  CHECK(read.finished_at > 0);
  CHECK(read.endpoint == job.endpoint);
  CHECK(read.completion_window == "24h");
  CHECK(read.input_file_id == job.input_file_id);
  CHECK(read.expires_at == job.expires_at);
  REQUIRE(read.errors.size() == 2);
  CHECK(read.errors[0].line == 3);
  CHECK(read.errors[0].param == "body.temperature");
  CHECK(read.errors[1].code == "invalid_json_line");
  CHECK(read.errors[1].message == "invalid JSON: \xEF\xBF\xBD");  // ill-formed UTF-8 replaced
  // No requests and not failed: refused as before.
  CHECK(store->CreateJob(JobRecord{}, {}, {}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

// Every result file ListResultFiles gives for `tenant`, walked `limit` at a time with the cursor.
std::vector<JobStore::ResultFile> WalkResultFiles(JobStore& store, const std::string& tenant,
                                                  int32_t limit, bool ascending) {
  std::vector<JobStore::ResultFile> all;
  int64_t at = 0;
  std::string id;
  for (int pages = 0; pages < 100; ++pages) {
    absl::StatusOr<JobStore::ResultFilePage> page =
        store.ListResultFiles(tenant, at, id, limit, ascending);
    INFO(page.status().ToString());
    REQUIRE(page.ok());
    CHECK(static_cast<int32_t>(page->files.size()) <= limit);
    all.insert(all.end(), page->files.begin(), page->files.end());
    if (!page->has_more) return all;
    REQUIRE(!page->files.empty());
    at = page->files.back().created_at;
    id = page->files.back().id;
  }
  FAIL("ListResultFiles did not end");
  return all;
}

TEST_CASE("JobStore: ListResultFiles lists exactly the result files HasResultFile names") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  const JobRecord mine = OfTenant("team-a");
  const JobRecord theirs = OfTenant("team-b");
  // Successful lines only; both outcomes; unfinished; cancelled before any result; expired;
  // failed validation (no lines); every line failed validation (completed at once).
  const JobRecord ok = CreateOk(*store, 2, mine);
  REQUIRE(CommitOk(*store, ok.id, Result(0)));
  REQUIRE(CommitOk(*store, ok.id, Result(1)));
  const JobRecord mixed = CreateOk(*store, 2, mine);
  REQUIRE(CommitOk(*store, mixed.id, Result(0)));
  REQUIRE(CommitOk(*store, mixed.id, Result(1, /*failed=*/true)));
  const JobRecord running = CreateOk(*store, 2, mine);
  REQUIRE(CommitOk(*store, running.id, Result(0)));
  const JobRecord cancelled = CreateOk(*store, 3, mine);
  REQUIRE(store->SetJobState(cancelled.id, JobState::kCancelling).ok());
  REQUIRE(store->SetJobState(cancelled.id, JobState::kCancelled).ok());
  const JobRecord expired = CreateOk(*store, 1, theirs);
  REQUIRE(store->SetJobState(expired.id, JobState::kExpired).ok());
  JobRecord invalid = mine;
  invalid.state = JobState::kFailed;
  invalid.errors = {{1, "invalid_json_line", "", "invalid JSON"}};
  absl::StatusOr<JobRecord> invalid_created = store->CreateJob(invalid, {}, {});
  REQUIRE(invalid_created.ok());
  absl::StatusOr<JobRecord> prefailed = store->CreateJob(
      mine, {}, {{0, "p0", R"({"custom_id":"p0","error":{"code":"invalid_request"}})"}});
  REQUIRE(prefailed.ok());
  REQUIRE(GetOk(*store, prefailed->id).state == JobState::kCompleted);

  const std::vector<std::string> ids = {ok.id,      mixed.id,      running.id,         cancelled.id,
                                        expired.id, prefailed->id, invalid_created->id};
  // (created_at, id) of every file HasResultFile names, of `tenant` ("" = all).
  auto expected = [&](const std::string& tenant) {
    std::vector<std::pair<int64_t, std::string>> files;
    for (const std::string& id : ids) {
      const JobRecord job = GetOk(*store, id);
      if (!tenant.empty() && job.tenant != tenant) continue;
      for (bool failed : {false, true}) {
        if (HasResultFile(job, failed))
          files.emplace_back(job.finished_at, ResultFileId(id, failed));
      }
    }
    std::sort(files.begin(), files.end());
    return files;
  };
  auto listed = [](const std::vector<JobStore::ResultFile>& files) {
    std::vector<std::pair<int64_t, std::string>> out;
    for (const JobStore::ResultFile& f : files) {
      CHECK(f.id == ResultFileId(f.job_id, f.failed));
      out.emplace_back(f.created_at, f.id);
    }
    return out;
  };
  // What HasResultFile says of these jobs.
  CHECK(HasResultFile(GetOk(*store, ok.id), false));
  CHECK_FALSE(HasResultFile(GetOk(*store, ok.id), true));
  CHECK(HasResultFile(GetOk(*store, mixed.id), false));
  CHECK(HasResultFile(GetOk(*store, mixed.id), true));
  CHECK_FALSE(HasResultFile(GetOk(*store, running.id), false));
  CHECK_FALSE(HasResultFile(GetOk(*store, cancelled.id), false));
  CHECK(HasResultFile(GetOk(*store, cancelled.id), true));
  CHECK(HasResultFile(GetOk(*store, expired.id), true));
  CHECK_FALSE(HasResultFile(GetOk(*store, invalid_created->id), true));
  CHECK(HasResultFile(GetOk(*store, prefailed->id), true));
  CHECK_FALSE(HasResultFile(GetOk(*store, prefailed->id), false));
  REQUIRE(expected("team-a").size() == 5);

  for (const std::string tenant : {"team-a", "team-b", ""}) {
    INFO("tenant '" << tenant << "'");
    auto want = expected(tenant);
    for (int32_t limit : {1, 2, 10000}) {
      INFO("limit " << limit);
      CHECK(listed(WalkResultFiles(*store, tenant, limit, /*ascending=*/true)) == want);
      auto descending = listed(WalkResultFiles(*store, tenant, limit, /*ascending=*/false));
      std::reverse(descending.begin(), descending.end());
      CHECK(descending == want);
    }
  }
  CHECK(listed(WalkResultFiles(*store, "team-b", 10, true)) ==
        std::vector<std::pair<int64_t, std::string>>{
            {GetOk(*store, expired.id).finished_at, ResultFileId(expired.id, true)}});
  CHECK(WalkResultFiles(*store, "team-c", 10, true).empty());

  // A deleted outcome is gone from the listing, the other stays; the counters stay.
  REQUIRE(store->DeleteResults(mixed.id, /*failed=*/false).ok());
  const JobRecord after_delete = GetOk(*store, mixed.id);
  CHECK(after_delete.output_deleted);
  CHECK_FALSE(after_delete.errors_deleted);
  CHECK(after_delete.completed == 1);
  CHECK_FALSE(HasResultFile(after_delete, false));
  CHECK(HasResultFile(after_delete, true));
  auto left = listed(WalkResultFiles(*store, "team-a", 1, true));
  CHECK(left == expected("team-a"));
  CHECK(left.size() == 4);
  REQUIRE(store->DeleteResults(mixed.id, /*failed=*/true).ok());
  CHECK(GetOk(*store, mixed.id).errors_deleted);
  CHECK(listed(WalkResultFiles(*store, "team-a", 1, true)).size() == 3);
  // A job deleted takes its files with it.
  REQUIRE(store->DeleteJob(ok.id).ok());
  CHECK(listed(WalkResultFiles(*store, "team-a", 1, false)).size() == 2);

  CHECK(store->ListResultFiles("", 0, "", 0, true).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(store->ListResultFiles("", 0, "", 10001, true).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("JobStore: ListJobsAfter pages by job id, newest first, per tenant") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    JobRecord job;
    job.tenant = i % 2 == 0 ? "even" : "odd";
    ids.push_back(CreateOk(*store, 1, job).id);
  }
  absl::StatusOr<JobStore::AfterPage> first = store->ListJobsAfter("", 2, "");
  REQUIRE(first.ok());
  REQUIRE(first->jobs.size() == 2);
  CHECK(first->has_more);
  CHECK(first->jobs[0].id == ids[4]);
  CHECK(first->jobs[1].id == ids[3]);
  absl::StatusOr<JobStore::AfterPage> rest = store->ListJobsAfter(ids[3], 10, "");
  REQUIRE(rest.ok());
  REQUIRE(rest->jobs.size() == 3);
  CHECK_FALSE(rest->has_more);
  CHECK(rest->jobs[2].id == ids[0]);
  absl::StatusOr<JobStore::AfterPage> even = store->ListJobsAfter("", 10, "even");
  REQUIRE(even.ok());
  CHECK(even->jobs.size() == 3);
  // Another tenant's id is no cursor for this tenant.
  CHECK(store->ListJobsAfter(ids[1], 10, "even").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(store->ListJobsAfter("job_nope", 10, "").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moebatch
