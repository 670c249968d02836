// Small RAII helpers over the SQLite C API for the job store: prepared statements with typed
// binding, transactions that roll back unless committed, errors as absl::Status (Internal, with
// SQLite's message and extended code). Not thread-safe: the caller serialises use of a
// connection (JobStore holds a mutex).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace moebatch::sqlite {

// Debian's Abseil has its own absl::string_view, which std::string_view does not convert to.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The payload key marking a status that the storage caused (disk full, damaged file, I/O error),
// as opposed to a bad argument or a missing job: JobStore::health() follows those.
inline constexpr char kStorageFailurePayload[] = "moebatch.job_store.storage";

// An SQLite failure as a status whose code says what the caller can do about it: the disk full
// (ResourceExhausted, naming the database's file: the data dir needs space), the file damaged
// (DataLoss), an I/O error (Unavailable: it may pass), anything else Internal.
inline absl::Status SqliteError(sqlite3* db, std::string_view what) {
  const int code = sqlite3_extended_errcode(db);
  const char* file = sqlite3_db_filename(db, "main");
  const std::string message =
      absl::StrCat("job store: ", Sv(what), ": ", sqlite3_errmsg(db), " (SQLite code ", code, ")");
  absl::Status status;
  switch (code & 0xff) {
    case SQLITE_FULL:
      status = absl::ResourceExhaustedError(absl::StrCat(
          message, "; the disk of ", file != nullptr ? file : "the data dir",
          " is full: free space there (nothing is lost; committing resumes by itself)"));
      break;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      status = absl::DataLossError(
          absl::StrCat(message, "; ", file != nullptr ? file : "the store", " is damaged"));
      break;
    case SQLITE_IOERR:
      status = absl::UnavailableError(message);
      break;
    default:
      return absl::InternalError(message);
  }
  status.SetPayload(kStorageFailurePayload, absl::Cord("1"));
  return status;
}

// The start of a statement, to name it in an error message.
inline std::string_view Abbreviated(std::string_view sql) {
  constexpr size_t kMax = 60;
  return sql.size() > kMax ? sql.substr(0, kMax) : sql;
}

inline absl::Status Exec(sqlite3* db, const char* sql) {
  if (sqlite3_exec(db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
    return SqliteError(db, Abbreviated(sql));
  }
  return absl::OkStatus();
}

// A bound BLOB parameter (a text parameter is a std::string_view).
struct Blob {
  std::string_view bytes;
};

// A prepared statement. Bind parameters are 1-based, columns 0-based, as in SQLite.
class Statement {
 public:
  static absl::StatusOr<Statement> Prepare(sqlite3* db, std::string_view sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr) !=
        SQLITE_OK) {
      return SqliteError(db, absl::StrCat("prepare ", Sv(Abbreviated(sql))));
    }
    return Statement(db, stmt);
  }

  Statement(Statement&& other) noexcept
      : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)) {}
  Statement& operator=(Statement&&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  // Binds args to parameters 1, 2, ...: integers, std::string_view (TEXT) and Blob.
  template <typename... Args>
  absl::Status BindAll(const Args&... args) {
    int i = 0;
    absl::Status status;
    ((status.ok() ? (status = Bind(++i, args), 0) : 0), ...);
    return status;
  }

  // True on a row, false when done.
  absl::StatusOr<bool> Step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return Error();
  }

  // Steps a statement that returns no rows (or ignores them).
  absl::Status Run() {
    absl::StatusOr<bool> row = Step();
    return row.status();
  }

  // Makes the statement ready to run again with new bindings. (sqlite3_reset's return value
  // repeats the last step's error, which Step already reported.)
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }

  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    if (p == nullptr) return std::string();
    return std::string(reinterpret_cast<const char*>(p),
                       static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }

  std::string BlobBytes(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    if (p == nullptr) return std::string();
    return std::string(static_cast<const char*>(p),
                       static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }

 private:
  Statement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}

  absl::Status Error() const {
    const char* sql = sqlite3_sql(stmt_);
    return SqliteError(db_, Abbreviated(sql != nullptr ? sql : ""));
  }

  absl::Status Check(int rc) const { return rc == SQLITE_OK ? absl::OkStatus() : Error(); }

  absl::Status Bind(int i, int64_t v) { return Check(sqlite3_bind_int64(stmt_, i, v)); }
  absl::Status Bind(int i, std::string_view v) {
    // data() of an empty view may be null, which SQLite would store as NULL: bind "" instead.
    const char* p = v.data() != nullptr ? v.data() : "";
    return Check(sqlite3_bind_text64(stmt_, i, p, v.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  }
  absl::Status Bind(int i, const std::string& v) { return Bind(i, std::string_view(v)); }
  absl::Status Bind(int i, const char* v) { return Bind(i, std::string_view(v)); }
  absl::Status Bind(int i, const Blob& v) {
    const char* p = v.bytes.data() != nullptr ? v.bytes.data() : "";
    return Check(sqlite3_bind_blob64(stmt_, i, p, v.bytes.size(), SQLITE_TRANSIENT));
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
};

// Reads one page of a query that asks for `limit` + 1 rows (LIMIT ?): calls `read(stmt)` (returning
// absl::Status) on each of the first `limit` rows; returns whether a row followed them (the page's
// has_more), or the first error of a step or of `read`.
template <typename Read>
absl::StatusOr<bool> ReadPage(Statement& stmt, int64_t limit, Read read) {
  for (int64_t n = 0;; ++n) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) return false;
    if (n == limit) return true;
    if (absl::Status s = read(stmt); !s.ok()) return s;
  }
}

// A transaction on the store's connection, rolled back on destruction unless committed.
// Begin(write=true) is BEGIN IMMEDIATE: it takes the write lock at once (waiting up to the busy
// timeout for another process), so the transaction never fails later on lock upgrade.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  ~Transaction() {
    // Some errors (I/O, full disk) roll back by themselves; roll back only what is still open.
    if (begun_ && sqlite3_get_autocommit(db_) == 0 &&
        sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr) != SQLITE_OK) {
      spdlog::warn("job store: ROLLBACK failed: {}", sqlite3_errmsg(db_));
    }
  }

  absl::Status Begin(bool write) {
    if (absl::Status s = Exec(db_, write ? "BEGIN IMMEDIATE" : "BEGIN"); !s.ok()) return s;
    begun_ = true;
    return absl::OkStatus();
  }
  absl::Status Commit() { return Exec(db_, "COMMIT"); }

 private:
  sqlite3* db_;
  bool begun_ = false;
};

}  // namespace moebatch::sqlite
