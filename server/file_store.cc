// The uploaded-file store (server/file_store.h) on the SQLite C API (server/sqlite_db.h).
//
// files.db, schema version 1 (PRAGMA user_version = 1):
//   files(id, seq, tenant, purpose, filename, bytes, created_at)  seq: creation order; List
//   orders by (created_at, id) (index files_by_created_id, made on open when missing).
// Bytes: <data_dir>/files/<id>; an upload in progress: <data_dir>/files/<id>.tmp.
#include "server/file_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/sqlite_db.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

namespace fs = std::filesystem;
using sqlite::Exec;
using sqlite::Statement;
using sqlite::Transaction;

constexpr const char* kDbFileName = "files.db";
constexpr const char* kDirName = "files";
constexpr const char* kTmpSuffix = ".tmp";
constexpr int kBusyTimeoutMs = 10000;
constexpr int32_t kMaxListLimit = 10000;

constexpr const char* kSchemaSql = R"sql(
CREATE TABLE IF NOT EXISTS files (
  id TEXT PRIMARY KEY NOT NULL,
  seq INTEGER NOT NULL UNIQUE,
  tenant TEXT NOT NULL,
  purpose TEXT NOT NULL,
  filename TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS files_by_tenant ON files (tenant, seq);
CREATE INDEX IF NOT EXISTS files_by_created ON files (created_at);
CREATE INDEX IF NOT EXISTS files_by_created_id ON files (created_at, id);
PRAGMA user_version = 1;
)sql";

constexpr const char* kSelectFile =
    "SELECT id, tenant, purpose, filename, bytes, created_at, seq FROM files ";

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

FileRecord ReadFile(const Statement& stmt) {
  FileRecord f;
  f.id = stmt.Text(0);
  f.tenant = stmt.Text(1);
  f.purpose = stmt.Text(2);
  f.filename = stmt.Text(3);
  f.bytes = stmt.Int(4);
  f.created_at = stmt.Int(5);
  return f;
}

absl::Status NotFound(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("file ", id.substr(0, 64), " not found"));
}

absl::Status Errno(const std::string& what, const std::string& path) {
  const int e = errno;
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOSPC || e == EDQUOT) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Errno("cannot open", dir);
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) return Errno("cannot fsync", dir);
  return absl::OkStatus();
}

// Whether `id` is one this store makes: "file-" and 24 hex characters (nothing else reaches the
// file system).
bool IsFileId(const std::string& id) {
  if (id.size() != 29 || !absl::StartsWith(id, "file-")) return false;
  for (size_t i = 5; i < id.size(); ++i) {
    const char c = id[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

struct FileStore::Impl {
  absl::Mutex mu;
  sqlite3* db ABSL_GUARDED_BY(mu) = nullptr;
  std::string dir;  // <data_dir>/files
  absl::Mutex rng_mu;
  std::mt19937_64 rng ABSL_GUARDED_BY(rng_mu);

  std::string NewId() {
    static constexpr char kHex[] = "0123456789abcdef";
    absl::MutexLock lock(&rng_mu);
    std::string id = "file-";
    uint64_t bits = 0;
    for (int i = 0; i < 24; ++i) {
      if (i % 16 == 0) bits = rng();
      id += kHex[bits & 0xf];
      bits >>= 4;
    }
    return id;
  }
};

FileStore::FileStore() : impl_(std::make_unique<Impl>()) {}

FileStore::~FileStore() {
  absl::MutexLock lock(&impl_->mu);
  if (impl_->db != nullptr) sqlite3_close_v2(impl_->db);
  impl_->db = nullptr;
}

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& data_dir) {
  std::unique_ptr<FileStore> store(new FileStore());
  Impl& impl = *store->impl_;
  impl.dir = (fs::path(data_dir) / kDirName).string();
  std::error_code ec;
  fs::create_directories(impl.dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the files directory ", impl.dir, ": ", ec.message()));
  }
  {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device()};
    absl::MutexLock lock(&impl.rng_mu);
    impl.rng.seed(seed);
  }
  const std::string path = (fs::path(data_dir) / kDbFileName).string();
  absl::MutexLock lock(&impl.mu);
  if (sqlite3_open_v2(path.c_str(), &impl.db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    return absl::InternalError(
        absl::StrCat("file store: cannot open ", path, ": ",
                     impl.db != nullptr ? sqlite3_errmsg(impl.db) : "out of memory"));
  }
  sqlite3_busy_timeout(impl.db, kBusyTimeoutMs);
  for (const char* pragma : {"PRAGMA journal_mode = WAL", "PRAGMA synchronous = FULL"}) {
    if (absl::Status s = Exec(impl.db, pragma); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("file store ", path, ": ", s.message()));
    }
  }
  {
    Transaction txn(impl.db);
    if (absl::Status s = txn.Begin(/*write=*/true); !s.ok()) return s;
    if (absl::Status s = Exec(impl.db, kSchemaSql); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("file store ", path, ": ", s.message()));
    }
    if (absl::Status s = txn.Commit(); !s.ok()) return s;
  }
  // Orphans: temporary files, and files whose record was never inserted.
  std::set<std::string> known;
  {
    absl::StatusOr<Statement> stmt = Statement::Prepare(impl.db, "SELECT id FROM files");
    if (!stmt.ok()) return stmt.status();
    for (;;) {
      absl::StatusOr<bool> row = stmt->Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      known.insert(stmt->Text(0));
    }
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(impl.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (known.count(name) != 0) continue;
    fs::remove(entry.path(), ec);
    spdlog::info("file store: removed {} (an upload that did not finish)", entry.path().string());
  }
  return store;
}

FileStore::Upload::Upload(FileStore* store, std::string id, std::string tmp_path, std::FILE* f,
                          int64_t max_bytes)
    : store_(store),
      id_(std::move(id)),
      tmp_path_(std::move(tmp_path)),
      file_(f),
      max_bytes_(max_bytes) {}

FileStore::Upload::~Upload() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) {
    std::error_code ec;
    fs::remove(tmp_path_, ec);
  }
}

absl::Status FileStore::Upload::Append(const char* data, size_t n) {
  if (dead_) return absl::FailedPreconditionError("the upload failed before");
  if (bytes_ + static_cast<int64_t>(n) > max_bytes_) {
    dead_ = true;
    return absl::ResourceExhaustedError(
        absl::StrCat("file: larger than the limit of ", max_bytes_, " bytes"));
  }
  if (n > 0 && std::fwrite(data, 1, n, file_) != n) {
    dead_ = true;
    return Errno("cannot write", tmp_path_);
  }
  bytes_ += static_cast<int64_t>(n);
  return absl::OkStatus();
}

absl::StatusOr<FileRecord> FileStore::Upload::Commit(const std::string& tenant,
                                                     const std::string& purpose,
                                                     const std::string& filename) {
  if (dead_ || committed_) return absl::FailedPreconditionError("the upload cannot be committed");
  if (std::fflush(file_) != 0 || fsync(fileno(file_)) != 0) {
    dead_ = true;
    return Errno("cannot write", tmp_path_);
  }
  std::fclose(file_);
  file_ = nullptr;
  const std::string final_path = store_->PathOf(id_);
  if (std::rename(tmp_path_.c_str(), final_path.c_str()) != 0) {
    dead_ = true;
    return Errno("cannot rename", tmp_path_);
  }
  committed_ = true;  // from here the bytes are the record's, or an orphan removed at open
  if (absl::Status s = SyncDirectory(store_->impl_->dir); !s.ok()) {
    std::error_code ec;
    fs::remove(final_path, ec);
    return s;
  }
  FileRecord record;
  record.id = id_;
  record.tenant = tenant;
  record.purpose = purpose;
  record.filename = filename;
  record.bytes = bytes_;
  record.created_at = NowSeconds();
  auto inserted = store_->Insert(record);
  if (!inserted.ok()) {
    std::error_code ec;
    fs::remove(final_path, ec);
  }
  return inserted;
}

absl::StatusOr<std::unique_ptr<FileStore::Upload>> FileStore::BeginUpload(int64_t max_bytes) {
  const std::string id = impl_->NewId();
  const std::string tmp = PathOf(id) + kTmpSuffix;
  std::FILE* f = std::fopen(tmp.c_str(), "wbx");
  if (f == nullptr) return Errno("cannot create", tmp);
  return std::unique_ptr<Upload>(new Upload(this, id, tmp, f, max_bytes));
}

std::string FileStore::PathOf(const std::string& id) const {
  return (fs::path(impl_->dir) / id).string();
}

absl::StatusOr<FileRecord> FileStore::Insert(const FileRecord& record) {
  absl::MutexLock lock(&impl_->mu);
  Transaction txn(impl_->db);
  if (absl::Status s = txn.Begin(/*write=*/true); !s.ok()) return s;
  absl::StatusOr<Statement> insert = Statement::Prepare(
      impl_->db,
      "INSERT INTO files (id, seq, tenant, purpose, filename, bytes, created_at) VALUES "
      "(?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM files), ?, ?, ?, ?, ?)");
  if (!insert.ok()) return insert.status();
  if (absl::Status s = insert->BindAll(record.id, record.tenant, record.purpose, record.filename,
                                       record.bytes, record.created_at);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = insert->Run(); !s.ok()) return s;
  if (absl::Status s = txn.Commit(); !s.ok()) return s;
  return record;
}

absl::StatusOr<FileRecord> FileStore::Get(const std::string& id) {
  if (!IsFileId(id)) return NotFound(id);
  absl::MutexLock lock(&impl_->mu);
  absl::StatusOr<Statement> stmt =
      Statement::Prepare(impl_->db, std::string(kSelectFile) + "WHERE id = ?");
  if (!stmt.ok()) return stmt.status();
  if (absl::Status s = stmt->BindAll(id); !s.ok()) return s;
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  if (!*row) return NotFound(id);
  return ReadFile(*stmt);
}

absl::StatusOr<FileStore::Page> FileStore::List(const std::string& tenant,
                                                const std::string& purpose,
                                                int64_t after_created_at,
                                                const std::string& after_id, int32_t limit,
                                                bool ascending) {
  if (limit < 1 || limit > kMaxListLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [1, ", kMaxListLimit, "], got ", limit));
  }
  const std::string sql =
      std::string(kSelectFile) +
      "WHERE (?1 = '' OR tenant = ?1) AND (?2 = '' OR purpose = ?2) AND " +
      (ascending ? "(?4 = '' OR (created_at, id) > (?3, ?4)) ORDER BY created_at, id LIMIT ?5"
                 : "(?4 = '' OR (created_at, id) < (?3, ?4)) "
                   "ORDER BY created_at DESC, id DESC LIMIT ?5");
  absl::MutexLock lock(&impl_->mu);
  absl::StatusOr<Statement> stmt = Statement::Prepare(impl_->db, sql);
  if (!stmt.ok()) return stmt.status();
  if (absl::Status s =
          stmt->BindAll(tenant, purpose, after_created_at, after_id, int64_t{limit} + 1);
      !s.ok()) {
    return s;
  }
  Page page;
  absl::StatusOr<bool> has_more = sqlite::ReadPage(*stmt, limit, [&](const Statement& row) {
    page.files.push_back(ReadFile(row));
    return absl::OkStatus();
  });
  if (!has_more.ok()) return has_more.status();
  page.has_more = *has_more;
  return page;
}

absl::Status FileStore::Delete(const std::string& id) {
  if (!IsFileId(id)) return NotFound(id);
  {
    absl::MutexLock lock(&impl_->mu);
    absl::StatusOr<Statement> del = Statement::Prepare(impl_->db, "DELETE FROM files WHERE id = ?");
    if (!del.ok()) return del.status();
    if (absl::Status s = del->BindAll(id); !s.ok()) return s;
    if (absl::Status s = del->Run(); !s.ok()) return s;
    if (sqlite3_changes(impl_->db) == 0) return NotFound(id);
  }
  // A reader that opened it before keeps reading (POSIX unlink semantics).
  std::error_code ec;
  fs::remove(PathOf(id), ec);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FileStore::DeleteCreatedBefore(int64_t cutoff) {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&impl_->mu);
    absl::StatusOr<Statement> stmt =
        Statement::Prepare(impl_->db, "SELECT id FROM files WHERE created_at < ?");
    if (!stmt.ok()) return stmt.status();
    if (absl::Status s = stmt->BindAll(cutoff); !s.ok()) return s;
    for (;;) {
      absl::StatusOr<bool> row = stmt->Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      ids.push_back(stmt->Text(0));
    }
  }
  int64_t deleted = 0;
  for (const std::string& id : ids) {
    absl::Status s = Delete(id);
    if (s.ok()) ++deleted;
    if (!s.ok() && !absl::IsNotFound(s)) return s;
  }
  return deleted;
}

}  // namespace moebatch
