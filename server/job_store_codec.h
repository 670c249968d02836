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

namespace moebatch {

// requests.prompt_token_ids: a BLOB of little-endian int32, 4 bytes per token id.
std::string EncodeTokenIds(const std::vector<int32_t>& ids);
// INTERNAL naming the column when the BLOB's length is not a multiple of 4.
absl::StatusOr<std::vector<int32_t>> DecodeTokenIds(const std::string& bytes);

// jobs.metadata: a JSON object of strings. INVALID_ARGUMENT when a key or value is not valid
// UTF-8 (the user's input); decoding gives INTERNAL for anything but an object of strings.
absl::StatusOr<std::string> EncodeMetadata(const std::map<std::string, std::string>& metadata);
absl::StatusOr<std::map<std::string, std::string>> DecodeMetadata(const std::string& text);

// ListJobs page tokens: 40 lowercase hex digits = created_at and seq (big-endian int64 each) of
// the page's last job, then a 32-bit check, so that a token this store did not produce is refused
// (nullopt) rather than misread. Decoding also refuses seq < 1.
std::string EncodePageToken(int64_t created_at, int64_t seq);
std::optional<std::pair<int64_t, int64_t>> DecodePageToken(const std::string& token);

}  // namespace moebatch
