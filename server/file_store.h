// Uploaded files of the OpenAI Files API (POST /v1/files, server/http_api.h): their bytes in
// <data_dir>/files/<id>, their records in <data_dir>/files.db (SQLite, WAL, synchronous=FULL).
//
// An upload is streamed to a temporary file (Upload::Append), then made durable and visible at
// once (Upload::Commit: fsync the file, rename it into place, fsync the directory, then insert
// the record in one transaction), so a crash leaves either a whole file with its record or
// neither; files without a record (a crash between the rename and the insert, or a temporary
// file) are removed when the store opens. Nothing here holds a whole file in memory.
//
// Threading: every method may be called from any thread (one connection under a mutex); an
// Upload belongs to one thread. Errors: absl::Status; NotFound for an unknown id ("file <id> not
// found"); ResourceExhausted when an upload passes its byte limit or the disk is full; Internal
// for SQLite and file-system failures (with their message).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moebatch {

struct FileRecord {
  std::string id;  // "file-" + 24 hex characters
  std::string tenant;
  std::string purpose;   // "batch" (the only purpose moebatchd takes)
  std::string filename;  // as the client named it
  int64_t bytes = 0;
  int64_t created_at = 0;  // Unix seconds
};

class FileStore {
 public:
  // Creates <data_dir>/files/ and files.db when missing; removes orphaned files.
  static absl::StatusOr<std::unique_ptr<FileStore>> Open(const std::string& data_dir);
  ~FileStore();

  // One upload in progress. Destroying it without Commit removes what was written.
  class Upload {
   public:
    ~Upload();
    // Appends bytes; ResourceExhausted once more than max_bytes were given (the upload is then
    // dead: Commit fails).
    absl::Status Append(const char* data, size_t n);
    int64_t bytes() const { return bytes_; }
    // Makes the file durable and visible; returns its record.
    absl::StatusOr<FileRecord> Commit(const std::string& tenant, const std::string& purpose,
                                      const std::string& filename);

   private:
    friend class FileStore;
    Upload(FileStore* store, std::string id, std::string tmp_path, std::FILE* f, int64_t max_bytes);
    FileStore* store_;
    std::string id_;
    std::string tmp_path_;
    std::FILE* file_;
    int64_t max_bytes_;
    int64_t bytes_ = 0;
    bool dead_ = false;
    bool committed_ = false;
  };

  // A new upload of at most `max_bytes` bytes.
  absl::StatusOr<std::unique_ptr<Upload>> BeginUpload(int64_t max_bytes);

  absl::StatusOr<FileRecord> Get(const std::string& id);
  // The path of a file's bytes (for reading; the file may be deleted meanwhile: open it once).
  std::string PathOf(const std::string& id) const;

  // `tenant` "" = every tenant's; `purpose` "" = any. Ordered by (created_at, id): newest first
  // unless `ascending`; strictly after the cursor (after_created_at: Unix seconds, after_id) in
  // that order (after_id "" = from the start; the cursor need not name a file: GET /v1/files
  // merges these with the batches' result files, server/http_api.h); at most `limit` (1..10000;
  // InvalidArgument otherwise). `has_more`: more files follow.
  struct Page {
    std::vector<FileRecord> files;
    bool has_more = false;
  };
  absl::StatusOr<Page> List(const std::string& tenant, const std::string& purpose,
                            int64_t after_created_at, const std::string& after_id, int32_t limit,
                            bool ascending);

  // Removes the record, then the bytes. NotFound for an unknown id.
  absl::Status Delete(const std::string& id);
  // Retention: deletes every file created before `cutoff` (Unix seconds); returns how many.
  absl::StatusOr<int64_t> DeleteCreatedBefore(int64_t cutoff);

 private:
  struct Impl;
  FileStore();
  absl::StatusOr<FileRecord> Insert(const FileRecord& record);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moebatch
