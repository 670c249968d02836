// Bearer-token authentication and tenancy for moebatchd.
//
// Callers send `authorization: Bearer <token>` in gRPC metadata. The daemon never stores tokens:
// the tokens file lists their SHA-256 digests (lower-case hex), each mapped to a tenant and a role:
//
//   {"tokens": [
//     {"sha256": "9f86d0...", "tenant": "team-a", "role": "user", "comment": "nightly evals"},
//     {"sha256": "2c26b4...", "tenant": "ops", "role": "admin"}]}
//
// A tenant sees, lists, watches and cancels only its own jobs (others' are NOT_FOUND, exactly as
// an unknown id, so nothing leaks); an admin sees every tenant's jobs. `moebatch-token` makes a
// token and its entry (server/moebatch_token_main.cc). Tenant names: 1-64 characters of
// [A-Za-z0-9._-].
//
// Without a tokens file authentication is off: every caller is the admin principal "local", and
// moebatchd refuses to listen on anything but loopback (moebatchd_main.cc).
//
// Threading: TokenAuthenticator is safe from any thread; Reload (SIGHUP) swaps the table
// atomically, so a call sees either the old or the new one. A failed reload keeps the old table.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace moebatch {

struct Principal {
  std::string tenant;  // owner of the jobs this caller creates
  bool admin = false;  // sees and cancels every tenant's jobs
};

// The principal of every caller when authentication is off.
Principal LocalPrincipal();

// SHA-256 of `data` as 64 lower-case hex characters (OpenSSL's EVP interface).
std::string Sha256Hex(std::string_view data);

// Whether `tenant` is a valid tenant name (1-64 of [A-Za-z0-9._-]).
bool IsValidTenantName(std::string_view tenant);

// sha256 hex -> principal. InvalidArgument naming the entry (its 1-based position and field) for
// a malformed file: not JSON, no "tokens" array, a digest that is not 64 hex characters, a
// duplicate digest, a bad tenant, a role other than "user" / "admin". NotFound when unreadable.
absl::StatusOr<std::map<std::string, Principal>> ParseTokensFile(const std::string& path);
absl::StatusOr<std::map<std::string, Principal>> ParseTokensJson(std::string_view text,
                                                                 const std::string& path);

class TokenAuthenticator {
 public:
  // Reads the tokens file; the error of ParseTokensFile when it is bad.
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> Load(const std::string& path);

  // Reads the file again; on error keeps the current table and returns the error.
  absl::Status Reload();

  // `authorization` is the metadata value ("Bearer <token>"; the scheme is case-insensitive).
  // Unauthenticated when it is missing, malformed or unknown (the message says which, never the
  // token).
  absl::StatusOr<Principal> Authenticate(std::string_view authorization) const;

  size_t size() const;
  const std::string& path() const { return path_; }

 private:
  explicit TokenAuthenticator(std::string path) : path_(std::move(path)) {}
  const std::string path_;
  mutable absl::Mutex mu_;
  std::map<std::string, Principal> by_digest_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moebatch
