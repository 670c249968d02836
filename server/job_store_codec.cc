// Column encodings of the job store (job_store_codec.h).
#include "server/job_store_codec.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>

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

std::string EncodeLineErrors(const std::vector<JobLineError>& errors) {
  if (errors.empty()) return "";
  json list = json::array();
  for (const JobLineError& e : errors) {
    list.push_back(
        {{"line", e.line}, {"code", e.code}, {"param", e.param}, {"message", e.message}});
  }
  return list.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<std::vector<JobLineError>> DecodeLineErrors(const std::string& text) {
  std::vector<JobLineError> errors;
  if (text.empty()) return errors;
  const json list = json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (list.is_discarded() || !list.is_array()) {
    return absl::InternalError("job store: corrupt errors column (not a JSON array)");
  }
  for (const json& e : list) {
    if (!e.is_object() || !e.contains("line") || !e["line"].is_number_integer() ||
        !e.contains("code") || !e["code"].is_string() || !e.contains("param") ||
        !e["param"].is_string() || !e.contains("message") || !e["message"].is_string()) {
      return absl::InternalError("job store: corrupt errors column (an entry is not an error)");
    }
    errors.push_back(JobLineError{e["line"].get<int64_t>(), e["code"].get<std::string>(),
                                  e["param"].get<std::string>(), e["message"].get<std::string>()});
  }
  return errors;
}

namespace {

constexpr size_t kNonceBytes = 12, kTagBytes = 16, kPayloadBytes = 16;

std::string Hex(const unsigned char* bytes, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 0xf];
  }
  return out;
}

}  // namespace

absl::StatusOr<PageTokenCodec> PageTokenCodec::FromKeyFile(const std::string& path) {
  {
    std::ifstream in(path, std::ios::binary);
    std::string key((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.good() || in.eof()) {
      if (key.size() == kKeyBytes) return PageTokenCodec(key);
    }
  }
  std::string key(kKeyBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), static_cast<int>(kKeyBytes)) != 1) {
    return absl::InternalError("job store: no random bytes for the page token key");
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, key.data(), key.size()) != static_cast<ssize_t>(key.size()) ||
      ::fsync(fd) != 0) {
    const std::string error = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return absl::InternalError(absl::StrCat("job store: cannot write ", path, ": ", error));
  }
  ::close(fd);
  return PageTokenCodec(key);
}

std::string PageTokenCodec::Encode(int64_t created_at, int64_t seq,
                                   const std::string& tenant) const {
  unsigned char plain[kPayloadBytes];
  for (int i = 0; i < 8; ++i) {
    plain[i] = static_cast<unsigned char>(static_cast<uint64_t>(created_at) >> (56 - 8 * i));
    plain[8 + i] = static_cast<unsigned char>(static_cast<uint64_t>(seq) >> (56 - 8 * i));
  }
  unsigned char out[kNonceBytes + kPayloadBytes + kTagBytes];
  RAND_bytes(out, kNonceBytes);
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  int n = 0;
  EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr,
                     reinterpret_cast<const unsigned char*>(key_.data()), out);
  EVP_EncryptUpdate(ctx, nullptr, &n, reinterpret_cast<const unsigned char*>(tenant.data()),
                    static_cast<int>(tenant.size()));
  EVP_EncryptUpdate(ctx, out + kNonceBytes, &n, plain, kPayloadBytes);
  EVP_EncryptFinal_ex(ctx, out + kNonceBytes + n, &n);
  EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kTagBytes, out + kNonceBytes + kPayloadBytes);
  EVP_CIPHER_CTX_free(ctx);
  return Hex(out, sizeof(out));
}

std::optional<std::pair<int64_t, int64_t>> PageTokenCodec::Decode(const std::string& token,
                                                                  const std::string& tenant) const {
  unsigned char in[kNonceBytes + kPayloadBytes + kTagBytes];
  if (token.size() != sizeof(in) * 2) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < sizeof(in); ++i) {
    const int hi = nibble(token[2 * i]), lo = nibble(token[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    in[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  unsigned char plain[kPayloadBytes];
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  int n = 0;
  bool ok =
      EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr,
                         reinterpret_cast<const unsigned char*>(key_.data()), in) == 1 &&
      EVP_DecryptUpdate(ctx, nullptr, &n, reinterpret_cast<const unsigned char*>(tenant.data()),
                        static_cast<int>(tenant.size())) == 1 &&
      EVP_DecryptUpdate(ctx, plain, &n, in + kNonceBytes, kPayloadBytes) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kTagBytes, in + kNonceBytes + kPayloadBytes) ==
          1 &&
      EVP_DecryptFinal_ex(ctx, plain + n, &n) == 1;
  EVP_CIPHER_CTX_free(ctx);
  if (!ok) return std::nullopt;
  uint64_t created_at = 0, seq = 0;
  for (int i = 0; i < 8; ++i) {
    created_at = created_at << 8 | plain[i];
    seq = seq << 8 | plain[8 + i];
  }
  if (static_cast<int64_t>(seq) < 1) return std::nullopt;
  return std::make_pair(static_cast<int64_t>(created_at), static_cast<int64_t>(seq));
}

}  // namespace moebatch
