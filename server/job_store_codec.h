// How the job store (job_store.h) encodes columns that are not plain SQLite values. Pure
// functions, thread-safe; nlohmann-json runs without exceptions leaving this file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/job_store.h"

namespace moebatch {

// requests.prompt_token_ids: a BLOB of little-endian int32, 4 bytes per token id.
std::string EncodeTokenIds(const std::vector<int32_t>& ids);
// INTERNAL naming the column when the BLOB's length is not a multiple of 4.
absl::StatusOr<std::vector<int32_t>> DecodeTokenIds(const std::string& bytes);

// jobs.metadata: a JSON object of strings. INVALID_ARGUMENT when a key or value is not valid
// UTF-8 (the user's input); decoding gives INTERNAL for anything but an object of strings.
absl::StatusOr<std::string> EncodeMetadata(const std::map<std::string, std::string>& metadata);
absl::StatusOr<std::map<std::string, std::string>> DecodeMetadata(const std::string& text);

// jobs.errors: "" (none) or a JSON array of {"line", "code", "param", "message"}. Encoding replaces
// ill-formed UTF-8 by U+FFFD; decoding gives INTERNAL for anything else.
std::string EncodeLineErrors(const std::vector<JobLineError>& errors);
absl::StatusOr<std::vector<JobLineError>> DecodeLineErrors(const std::string& text);

// ListJobs page tokens, opaque per tenant: created_at and seq of the page's last job (big-endian
// int64 each) sealed with AES-256-GCM under the store's key (a 12-byte random nonce, the 16-byte
// tag; the listing's tenant as associated data), as lowercase hex. A tenant learns nothing from a
// token (the global job sequence is hidden), cannot forge one, and a token made for one tenant's
// listing is refused for another's. Decoding refuses (nullopt) anything this key did not seal for
// that tenant, and seq < 1.
class PageTokenCodec {
 public:
  static constexpr size_t kKeyBytes = 32;
  // The key file under the data dir: read when it holds kKeyBytes bytes, else (missing, or a
  // damaged one) made anew from OpenSSL's RAND_bytes with mode 0600 (tokens handed out earlier are
  // then refused). Internal when it can be neither read nor written.
  static absl::StatusOr<PageTokenCodec> FromKeyFile(const std::string& path);
  explicit PageTokenCodec(const std::string& key) : key_(key) {}

  std::string Encode(int64_t created_at, int64_t seq, const std::string& tenant) const;
  std::optional<std::pair<int64_t, int64_t>> Decode(const std::string& token,
                                                    const std::string& tenant) const;

 private:
  std::string key_;  // kKeyBytes
};

}  // namespace moebatch
