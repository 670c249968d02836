// The uploaded-file store (server/file_store.h): streamed uploads made durable and visible at once,
// listing and paging, deletion, the upload limit, and what a crash leaves behind.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "server/file_store.h"
#include "tests/support/temp_dir.h"

namespace moebatch {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

std::unique_ptr<FileStore> OpenOk(const std::string& dir) {
  auto store = FileStore::Open(dir);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  return *std::move(store);
}

FileRecord UploadOk(FileStore& store, const std::string& tenant, const std::string& bytes) {
  auto upload = store.BeginUpload(1 << 20);
  REQUIRE(upload.ok());
  // In pieces, as an HTTP body arrives.
  for (size_t i = 0; i < bytes.size(); i += 7) {
    REQUIRE((*upload)->Append(bytes.data() + i, std::min<size_t>(7, bytes.size() - i)).ok());
  }
  auto record = (*upload)->Commit(tenant, "batch", "in.jsonl");
  INFO(record.status().ToString());
  REQUIRE(record.ok());
  return *record;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_CASE("FileStore: an upload is stored whole, listed, read and deleted") {
  TempDir dir;
  std::unique_ptr<FileStore> store = OpenOk(dir.str());
  const std::string bytes = "{\"custom_id\": \"a\"}\n{\"custom_id\": \"b\"}\n";
  const FileRecord a = UploadOk(*store, "team-a", bytes);
  CHECK(a.id.rfind("file-", 0) == 0);
  CHECK(a.id.size() == 29);
  CHECK(a.bytes == static_cast<int64_t>(bytes.size()));
  CHECK(a.created_at > 0);
  CHECK(ReadAll(store->PathOf(a.id)) == bytes);
  auto got = store->Get(a.id);
  REQUIRE(got.ok());
  CHECK(got->tenant == "team-a");
  CHECK(got->filename == "in.jsonl");
  CHECK(got->purpose == "batch");

  const FileRecord b = UploadOk(*store, "team-b", "x\n");
  const FileRecord c = UploadOk(*store, "team-a", "y\n");
  // Newest first by default, in the order (created_at, id) (uploads within a second share
  // created_at: their ids decide), per tenant, paged by the cursor (created_at, id).
  auto older = [](const FileRecord& x, const FileRecord& y) {
    return std::tie(x.created_at, x.id) < std::tie(y.created_at, y.id);
  };
  std::vector<FileRecord> expected = {a, b, c};
  std::sort(expected.begin(), expected.end(), older);
  auto all = store->List("", "", 0, "", 10, /*ascending=*/false);
  REQUIRE(all.ok());
  REQUIRE(all->files.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(all->files[i].id == expected[2 - i].id);
  CHECK_FALSE(all->has_more);
  const FileRecord& newer_a = older(a, c) ? c : a;
  const FileRecord& older_a = older(a, c) ? a : c;
  auto mine = store->List("team-a", "batch", 0, "", 1, false);
  REQUIRE(mine.ok());
  REQUIRE(mine->files.size() == 1);
  CHECK(mine->files[0].id == newer_a.id);
  CHECK(mine->has_more);
  auto next = store->List("team-a", "batch", newer_a.created_at, newer_a.id, 1, false);
  REQUIRE(next.ok());
  REQUIRE(next->files.size() == 1);
  CHECK(next->files[0].id == older_a.id);
  CHECK_FALSE(next->has_more);
  auto ascending = store->List("", "", 0, "", 10, /*ascending=*/true);
  REQUIRE(ascending.ok());
  REQUIRE(ascending->files.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(ascending->files[i].id == expected[i].id);
  // A cursor need not name a file ("file-job_" sorts after every upload id of its second).
  const int64_t t0 = expected[0].created_at;
  size_t later = 0;
  for (const FileRecord& f : expected) later += f.created_at > t0 ? 1 : 0;
  auto after_cursor = store->List("", "", t0, "file-job_", 10, /*ascending=*/true);
  REQUIRE(after_cursor.ok());
  CHECK(after_cursor->files.size() == later);
  auto before_cursor = store->List("", "", t0, "file-job_", 10, /*ascending=*/false);
  REQUIRE(before_cursor.ok());
  CHECK(before_cursor->files.size() == 3 - later);
  CHECK(store->List("", "", 0, "", 0, false).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(store->List("", "", 0, "", 10001, false).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(store->List("", "fine-tune", 0, "", 10, false)->files.empty());

  REQUIRE(store->Delete(a.id).ok());
  CHECK(store->Get(a.id).status().code() == absl::StatusCode::kNotFound);
  CHECK_FALSE(fs::exists(store->PathOf(a.id)));
  CHECK(store->Delete(a.id).code() == absl::StatusCode::kNotFound);
  // Ids are checked before they reach the file system.
  CHECK(store->Get("../files.db").status().code() == absl::StatusCode::kNotFound);
  CHECK(store->Delete("file-../../etc").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("FileStore: an upload over its limit fails and leaves nothing") {
  TempDir dir;
  std::unique_ptr<FileStore> store = OpenOk(dir.str());
  {
    auto upload = store->BeginUpload(10);
    REQUIRE(upload.ok());
    REQUIRE((*upload)->Append("0123456789", 10).ok());
    const absl::Status over = (*upload)->Append("x", 1);
    CHECK(over.code() == absl::StatusCode::kResourceExhausted);
    CHECK((*upload)->Commit("t", "batch", "f").status().code() ==
          absl::StatusCode::kFailedPrecondition);
  }
  CHECK(fs::is_empty(fs::path(dir.str()) / "files"));
  CHECK(store->List("", "", 0, "", 10, false)->files.empty());
}

TEST_CASE(
    "FileStore: what a crash leaves (a temporary file, bytes without a record) goes at open") {
  TempDir dir;
  std::string kept;
  {
    std::unique_ptr<FileStore> store = OpenOk(dir.str());
    kept = UploadOk(*store, "t", "kept\n").id;
  }
  const fs::path files = fs::path(dir.str()) / "files";
  std::ofstream(files / "file-0123456789abcdef01234567.tmp") << "half an upload";
  std::ofstream(files / "file-89abcdef0123456789abcdef") << "renamed, never recorded";
  std::unique_ptr<FileStore> store = OpenOk(dir.str());
  CHECK(fs::exists(files / kept));
  CHECK_FALSE(fs::exists(files / "file-0123456789abcdef01234567.tmp"));
  CHECK_FALSE(fs::exists(files / "file-89abcdef0123456789abcdef"));
  CHECK(ReadAll(store->PathOf(kept)) == "kept\n");
}

TEST_CASE("FileStore: retention deletes files created before the cutoff") {
  TempDir dir;
  std::unique_ptr<FileStore> store = OpenOk(dir.str());
  const FileRecord f = UploadOk(*store, "t", "x\n");
  auto none = store->DeleteCreatedBefore(f.created_at);
  REQUIRE(none.ok());
  CHECK(*none == 0);
  auto one = store->DeleteCreatedBefore(f.created_at + 1);
  REQUIRE(one.ok());
  CHECK(*one == 1);
  CHECK(store->Get(f.id).status().code() == absl::StatusCode::kNotFound);
  CHECK_FALSE(fs::exists(store->PathOf(f.id)));
}

}  // namespace
}  // namespace moebatch
