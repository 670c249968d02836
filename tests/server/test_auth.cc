// Bearer tokens and tenants (server/auth.h): SHA-256 against known vectors, the tokens file's
// rules (each malformed entry named), authentication of metadata values, and reload keeping the
// old table when the new file is bad.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "server/auth.h"

namespace moebatch {
namespace {

namespace fs = std::filesystem;

// FIPS 180-2 / NIST test vectors.
TEST_CASE("Sha256Hex matches the standard test vectors", "[auth]") {
  CHECK(Sha256Hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(Sha256Hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST_CASE("tenant names", "[auth]") {
  CHECK(IsValidTenantName("team-a"));
  CHECK(IsValidTenantName("ops.on_call-2"));
  CHECK_FALSE(IsValidTenantName(""));
  CHECK_FALSE(IsValidTenantName("a b"));
  CHECK_FALSE(IsValidTenantName("a/b"));
  CHECK_FALSE(IsValidTenantName(std::string(65, 'a')));
  CHECK(IsValidTenantName(std::string(64, 'a')));
}

std::string Entry(const std::string& token, const std::string& tenant, const std::string& role) {
  return "{\"sha256\": \"" + Sha256Hex(token) + "\", \"tenant\": \"" + tenant + "\", \"role\": \"" +
         role + "\"}";
}

TEST_CASE("ParseTokensJson accepts a good file and names each bad entry", "[auth]") {
  const std::string good = "{\"tokens\": [" + Entry("tok-a", "team-a", "user") + ", " +
                           Entry("tok-admin", "ops", "admin") + "]}";
  auto table = ParseTokensJson(good, "t.json");
  REQUIRE(table.ok());
  REQUIRE(table->size() == 2);
  CHECK(table->at(Sha256Hex("tok-a")).tenant == "team-a");
  CHECK_FALSE(table->at(Sha256Hex("tok-a")).admin);
  CHECK(table->at(Sha256Hex("tok-admin")).admin);

  struct Bad {
    std::string text;
    std::string says;
  };
  const std::string digest = Sha256Hex("x");
  const Bad bad[] = {
      {"not json", "not valid JSON"},
      {"[]", "\"tokens\" array"},
      {"{\"tokens\": {}}", "\"tokens\" array"},
      {"{\"tokens\": [1]}", "tokens[0].: not an object"},
      {"{\"tokens\": [{\"tenant\": \"a\"}]}", "tokens[0].sha256: required"},
      {"{\"tokens\": [{\"sha256\": \"abc\", \"tenant\": \"a\"}]}", "tokens[0].sha256: must be 64"},
      {"{\"tokens\": [{\"sha256\": \"" + std::string(64, 'g') + "\", \"tenant\": \"a\"}]}",
       "must be 64 hex"},
      {"{\"tokens\": [{\"sha256\": \"" + digest + "\"}]}", "tokens[0].tenant: required"},
      {"{\"tokens\": [{\"sha256\": \"" + digest + "\", \"tenant\": \"a b\"}]}", "tokens[0].tenant"},
      {"{\"tokens\": [{\"sha256\": \"" + digest + "\", \"tenant\": \"a\", \"role\": \"root\"}]}",
       "tokens[0].role"},
      {"{\"tokens\": [" + Entry("x", "a", "user") + ", " + Entry("x", "b", "user") + "]}",
       "tokens[1].sha256: listed twice"},
  };
  for (const Bad& b : bad) {
    auto parsed = ParseTokensJson(b.text, "t.json");
    INFO(b.text << " -> " << parsed.status().ToString());
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(parsed.status().message(), b.says));
    CHECK(absl::StrContains(parsed.status().message(), "t.json"));
  }
  // Upper-case digests are accepted; a missing role means user.
  std::string upper = Sha256Hex("up");
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto parsed =
      ParseTokensJson("{\"tokens\": [{\"sha256\": \"" + upper + "\", \"tenant\": \"u\"}]}", "t");
  REQUIRE(parsed.ok());
  CHECK_FALSE(parsed->at(Sha256Hex("up")).admin);
}

class TokensFile {
 public:
  TokensFile()
      : path_(fs::temp_directory_path() /
              ("moebatch_tokens_" + std::to_string(::getpid()) + ".json")) {}
  ~TokensFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  void Write(const std::string& text) { std::ofstream(path_, std::ios::trunc) << text; }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

TEST_CASE("TokenAuthenticator authenticates bearer metadata and reloads", "[auth]") {
  TokensFile file;
  file.Write("{\"tokens\": [" + Entry("secret-a", "team-a", "user") + "]}");
  auto auth = TokenAuthenticator::Load(file.path());
  REQUIRE(auth.ok());
  CHECK((*auth)->size() == 1);

  auto a = (*auth)->Authenticate("Bearer secret-a");
  REQUIRE(a.ok());
  CHECK(a->tenant == "team-a");
  CHECK_FALSE(a->admin);
  CHECK((*auth)->Authenticate("bearer   secret-a ").ok());  // scheme case, spaces

  for (const char* value : {"", "secret-a", "Basic c2VjcmV0", "Bearer ", "Bearer secret-b"}) {
    auto refused = (*auth)->Authenticate(value);
    INFO(value);
    CHECK(refused.status().code() == absl::StatusCode::kUnauthenticated);
    CHECK_FALSE(absl::StrContains(refused.status().message(), "secret"));
  }

  // Reload: a new token works, the removed one stops working.
  file.Write("{\"tokens\": [" + Entry("secret-b", "team-b", "admin") + "]}");
  REQUIRE((*auth)->Reload().ok());
  CHECK((*auth)->Authenticate("Bearer secret-a").status().code() ==
        absl::StatusCode::kUnauthenticated);
  auto b = (*auth)->Authenticate("Bearer secret-b");
  REQUIRE(b.ok());
  CHECK(b->admin);

  // A bad file is refused and the loaded tokens stay.
  file.Write("{\"tokens\": [{\"sha256\": \"nope\"}]}");
  CHECK((*auth)->Reload().code() == absl::StatusCode::kInvalidArgument);
  CHECK((*auth)->Authenticate("Bearer secret-b").ok());

  CHECK(TokenAuthenticator::Load(file.path() + ".missing").status().code() ==
        absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace moebatch
