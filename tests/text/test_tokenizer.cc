// Tokenizer tests against references from Python (tests/fixtures/tokenizer_cases.jsonl, written by
// tests/fixtures/make_tokenizer_cases.py: sentencepiece encodings and decodes, mistral-common v1
// chat tokenizations) and the streaming detokenizer against Tokenizer::Decode.
//
// The tokenizer is the real Mixtral-8x7B tokenizer.model, which is third-party data and not in git:
// scripts/fetch_tokenizer.sh puts it into tests/fixtures/tiny-mixtral/tokenizer.model. To use a
// copy elsewhere, set MOEBATCH_TOKENIZER, e.g.
//   MOEBATCH_TOKENIZER=.deps/tokenizers/mixtral-8x7b.tokenizer.model.v1 build/tests/test_tokenizer

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/text/tokenizer.h"

namespace moebatch {
namespace {

using json = nlohmann::json;

constexpr int32_t kBos = 1;
constexpr int32_t kEos = 2;
constexpr int32_t kByte0 = 3;  // <0x00>; <0xFF> is 258

std::string TokenizerPath() {
  const char* env = std::getenv("MOEBATCH_TOKENIZER");
  if (env != nullptr && *env != '\0') return env;
  return std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral/tokenizer.model";
}

// The Mixtral tokenizer, loaded once; fails the calling test when it is not there.
const Tokenizer& Tok() {
  static const absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Load(TokenizerPath(), kBos, kEos);
  if (!tok.ok()) {
    FAIL("cannot load the Mixtral tokenizer (" << tok.status().ToString()
                                               << "); run scripts/fetch_tokenizer.sh, or set "
                                                  "MOEBATCH_TOKENIZER to a tokenizer.model");
  }
  return **tok;
}

// The cases of one kind in a cases file under tests/fixtures (default: the Mixtral-8x7B ones).
const std::vector<json>& Cases(const std::string& kind,
                               const std::string& file = "tokenizer_cases.jsonl") {
  static std::map<std::string, std::map<std::string, std::vector<json>>> by_file;
  auto [at, inserted] = by_file.try_emplace(file);
  if (inserted) {
    std::ifstream in(std::string(MOEBATCH_FIXTURES_DIR) + "/" + file);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      json j = json::parse(line);
      at->second[j.at("kind").get<std::string>()].push_back(std::move(j));
    }
  }
  static const std::vector<json> none;
  auto it = at->second.find(kind);
  return it == at->second.end() ? none : it->second;
}

bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80                 ? 1
                 : c >= 0xC2 && c <= 0xDF ? 2
                 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4
                                          : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char t = static_cast<unsigned char>(s[i + k]);
      if ((t & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (t & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

std::string Show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

// Streams `ids` through a StreamingDetokenizer and checks it against Decode after every id.
// Returns an empty string when every check holds, else what went wrong.
std::string CheckStreaming(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  const std::string expected = tok.Decode(ids);
  StreamingDetokenizer detok(tok);
  std::string concat;
  std::vector<int32_t> prefix;
  for (int32_t id : ids) {
    prefix.push_back(id);
    const std::string delta = detok.Add(id);
    concat += delta;
    if (!IsValidUtf8(delta)) return "a released delta is not valid UTF-8";
    if (concat != detok.text()) return "text() is not the concatenation of the deltas";
    if (expected.compare(0, concat.size(), concat) != 0) {
      return "released text \"" + concat + "\" is not a prefix of Decode(all) \"" + expected + "\"";
    }
    // Nothing but an unfinished character (at most 3 byte pieces, each U+FFFD when decoded at the
    // end) may be held back.
    const std::string now = tok.Decode(prefix);
    if (now.compare(0, concat.size(), concat) != 0)
      return "released text is not a prefix of Decode(prefix)";
    const std::string held = now.substr(concat.size());
    size_t fffd = 0;
    for (size_t i = 0; i < held.size(); i += 3, ++fffd) {
      if (held.compare(i, 3, "\xEF\xBF\xBD") != 0) {
        return "held back more than an unfinished character after " +
               std::to_string(prefix.size()) + " ids: \"" + held + "\"";
      }
    }
    if (fffd > 3) return "held back more than 3 bytes";
    if (!(id >= kByte0 && id <= kByte0 + 255) && !held.empty()) {
      return "held back text after a non-byte id";
    }
  }
  const std::string tail = detok.Finish();
  concat += tail;
  if (!IsValidUtf8(tail)) return "Finish() is not valid UTF-8";
  if (concat != expected || detok.text() != expected) {
    return "streamed \"" + concat + "\" != Decode \"" + expected + "\"";
  }
  if (detok.ids() != ids) return "ids() differs";
  return "";
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("moebatch_test_tokenizer_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

TEST_CASE("fixture cases were generated for this tokenizer") {
  const Tokenizer& tok = Tok();
  REQUIRE(Cases("meta").size() == 1);
  const json& meta = Cases("meta")[0];
  CHECK(meta.at("vocab_size").get<int32_t>() == tok.vocab_size());
  CHECK(meta.at("bos_id").get<int32_t>() == kBos);
  CHECK(meta.at("eos_id").get<int32_t>() == kEos);
  CHECK(Cases("encode").size() >= 40);
  CHECK(Cases("chat").size() >= 8);
  CHECK(Cases("decode").size() >= 300);
}

TEST_CASE("Load: a missing file is NotFound") {
  const std::string path = TempPath("does_not_exist.model");
  auto tok = Tokenizer::Load(path, kBos, kEos);
  REQUIRE_FALSE(tok.ok());
  CHECK(tok.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(tok.status().message()), Catch::Contains("missing tokenizer: " + path));
}

TEST_CASE("Load: a file that is not a sentencepiece model is InvalidArgument") {
  std::mt19937 rng(7);
  std::string random_bytes(4096, '\0');
  for (char& c : random_bytes) c = static_cast<char>(rng());
  const std::vector<std::pair<std::string, std::string>> files = {
      {"text.model", "this is not a sentencepiece model\n"},
      {"empty.model", ""},
      {"random.model", random_bytes},
      {"json.model", R"({"model": {"type": "BPE", "vocab": {}}})"},
  };
  for (const auto& [name, contents] : files) {
    SECTION(name) {
      const std::string path = TempPath(name);
      {
        std::ofstream out(path, std::ios::binary);
        out << contents;
      }
      auto tok = Tokenizer::Load(path, kBos, kEos);
      std::remove(path.c_str());
      REQUIRE_FALSE(tok.ok());
      CHECK(tok.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(tok.status().message()), Catch::Contains(path));
    }
  }
  SECTION("a directory") {
    auto tok = Tokenizer::Load(MOEBATCH_FIXTURES_DIR, kBos, kEos);
    REQUIRE_FALSE(tok.ok());
    CHECK(tok.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("Load: BOS/EOS ids outside the vocabulary are InvalidArgument") {
  const int32_t n = Tok().vocab_size();
  for (const auto& [bos, eos] :
       std::vector<std::pair<int32_t, int32_t>>{{-1, kEos}, {n, kEos}, {kBos, n}, {kBos, -5}}) {
    auto tok = Tokenizer::Load(TokenizerPath(), bos, eos);
    REQUIRE_FALSE(tok.ok());
    CHECK(tok.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(tok.status().message()), Catch::Contains("outside the vocabulary"));
  }
  auto ok = Tokenizer::Load(TokenizerPath(), kBos, kEos);
  REQUIRE(ok.ok());
  CHECK((*ok)->vocab_size() == 32000);
  CHECK((*ok)->bos_id() == kBos);
  CHECK((*ok)->eos_id() == kEos);
}

TEST_CASE("Encode matches sentencepiece") {
  const Tokenizer& tok = Tok();
  for (const json& c : Cases("encode")) {
    INFO("case " << c.at("name").get<std::string>());
    const auto expected = c.at("ids").get<std::vector<int32_t>>();
    CHECK(Show(tok.Encode(c.at("text").get<std::string>(), c.at("add_bos").get<bool>())) ==
          Show(expected));
  }
}

TEST_CASE("Encode takes bytes that are not UTF-8 without failing") {
  const Tokenizer& tok = Tok();
  const std::vector<int32_t> ids = tok.Encode("ok \xFF\xC3 end", false);
  CHECK_FALSE(ids.empty());
  CHECK(IsValidUtf8(tok.Decode(ids)));
  CHECK(CheckStreaming(tok, ids) == "");
}

std::vector<ChatMessage> Messages(const json& chat_case) {
  std::vector<ChatMessage> messages;
  for (const json& m : chat_case.at("messages")) {
    messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
  }
  return messages;
}

// Every "chat" case of `file` through tok.EncodeChat.
void CheckChatCases(const Tokenizer& tok, const std::string& file) {
  for (const json& c : Cases("chat", file)) {
    INFO(file << " case " << c.at("name").get<std::string>());
    auto ids = tok.EncodeChat(Messages(c));
    REQUIRE(ids.ok());
    CHECK(Show(*ids) == Show(c.at("ids").get<std::vector<int32_t>>()));
  }
}

TEST_CASE("EncodeChat matches mistral-common's v1 instruct tokenizer") {
  CHECK(Tok().chat_format() == ChatFormat::kMistralV1);
  CheckChatCases(Tok(), "tokenizer_cases.jsonl");
}

TEST_CASE("EncodeChat builds the Mixtral-Instruct layout") {
  const Tokenizer& tok = Tok();
  auto ids = tok.EncodeChat({{"system", "S"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}});
  REQUIRE(ids.ok());
  std::vector<int32_t> expected = {kBos};
  for (const std::vector<int32_t>& part :
       {tok.Encode("[INST] S\n\na [/INST]", false), tok.Encode("b", false),
        std::vector<int32_t>{kEos}, tok.Encode("[INST] c [/INST]", false)}) {
    expected.insert(expected.end(), part.begin(), part.end());
  }
  CHECK(Show(*ids) == Show(expected));
}

TEST_CASE("EncodeChat rejects malformed conversations, naming the message") {
  const Tokenizer& tok = Tok();
  struct Bad {
    const char* what;
    std::vector<ChatMessage> messages;
    const char* message;
  };
  const std::vector<Bad> bad = {
      {"empty list", {}, "messages[0]: missing"},
      {"system only", {{"system", "S"}}, "messages[1]: missing"},
      {"two users",
       {{"user", "a"}, {"user", "b"}},
       "messages[1].role: expected 'assistant', found 'user'"},
      {"starts with assistant",
       {{"assistant", "a"}, {"user", "b"}},
       "messages[0].role: expected 'user', found 'assistant'"},
      {"system then assistant",
       {{"system", "S"}, {"assistant", "a"}, {"user", "b"}},
       "messages[1].role: expected 'user', found 'assistant'"},
      {"two assistants",
       {{"user", "a"}, {"assistant", "b"}, {"assistant", "c"}, {"user", "d"}},
       "messages[2].role: expected 'user', found 'assistant'"},
      {"ends with assistant",
       {{"user", "a"}, {"assistant", "b"}},
       "messages[1].role: the conversation must end with a 'user' message"},
      {"unknown role",
       {{"user", "a"}, {"tool", "b"}, {"user", "c"}},
       "messages[1].role: unknown role 'tool'"},
      {"role names are case-sensitive", {{"User", "a"}}, "messages[0].role: unknown role 'User'"},
      {"late system message",
       {{"user", "a"}, {"assistant", "b"}, {"system", "S"}, {"user", "c"}},
       "messages[2].role: expected 'user', found 'system' (a system message may only be "
       "messages[0])"},
      {"two system messages",
       {{"system", "S1"}, {"system", "S2"}, {"user", "c"}},
       "messages[1].role: expected 'user', found 'system'"},
      {"empty assistant",
       {{"user", "a"}, {"assistant", ""}, {"user", "c"}},
       "messages[1].content: an assistant message must not be empty"},
      {"invalid UTF-8",
       {{"user", "ok"}, {"assistant", "fine"}, {"user", "bad \xC3\x28"}},
       "messages[2].content: not valid UTF-8 (byte 4)"},
      {"invalid UTF-8 in system",
       {{"system", "\xFF"}, {"user", "a"}},
       "messages[0].content: not valid UTF-8"},
  };
  for (const Bad& b : bad) {
    INFO(b.what);
    auto ids = tok.EncodeChat(b.messages);
    REQUIRE_FALSE(ids.ok());
    CHECK(ids.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(ids.status().message()), Catch::StartsWith(b.message));
  }
}

TEST_CASE("Decode matches sentencepiece") {
  const Tokenizer& tok = Tok();
  for (const json& c : Cases("decode")) {
    INFO("case " << c.at("name").get<std::string>());
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    CHECK(tok.Decode(ids) == c.at("text").get<std::string>());
  }
}

TEST_CASE("Decode treats ids outside the vocabulary as <unk>") {
  const Tokenizer& tok = Tok();
  const int32_t hello = tok.Encode("Hello", false).at(0);
  CHECK(tok.Decode({hello, 0, hello}) == "Hello \xE2\x81\x87  Hello");
  CHECK(tok.Decode({hello, 32000, hello}) == tok.Decode({hello, 0, hello}));
  CHECK(tok.Decode({-1, hello}) == tok.Decode({0, hello}));
  CHECK(CheckStreaming(tok, {hello, 32000, kByte0 + 0xE3, -7, kByte0 + 0x81, 1 << 30}).empty());
}

TEST_CASE("StreamingDetokenizer equals Decode on every fixture id list") {
  const Tokenizer& tok = Tok();
  for (const char* kind : {"decode", "encode", "chat"}) {
    for (const json& c : Cases(kind)) {
      const auto ids = c.at("ids").get<std::vector<int32_t>>();
      INFO(kind << " case " << c.at("name").get<std::string>() << ": " << Show(ids));
      CHECK(CheckStreaming(tok, ids) == "");
    }
  }
}

TEST_CASE("StreamingDetokenizer releases characters as soon as they are complete") {
  const Tokenizer& tok = Tok();
  const int32_t hello = tok.Encode("Hello", false).at(0);
  StreamingDetokenizer d(tok);
  CHECK(d.Add(kBos) == "");
  CHECK(d.Add(hello) == "Hello");     // first piece: its space is dropped
  CHECK(d.Add(kByte0 + 0xE3) == "");  // あ = E3 81 82
  CHECK(d.Add(kByte0 + 0x81) == "");
  CHECK(d.Add(kByte0 + 0x82) == "\xE3\x81\x82");
  CHECK(d.Add(hello) == " Hello");       // later pieces keep theirs
  CHECK(d.Add(kByte0 + 0xF0) == "");     // an unfinished 4-byte character at the end
  CHECK(d.Add(kEos) == "\xEF\xBF\xBD");  // EOS ends the byte run: U+FFFD
  CHECK(d.Add(kByte0 + 0xE3) == "");
  CHECK(d.Finish() == "\xEF\xBF\xBD");
  CHECK(d.text() == tok.Decode(d.ids()));

  StreamingDetokenizer first_byte(tok);  // a sequence that starts with byte pieces
  CHECK(first_byte.Add(kByte0 + 0xC3) == "");
  CHECK(first_byte.Add(kByte0 + 0xA9) == "\xC3\xA9");
  CHECK(first_byte.Add(hello) == " Hello");  // a byte piece came first, so the space stays
  CHECK(first_byte.Finish() == "");
}

TEST_CASE("StreamingDetokenizer equals Decode on random id sequences") {
  const Tokenizer& tok = Tok();
  const int32_t vocab = tok.vocab_size();
  const int32_t space = tok.Encode(" ", false).at(0);        // "▁▁"
  const int32_t lone_space = tok.Encode("\n", false).at(0);  // "▁"
  std::mt19937 rng(12345);
  auto pick = [&](int32_t lo, int32_t hi) {  // uniform in [lo, hi]
    return lo + static_cast<int32_t>(rng() % static_cast<uint32_t>(hi - lo + 1));
  };
  int checked = 0;
  for (int seq = 0; seq < 5000; ++seq) {
    std::vector<int32_t> ids(static_cast<size_t>(pick(1, 40)));
    for (int32_t& id : ids) {
      const int32_t r = pick(0, 99);
      if (r < 25) {
        id = kByte0 + pick(0, 255);  // any byte
      } else if (r < 40) {
        id = kByte0 + pick(0x80, 0xBF);  // continuation bytes
      } else if (r < 55) {
        id = kByte0 + pick(0xC0, 0xF7);  // lead bytes
      } else if (r < 62) {
        id = pick(0, 2);  // <unk>, <s>, </s>
      } else if (r < 70) {
        id = r % 2 ? space : lone_space;
      } else if (r < 71) {
        id = r % 2 ? vocab + pick(0, 100) : -1;  // outside the vocabulary
      } else {
        id = pick(259, vocab - 1);  // ordinary pieces
      }
    }
    const std::string problem = CheckStreaming(tok, ids);
    if (!problem.empty()) FAIL("sequence " << seq << " " << Show(ids) << ": " << problem);
    ++checked;
  }
  CHECK(checked == 5000);
}

TEST_CASE("StreamingDetokenizer does constant work per id on long sequences") {
  // Re-decoding the whole sequence per id would take minutes here; the window decode takes well
  // under a second.
  const Tokenizer& tok = Tok();
  std::mt19937 rng(99);
  std::vector<int32_t> ids;
  ids.reserve(100000);
  for (int i = 0; i < 100000; ++i) {
    ids.push_back(i % 7 == 0 ? kByte0 + static_cast<int32_t>(rng() % 256)
                             : 259 + static_cast<int32_t>(rng() % (32000 - 259)));
  }
  StreamingDetokenizer d(tok);
  std::string text;
  for (int32_t id : ids) text += d.Add(id);
  text += d.Finish();
  CHECK(text == tok.Decode(ids));
  CHECK(IsValidUtf8(text));
}

// Mixtral-8x22B-Instruct-v0.1's tokenizer (32,768 pieces, [INST]/[/INST] control pieces) and
// mistral-common's v7 vocabulary ([SYSTEM_PROMPT] too), fetched by scripts/fetch_tokenizer.sh into
// tests/fixtures/mistral-v3/ and mistral-v7/ beside their cases (make_tokenizer_cases.py).
std::unique_ptr<Tokenizer> LoadFixtureTokenizer(const std::string& dir) {
  auto tok = Tokenizer::Load(std::string(MOEBATCH_FIXTURES_DIR) + "/" + dir + "/tokenizer.model",
                             kBos, kEos);
  INFO(tok.status().ToString() << " (run scripts/fetch_tokenizer.sh)");
  REQUIRE(tok.ok());
  return *std::move(tok);
}

TEST_CASE("the Mixtral-8x22B-Instruct tokenizer: mistral-common's v3 layout, encode and decode") {
  const auto tok = LoadFixtureTokenizer("mistral-v3");
  const std::string file = "mistral-v3/tokenizer_cases.jsonl";
  REQUIRE(Cases("meta", file).size() == 1);
  const json& meta = Cases("meta", file)[0];
  CHECK(meta.at("vocab_size").get<int32_t>() == tok->vocab_size());
  CHECK(tok->vocab_size() == 32768);
  CHECK(meta.at("instruct_tokenizer").get<std::string>() == "InstructTokenizerV3");
  CHECK(tok->chat_format() == ChatFormat::kMistralV3);
  REQUIRE(Cases("chat", file).size() >= 8);
  CheckChatCases(*tok, file);
  REQUIRE(Cases("encode", file).size() >= 40);
  for (const json& c : Cases("encode", file)) {
    INFO("case " << c.at("name").get<std::string>());
    CHECK(Show(tok->Encode(c.at("text").get<std::string>(), false)) ==
          Show(c.at("ids").get<std::vector<int32_t>>()));
  }
  REQUIRE(Cases("decode", file).size() >= 4);
  for (const json& c : Cases("decode", file)) {
    INFO("case " << c.at("name").get<std::string>());
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    CHECK(tok->Decode(ids) == c.at("text").get<std::string>());
    CHECK(CheckStreaming(*tok, ids) == "");
  }
  // The layout, spelled out: control ids around each user turn, the system prompt on the last.
  const int32_t inst = meta.at("inst_id").get<int32_t>(),
                end = meta.at("end_inst_id").get<int32_t>();
  auto ids = tok->EncodeChat({{"system", "S"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}});
  REQUIRE(ids.ok());
  std::vector<int32_t> expected = {kBos, inst};
  for (const std::vector<int32_t>& part : {tok->Encode("a", false),
                                           {end},
                                           tok->Encode("b", false),
                                           {kEos, inst},
                                           tok->Encode("S\n\nc", false),
                                           {end}}) {
    expected.insert(expected.end(), part.begin(), part.end());
  }
  CHECK(Show(*ids) == Show(expected));
  // Literal "[INST]" text in a message stays text.
  auto literal = tok->EncodeChat({{"user", "[INST]"}});
  REQUIRE(literal.ok());
  CHECK(std::count(literal->begin(), literal->end(), inst) == 1);
}

TEST_CASE("a v7 vocabulary: user/assistant turns as mistral-common's, system messages refused") {
  const auto tok = LoadFixtureTokenizer("mistral-v7");
  const std::string file = "mistral-v7/tokenizer_cases.jsonl";
  REQUIRE(Cases("meta", file).size() == 1);
  CHECK(Cases("meta", file)[0].at("instruct_tokenizer").get<std::string>() ==
        "InstructTokenizerV7");
  CHECK(tok->chat_format() == ChatFormat::kMistralV3);
  REQUIRE(Cases("chat", file).size() >= 4);
  CheckChatCases(*tok, file);
  for (const char* system : {"Be brief.", ""}) {
    auto refused = tok->EncodeChat({{"system", system}, {"user", "Hi"}});
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(refused.status().message()),
               Catch::StartsWith("messages[0].role") && Catch::Contains("SYSTEM_PROMPT"));
  }
}

}  // namespace
}  // namespace moebatch
