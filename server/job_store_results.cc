// The job store's results (server/job_store.h): committing one, the pending requests, reading
// them back, their sizes, deleting them, and the result-file listing. The schema and the
// transaction rules are in job_store.cc's header comment.
#include <sqlite3.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/job_store.h"
#include "server/job_store_internal.h"
#include "spdlog/spdlog.h"

namespace moebatch {

using job_store_internal::kMaxResultFileLimit;
using job_store_internal::NotFound;
using job_store_internal::NowSeconds;
using job_store_internal::Statement;
using job_store_internal::Transaction;

absl::StatusOr<bool> JobStore::CommitResultUntracked(const std::string& job_id,
                                                     const StoredResult& result,
                                                     int64_t prompt_tokens,
                                                     int64_t generated_tokens) {
  if (prompt_tokens < 0 || generated_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative token count (prompt ", prompt_tokens,
                                                   ", generated ", generated_tokens, ")"));
  }
  absl::MutexLock lock(&impl_->mu);
  sqlite3* db = impl_->db;
  Transaction txn(db);
  if (absl::Status s = txn.Begin(/*write=*/true); !s.ok()) return s;

  JobState state;
  int64_t total, completed, failed, started_at, finished_at;
  {
    absl::StatusOr<Statement> stmt = Statement::Prepare(
        db,
        "SELECT state, total, completed, failed, started_at, finished_at FROM jobs "
        "WHERE id = ?");
    if (!stmt.ok()) return stmt.status();
    if (absl::Status s = stmt->BindAll(job_id); !s.ok()) return s;
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row) return NotFound(job_id);
    state = static_cast<JobState>(stmt->Int(0));
    total = stmt->Int(1);
    completed = stmt->Int(2);
    failed = stmt->Int(3);
    started_at = stmt->Int(4);
    finished_at = stmt->Int(5);
  }
  if (result.index < 0 || result.index >= total) {
    return absl::InvalidArgumentError(absl::StrCat("result index ", result.index, " of job ",
                                                   job_id, " is outside 0..", total - 1));
  }
  {
    // Only a second result for the same index conflicts; any other failure is an error.
    absl::StatusOr<Statement> insert = Statement::Prepare(
        db,
        "INSERT INTO results (job_id, idx, custom_id, line, failed) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (job_id, idx) DO NOTHING");
    if (!insert.ok()) return insert.status();
    if (absl::Status s = insert->BindAll(job_id, result.index, result.custom_id, result.line,
                                         int64_t{result.failed ? 1 : 0});
        !s.ok()) {
      return s;
    }
    if (absl::Status s = insert->Run(); !s.ok()) return s;
    if (sqlite3_changes(db) == 0) return false;  // already stored; the rollback changes nothing
  }

  (result.failed ? failed : completed) += 1;
  const int64_t now = NowSeconds();
  if (started_at == 0) started_at = now;
  if (completed + failed >= total && !IsTerminal(state)) {
    state = state == JobState::kCancelling ? JobState::kCancelled : JobState::kCompleted;
    finished_at = now;
  }
  {
    absl::StatusOr<Statement> update = Statement::Prepare(
        db,
        "UPDATE jobs SET state = ?, completed = ?, failed = ?, prompt_tokens = prompt_tokens + ?, "
        "generated_tokens = generated_tokens + ?, started_at = ?, finished_at = ? WHERE id = ?");
    if (!update.ok()) return update.status();
    if (absl::Status s =
            update->BindAll(static_cast<int64_t>(state), completed, failed, prompt_tokens,
                            generated_tokens, started_at, finished_at, job_id);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = update->Run(); !s.ok()) return s;
  }
  if (absl::Status s = txn.Commit(); !s.ok()) return s;
  return true;
}

absl::StatusOr<std::vector<PendingRequest>> JobStore::PendingRequests(
    int64_t limit, const std::string& after_tenant, const PendingFilter& skip) {
  if (limit < 0) return absl::InvalidArgumentError(absl::StrCat("negative limit ", limit));
  absl::MutexLock lock(&impl_->mu);
  Transaction txn(impl_->db);  // one snapshot for the tenants and their requests
  if (absl::Status s = txn.Begin(/*write=*/false); !s.ok()) return s;
  // Tenants with runnable jobs, by name.
  absl::StatusOr<Statement> tenants_stmt = Statement::Prepare(
      impl_->db, "SELECT DISTINCT tenant FROM jobs WHERE state IN (?, ?) ORDER BY tenant");
  if (!tenants_stmt.ok()) return tenants_stmt.status();
  if (absl::Status s = tenants_stmt->BindAll(static_cast<int64_t>(JobState::kValidating),
                                             static_cast<int64_t>(JobState::kInProgress));
      !s.ok()) {
    return s;
  }
  std::vector<std::string> tenants;
  for (;;) {
    absl::StatusOr<bool> row = tenants_stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    tenants.push_back(tenants_stmt->Text(0));
  }
  // Start after `after_tenant`.
  const auto start = std::upper_bound(tenants.begin(), tenants.end(), after_tenant);
  std::rotate(tenants.begin(), start, tenants.end());
  // Each tenant's first `limit` pending requests not skipped, in its job order then index.
  std::vector<std::vector<PendingRequest>> per_tenant;
  for (const std::string& tenant : tenants) {
    absl::StatusOr<Statement> stmt = Statement::Prepare(
        impl_->db,
        "SELECT r.job_id, r.idx, r.custom_id, r.line, r.prompt_token_ids, r.budget_tokens "
        "FROM jobs j JOIN requests r ON r.job_id = j.id "
        "LEFT JOIN results s ON s.job_id = r.job_id AND s.idx = r.idx "
        "WHERE j.state IN (?, ?) AND j.tenant = ? AND s.idx IS NULL ORDER BY j.seq, r.idx");
    if (!stmt.ok()) return stmt.status();
    if (absl::Status s = stmt->BindAll(static_cast<int64_t>(JobState::kValidating),
                                       static_cast<int64_t>(JobState::kInProgress), tenant);
        !s.ok()) {
      return s;
    }
    std::vector<PendingRequest>& list = per_tenant.emplace_back();
    while (limit == 0 || static_cast<int64_t>(list.size()) < limit) {
      absl::StatusOr<bool> row = stmt->Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      const std::string job_id = stmt->Text(0);
      const int64_t index = stmt->Int(1);
      if (skip && skip(job_id, index)) continue;  // before the costly columns are read
      PendingRequest p;
      p.job_id = job_id;
      p.tenant = tenant;
      p.request.index = index;
      p.request.custom_id = stmt->Text(2);
      p.request.line = stmt->Text(3);
      absl::StatusOr<std::vector<int32_t>> ids = DecodeTokenIds(stmt->BlobBytes(4));
      if (!ids.ok()) return ids.status();
      p.request.prompt_token_ids = *std::move(ids);
      p.request.budget_tokens = stmt->Int(5);
      list.push_back(std::move(p));
    }
  }
  // Round robin over the tenants: one team's large job does not hold back another's.
  std::vector<PendingRequest> pending;
  for (size_t turn = 0;; ++turn) {
    bool any = false;
    for (std::vector<PendingRequest>& list : per_tenant) {
      if (turn >= list.size()) continue;
      any = true;
      if (limit != 0 && static_cast<int64_t>(pending.size()) == limit) return pending;
      pending.push_back(std::move(list[turn]));
    }
    if (!any) return pending;
  }
}

absl::StatusOr<std::vector<StoredResult>> JobStore::Results(const std::string& job_id,
                                                            int64_t from_index, int64_t limit,
                                                            std::optional<bool> failed) {
  if (from_index < 0 || limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative from_index or limit (", from_index, ", ", limit, ")"));
  }
  absl::MutexLock lock(&impl_->read_mu);
  // One read transaction: the job's existence and its results from the same snapshot.
  Transaction txn(impl_->reader);
  if (absl::Status s = txn.Begin(/*write=*/false); !s.ok()) return s;
  if (absl::Status s = Impl::CheckJobExists(impl_->reader, job_id); !s.ok()) return s;

  absl::StatusOr<Statement> stmt = Statement::Prepare(
      impl_->reader,
      "SELECT idx, custom_id, line, failed FROM results WHERE job_id = ?1 AND idx >= ?2 "
      "AND (?4 < 0 OR failed = ?4) ORDER BY idx LIMIT ?3");
  if (!stmt.ok()) return stmt.status();
  if (absl::Status s = stmt->BindAll(job_id, from_index, limit == 0 ? int64_t{-1} : limit,
                                     failed.has_value() ? int64_t{*failed ? 1 : 0} : int64_t{-1});
      !s.ok()) {
    return s;
  }
  std::vector<StoredResult> results;
  for (;;) {
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    StoredResult r;
    r.index = stmt->Int(0);
    r.custom_id = stmt->Text(1);
    r.line = stmt->Text(2);
    r.failed = stmt->Int(3) != 0;
    results.push_back(std::move(r));
  }
  if (absl::Status s = txn.Commit(); !s.ok()) return s;
  return results;
}

absl::StatusOr<JobStore::ResultStats> JobStore::ResultSizes(const std::string& job_id) {
  absl::MutexLock lock(&impl_->read_mu);
  Transaction txn(impl_->reader);
  if (absl::Status s = txn.Begin(/*write=*/false); !s.ok()) return s;
  if (absl::Status s = Impl::CheckJobExists(impl_->reader, job_id); !s.ok()) return s;
  // Bytes, not characters: length() of a BLOB.
  absl::StatusOr<Statement> stmt = Statement::Prepare(
      impl_->reader,
      "SELECT failed, count(*), COALESCE(SUM(length(CAST(line AS BLOB)) + 1), 0) FROM results "
      "WHERE job_id = ? GROUP BY failed");
  if (!stmt.ok()) return stmt.status();
  if (absl::Status s = stmt->BindAll(job_id); !s.ok()) return s;
  ResultStats stats;
  for (;;) {
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    if (stmt->Int(0) != 0) {
      stats.failed_lines = stmt->Int(1);
      stats.failed_bytes = stmt->Int(2);
    } else {
      stats.ok_lines = stmt->Int(1);
      stats.ok_bytes = stmt->Int(2);
    }
  }
  if (absl::Status s = txn.Commit(); !s.ok()) return s;
  return stats;
}

absl::StatusOr<int64_t> JobStore::DeleteResults(const std::string& job_id, bool failed) {
  absl::StatusOr<int64_t> deleted = [&]() -> absl::StatusOr<int64_t> {
    absl::MutexLock lock(&impl_->mu);
    Transaction txn(impl_->db);
    if (absl::Status s = txn.Begin(/*write=*/true); !s.ok()) return s;
    if (absl::Status s = Impl::CheckJobExists(impl_->db, job_id); !s.ok()) return s;
    absl::StatusOr<Statement> del =
        Statement::Prepare(impl_->db, "DELETE FROM results WHERE job_id = ? AND failed = ?");
    if (!del.ok()) return del.status();
    if (absl::Status s = del->BindAll(job_id, int64_t{failed ? 1 : 0}); !s.ok()) return s;
    if (absl::Status s = del->Run(); !s.ok()) return s;
    const int64_t n = sqlite3_changes(impl_->db);
    absl::StatusOr<Statement> mark = Statement::Prepare(
        impl_->db,
        "UPDATE jobs SET output_deleted = CASE WHEN ?2 = 0 THEN 1 ELSE output_deleted END, "
        "errors_deleted = CASE WHEN ?2 = 1 THEN 1 ELSE errors_deleted END WHERE id = ?1");
    if (!mark.ok()) return mark.status();
    if (absl::Status s = mark->BindAll(job_id, int64_t{failed ? 1 : 0}); !s.ok()) return s;
    if (absl::Status s = mark->Run(); !s.ok()) return s;
    if (absl::Status s = txn.Commit(); !s.ok()) return s;
    return n;
  }();
  Track(deleted.status());
  return deleted;
}

bool HasResultFile(const JobRecord& job, bool failed) {
  if (!IsTerminal(job.state)) return false;
  return failed ? job.failed + job.cancelled > 0 && !job.errors_deleted
                : job.completed > 0 && !job.output_deleted;
}

std::string ResultFileId(const std::string& job_id, bool failed) {
  return absl::StrCat(kResultFilePrefix, job_id, failed ? kErrorFileSuffix : kOutputFileSuffix);
}

absl::StatusOr<JobStore::ResultFilePage> JobStore::ListResultFiles(const std::string& tenant,
                                                                   int64_t after_created_at,
                                                                   const std::string& after_id,
                                                                   int32_t limit, bool ascending) {
  if (limit < 1 || limit > kMaxResultFileLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [1, ", kMaxResultFileLimit, "], got ", limit));
  }
  // Each finished job gives up to two rows (HasResultFile's conditions in SQL; the ids as
  // ResultFileId spells them, "job_" ids only, as the HTTP API's file ids parse), in the order
  // (finished_at, file id) strictly after the cursor. Reads the jobs table only.
  constexpr const char* kRows =
      "SELECT file_id, job_id, failed, finished_at FROM ("
      "SELECT ?1 || id || ?2 AS file_id, id AS job_id, 0 AS failed, finished_at FROM jobs "
      "WHERE state IN (?7, ?8, ?9, ?10) AND completed > 0 AND output_deleted = 0 "
      "AND substr(id, 1, 4) = 'job_' AND (?4 = '' OR tenant = ?4) "
      "UNION ALL "
      "SELECT ?1 || id || ?3, id, 1, finished_at FROM jobs "
      "WHERE state IN (?7, ?8, ?9, ?10) AND failed + cancelled > 0 AND errors_deleted = 0 "
      "AND substr(id, 1, 4) = 'job_' AND (?4 = '' OR tenant = ?4)) ";
  const std::string sql =
      std::string(kRows) + (ascending ? "WHERE ?6 = '' OR (finished_at, file_id) > (?5, ?6) "
                                        "ORDER BY finished_at, file_id LIMIT ?11"
                                      : "WHERE ?6 = '' OR (finished_at, file_id) < (?5, ?6) "
                                        "ORDER BY finished_at DESC, file_id DESC LIMIT ?11");
  absl::MutexLock lock(&impl_->read_mu);
  absl::StatusOr<Statement> stmt = Statement::Prepare(impl_->reader, sql);
  if (!stmt.ok()) return stmt.status();
  if (absl::Status s = stmt->BindAll(
          kResultFilePrefix, kOutputFileSuffix, kErrorFileSuffix, tenant, after_created_at,
          after_id, static_cast<int64_t>(JobState::kCompleted),
          static_cast<int64_t>(JobState::kFailed), static_cast<int64_t>(JobState::kCancelled),
          static_cast<int64_t>(JobState::kExpired), int64_t{limit} + 1);
      !s.ok()) {
    return s;
  }
  ResultFilePage page;
  absl::StatusOr<bool> has_more = sqlite::ReadPage(*stmt, limit, [&](const Statement& row) {
    ResultFile f;
    f.id = row.Text(0);
    f.job_id = row.Text(1);
    f.failed = row.Int(2) != 0;
    f.created_at = row.Int(3);
    page.files.push_back(std::move(f));
    return absl::OkStatus();
  });
  if (!has_more.ok()) return has_more.status();
  page.has_more = *has_more;
  return page;
}

}  // namespace moebatch
