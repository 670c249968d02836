// The durable job store (server/job_store.h): round trips, paging, idempotent results, state
// transitions, pending requests across reopen, bad files, and a child process killed with SIGKILL
// while it commits results. Each test uses its own temporary data directory.
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "server/job_store.h"
#include "tests/support/temp_dir.h"

namespace moebatch {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
using testing::TempDir;

std::unique_ptr<JobStore> OpenOk(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  return *std::move(store);
}

StoredRequest Request(int64_t index, std::vector<int32_t> ids = {1, 2, 3}) {
  StoredRequest r;
  r.index = index;
  r.custom_id = "req-" + std::to_string(index);
  r.line = R"({"custom_id":"req-)" + std::to_string(index) + R"(","method":"POST"})";
  r.prompt_token_ids = std::move(ids);
  return r;
}

// Requests 0 .. n-1.
std::vector<StoredRequest> Requests(int64_t n) {
  std::vector<StoredRequest> requests;
  for (int64_t i = 0; i < n; ++i) requests.push_back(Request(i, {int32_t(i), -1, 32000}));
  return requests;
}

StoredResult Result(int64_t index, bool failed = false) {
  StoredResult r;
  r.index = index;
  r.custom_id = "req-" + std::to_string(index);
  r.line = R"({"custom_id":"req-)" + std::to_string(index) + R"(","response":{"n":)" +
           std::to_string(index) + "}}";
  r.failed = failed;
  return r;
}

JobRecord CreateOk(JobStore& store, int64_t n, JobRecord job = {}) {
  absl::StatusOr<JobRecord> created = store.CreateJob(job, Requests(n), {});
  INFO(created.status().ToString());
  REQUIRE(created.ok());
  return *created;
}

JobRecord GetOk(JobStore& store, const std::string& id) {
  absl::StatusOr<JobRecord> job = store.GetJob(id);
  INFO(job.status().ToString());
  REQUIRE(job.ok());
  return *job;
}

bool CommitOk(JobStore& store, const std::string& id, const StoredResult& r, int64_t prompt = 0,
              int64_t generated = 0) {
  absl::StatusOr<bool> stored = store.CommitResult(id, r, prompt, generated);
  INFO(stored.status().ToString());
  REQUIRE(stored.ok());
  return *stored;
}

TEST_CASE("JobStore: create and get round trip", "[job_store]") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());

  JobRecord job;
  job.model = "mixtral-tiny";
  job.metadata = {{"owner", "ada"}, {"purpose", "eval \"quoted\" ünïcode"}, {"empty", ""}};
  job.state = JobState::kValidating;
  std::vector<StoredRequest> requests = {Request(0, {1, 2, 3}), Request(2, {}),
                                         Request(3, {-7, 2147483647, -2147483647 - 1})};
  PrefailedRequest bad;
  bad.index = 1;
  bad.custom_id = "req-1";
  bad.result_line = R"({"custom_id":"req-1","error":{"message":"prompt too long"}})";

  absl::StatusOr<JobRecord> created = store->CreateJob(job, requests, {bad});
  REQUIRE(created.ok());
  CHECK(absl::StartsWith(created->id, "job_"));
  CHECK(created->id.size() == 4 + 24);
  CHECK(created->id.find_first_not_of("0123456789abcdef", 4) == std::string::npos);
  CHECK(created->created_at > 0);
  CHECK(created->state == JobState::kValidating);

  JobRecord got = GetOk(*store, created->id);
  CHECK(got.id == created->id);
  CHECK(got.model == "mixtral-tiny");
  CHECK(got.metadata == job.metadata);
  CHECK(got.state == JobState::kValidating);
  CHECK(got.total == 4);
  CHECK(got.completed == 0);
  CHECK(got.failed == 1);  // the pre-failed request
  CHECK(got.created_at == created->created_at);
  CHECK(got.started_at == 0);
  CHECK(got.finished_at == 0);

  absl::StatusOr<std::vector<StoredResult>> results = store->Results(created->id, 0);
  REQUIRE(results.ok());
  REQUIRE(results->size() == 1);
  CHECK((*results)[0].index == 1);
  CHECK((*results)[0].failed);
  CHECK((*results)[0].line == bad.result_line);

  absl::StatusOr<std::vector<PendingRequest>> pending = store->PendingRequests();
  REQUIRE(pending.ok());
  REQUIRE(pending->size() == 3);
  for (size_t i = 0; i < pending->size(); ++i) {
    CHECK((*pending)[i].job_id == created->id);
    CHECK((*pending)[i].request.index == requests[i].index);
    CHECK((*pending)[i].request.custom_id == requests[i].custom_id);
    CHECK((*pending)[i].request.line == requests[i].line);
    CHECK((*pending)[i].request.prompt_token_ids == requests[i].prompt_token_ids);
  }

  SECTION("a caller-chosen id and created_at are kept; a taken id is refused") {
    JobRecord named;
    named.id = "job_chosen";
    named.created_at = 1234;
    absl::StatusOr<JobRecord> a = store->CreateJob(named, Requests(1), {});
    REQUIRE(a.ok());
    CHECK(a->id == "job_chosen");
    CHECK(GetOk(*store, "job_chosen").created_at == 1234);
    absl::StatusOr<JobRecord> b = store->CreateJob(named, Requests(1), {});
    CHECK(b.status().code() == absl::StatusCode::kAlreadyExists);
  }
  SECTION("every request pre-failed: COMPLETED at once") {
    std::vector<PrefailedRequest> all(3);
    for (int i = 0; i < 3; ++i) {
      all[i].index = i;
      all[i].custom_id = "req-" + std::to_string(i);
      all[i].result_line = "{}";
    }
    absl::StatusOr<JobRecord> done = store->CreateJob(JobRecord{}, {}, all);
    REQUIRE(done.ok());
    CHECK(done->state == JobState::kCompleted);
    JobRecord stored = GetOk(*store, done->id);
    CHECK(stored.state == JobState::kCompleted);
    CHECK(stored.total == 3);
    CHECK(stored.failed == 3);
    CHECK(stored.completed == 0);
    CHECK(stored.finished_at > 0);
    // Not pending: only the first job's three requests are.
    absl::StatusOr<std::vector<PendingRequest>> again = store->PendingRequests();
    REQUIRE(again.ok());
    CHECK(again->size() == 3);
  }
  SECTION("bad jobs are refused whole and store nothing") {
    CHECK(store->CreateJob(JobRecord{}, {}, {}).status().code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(store->CreateJob(JobRecord{}, {Request(0), Request(0)}, {}).status().code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(store->CreateJob(JobRecord{}, {Request(0), Request(2)}, {}).status().code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(store->CreateJob(JobRecord{}, {Request(-1)}, {}).status().code() ==
          absl::StatusCode::kInvalidArgument);
    JobRecord done;
    done.state = JobState::kCompleted;
    CHECK(store->CreateJob(done, Requests(1), {}).status().code() ==
          absl::StatusCode::kInvalidArgument);
    JobRecord bad_utf8;
    bad_utf8.metadata = {{"k", "\xff\xfe"}};
    CHECK(store->CreateJob(bad_utf8, Requests(1), {}).status().code() ==
          absl::StatusCode::kInvalidArgument);
    absl::StatusOr<JobStore::Page> page = store->ListJobs(100, "", std::nullopt);
    REQUIRE(page.ok());
    CHECK(page->jobs.size() == 1);
  }
}

TEST_CASE("JobStore: ListJobs pages newest first with a state filter", "[job_store]") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  std::vector<std::string> ids;  // in creation order
  for (int i = 0; i < 25; ++i) {
    JobRecord job;
    job.created_at = 1000 + i / 2;  // pairs share a second: ties are broken by creation order
    job.model = "m" + std::to_string(i);
    ids.push_back(CreateOk(*store, 1, job).id);
  }
  for (int i = 0; i < 25; i += 3) REQUIRE(store->SetJobState(ids[i], JobState::kCancelled).ok());

  SECTION("all jobs: 10 + 10 + 5") {
    std::vector<std::string> seen;
    std::string token;
    std::vector<size_t> sizes;
    do {
      absl::StatusOr<JobStore::Page> page = store->ListJobs(10, token, std::nullopt);
      INFO(page.status().ToString());
      REQUIRE(page.ok());
      sizes.push_back(page->jobs.size());
      for (const JobRecord& j : page->jobs) seen.push_back(j.id);
      token = page->next_page_token;
    } while (!token.empty());
    CHECK(sizes == std::vector<size_t>{10, 10, 5});
    std::vector<std::string> newest_first(ids.rbegin(), ids.rend());
    CHECK(seen == newest_first);
  }
  SECTION("an exact multiple of the page size ends with an empty token") {
    absl::StatusOr<JobStore::Page> page = store->ListJobs(25, "", std::nullopt);
    REQUIRE(page.ok());
    CHECK(page->jobs.size() == 25);
    CHECK(page->next_page_token.empty());
  }
  SECTION("state filter") {
    std::vector<std::string> cancelled, seen;
    for (int i = 24; i >= 0; --i) {
      if (i % 3 == 0) cancelled.push_back(ids[i]);
    }
    std::string token;
    int pages = 0;
    do {
      absl::StatusOr<JobStore::Page> page = store->ListJobs(4, token, JobState::kCancelled);
      REQUIRE(page.ok());
      ++pages;
      for (const JobRecord& j : page->jobs) {
        CHECK(j.state == JobState::kCancelled);
        seen.push_back(j.id);
      }
      token = page->next_page_token;
    } while (!token.empty());
    CHECK(seen == cancelled);  // 9 jobs
    CHECK(pages == 3);
    absl::StatusOr<JobStore::Page> none = store->ListJobs(10, "", JobState::kFinalizing);
    REQUIRE(none.ok());
    CHECK(none->jobs.empty());
    CHECK(none->next_page_token.empty());
  }
  SECTION("bad tokens and page sizes are InvalidArgument") {
    absl::StatusOr<JobStore::Page> first = store->ListJobs(10, "", std::nullopt);
    REQUIRE(first.ok());
    std::string token = first->next_page_token;
    REQUIRE(!token.empty());
    std::string flipped = token;
    flipped[5] = flipped[5] == '0' ? '1' : '0';
    for (const std::string& bad :
         {std::string("garbage"), flipped, token.substr(1), token + "00", std::string(40, 'z')}) {
      INFO(bad);
      CHECK(store->ListJobs(10, bad, std::nullopt).status().code() ==
            absl::StatusCode::kInvalidArgument);
    }
    CHECK(store->ListJobs(0, "", std::nullopt).status().code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(store->ListJobs(1001, "", std::nullopt).status().code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(store->ListJobs(1000, "", std::nullopt).ok());
  }
}

TEST_CASE("JobStore: CommitResult is idempotent and finishes the job", "[job_store]") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  const std::string id = CreateOk(*store, 3).id;

  CHECK(CommitOk(*store, id, Result(1), 10, 5));
  JobRecord after_first = GetOk(*store, id);
  CHECK(after_first.completed == 1);
  CHECK(after_first.prompt_tokens == 10);
  CHECK(after_first.generated_tokens == 5);
  CHECK(after_first.started_at > 0);
  CHECK(after_first.state == JobState::kInProgress);

  // The same index again, even with other content: ignored, nothing changes.
  StoredResult other = Result(1, /*failed=*/true);
  other.line = "different";
  CHECK_FALSE(CommitOk(*store, id, other, 99, 99));
  JobRecord after_second = GetOk(*store, id);
  CHECK(after_second.completed == 1);
  CHECK(after_second.failed == 0);
  CHECK(after_second.prompt_tokens == 10);
  CHECK(after_second.generated_tokens == 5);
  absl::StatusOr<std::vector<StoredResult>> results = store->Results(id, 0);
  REQUIRE(results.ok());
  REQUIRE(results->size() == 1);
  CHECK((*results)[0].line == Result(1).line);

  CHECK(store->CommitResult(id, Result(3), 0, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(store->CommitResult(id, Result(-1), 0, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(store->CommitResult(id, Result(0), -1, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);

  SECTION("the last result completes the job") {
    CHECK(CommitOk(*store, id, Result(0, /*failed=*/true), 7, 0));
    CHECK(GetOk(*store, id).state == JobState::kInProgress);
    CHECK(CommitOk(*store, id, Result(2), 3, 4));
    JobRecord done = GetOk(*store, id);
    CHECK(done.state == JobState::kCompleted);
    CHECK(done.completed == 2);
    CHECK(done.failed == 1);
    CHECK(done.prompt_tokens == 20);
    CHECK(done.generated_tokens == 9);
    CHECK(done.finished_at >= done.started_at);
    CHECK(done.finished_at > 0);
    // Terminal states are final.
    CHECK(store->SetJobState(id, JobState::kCancelling).code() ==
          absl::StatusCode::kFailedPrecondition);
    CHECK(store->SetJobState(id, JobState::kCompleted).ok());
    CHECK(GetOk(*store, id).state == JobState::kCompleted);
  }
  SECTION("the last result of a cancelling job cancels it") {
    REQUIRE(store->SetJobState(id, JobState::kCancelling).ok());
    absl::StatusOr<std::vector<std::string>> cancelling = store->JobsInState(JobState::kCancelling);
    REQUIRE(cancelling.ok());
    CHECK(*cancelling == std::vector<std::string>{id});
    absl::StatusOr<std::vector<PendingRequest>> pending = store->PendingRequests();
    REQUIRE(pending.ok());
    CHECK(pending->empty());  // a cancelling job is not queued again

    CHECK(CommitOk(*store, id, Result(0)));
    CHECK(GetOk(*store, id).state == JobState::kCancelling);
    CHECK(CommitOk(*store, id, Result(2)));
    JobRecord done = GetOk(*store, id);
    CHECK(done.state == JobState::kCancelled);
    CHECK(done.finished_at > 0);
    CHECK(done.completed == 3);
  }
  SECTION("SetJobState: error and finished_at") {
    REQUIRE(store->SetJobState(id, JobState::kFailed, "engine failed").ok());
    JobRecord failed = GetOk(*store, id);
    CHECK(failed.state == JobState::kFailed);
    CHECK(failed.error == "engine failed");
    CHECK(failed.finished_at > 0);
    // A late result is still stored and counted, the state stays.
    CHECK(CommitOk(*store, id, Result(0)));
    CHECK(CommitOk(*store, id, Result(2)));
    JobRecord late = GetOk(*store, id);
    CHECK(late.state == JobState::kFailed);
    CHECK(late.completed == 3);
    CHECK(store->SetJobState(id, static_cast<JobState>(42)).code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("JobStore: concurrent commits from several threads", "[job_store]") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  constexpr int kRequests = 200;
  const std::string id = CreateOk(*store, kRequests).id;
  std::vector<std::thread> threads;
  std::vector<int> stored(4, 0);
  std::vector<int> errors(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Every thread commits every index: exactly one commit per index is stored.
      for (int i = 0; i < kRequests; ++i) {
        absl::StatusOr<bool> r = store->CommitResult(id, Result((i + 50 * t) % kRequests), 1, 2);
        if (!r.ok()) ++errors[t];
        if (r.ok() && *r) ++stored[t];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(errors == std::vector<int>(4, 0));
  CHECK(stored[0] + stored[1] + stored[2] + stored[3] == kRequests);
  JobRecord done = GetOk(*store, id);
  CHECK(done.state == JobState::kCompleted);
  CHECK(done.completed == kRequests);
  CHECK(done.prompt_tokens == kRequests);
  CHECK(done.generated_tokens == 2 * kRequests);
}

TEST_CASE("JobStore: pending requests in job order survive reopening", "[job_store]") {
  TempDir dir;
  std::string a, b, c;
  {
    std::unique_ptr<JobStore> store = OpenOk(dir.str());
    a = CreateOk(*store, 3).id;
    b = CreateOk(*store, 2).id;
    c = CreateOk(*store, 2).id;
    // Creation order, not id or time order, decides: make the first job look newer.
    CHECK(CommitOk(*store, a, Result(1)));
    CHECK(CommitOk(*store, b, Result(0)));
    CHECK(CommitOk(*store, b, Result(1)));  // b completes
    REQUIRE(store->SetJobState(c, JobState::kCancelling).ok());
  }
  {
    std::unique_ptr<JobStore> store = OpenOk(dir.str());
    absl::StatusOr<std::vector<PendingRequest>> pending = store->PendingRequests();
    REQUIRE(pending.ok());
    REQUIRE(pending->size() == 2);
    CHECK((*pending)[0].job_id == a);
    CHECK((*pending)[0].request.index == 0);
    CHECK((*pending)[1].job_id == a);
    CHECK((*pending)[1].request.index == 2);
    CHECK((*pending)[1].request.prompt_token_ids == std::vector<int32_t>{2, -1, 32000});

    JobRecord job_b = GetOk(*store, b);
    CHECK(job_b.state == JobState::kCompleted);
    CHECK(job_b.completed == 2);
    CHECK(GetOk(*store, c).state == JobState::kCancelling);

    // A new job comes after the older ones; limit cuts the list.
    const std::string d = CreateOk(*store, 2).id;
    pending = store->PendingRequests();
    REQUIRE(pending.ok());
    REQUIRE(pending->size() == 4);
    CHECK((*pending)[2].job_id == d);
    CHECK((*pending)[3].job_id == d);
    pending = store->PendingRequests(1);
    REQUIRE(pending.ok());
    REQUIRE(pending->size() == 1);
    CHECK((*pending)[0].job_id == a);
    CHECK(store->PendingRequests(-1).status().code() == absl::StatusCode::kInvalidArgument);

    // VALIDATING jobs are pending too; FINALIZING ones are not.
    REQUIRE(store->SetJobState(d, JobState::kValidating).ok());
    CHECK(store->PendingRequests()->size() == 4);
    REQUIRE(store->SetJobState(d, JobState::kFinalizing).ok());
    CHECK(store->PendingRequests()->size() == 2);
  }
}

TEST_CASE("JobStore: results in index order, from_index and limit", "[job_store]") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  const std::string id = CreateOk(*store, 10).id;
  for (int i : {7, 2, 9, 0, 5, 3}) CHECK(CommitOk(*store, id, Result(i, i == 5)));

  auto indices = [&](int64_t from, int64_t limit) {
    absl::StatusOr<std::vector<StoredResult>> results = store->Results(id, from, limit);
    REQUIRE(results.ok());
    std::vector<int64_t> out;
    for (const StoredResult& r : *results) {
      CHECK(r.line == Result(r.index).line);
      CHECK(r.custom_id == "req-" + std::to_string(r.index));
      CHECK(r.failed == (r.index == 5));
      out.push_back(r.index);
    }
    return out;
  };
  CHECK(indices(0, 0) == std::vector<int64_t>{0, 2, 3, 5, 7, 9});
  CHECK(indices(3, 0) == std::vector<int64_t>{3, 5, 7, 9});
  CHECK(indices(4, 2) == std::vector<int64_t>{5, 7});
  CHECK(indices(0, 1) == std::vector<int64_t>{0});
  CHECK(indices(10, 0).empty());
  CHECK(store->Results(id, -1, 0).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("JobStore: unknown job ids are NotFound", "[job_store]") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  CreateOk(*store, 1);
  const std::string unknown = "job_000000000000000000000000";
  CHECK(store->GetJob(unknown).status().code() == absl::StatusCode::kNotFound);
  CHECK(store->GetJob("").status().code() == absl::StatusCode::kNotFound);
  CHECK(store->GetJob("' OR 1=1 --").status().code() == absl::StatusCode::kNotFound);
  CHECK(store->CommitResult(unknown, Result(0), 0, 0).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(store->SetJobState(unknown, JobState::kCancelling).code() == absl::StatusCode::kNotFound);
  CHECK(store->Results(unknown, 0).status().code() == absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<std::string>> none = store->JobsInState(JobState::kCancelled);
  REQUIRE(none.ok());
  CHECK(none->empty());
}

TEST_CASE("JobStore: a damaged file is found at Open, named, and left as it was", "[job_store]") {
  TempDir dir;
  {
    std::unique_ptr<JobStore> store = OpenOk(dir.str());
    for (int i = 0; i < 40; ++i) CreateOk(*store, 20);
  }  // the last close checkpoints the WAL into the file
  const uintmax_t size = fs::file_size((dir / "moebatch.db"));
  REQUIRE(size > 16 * 4096);
  {
    // A zeroed 4 KiB page in the middle (SQLite's default page size).
    std::fstream f((dir / "moebatch.db"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>((size / 4096 / 2) * 4096));
    const std::string zeros(4096, '\0');
    f.write(zeros.data(), zeros.size());
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir.str());
  CHECK(store.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(store.status().message(), "moebatch.db"));
  CHECK(absl::StrContains(store.status().message(), "quick_check"));
  CHECK(fs::file_size((dir / "moebatch.db")) == size);
}

TEST_CASE("JobStore: health follows the storage, not the callers' mistakes", "[job_store]") {
  TempDir dir;
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  CHECK(store->health().ok());
  // A refused argument or an unknown job says nothing about the disk.
  CHECK(store->CreateJob(JobRecord{}, {}, {}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(store->SetJobState("job_nope", JobState::kCancelled).code() == absl::StatusCode::kNotFound);
  CHECK(store->health().ok());
  CHECK_FALSE(JobStore::IsStorageFailure(absl::ResourceExhaustedError("quota")));
}

TEST_CASE("JobStore: files that are not a job store give a clean error", "[job_store]") {
  TempDir dir;
  SECTION("a text file") {
    {
      std::ofstream out((dir / "moebatch.db"), std::ios::binary);
      for (int i = 0; i < 200; ++i) out << "this is not a database, just some text\n";
    }
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir.str());
    CHECK(store.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(store.status().message(), "moebatch.db"));
    // The file is left as it was.
    CHECK(fs::file_size((dir / "moebatch.db")) == 200 * 39);
  }
  // Byte offsets in the SQLite header: user_version at 60, application_id at 68 (big-endian).
  auto patch_header = [&](int offset, uint32_t value) {
    {
      std::unique_ptr<JobStore> store = OpenOk(dir.str());
      CreateOk(*store, 1);
    }  // the last close checkpoints the WAL into the file and removes it
    REQUIRE_FALSE(fs::exists(dir.str() + "/moebatch.db-wal"));
    std::fstream f((dir / "moebatch.db"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(offset);
    for (int i = 3; i >= 0; --i) f.put(static_cast<char>((value >> (8 * i)) & 0xff));
  };
  SECTION("a newer schema version") {
    patch_header(60, 4);
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir.str());
    CHECK(store.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(store.status().message(), "version 4"));
  }
  SECTION("another program's database") {
    patch_header(68, 0x12345678);
    CHECK(JobStore::Open(dir.str()).status().code() == absl::StatusCode::kFailedPrecondition);
  }
  SECTION("a data dir that is a file") {
    std::ofstream(dir.str() + "/plain_file") << "x";
    CHECK_FALSE(JobStore::Open(dir.str() + "/plain_file").ok());
  }
  SECTION("an empty file becomes a new store") {
    std::ofstream((dir / "moebatch.db")).close();
    std::unique_ptr<JobStore> store = OpenOk(dir.str());
    CreateOk(*store, 1);
  }
}

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

TEST_CASE("JobStore: a schema version 1 store is upgraded in place", "[job_store]") {
  TempDir dir;
  {
    // The version 1 schema, as an earlier build created it, with one job of two requests.
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open((dir / "moebatch.db").c_str(), &db) == SQLITE_OK);
    const char* v1 = R"sql(
PRAGMA journal_mode = WAL;
CREATE TABLE jobs (id TEXT PRIMARY KEY NOT NULL, seq INTEGER NOT NULL UNIQUE,
  state INTEGER NOT NULL, model TEXT NOT NULL, metadata TEXT NOT NULL, total INTEGER NOT NULL,
  completed INTEGER NOT NULL, failed INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,
  generated_tokens INTEGER NOT NULL, created_at INTEGER NOT NULL, started_at INTEGER NOT NULL,
  finished_at INTEGER NOT NULL, error TEXT NOT NULL);
CREATE INDEX jobs_by_created ON jobs (created_at, seq);
CREATE INDEX jobs_by_state ON jobs (state, seq);
CREATE TABLE requests (job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  idx INTEGER NOT NULL, custom_id TEXT NOT NULL, line TEXT NOT NULL,
  prompt_token_ids BLOB NOT NULL, PRIMARY KEY (job_id, idx));
CREATE TABLE results (job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  idx INTEGER NOT NULL, custom_id TEXT NOT NULL, line TEXT NOT NULL, failed INTEGER NOT NULL,
  PRIMARY KEY (job_id, idx));
PRAGMA application_id = 1836016994;
PRAGMA user_version = 1;
INSERT INTO jobs VALUES ('job_old', 1, 2, 'm', '{}', 2, 0, 0, 0, 0, 100, 0, 0, '');
INSERT INTO requests VALUES ('job_old', 0, 'a', '{}', x'01000000');
INSERT INTO requests VALUES ('job_old', 1, 'b', '{}', x'02000000');
)sql";
    char* error = nullptr;
    const int rc = sqlite3_exec(db, v1, nullptr, nullptr, &error);
    INFO((error != nullptr ? error : ""));
    REQUIRE(rc == SQLITE_OK);
    sqlite3_close(db);
  }
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  const JobRecord old = GetOk(*store, "job_old");
  CHECK(old.tenant == "local");
  CHECK(old.total == 2);
  absl::StatusOr<std::vector<PendingRequest>> pending = store->PendingRequests();
  REQUIRE(pending.ok());
  REQUIRE(pending->size() == 2);
  CHECK((*pending)[1].request.prompt_token_ids == std::vector<int32_t>{2});
  CHECK((*pending)[1].request.budget_tokens == 0);
  CHECK(CommitOk(*store, "job_old", Result(0)));
  // New jobs work in the upgraded file, and it opens again as the current version.
  CreateOk(*store, 1);
  store.reset();
  store = OpenOk(dir.str());
  CHECK(GetOk(*store, "job_old").completed == 1);
}

// The child: opens the store and commits results one by one, reporting each committed index on
// `report_fd` after CommitResult returned. Every so often it commits an index a second time.
// Never returns.
[[noreturn]] void CommitUntilKilled(const std::string& dir, const std::string& job_id,
                                    int64_t total, int report_fd) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir);
  if (!store.ok()) _exit(2);
  for (int64_t i = 0; i < total; ++i) {
    absl::StatusOr<bool> stored = (*store)->CommitResult(job_id, Result(i, i % 7 == 0), i, 2 * i);
    if (!stored.ok() || !*stored) _exit(3);
    if (i % 10 == 9) {
      absl::StatusOr<bool> again = (*store)->CommitResult(job_id, Result(i - 5), 1, 1);
      if (!again.ok() || *again) _exit(4);
    }
    if (write(report_fd, &i, sizeof i) != sizeof i) _exit(5);
  }
  _exit(0);
}

TEST_CASE("JobStore: a process killed mid-commit leaves every committed result intact",
          "[job_store][crash]") {
  TempDir dir;
  constexpr int64_t kTotal = 5000;
  std::string job_id;
  {
    std::unique_ptr<JobStore> store = OpenOk(dir.str());
    job_id = CreateOk(*store, kTotal).id;
  }  // no connection of the parent crosses the fork

  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(fds[0]);
    CommitUntilKilled(dir.str(), job_id, kTotal, fds[1]);
  }
  close(fds[1]);

  // Wait until the child is committing, let it run a little longer, then kill it mid-way.
  std::vector<int64_t> reported;
  int64_t index = 0;
  while (reported.size() < 200 && read(fds[0], &index, sizeof index) == sizeof index) {
    reported.push_back(index);
  }
  REQUIRE(reported.size() == 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(kill(child, SIGKILL) == 0);
  int wstatus = 0;
  REQUIRE(waitpid(child, &wstatus, 0) == child);
  while (read(fds[0], &index, sizeof index) == sizeof index) reported.push_back(index);
  close(fds[0]);
  INFO("child committed and reported " << reported.size() << " of " << kTotal);
  CHECK(WIFSIGNALED(wstatus));
  CHECK(reported.size() < static_cast<size_t>(kTotal));  // killed mid-way

  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  absl::StatusOr<std::vector<StoredResult>> results = store->Results(job_id, 0);
  REQUIRE(results.ok());
  // Committed in index order, so the stored results are exactly 0 .. n-1, each once, intact; the
  // one commit that may have finished without being reported is the next index.
  const size_t n = results->size();
  CHECK(n >= reported.size());
  CHECK(n <= reported.size() + 1);
  std::set<int64_t> seen;
  int64_t failed = 0, prompt = 0, generated = 0;
  for (size_t i = 0; i < n; ++i) {
    const StoredResult& r = (*results)[i];
    CHECK(seen.insert(r.index).second);
    REQUIRE(r.index == static_cast<int64_t>(i));
    CHECK(r.line == Result(r.index).line);
    CHECK(r.custom_id == Result(r.index).custom_id);
    CHECK(r.failed == (r.index % 7 == 0));
    failed += r.failed ? 1 : 0;
    prompt += r.index;
    generated += 2 * r.index;
  }
  for (size_t i = 0; i < reported.size(); ++i) CHECK(reported[i] == static_cast<int64_t>(i));

  JobRecord job = GetOk(*store, job_id);
  CHECK(job.completed + job.failed == static_cast<int64_t>(n));
  CHECK(job.failed == failed);
  CHECK(job.prompt_tokens == prompt);
  CHECK(job.generated_tokens == generated);
  CHECK(job.state == JobState::kInProgress);

  // After the "restart" exactly the unfinished requests are pending, and finishing them completes
  // the job with every index once.
  absl::StatusOr<std::vector<PendingRequest>> pending = store->PendingRequests();
  REQUIRE(pending.ok());
  REQUIRE(pending->size() == static_cast<size_t>(kTotal) - n);
  CHECK(pending->front().request.index == static_cast<int64_t>(n));
  for (const PendingRequest& p : *pending) {
    REQUIRE(CommitOk(*store, job_id, Result(p.request.index)));
  }
  JobRecord done = GetOk(*store, job_id);
  CHECK(done.state == JobState::kCompleted);
  CHECK(done.completed + done.failed == kTotal);
  CHECK(store->Results(job_id, 0)->size() == static_cast<size_t>(kTotal));
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
