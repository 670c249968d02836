// Tokenizer::LoadFromGguf (engine/text/gguf_tokenizer.h): the tokenizer of a GGUF file's
// tokenizer.ggml.* metadata against Hugging Face references, id for id and byte for byte, on the
// cases tests/fixtures/make_gguf_tokenizer_cases.py computed: the real SmolLM2-135M-Instruct GGUF
// (byte-level BPE, pre "smollm", its ChatML template), GGUF files converted as
// convert_hf_to_gguf.py does from the Llama 3, Qwen2 and GPT-2 tokenizer.json files and from
// Mixtral's two sentencepiece tokenizer.model files, and the other pre-tokenizer types on those
// vocabularies. Also: every supported pre name loads, and broken metadata is refused naming the
// file and the key (GGUF images built in memory here).
//
// The GGUF files and cases are third-party data, not in git: scripts/fetch_gguf_tokenizer_cases.sh
// (run by scripts/test.sh) writes them to .deps/gguf-tokenizer/ ($MOEBATCH_DEPS_DIR/gguf-tokenizer
// when that is set; MOEBATCH_GGUF_TOKENIZERS names another directory). Without them the tests
// that need them fail, saying so.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/model/gguf.h"
#include "engine/text/gguf_tokenizer.h"
#include "engine/text/text_unicode.h"
#include "engine/text/tokenizer.h"

namespace moebatch {
namespace {

using json = nlohmann::json;

constexpr char kMakeThem[] =
    "run scripts/fetch_gguf_tokenizer_cases.sh (it writes them with "
    "tests/fixtures/make_gguf_tokenizer_cases.py; scripts/test.sh runs it before ctest)";

std::string Root() {
  if (const char* env = std::getenv("MOEBATCH_GGUF_TOKENIZERS"); env != nullptr && *env != '\0') {
    return env;
  }
  if (const char* deps = std::getenv("MOEBATCH_DEPS_DIR"); deps != nullptr && *deps != '\0') {
    return std::string(deps) + "/gguf-tokenizer";
  }
  return (std::filesystem::path(MOEBATCH_FIXTURES_DIR) / ".." / ".." / ".deps" / "gguf-tokenizer")
      .lexically_normal()
      .string();
}

std::string Dir(const std::string& name) { return Root() + "/" + name; }

struct Loaded {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

// The GGUF file of one generated directory and its tokenizer, loaded once; fails the calling test
// when either cannot be loaded.
const Loaded& Load(const std::string& name) {
  static std::map<std::string, Loaded> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) {
    Loaded l;
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(Dir(name) + "/tokenizer.gguf");
    if (!file.ok())
      FAIL("cannot open " << name << ": " << file.status().ToString() << ": " << kMakeThem);
    l.file = *std::move(file);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromGguf(*l.file);
    if (!tok.ok()) FAIL("cannot load the tokenizer of " << name << ": " << tok.status().ToString());
    l.tok = *std::move(tok);
    it = loaded.emplace(name, std::move(l)).first;
  }
  return it->second;
}

struct Cases {
  json meta;
  std::vector<json> encode, decode, chat;
};

const Cases& CasesOf(const std::string& name) {
  static std::map<std::string, Cases> by_name;
  auto [it, inserted] = by_name.try_emplace(name);
  if (inserted) {
    std::ifstream in(Dir(name) + "/cases.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      json c = json::parse(line);
      const std::string kind = c.at("kind");
      if (kind == "meta")
        it->second.meta = std::move(c);
      else if (kind == "encode")
        it->second.encode.push_back(std::move(c));
      else if (kind == "decode")
        it->second.decode.push_back(std::move(c));
      else
        it->second.chat.push_back(std::move(c));
    }
  }
  if (it->second.encode.empty()) FAIL("no cases in " << Dir(name) << "/cases.jsonl: " << kMakeThem);
  return it->second;
}

std::vector<int32_t> Ids(const json& j) { return j.get<std::vector<int32_t>>(); }

std::string Show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s + "]";
}

std::vector<ChatMessage> Messages(const json& j) {
  std::vector<ChatMessage> out;
  for (const json& m : j) out.push_back({m.at("role"), m.at("content")});
  return out;
}

// Everything one tokenizer's cases check: the metadata's kind, vocabulary size, BOS/EOS and chat
// layout; every text encoded with and without special tokens; every id sequence decoded, whole
// and streamed; every chat conversation.
void CheckAgainstReference(const std::string& name) {
  const Tokenizer& tok = *Load(name).tok;
  const Cases& cases = CasesOf(name);
  const json& meta = cases.meta;
  INFO(name);
  CHECK(tok.kind() ==
        (meta.at("model") == "gpt2" ? TokenizerKind::kBpe : TokenizerKind::kSentencePiece));
  CHECK(tok.vocab_size() == meta.at("vocab_size").get<int32_t>());
  CHECK(tok.bos_id() == meta.at("bos_id").get<int32_t>());
  CHECK(tok.eos_id() == meta.at("eos_id").get<int32_t>());
  const json& layout = meta.at("chat_layout");
  CHECK(tok.chat_layout_name() == (layout.is_null() ? "none" : layout.get<std::string>()));

  size_t match = 0, other = 0;
  std::vector<std::string> failures;
  for (const json& c : cases.encode) {
    const std::string text = c.at("text");
    const std::vector<int32_t> want = Ids(c.at("ids")), want_plain = Ids(c.at("ids_plain"));
    const std::vector<int32_t> got = tok.Encode(text, /*add_bos=*/true);
    const std::vector<int32_t> got_plain = tok.Encode(text, /*add_bos=*/false);
    if (got == want && got_plain == want_plain) {
      ++match;
    } else {
      failures.push_back(json(text).dump() + ": want " + Show(want) + " got " + Show(got) +
                         " (without special tokens: want " + Show(want_plain) + " got " +
                         Show(got_plain) + ")");
    }
    if (c.contains("ids_other")) ++other;
  }
  std::printf("gguf tokenizer %s (%s, pre %s): %zu of %zu encode cases match %s\n", name.c_str(),
              meta.at("model").get<std::string>().c_str(),
              meta.at("pre").is_null() ? "-" : meta.at("pre").get<std::string>().c_str(), match,
              cases.encode.size(), meta.at("reference").get<std::string>().c_str());
  if (const auto it = meta.find("llama_cpp_differs"); it != meta.end() && !it->is_null()) {
    std::printf("  (llama.cpp's own tokenizer differs on %d of them)\n", it->get<int>());
  }
  if (!meta.at("other_reference").is_null()) {
    std::printf("  (%s differs on %zu of them%s)\n",
                meta.at("other_reference").get<std::string>().c_str(), other,
                meta.value("transformers_gguf_adds_bos", false)
                    ? "; and it adds BOS although tokenizer.ggml.add_bos_token is false"
                    : "");
  }
  for (size_t i = 0; i < failures.size() && i < 5; ++i) UNSCOPED_INFO(failures[i]);
  CHECK(match == cases.encode.size());
  CHECK(cases.encode.size() >= 800);

  size_t decoded = 0, checked = 0, bad_stream = 0;
  failures.clear();
  auto check = [&](const std::vector<int32_t>& ids, const std::string& want) {
    ++checked;
    const std::string got = tok.Decode(ids);
    if (got == want)
      ++decoded;
    else
      failures.push_back(Show(ids) + ": want " + json(want).dump() + " got " + json(got).dump());
    StreamingDetokenizer stream(tok);
    std::string all;
    for (int32_t id : ids) all += stream.Add(id);
    all += stream.Finish();
    if (all != got || !IsValidUtf8(all)) ++bad_stream;
  };
  for (const json& c : cases.encode) check(Ids(c.at("ids")), c.at("decode"));
  for (const json& c : cases.decode) check(Ids(c.at("ids")), c.at("text"));
  std::printf("gguf tokenizer %s: %zu of %zu decode cases match\n", name.c_str(), decoded, checked);
  for (size_t i = 0; i < failures.size() && i < 5; ++i) UNSCOPED_INFO(failures[i]);
  CHECK(decoded == checked);
  CHECK(bad_stream == 0);

  size_t chats = 0;
  for (const json& c : cases.chat) {
    absl::StatusOr<std::vector<int32_t>> ids = tok.EncodeChat(Messages(c.at("messages")));
    INFO(c.at("name").get<std::string>() << ": " << ids.status().ToString());
    REQUIRE(ids.ok());
    CHECK(Show(*ids) == Show(Ids(c.at("ids"))));
    if (*ids == Ids(c.at("ids"))) ++chats;
  }
  if (!cases.chat.empty()) {
    std::printf("gguf tokenizer %s: %zu of %zu chat conversations match (layout %s)\n",
                name.c_str(), chats, cases.chat.size(), tok.chat_layout_name().c_str());
  }
}

#define GGUF_REFERENCE_TEST(name, what)                                                  \
  TEST_CASE("gguf tokenizer " name " (" what "): encode, decode, chat as the reference", \
            "[gguf_tok]") {                                                              \
    CheckAgainstReference(name);                                                         \
  }

GGUF_REFERENCE_TEST("smollm2", "the real SmolLM2-135M-Instruct file")
GGUF_REFERENCE_TEST("llama3", "converted, pre llama-bpe")
GGUF_REFERENCE_TEST("qwen2", "converted, pre qwen2")
GGUF_REFERENCE_TEST("gpt2", "converted, pre gpt-2")
GGUF_REFERENCE_TEST("pre-default", "GPT-2's vocabulary")
GGUF_REFERENCE_TEST("pre-starcoder", "GPT-2's vocabulary")
GGUF_REFERENCE_TEST("pre-dbrx", "GPT-2's vocabulary")
GGUF_REFERENCE_TEST("pre-gpt-4o", "GPT-2's vocabulary")
GGUF_REFERENCE_TEST("pre-tekken", "GPT-2's vocabulary")
GGUF_REFERENCE_TEST("pre-stablelm2", "GPT-2's vocabulary")
GGUF_REFERENCE_TEST("mixtral-v1", "converted from Mixtral-8x7B's tokenizer.model")
GGUF_REFERENCE_TEST("mixtral-v3", "converted from Mixtral-8x22B-Instruct's tokenizer.model")

TEST_CASE("gguf tokenizer: chat cases cover the three templates", "[gguf_tok]") {
  size_t total = 0;
  for (const char* name : {"smollm2", "llama3", "qwen2"}) {
    INFO(name);
    CHECK(CasesOf(name).chat.size() >= 10);
    total += CasesOf(name).chat.size();
  }
  CHECK(total >= 30);
}

TEST_CASE("gguf tokenizer: sentencepiece from GGUF equals the tokenizer.model it came from",
          "[gguf_tok]") {
  for (const char* name : {"mixtral-v1", "mixtral-v3"}) {
    const Tokenizer& gguf = *Load(name).tok;
    const Cases& cases = CasesOf(name);
    absl::StatusOr<std::unique_ptr<Tokenizer>> file =
        Tokenizer::Load(cases.meta.at("tokenizer_model"), 1, 2);
    REQUIRE(file.ok());
    INFO(name);
    CHECK(gguf.chat_format() == (*file)->chat_format());
    CHECK(gguf.vocab_size() == (*file)->vocab_size());
    size_t same = 0, checked = 0;
    for (size_t i = 0; i < cases.encode.size(); i += 4, ++checked) {
      const std::string text = cases.encode[i].at("text");
      if (gguf.Encode(text, true) == (*file)->Encode(text, true)) ++same;
    }
    CHECK(same == checked);
    const std::vector<std::vector<ChatMessage>> conversations = {
        {{"user", "Hello!"}},
        {{"system", "Be brief."},
         {"user", "Name a colour."},
         {"assistant", "Blue."},
         {"user", "Why?"}},
        {{"user", "naïve café — 你好 🌍"}, {"assistant", "Ça va ✓"}, {"user", "[INST] x [/INST]"}},
    };
    for (const auto& messages : conversations) {
      absl::StatusOr<std::vector<int32_t>> a = gguf.EncodeChat(messages);
      absl::StatusOr<std::vector<int32_t>> b = (*file)->EncodeChat(messages);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      CHECK(*a == *b);
    }
  }
}

TEST_CASE("gguf tokenizer: ids and --chat_template given to LoadFromGguf", "[gguf_tok]") {
  const GgufFile& smollm2 = *Load("smollm2").file;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::LoadFromGguf(smollm2, 7, 8, /*chat_template_name=*/"chatml");
  REQUIRE(tok.ok());
  CHECK((*tok)->bos_id() == 7);
  CHECK((*tok)->eos_id() == 8);
  CHECK((*tok)->chat_layout_name() == "chatml");
  CHECK((*tok)->chat_template().find("You are a helpful AI assistant named SmolLM") !=
        std::string::npos);
  tok = Tokenizer::LoadFromGguf(smollm2, 49152, std::nullopt);
  REQUIRE(!tok.ok());
  CHECK(tok.status().message().find("bos_id 49152 is outside the vocabulary [0, 49152)") !=
        std::string::npos);
  tok = Tokenizer::LoadFromGguf(smollm2, std::nullopt, std::nullopt, "nonesuch");
  REQUIRE(!tok.ok());
  CHECK(tok.status().message().find("--chat_template: 'nonesuch'") != std::string::npos);
  const GgufFile& mixtral = *Load("mixtral-v1").file;
  tok = Tokenizer::LoadFromGguf(mixtral, std::nullopt, std::nullopt, "chatml");
  REQUIRE(!tok.ok());
  CHECK(tok.status().message().find("sentencepiece") != std::string::npos);
  tok = Tokenizer::LoadFromGguf(mixtral, std::nullopt, std::nullopt, "mistral-v1");
  REQUIRE(tok.ok());
  CHECK((*tok)->chat_layout_name() == "mistral-v1");
}

// ---- GGUF images built here ------------------------------------------------------------------

template <typename T>
void Append(T v, std::string* out) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

void AppendString(const std::string& s, std::string* out) {
  Append(uint64_t{s.size()}, out);
  out->append(s);
}

// A GGUF v3 image with metadata only, laid out as ggml's docs/gguf.md says (little-endian).
class GgufImage {
 public:
  GgufImage& Str(const std::string& key, const std::string& v) {
    Key(key, 8);
    AppendString(v, &kv_);
    return *this;
  }
  GgufImage& U32(const std::string& key, uint32_t v) {
    Key(key, 4);
    Append(v, &kv_);
    return *this;
  }
  GgufImage& Bool(const std::string& key, bool v) {
    Key(key, 7);
    kv_.push_back(v ? 1 : 0);
    return *this;
  }
  GgufImage& Strs(const std::string& key, const std::vector<std::string>& v) {
    ArrayKey(key, 8, v.size());
    for (const std::string& s : v) AppendString(s, &kv_);
    return *this;
  }
  GgufImage& I32s(const std::string& key, const std::vector<int32_t>& v) {
    ArrayKey(key, 5, v.size());
    for (int32_t x : v) Append(x, &kv_);
    return *this;
  }
  GgufImage& F32s(const std::string& key, const std::vector<float>& v) {
    ArrayKey(key, 6, v.size());
    for (float x : v) Append(x, &kv_);
    return *this;
  }
  // The whole image parsed (the bytes are kept in `this`, which must outlive the result).
  absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const std::string& path) {
    bytes_ = "GGUF";
    Append(uint32_t{3}, &bytes_);       // version
    Append(uint64_t{0}, &bytes_);       // tensors
    Append(uint64_t{count_}, &bytes_);  // metadata keys
    bytes_ += kv_;
    while (bytes_.size() % 32 != 0) bytes_.push_back(0);  // the (empty) data section
    return ParseGguf(reinterpret_cast<const std::byte*>(bytes_.data()), bytes_.size(), path);
  }

 private:
  void Key(const std::string& key, uint32_t type) {
    AppendString(key, &kv_);
    Append(type, &kv_);
    ++count_;
  }
  void ArrayKey(const std::string& key, uint32_t element_type, size_t n) {
    Key(key, 9);
    Append(element_type, &kv_);
    Append(uint64_t{n}, &kv_);
  }
  std::string kv_, bytes_;
  uint64_t count_ = 0;
};

// A small byte-level vocabulary: the 256 byte characters, merges up to "Ġhello", "Ġworld" and
// "12", and a control token.
struct TinyVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
};

TinyVocab MakeTinyVocab() {
  TinyVocab v;
  char32_t shifted = 256;
  for (int b = 0; b < 256; ++b) {
    // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for
    // U+0100 onwards.
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t c = direct ? static_cast<char32_t>(b) : shifted++;
    std::string s;
    AppendUtf8(c, &s);
    v.tokens.push_back(s);
    v.types.push_back(1);
  }
  for (const char* m : {"Ġ h", "e l", "el l", "ell o", "Ġh ello", "Ġ w", "o r", "or l", "orl d",
                        "Ġw orld", "1 2"}) {
    v.merges.push_back(m);
    std::string joined(m);
    joined.erase(joined.find(' '), 1);
    v.tokens.push_back(joined);
    v.types.push_back(1);
  }
  v.tokens.push_back("<|end|>");
  v.types.push_back(3);
  return v;
}

GgufImage TinyGpt2(const TinyVocab& v) {
  GgufImage g;
  g.Str("general.architecture", "llama")
      .Str("tokenizer.ggml.model", "gpt2")
      .Strs("tokenizer.ggml.tokens", v.tokens)
      .I32s("tokenizer.ggml.token_type", v.types)
      .Strs("tokenizer.ggml.merges", v.merges)
      .U32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.tokens.size() - 1));
  return g;
}

// The same with one of the three arrays replaced.
GgufImage TinyGpt2With(TinyVocab v, const std::vector<std::string>* tokens,
                       const std::vector<int32_t>* types, const std::vector<std::string>* merges) {
  if (tokens != nullptr) v.tokens = *tokens;
  if (types != nullptr) v.types = *types;
  if (merges != nullptr) v.merges = *merges;
  GgufImage g = TinyGpt2(v);
  return g;
}

TEST_CASE("gguf tokenizer: every supported tokenizer.ggml.pre loads and aliases split alike",
          "[gguf_tok]") {
  const TinyVocab v = MakeTinyVocab();
  const std::string names = GgufPreTokenizerNames();
  const std::string text = " hello world 1234 ½ it'S\n\n5 <|end|>x";
  std::map<std::string, std::vector<int32_t>> by_name;
  size_t count = 0;
  for (size_t start = 0; start < names.size();) {
    size_t end = names.find(", ", start);
    if (end == std::string::npos) end = names.size();
    const std::string name = names.substr(start, end - start);
    start = end + 2;
    GgufImage g = TinyGpt2(v);
    g.Str("tokenizer.ggml.pre", name).U32("tokenizer.ggml.bos_token_id", 0);
    absl::StatusOr<std::unique_ptr<GgufFile>> file = g.Parse("tiny-" + name + ".gguf");
    REQUIRE(file.ok());
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromGguf(**file);
    INFO(name << ": " << tok.status().ToString());
    REQUIRE(tok.ok());
    by_name[name] = (*tok)->Encode(text, /*add_bos=*/false);
    CHECK((*tok)->Decode(by_name[name]) == " hello world 1234 ½ it'S\n\n5 x");
    ++count;
  }
  CHECK(count >= 20);
  // The merges work ("Ġhello" is one token), the control token is matched in the text.
  const int32_t hello = 256 + 4, end_token = static_cast<int32_t>(v.tokens.size() - 1);
  CHECK(by_name["gpt-2"][0] == hello);
  CHECK(std::count(by_name["gpt-2"].begin(), by_name["gpt-2"].end(), end_token) == 1);
  // llama.cpp's groups: the same regexes give the same ids, different ones do not.
  CHECK(by_name["olmo"] == by_name["gpt-2"]);
  CHECK(by_name["mpt"] == by_name["gpt-2"]);
  CHECK(by_name["smollm"] == by_name["starcoder"]);
  CHECK(by_name["smollm"] != by_name["gpt-2"]);  // "12" is not merged after single digits
  CHECK(by_name["dbrx"] == by_name["llama-bpe"]);
  CHECK(by_name["stablelm2"] == by_name["qwen2"]);
  CHECK(by_name["llama4"] == by_name["gpt-4o"]);
  // BOS by default for llama3 and tekken, not for the others (no add_bos_token in the file).
  GgufImage g = TinyGpt2(v);
  g.U32("tokenizer.ggml.bos_token_id", 0);
  for (const auto& [pre, bos] : std::vector<std::pair<std::string, bool>>{
           {"llama-bpe", true}, {"tekken", true}, {"gpt-2", false}, {"", false}}) {
    GgufImage h = g;
    if (!pre.empty()) h.Str("tokenizer.ggml.pre", pre);
    absl::StatusOr<std::unique_ptr<GgufFile>> file = h.Parse("bos.gguf");
    REQUIRE(file.ok());
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromGguf(**file);
    REQUIRE(tok.ok());
    INFO(pre);
    CHECK(((*tok)->Encode("hello", true).front() == 0) == bos);
  }
}

TEST_CASE("gguf tokenizer: tokenizer.chat_template recognised, or named when it is not",
          "[gguf_tok]") {
  const TinyVocab v = MakeTinyVocab();
  auto load = [&](const char* tmpl, GgufImage* g) {
    *g = TinyGpt2(v);
    if (tmpl != nullptr) g->Str("tokenizer.chat_template", tmpl);
    absl::StatusOr<std::unique_ptr<GgufFile>> file = g->Parse("tiny.gguf");
    REQUIRE(file.ok());
    return Tokenizer::LoadFromGguf(**file);
  };
  const std::vector<ChatMessage> hi = {{"user", "hello"}};
  GgufImage g;
  // ChatML: the turn markers are plain text in this vocabulary.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = load(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\n' }}{% endif %}",
      &g);
  REQUIRE(tok.ok());
  CHECK((*tok)->chat_layout_name() == "chatml");
  absl::StatusOr<std::vector<int32_t>> ids = (*tok)->EncodeChat(hi);
  REQUIRE(ids.ok());
  CHECK((*tok)->Decode(*ids) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n");

  tok = load("{{ messages[0]['content'] }}", &g);
  REQUIRE(tok.ok());
  CHECK((*tok)->chat_layout_name() == "none (the chat template is not recognised)");
  CHECK((*tok)->chat_template() == "{{ messages[0]['content'] }}");
  ids = (*tok)->EncodeChat(hi);
  REQUIRE(!ids.ok());
  CHECK_THAT(std::string(ids.status().message()),
             Catch::Contains("tiny.gguf (tokenizer.chat_template): chat_template: not a template"));

  tok = load(nullptr, &g);
  REQUIRE(tok.ok());
  CHECK((*tok)->chat_layout_name() == "none");
  ids = (*tok)->EncodeChat(hi);
  REQUIRE(!ids.ok());
  CHECK_THAT(std::string(ids.status().message()), Catch::Contains("tokenizer.chat_template"));
}

// LoadFromGguf's error for `image`, which must fail.
absl::Status ErrorOf(GgufImage image) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = image.Parse("broken.gguf");
  if (!file.ok())
    return absl::InternalError("the image does not parse: " + file.status().ToString());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromGguf(**file);
  if (tok.ok()) return absl::InternalError("loaded");
  return tok.status();
}

TEST_CASE("gguf tokenizer: broken metadata is refused naming the file and the key", "[gguf_tok]") {
  const TinyVocab v = MakeTinyVocab();
  struct Case {
    const char* what;
    GgufImage image;
    absl::StatusCode code;
    std::vector<std::string> says;
  };
  std::vector<std::string> dup = v.tokens;
  dup[260] = dup[5];
  std::vector<int32_t> short_types(v.types.begin(), v.types.end() - 1);
  std::vector<int32_t> bad_type = v.types;
  bad_type[10] = 9;
  std::vector<std::string> unknown_merge = v.merges, no_space = v.merges, not_token = v.merges;
  unknown_merge[1] = "e zz";
  no_space[2] = "ell";
  not_token.push_back("d o");
  auto base = [&] { return TinyGpt2(v); };
  auto without = [&](const std::string& skip) {  // the tiny vocabulary without one key
    GgufImage g;
    g.Str("tokenizer.ggml.model", "gpt2");
    if (skip != "tokens") g.Strs("tokenizer.ggml.tokens", v.tokens);
    if (skip != "merges") g.Strs("tokenizer.ggml.merges", v.merges);
    return g;
  };
  std::vector<Case> cases;
  cases.push_back({"no tokenizer",
                   GgufImage().Str("general.architecture", "llama"),
                   absl::StatusCode::kNotFound,
                   {"broken.gguf", "tokenizer.ggml.model", "missing"}});
  cases.push_back({"an unknown model",
                   GgufImage().Str("tokenizer.ggml.model", "bert"),
                   absl::StatusCode::kInvalidArgument,
                   {"broken.gguf", "tokenizer.ggml.model", "'bert' is not supported"}});
  cases.push_back({"no tokens",
                   without("tokens"),
                   absl::StatusCode::kInvalidArgument,
                   {"broken.gguf: tokenizer.ggml.tokens: missing"}});
  cases.push_back({"no merges",
                   without("merges"),
                   absl::StatusCode::kInvalidArgument,
                   {"broken.gguf: tokenizer.ggml.merges: missing"}});
  cases.push_back(
      {"tokens of another type",
       GgufImage().Str("tokenizer.ggml.model", "gpt2").I32s("tokenizer.ggml.tokens", {1}),
       absl::StatusCode::kInvalidArgument,
       {"tokenizer.ggml.tokens: expected an array of strings, found an array of int32"}});
  cases.push_back({"a repeated token",
                   TinyGpt2With(v, &dup, nullptr, nullptr),
                   absl::StatusCode::kInvalidArgument,
                   {"broken.gguf: tokenizer.ggml.tokens[260]", "is also token 5"}});
  cases.push_back({"token_type too short",
                   TinyGpt2With(v, nullptr, &short_types, nullptr),
                   absl::StatusCode::kInvalidArgument,
                   {"tokenizer.ggml.token_type: 267 types for 268 tokens"}});
  cases.push_back({"a token type out of range",
                   TinyGpt2With(v, nullptr, &bad_type, nullptr),
                   absl::StatusCode::kInvalidArgument,
                   {"tokenizer.ggml.token_type[10]: 9 is not a token type"}});
  cases.push_back({"a merge of an unknown token",
                   TinyGpt2With(v, nullptr, nullptr, &unknown_merge),
                   absl::StatusCode::kInvalidArgument,
                   {"tokenizer.ggml.merges[1]: 'zz' is not a token"}});
  cases.push_back({"a merge without a space",
                   TinyGpt2With(v, nullptr, nullptr, &no_space),
                   absl::StatusCode::kInvalidArgument,
                   {"tokenizer.ggml.merges[2]: 'ell' is not two tokens"}});
  cases.push_back({"a merge whose result is not a token",
                   TinyGpt2With(v, nullptr, nullptr, &not_token),
                   absl::StatusCode::kInvalidArgument,
                   {"tokenizer.ggml.merges[11]: the merged token 'do' is not a token"}});
  cases.push_back({"bos id out of range",
                   base().U32("tokenizer.ggml.bos_token_id", 268),
                   absl::StatusCode::kInvalidArgument,
                   {"tokenizer.ggml.bos_token_id: id 268 is outside the vocabulary [0, 268)"}});
  cases.push_back({"an unknown pre-tokenizer",
                   base().Str("tokenizer.ggml.pre", "nonesuch"),
                   absl::StatusCode::kInvalidArgument,
                   {"broken.gguf: tokenizer.ggml.pre: 'nonesuch' is not a pre-tokenizer", "smollm",
                    "qwen2", "llama-bpe", "gpt-4o", "default"}});
  cases.push_back({"BOS to add without a BOS id",
                   base().Bool("tokenizer.ggml.add_bos_token", true),
                   absl::StatusCode::kInvalidArgument,
                   {"tokenizer.ggml.bos_token_id: missing"}});
  cases.push_back({"add_bos_token not a bool",
                   base().U32("tokenizer.ggml.add_bos_token", 1),
                   absl::StatusCode::kInvalidArgument,
                   {"tokenizer.ggml.add_bos_token: expected a bool, found uint32"}});
  // sentencepiece ("llama")
  auto spm = [](const std::vector<std::string>& tokens, const std::vector<int32_t>& types) {
    GgufImage g;
    g.Str("tokenizer.ggml.model", "llama")
        .Strs("tokenizer.ggml.tokens", tokens)
        .F32s("tokenizer.ggml.scores", std::vector<float>(tokens.size(), 0.0f))
        .I32s("tokenizer.ggml.token_type", types);
    return g;
  };
  cases.push_back({"llama: no scores",
                   GgufImage()
                       .Str("tokenizer.ggml.model", "llama")
                       .Strs("tokenizer.ggml.tokens", {"<unk>", "a"})
                       .I32s("tokenizer.ggml.token_type", {2, 1}),
                   absl::StatusCode::kInvalidArgument,
                   {"tokenizer.ggml.scores: missing"}});
  cases.push_back({"llama: scores of another length",
                   GgufImage()
                       .Str("tokenizer.ggml.model", "llama")
                       .Strs("tokenizer.ggml.tokens", {"<unk>", "a"})
                       .F32s("tokenizer.ggml.scores", {0})
                       .I32s("tokenizer.ggml.token_type", {2, 1}),
                   absl::StatusCode::kInvalidArgument,
                   {"tokenizer.ggml.scores: 1 scores for 2 tokens"}});
  cases.push_back(
      {"llama: two unknown pieces",
       spm({"<unk>", "<s>", "</s>", "a"}, {2, 3, 3, 2}),
       absl::StatusCode::kInvalidArgument,
       {"broken.gguf: tokenizer.ggml.token_type: not a usable sentencepiece vocabulary"}});
  cases.push_back(
      {"llama: eos id out of range",
       spm({"<unk>", "<s>", "</s>", "a"}, {2, 3, 3, 1}).U32("tokenizer.ggml.eos_token_id", 4),
       absl::StatusCode::kInvalidArgument,
       {"tokenizer.ggml.eos_token_id: id 4 is outside the vocabulary [0, 4)"}});
  cases.push_back({"llama: no BOS id and no <s>",
                   spm({"<unk>", "a", "b"}, {2, 1, 1}),
                   absl::StatusCode::kInvalidArgument,
                   {"tokenizer.ggml.bos_token_id: missing, and no piece is '<s>'"}});
  for (Case& c : cases) {
    const absl::Status s = ErrorOf(c.image);
    INFO(c.what << ": " << s.ToString());
    CHECK(s.code() == c.code);
    for (const std::string& part : c.says) CHECK(s.message().find(part) != std::string::npos);
  }
  // A small sentencepiece vocabulary loads and encodes (byte fallback for the rest).
  std::vector<std::string> tokens = {"<unk>",         "<s>", "</s>",
                                     "\xE2\x96\x81h", "i",   "\xE2\x96\x81hi"};
  std::vector<int32_t> types = {2, 3, 3, 1, 1, 1};
  for (int b = 0; b < 256; ++b) {
    char piece[8];
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    tokens.push_back(piece);
    types.push_back(6);
  }
  GgufImage ok = spm(tokens, types);
  ok.Bool("tokenizer.ggml.add_eos_token", true);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = ok.Parse("tiny-spm.gguf");
  REQUIRE(file.ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromGguf(**file);
  REQUIRE(tok.ok());
  CHECK((*tok)->kind() == TokenizerKind::kSentencePiece);
  // "▁hi" (scores all equal: the first merge found wins), then "!" as its byte, BOS and EOS.
  CHECK(Show((*tok)->Encode("hi!", true)) == "[1 5 " + std::to_string(6 + '!') + " 2]");
  CHECK((*tok)->Decode((*tok)->Encode("hi!", true)) == "hi!");
}

}  // namespace
}  // namespace moebatch
