#include "server/auth.h"

#include <openssl/evp.h>

#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace moebatch {

Principal LocalPrincipal() { return Principal{"local", /*admin=*/true}; }

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  // EVP_Digest fails only on allocation failure inside OpenSSL; an empty digest then matches
  // no entry, so the caller is refused rather than let in.
  if (EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr) != 1) return "";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * size);
  for (unsigned int i = 0; i < size; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 0xf];
  }
  return hex;
}

bool IsValidTenantName(std::string_view tenant) {
  if (tenant.empty() || tenant.size() > 64) return false;
  for (char c : tenant) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::map<std::string, Principal>> ParseTokensJson(std::string_view text,
                                                                 const std::string& path) {
  using Json = nlohmann::json;
  const Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("tokens file ", path, ": not valid JSON"));
  }
  if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens file ", path, ": expected an object with a \"tokens\" array"));
  }
  std::map<std::string, Principal> table;
  size_t n = 0;
  for (const Json& entry : j["tokens"]) {
    ++n;
    auto bad = [&](const std::string& field, const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens file ", path, ": tokens[", n - 1, "].", field, ": ", why));
    };
    if (!entry.is_object()) return bad("", "not an object");
    if (!entry.contains("sha256") || !entry["sha256"].is_string()) {
      return bad("sha256", "required (the token's SHA-256 in hex; see moebatch-token)");
    }
    std::string digest = entry["sha256"].get<std::string>();
    for (char& c : digest) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (digest.size() != 64 || digest.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return bad("sha256", "must be 64 hex characters");
    }
    if (!entry.contains("tenant") || !entry["tenant"].is_string() ||
        !IsValidTenantName(entry["tenant"].get<std::string>())) {
      return bad("tenant", "required, 1-64 characters of [A-Za-z0-9._-]");
    }
    Principal p;
    p.tenant = entry["tenant"].get<std::string>();
    if (entry.contains("role")) {
      const Json& role = entry["role"];
      if (!role.is_string() || (role != "user" && role != "admin")) {
        return bad("role", "must be \"user\" or \"admin\"");
      }
      p.admin = role == "admin";
    }
    if (!table.emplace(digest, p).second) return bad("sha256", "listed twice");
  }
  return table;
}

absl::StatusOr<std::map<std::string, Principal>> ParseTokensFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("tokens file ", path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseTokensJson(text.str(), path);
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::Load(
    const std::string& path) {
  std::unique_ptr<TokenAuthenticator> auth(new TokenAuthenticator(path));
  if (absl::Status st = auth->Reload(); !st.ok()) return st;
  return auth;
}

absl::Status TokenAuthenticator::Reload() {
  auto table = ParseTokensFile(path_);
  if (!table.ok()) return table.status();
  absl::MutexLock lock(&mu_);
  by_digest_ = *std::move(table);
  return absl::OkStatus();
}

absl::StatusOr<Principal> TokenAuthenticator::Authenticate(std::string_view authorization) const {
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing credentials: send the metadata 'authorization: Bearer <token>'");
  }
  constexpr std::string_view kScheme = "bearer ";
  std::string scheme(authorization.substr(0, kScheme.size()));
  for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (scheme != kScheme) {
    return absl::UnauthenticatedError("authorization: expected 'Bearer <token>'");
  }
  std::string_view token = authorization.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  if (token.empty()) return absl::UnauthenticatedError("authorization: empty token");
  const std::string digest = Sha256Hex(token);
  absl::MutexLock lock(&mu_);
  auto it = by_digest_.find(digest);
  if (it == by_digest_.end()) return absl::UnauthenticatedError("unknown token");
  return it->second;
}

size_t TokenAuthenticator::size() const {
  absl::MutexLock lock(&mu_);
  return by_digest_.size();
}

}  // namespace moebatch
