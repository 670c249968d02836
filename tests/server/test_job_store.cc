// The durable job store (server/job_store.h): round trips, paging, idempotent results, state
// transitions, pending requests across reopen, bad files, and a child process killed with SIGKILL
// while it commits results. Each test uses its own temporary data directory.
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
#include "tests/server/job_store_test_util.h"
#include "tests/support/temp_dir.h"

namespace moebatch {
namespace {

namespace fs = std::filesystem;

// TempDir and the helpers of job_store_test_util.h.
using namespace testing;  // NOLINT(build/namespaces)

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
    patch_header(60, 5);
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir.str());
    CHECK(store.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(store.status().message(), "version 5"));
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

TEST_CASE("JobStore: a schema version 3 store is upgraded, its deleted results marked",
          "[job_store]") {
  TempDir dir;
  std::string both, deleted_output;
  {
    std::unique_ptr<JobStore> store = OpenOk(dir.str());
    for (std::string* id : {&both, &deleted_output}) {
      *id = CreateOk(*store, 2).id;
      REQUIRE(CommitOk(*store, *id, Result(0)));
      REQUIRE(CommitOk(*store, *id, Result(1, /*failed=*/true)));
    }
  }
  {
    // Back to version 3, as an earlier build left it after deleting the output file's rows.
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open((dir / "moebatch.db").c_str(), &db) == SQLITE_OK);
    sqlite3_stmt* del = nullptr;
    REQUIRE(sqlite3_prepare_v2(db, "DELETE FROM results WHERE job_id = ? AND failed = 0", -1, &del,
                               nullptr) == SQLITE_OK);
    REQUIRE(sqlite3_bind_text(del, 1, deleted_output.c_str(), -1, SQLITE_TRANSIENT) == SQLITE_OK);
    CHECK(sqlite3_step(del) == SQLITE_DONE);
    sqlite3_finalize(del);
    char* error = nullptr;
    const int rc = sqlite3_exec(db,
                                "ALTER TABLE jobs DROP COLUMN output_deleted; "
                                "ALTER TABLE jobs DROP COLUMN errors_deleted; "
                                "PRAGMA user_version = 3;",
                                nullptr, nullptr, &error);
    INFO((error != nullptr ? error : ""));
    REQUIRE(rc == SQLITE_OK);
    sqlite3_close(db);
  }
  std::unique_ptr<JobStore> store = OpenOk(dir.str());
  const JobRecord kept = GetOk(*store, both);
  CHECK_FALSE(kept.output_deleted);
  CHECK_FALSE(kept.errors_deleted);
  const JobRecord upgraded = GetOk(*store, deleted_output);
  CHECK(upgraded.output_deleted);
  CHECK_FALSE(upgraded.errors_deleted);
  CHECK(upgraded.completed == 1);
  absl::StatusOr<JobStore::ResultFilePage> files = store->ListResultFiles("", 0, "", 10, true);
  REQUIRE(files.ok());
  std::vector<std::string> ids;
  for (const JobStore::ResultFile& f : files->files) ids.push_back(f.id);
  std::sort(ids.begin(), ids.end());
  std::vector<std::string> want = {ResultFileId(both, false), ResultFileId(both, true),
                                   ResultFileId(deleted_output, true)};
  std::sort(want.begin(), want.end());
  CHECK(ids == want);
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

}  // namespace
}  // namespace moebatch
