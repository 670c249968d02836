// moebatch-token: makes a bearer token for moebatchd and its tokens-file entry (server/auth.h).
//
//   moebatch-token --tenant team-a [--role admin] [--tokens_file /etc/moebatch/tokens.json]
//       Draws a random token (256 bits from OpenSSL's RAND_bytes), prints it once on stdout, and
//       adds its SHA-256 entry to --tokens_file (created with mode 0600 when missing; written to
//       a temporary file and renamed, so moebatchd never reads half a file). Without
//       --tokens_file it prints the entry to add on stderr. Send SIGHUP to moebatchd to load it.
//   moebatch-token --hash < token.txt
//       Prints the SHA-256 hex of the token read from stdin (surrounding whitespace removed).
//
// Exit codes: 0 done, 1 file error, 2 usage error.
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "engine/tools/program_flags.h"
#include "nlohmann/json.hpp"
#include "server/auth.h"

ABSL_FLAG(std::string, tenant, "", "tenant the new token acts for ([A-Za-z0-9._-], 1-64 chars)");
ABSL_FLAG(std::string, role, "user", "user (own jobs only) or admin (every tenant's jobs)");
ABSL_FLAG(std::string, tokens_file, "", "tokens file to add the entry to (JSON; see auth.h)");
ABSL_FLAG(std::string, comment, "", "free text stored with the entry (who, what for)");
ABSL_FLAG(bool, hash, false, "print the SHA-256 of a token read from stdin and exit");

namespace {

int Fail(int code, const std::string& message) {
  std::cerr << "moebatch-token: " << message << "\n";
  return code;
}

std::string Trim(std::string s) {
  const auto space = " \t\r\n";
  s.erase(0, s.find_first_not_of(space));
  s.erase(s.find_last_not_of(space) + 1);
  return s;
}

// "mbt_" + 64 hex characters of RAND_bytes.
bool NewToken(std::string* token) {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) return false;
  static constexpr char kHex[] = "0123456789abcdef";
  *token = "mbt_";
  for (unsigned char b : bytes) {
    *token += kHex[b >> 4];
    *token += kHex[b & 0xf];
  }
  return true;
}

int AddEntry(const std::string& path, const nlohmann::json& entry) {
  nlohmann::json doc = {{"tokens", nlohmann::json::array()}};
  if (std::filesystem::exists(path)) {
    // Check the file as moebatchd would before touching it.
    if (auto parsed = moebatch::ParseTokensFile(path); !parsed.ok()) {
      return Fail(1, std::string(parsed.status().message()));
    }
    std::ifstream in(path);
    doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  doc["tokens"].push_back(entry);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return Fail(1, "cannot write " + tmp);
    out << doc.dump(2) << "\n";
    if (!out.flush()) return Fail(1, "cannot write " + tmp);
  }
  struct stat st {};
  const mode_t mode = ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0600;
  ::chmod(tmp.c_str(), mode);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Fail(1, "cannot replace " + path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  moebatch::ParseProgramFlags(
      argc, argv,
      "moebatch-token --tenant NAME [--role user|admin] [--tokens_file FILE] | --hash < token");
  if (absl::GetFlag(FLAGS_hash)) {
    std::string token((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    token = Trim(token);
    if (token.empty()) return Fail(2, "--hash: no token on stdin");
    std::cout << moebatch::Sha256Hex(token) << "\n";
    return 0;
  }
  const std::string tenant = absl::GetFlag(FLAGS_tenant);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (!moebatch::IsValidTenantName(tenant)) {
    return Fail(2, "--tenant: required, 1-64 characters of [A-Za-z0-9._-]");
  }
  if (role != "user" && role != "admin") return Fail(2, "--role: must be user or admin");
  std::string token;
  if (!NewToken(&token)) return Fail(1, "RAND_bytes failed");
  nlohmann::json entry = {
      {"sha256", moebatch::Sha256Hex(token)}, {"tenant", tenant}, {"role", role}};
  if (!absl::GetFlag(FLAGS_comment).empty()) entry["comment"] = absl::GetFlag(FLAGS_comment);
  const std::string path = absl::GetFlag(FLAGS_tokens_file);
  if (path.empty()) {
    std::cerr << "add to the \"tokens\" array of the tokens file:\n" << entry.dump() << "\n";
  } else if (int rc = AddEntry(path, entry); rc != 0) {
    return rc;
  } else {
    std::cerr << "added tenant '" << tenant << "' (" << role << ") to " << path
              << "; send SIGHUP to moebatchd to load it\n";
  }
  std::cout << token << "\n";
  return 0;
}
