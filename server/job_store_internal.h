// Internals of the job store shared by its two source files: server/job_store.cc (the schema,
// opening, jobs and their states) and server/job_store_results.cc (results: commits, pending
// requests, reads, sizes, deletion, the result-file listing). Include only from those.
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/job_store.h"
#include "server/job_store_codec.h"
#include "server/sqlite_db.h"

namespace moebatch {
namespace job_store_internal {

using sqlite::Blob;
using sqlite::Exec;
using sqlite::SqliteError;
using sqlite::Statement;
using sqlite::Sv;
using sqlite::Transaction;

inline constexpr int kIdHexChars = 24;                 // JobStore::Impl::NewJobId
inline constexpr int32_t kMaxResultFileLimit = 10000;  // ListResultFiles, as GET /v1/files's limit

// The columns ReadJob reads, in its order.
inline constexpr const char* kSelectJob =
    "SELECT id, state, model, metadata, total, completed, failed, prompt_tokens, "
    "generated_tokens, created_at, started_at, finished_at, error, seq, tenant, cancelled, "
    "endpoint, completion_window, input_file_id, expires_at, cancelling_at, errors, "
    "output_deleted, errors_deleted FROM jobs ";

inline int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline bool IsKnownState(JobState s) {
  int v = static_cast<int>(s);
  return v >= static_cast<int>(JobState::kValidating) && v <= static_cast<int>(JobState::kExpired);
}

// NotFound naming the id as the caller gave it, cut: a message quoting a 100 KB id would exceed
// gRPC's metadata limit and hide the error behind RESOURCE_EXHAUSTED.
absl::Status NotFound(const std::string& job_id);

// Reads a row of kSelectJob; `seq` receives the job's creation number when not null.
absl::StatusOr<JobRecord> ReadJob(const Statement& stmt, int64_t* seq = nullptr);

}  // namespace job_store_internal

// Connections: `db` writes (and reads inside its write transactions), under `mu`; `reader` serves
// the read-only calls (GetJob, ListJobs, Results, ...) under its own `read_mu`, so that a reader
// never waits for a write's fsync (WAL mode: readers see the last committed snapshot); and the
// checkpointer thread moves the WAL into the database file in the background (PASSIVE: it waits
// for neither), instead of SQLite's automatic checkpoint inside a commit, which held `mu` across
// the database file's fsync and stalled every call for seconds under load.
struct JobStore::Impl {
  absl::Mutex mu;
  absl::Mutex read_mu;
  sqlite3* reader ABSL_GUARDED_BY(read_mu) = nullptr;
  absl::Mutex checkpoint_mu;
  sqlite3* checkpointer ABSL_GUARDED_BY(checkpoint_mu) = nullptr;
  bool stopping ABSL_GUARDED_BY(checkpoint_mu) = false;
  std::thread checkpoint_thread;
  mutable absl::Mutex health_mu;
  absl::Status health ABSL_GUARDED_BY(health_mu);
  sqlite3* db ABSL_GUARDED_BY(mu) = nullptr;
  std::optional<PageTokenCodec> page_tokens;  // set by Open; read-only afterwards
  std::mt19937_64 rng ABSL_GUARDED_BY(mu);

  // "job_" + 24 random hex characters.
  std::string NewJobId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string id = "job_";
    uint64_t bits = 0;
    for (int i = 0; i < job_store_internal::kIdHexChars; ++i) {
      if (i % 16 == 0) bits = rng();
      id += kHex[bits & 0xf];
      bits >>= 4;
    }
    return id;
  }

  // On `conn` (db under mu, or reader under read_mu).
  static absl::StatusOr<bool> JobExists(sqlite3* conn, const std::string& job_id) {
    absl::StatusOr<job_store_internal::Statement> stmt =
        job_store_internal::Statement::Prepare(conn, "SELECT 1 FROM jobs WHERE id = ?");
    if (!stmt.ok()) return stmt.status();
    if (absl::Status s = stmt->BindAll(job_id); !s.ok()) return s;
    return stmt->Step();
  }
  // OK when the job exists, else NotFound (or the query's error).
  static absl::Status CheckJobExists(sqlite3* conn, const std::string& job_id) {
    absl::StatusOr<bool> exists = JobExists(conn, job_id);
    if (!exists.ok()) return exists.status();
    return *exists ? absl::OkStatus() : job_store_internal::NotFound(job_id);
  }
};

}  // namespace moebatch
