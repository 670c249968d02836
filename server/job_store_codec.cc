// Column encodings of the job store (job_store_codec.h).
#include "server/job_store_codec.h"

#include <array>
#include <exception>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace moebatch {

using json = nlohmann::json;

std::string EncodeTokenIds(const std::vector<int32_t>& ids) {
  std::string bytes(ids.size() * 4, '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v = static_cast<uint32_t>(ids[i]);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<char>((v >> (8 * b)) & 0xff);
  }
  return bytes;
}

absl::StatusOr<std::vector<int32_t>> DecodeTokenIds(const std::string& bytes) {
  if (bytes.size() % 4 != 0) {
    return absl::InternalError(absl::StrCat("job store: corrupt prompt_token_ids (", bytes.size(),
                                            " bytes, not a multiple of 4)"));
  }
  std::vector<int32_t> ids(bytes.size() / 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v = 0;
    for (int b = 0; b < 4; ++b) v |= uint32_t{static_cast<uint8_t>(bytes[i * 4 + b])} << (8 * b);
    ids[i] = static_cast<int32_t>(v);
  }
  return ids;
}

absl::StatusOr<std::string> EncodeMetadata(const std::map<std::string, std::string>& metadata) {
  json object = json::object();
  for (const auto& [key, value] : metadata) object[key] = value;
  try {
    return object.dump();  // strict: throws type_error 316 on ill-formed UTF-8
  } catch (const std::exception&) {
    return absl::InvalidArgumentError("job metadata: keys and values must be valid UTF-8");
  }
}

absl::StatusOr<std::map<std::string, std::string>> DecodeMetadata(const std::string& text) {
  json object = json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded() || !object.is_object()) {
    return absl::InternalError("job store: corrupt metadata (not a JSON object)");
  }
  std::map<std::string, std::string> metadata;
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InternalError(absl::StrCat("job store: corrupt metadata (value of \"", it.key(),
                                              "\" is not a string)"));
    }
    metadata[it.key()] = it.value().get_ref<const std::string&>();
  }
  return metadata;
}

namespace {

// FNV-1a (salted) of a page token's 16 payload bytes.
uint32_t TokenCheck(const uint8_t* bytes, size_t n) {
  uint32_t h = 0x811c9dc5u ^ 0x6d6f6562u;  // FNV-1a, salted
  for (size_t i = 0; i < n; ++i) {
    h ^= bytes[i];
    h *= 0x01000193u;
  }
  return h;
}

}  // namespace

std::string EncodePageToken(int64_t created_at, int64_t seq) {
  std::array<uint8_t, 20> bytes{};
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<uint8_t>(static_cast<uint64_t>(created_at) >> (56 - 8 * i));
    bytes[8 + i] = static_cast<uint8_t>(static_cast<uint64_t>(seq) >> (56 - 8 * i));
  }
  uint32_t check = TokenCheck(bytes.data(), 16);
  for (int i = 0; i < 4; ++i) bytes[16 + i] = static_cast<uint8_t>(check >> (24 - 8 * i));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (uint8_t b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 0xf];
  }
  return token;
}

std::optional<std::pair<int64_t, int64_t>> DecodePageToken(const std::string& token) {
  std::array<uint8_t, 20> bytes{};
  if (token.size() != bytes.size() * 2) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < bytes.size(); ++i) {
    int hi = nibble(token[2 * i]), lo = nibble(token[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  uint32_t check = 0;
  for (int i = 0; i < 4; ++i) check = check << 8 | bytes[16 + i];
  if (check != TokenCheck(bytes.data(), 16)) return std::nullopt;
  uint64_t created_at = 0, seq = 0;
  for (int i = 0; i < 8; ++i) {
    created_at = created_at << 8 | bytes[i];
    seq = seq << 8 | bytes[8 + i];
  }
  if (static_cast<int64_t>(seq) < 1) return std::nullopt;
  return std::make_pair(static_cast<int64_t>(created_at), static_cast<int64_t>(seq));
}

}  // namespace moebatch
