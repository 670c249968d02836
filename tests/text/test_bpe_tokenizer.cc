// Hugging Face tokenizer.json BPE tokenizers (engine/text/bpe_tokenizer.h) through the Tokenizer
// facade, against Hugging Face `tokenizers` itself: every encode and decode case that
// tests/fixtures/make_bpe_tokenizer_cases.py computed for six tokenizer.json files (Llama 3,
// Qwen2 and GPT-2 rebuilt from llama.cpp's vocab GGUFs, a Llama-2-style byte-fallback file, a
// Metaspace/unk file trained by `tokenizers`, and gpt-oss's o200k_harmony file made from the real
// o200k_base ranks as transformers converts them), id for id and byte for byte; streaming
// detokenization against Decode; added tokens never split; and bad files refused with the file and
// the field named.
//
// The tokenizer files and cases are third-party data, not in git: scripts/fetch_bpe_tokenizers.sh
// (run by scripts/test.sh) writes them to .deps/tokenizers/bpe/ ($MOEBATCH_DEPS_DIR/tokenizers/bpe
// when that is set; MOEBATCH_BPE_TOKENIZERS names another directory). Without them these tests
// fail, saying so.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/text/bpe_tokenizer.h"
#include "engine/text/harmony_output.h"
#include "engine/text/output_text.h"
#include "engine/text/text_unicode.h"
#include "engine/text/tokenizer.h"

namespace moebatch {
namespace {

using json = nlohmann::json;

const char* const kNames[] = {"llama3", "qwen2", "gpt2", "llama2", "metaspace", "gpt-oss"};
constexpr char kMakeThem[] =
    "run scripts/fetch_bpe_tokenizers.sh (it writes them with "
    "tests/fixtures/make_bpe_tokenizer_cases.py; scripts/test.sh runs it before ctest)";

std::string BpeRoot() {
  if (const char* env = std::getenv("MOEBATCH_BPE_TOKENIZERS"); env != nullptr && *env != '\0') {
    return env;
  }
  if (const char* deps = std::getenv("MOEBATCH_DEPS_DIR"); deps != nullptr && *deps != '\0') {
    return std::string(deps) + "/tokenizers/bpe";
  }
  return (std::filesystem::path(MOEBATCH_FIXTURES_DIR) / ".." / ".." / ".deps" / "tokenizers" /
          "bpe")
      .lexically_normal()
      .string();
}

std::string Dir(const std::string& name) { return BpeRoot() + "/" + name; }

// The tokenizer of one generated directory, loaded once through the facade; fails the calling
// test when it cannot be loaded.
const Tokenizer& Tok(const std::string& name) {
  static std::map<std::string, absl::StatusOr<std::unique_ptr<Tokenizer>>> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) it = loaded.emplace(name, Tokenizer::LoadFromModelDir(Dir(name))).first;
  if (!it->second.ok()) {
    FAIL("cannot load the " << name << " tokenizer.json (" << it->second.status().ToString()
                            << "): " << kMakeThem);
  }
  return **it->second;
}

struct Cases {
  json meta;
  std::vector<json> encode, decode;
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
      else
        it->second.decode.push_back(std::move(c));
    }
  }
  if (it->second.encode.empty()) {
    FAIL("no cases in " << Dir(name) << "/cases.jsonl: " << kMakeThem);
  }
  return it->second;
}

std::vector<int32_t> Ids(const json& j) { return j.get<std::vector<int32_t>>(); }

std::string Show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s + "]";
}

TEST_CASE("bpe: encode matches Hugging Face tokenizers id for id on every case", "[bpe]") {
  for (const char* name : kNames) {
    const Tokenizer& tok = Tok(name);
    const Cases& cases = CasesOf(name);
    REQUIRE(tok.kind() == TokenizerKind::kBpe);
    size_t match = 0, checked = 0, plain = 0, split = 0;
    std::vector<std::string> failures;
    for (const json& c : cases.encode) {
      const std::string text = c.at("text");
      ++checked;
      const std::vector<int32_t> want = Ids(c.at("ids"));
      const std::vector<int32_t> got = tok.Encode(text, /*add_bos=*/true);
      bool ok = got == want;
      if (c.contains("ids_plain")) {
        ++plain;
        const std::vector<int32_t> got_plain = tok.Encode(text, /*add_bos=*/false);
        if (got_plain != Ids(c.at("ids_plain"))) {
          ok = false;
          failures.push_back("add_special_tokens=False " + json(text).dump() + ": want " +
                             Show(Ids(c.at("ids_plain"))) + " got " + Show(got_plain));
        }
      }
      if (c.contains("ids_split_special")) {
        ++split;
        const std::vector<int32_t> got_split = tok.Encode(
            text, EncodeOptions{/*add_special_tokens=*/true, /*parse_special_tokens=*/false});
        if (got_split != Ids(c.at("ids_split_special"))) {
          ok = false;
          failures.push_back("encode_special_tokens " + json(text).dump() + ": want " +
                             Show(Ids(c.at("ids_split_special"))) + " got " + Show(got_split));
        }
      }
      if (got != want) {
        failures.push_back(json(text).dump() + ": want " + Show(want) + " got " + Show(got));
      }
      if (ok) ++match;
    }
    std::printf(
        "bpe %s: %zu of %zu encode cases match HF tokenizers %s (%zu with "
        "add_special_tokens=False, %zu with encode_special_tokens)\n",
        name, match, checked, cases.meta.value("tokenizers", "?").c_str(), plain, split);
    for (size_t i = 0; i < failures.size() && i < 5; ++i) UNSCOPED_INFO(failures[i]);
    CHECK(match == checked);
    CHECK(checked >= 2000);
  }
}

TEST_CASE("bpe: decode matches Hugging Face tokenizers byte for byte", "[bpe]") {
  for (const char* name : kNames) {
    const Tokenizer& tok = Tok(name);
    const Cases& cases = CasesOf(name);
    size_t match = 0, checked = 0;
    std::vector<std::string> failures;
    auto check = [&](const std::vector<int32_t>& ids, const std::string& want,
                     const std::string& want_all) {
      checked += 2;
      const std::string got = tok.Decode(ids);
      const std::string got_all = tok.bpe()->Decode(ids, /*skip_special_tokens=*/false);
      if (got == want)
        ++match;
      else
        failures.push_back(Show(ids) + ": want " + json(want).dump() + " got " + json(got).dump());
      if (got_all == want_all)
        ++match;
      else
        failures.push_back("skip_special_tokens=False " + Show(ids) + ": want " +
                           json(want_all).dump() + " got " + json(got_all).dump());
    };
    for (const json& c : cases.encode) check(Ids(c.at("ids")), c.at("decode"), c.at("decode_all"));
    for (const json& c : cases.decode) check(Ids(c.at("ids")), c.at("text"), c.at("text_all"));
    std::printf("bpe %s: %zu of %zu decode cases match HF tokenizers\n", name, match, checked);
    for (size_t i = 0; i < failures.size() && i < 5; ++i) UNSCOPED_INFO(failures[i]);
    CHECK(match == checked);
  }
}

TEST_CASE("bpe: streaming detokenization releases whole characters and ends equal to Decode",
          "[bpe]") {
  for (const char* name : kNames) {
    const Tokenizer& tok = Tok(name);
    const Cases& cases = CasesOf(name);
    std::vector<std::vector<int32_t>> runs;
    for (const json& c : cases.encode) runs.push_back(Ids(c.at("ids")));
    for (const json& c : cases.decode) runs.push_back(Ids(c.at("ids")));
    size_t bad_delta = 0, bad_total = 0, held = 0;
    for (const std::vector<int32_t>& ids : runs) {
      StreamingDetokenizer stream(tok);
      std::string all;
      for (int32_t id : ids) {
        const std::string delta = stream.Add(id);
        if (!IsValidUtf8(delta)) ++bad_delta;
        if (delta.empty()) ++held;
        all += delta;
      }
      const std::string rest = stream.Finish();
      if (!IsValidUtf8(rest)) ++bad_delta;
      all += rest;
      if (all != tok.Decode(ids) || stream.text() != all) ++bad_total;
    }
    INFO(name);
    CHECK(bad_delta == 0);
    CHECK(bad_total == 0);
    CHECK(held > 0);  // some deltas were held back (split characters, specials)
  }
}

TEST_CASE("bpe: a character split over byte-level tokens is held back until complete", "[bpe]") {
  const Tokenizer& tok = Tok("gpt2");
  // GPT-2 has no single token for these: each byte is a token of its own or a partial merge.
  for (const std::string text : {"😀", "👨\u200d👩\u200d👧", "𝔘𝔫", "日本"}) {
    const std::vector<int32_t> ids = tok.Encode(text, /*add_bos=*/false);
    StreamingDetokenizer stream(tok);
    std::string all;
    for (int32_t id : ids) {
      const std::string delta = stream.Add(id);
      CHECK(IsValidUtf8(delta));
      all += delta;
    }
    all += stream.Finish();
    CHECK(all == text);
  }
  // An unfinished character at the end: Finish releases it as Decode does (one U+FFFD).
  const std::vector<int32_t> ids = tok.Encode("😀", false);
  REQUIRE(ids.size() >= 2);
  StreamingDetokenizer stream(tok);
  std::string all;
  for (size_t i = 0; i + 1 < ids.size(); ++i) all += stream.Add(ids[i]);
  CHECK(all.empty());
  const std::string rest = stream.Finish();
  CHECK(rest == "\xEF\xBF\xBD");
  CHECK(rest == tok.Decode(std::vector<int32_t>(ids.begin(), ids.end() - 1)));
}

TEST_CASE("bpe: TokenBytes gives each token's raw bytes (logprobs' \"bytes\")", "[bpe]") {
  const Tokenizer& tok = Tok("gpt2");
  // Byte-level: the bytes of a character split over tokens add up to it; a part alone is not UTF-8.
  const std::vector<int32_t> ids = tok.Encode("a 😀", /*add_bos=*/false);
  std::string all;
  bool partial = false;
  for (int32_t id : ids) {
    all += tok.TokenBytes(id);
    partial = partial || !IsValidUtf8(tok.TokenBytes(id));
  }
  CHECK(all == "a 😀");
  CHECK(partial);
  // "Ġworld": the byte-level space is a space.
  const std::vector<int32_t> word = tok.Encode(" world", false);
  REQUIRE(word.size() == 1);
  CHECK(tok.TokenBytes(word[0]) == " world");
  CHECK(tok.TokenBytes(-1).empty());
}

TEST_CASE("bpe: OutputText over a byte-level tokenizer never splits a character", "[bpe]") {
  const Tokenizer& tok = Tok("llama3");
  const std::string text = "Stop here: 😀 日本語 END more text";
  const std::vector<int32_t> ids = tok.Encode(text, /*add_bos=*/false);
  OutputText out(tok, {"END"});
  std::string released;
  bool stopped = false;
  for (size_t i = 0; i < ids.size() && !stopped; ++i) {
    stopped = out.Add(ids[i], i + 1 == ids.size());
    std::string delta;
    out.Release(stopped || i + 1 == ids.size(), &delta);
    CHECK(IsValidUtf8(delta));
    released += delta;
  }
  CHECK(stopped);
  CHECK(released == "Stop here: 😀 日本語 ");
}

// The added tokens of a generated tokenizer.json.
std::vector<json> AddedTokens(const std::string& name) {
  std::ifstream in(Dir(name) + "/tokenizer.json");
  const json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) FAIL("cannot read " << Dir(name) << "/tokenizer.json: " << kMakeThem);
  return doc.at("added_tokens").get<std::vector<json>>();
}

TEST_CASE("bpe: added tokens are matched first and never split", "[bpe]") {
  for (const char* name : kNames) {
    const Tokenizer& tok = Tok(name);
    INFO(name);
    const std::vector<json> added = AddedTokens(name);
    REQUIRE(!added.empty());
    for (const json& t : added) {
      const std::string content = t.at("content");
      const int32_t id = t.at("id");
      const bool special = t.at("special");
      INFO(content);
      CHECK(tok.TokenToId(content) == id);
      if (t.at("normalized").get<bool>() &&
          content != NormalizeUnicode(content, NormalizationForm::kNfkc)) {
        continue;  // matched in its normalized form (the metaspace file's "ﬁle")
      }
      CHECK(tok.Encode(content, EncodeOptions{false, true}) == std::vector<int32_t>{id});
      // Inside text, glued to other characters (single_word tokens only between non-word ones).
      const std::string around =
          t.at("single_word").get<bool>() ? " " + content + " " : "a" + content + "b";
      const std::vector<int32_t> ids = tok.Encode(around, EncodeOptions{false, true});
      CHECK(std::count(ids.begin(), ids.end(), id) == 1);
      if (special && std::string(name) != "llama2" && std::string(name) != "metaspace") {
        // Special-token parsing off: the text is plain text (byte-level files decode it back).
        const std::vector<int32_t> plain = tok.Encode(around, EncodeOptions{false, false});
        CHECK(std::count(plain.begin(), plain.end(), id) == 0);
        CHECK(tok.Decode(plain) == tok.bpe()->Decode(ids, /*skip_special_tokens=*/false));
      }
    }
  }
}

TEST_CASE("bpe: ids and configuration from tokenizer_config.json and config.json", "[bpe]") {
  const Tokenizer& llama3 = Tok("llama3");
  CHECK(llama3.vocab_size() == 128256);
  CHECK(llama3.eos_id() == 128009);  // tokenizer_config's eos_token <|eot_id|>
  CHECK(llama3.bos_id() == 128000);
  CHECK(llama3.chat_format() == ChatFormat::kNone);
  CHECK(llama3.chat_template().find("<|start_header_id|>") != std::string::npos);  // .jinja file
  CHECK(llama3.Encode("Hi", true).front() == 128000);
  // The chat layout is recognised from the template (Llama 3.1's) and rendered as text whose
  // special tokens are matched, without a second BOS (apply_chat_template's tokenization).
  CHECK(llama3.chat_layout_name() == "llama3.1");
  const absl::StatusOr<std::vector<int32_t>> chat = llama3.EncodeChat({{"user", "hi"}});
  REQUIRE(chat.ok());
  EncodeOptions raw;
  raw.add_special_tokens = false;
  CHECK(*chat == llama3.Encode("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                               "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024"
                               "\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi"
                               "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                               raw));
  CHECK(std::count(chat->begin(), chat->end(), 128000) == 1);
  CHECK(chat->front() == 128000);
  CHECK(chat->back() == llama3.Encode("\n\n", raw).back());

  const Tokenizer& qwen2 = Tok("qwen2");
  CHECK(qwen2.eos_id() == 151645);  // <|im_end|>
  CHECK(qwen2.bos_id() == 151643);  // no bos_token: config.json's bos_token_id
  CHECK(qwen2.chat_template().find("<|im_start|>") != std::string::npos);
  CHECK(qwen2.Encode("Hi", true) == qwen2.Encode("Hi", false));  // no BOS

  const Tokenizer& gpt2 = Tok("gpt2");
  CHECK(gpt2.eos_id() == 50256);  // an AddedToken object in tokenizer_config
  CHECK(gpt2.chat_template().empty());
  CHECK(gpt2.chat_layout_name() == "none");
  const absl::Status no_template = gpt2.EncodeChat({{"user", "hi"}}).status();
  CHECK(no_template.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(no_template.message()),
             Catch::Contains("no chat template") && Catch::Contains("--chat_template"));

  const Tokenizer& llama2 = Tok("llama2");  // add_bos_token and add_eos_token
  const std::vector<int32_t> ids = llama2.Encode("Hi there", true);
  CHECK(ids.front() == 1);
  CHECK(ids.back() == 2);

  const Tokenizer& metaspace = Tok("metaspace");  // a list of named templates
  CHECK(metaspace.chat_template() == "{{ messages[0]['content'] }}");
  // A template moebatch does not lay out: the model loads (prompts run), chat is refused with the
  // reason, and --chat_template overrides it.
  CHECK(metaspace.chat_layout_name() == "none (the chat template is not recognised)");
  const absl::Status unrecognised = metaspace.EncodeChat({{"user", "hi"}}).status();
  CHECK(unrecognised.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(unrecognised.message()),
             Catch::StartsWith("messages: " + Dir("metaspace") +
                               "/tokenizer_config.json: "
                               "chat_template: not a template moebatch recognises (") &&
                 Catch::Contains("; give --chat_template NAME with one of: chatml,") &&
                 Catch::EndsWith(" (or send prompts)"));
  absl::StatusOr<std::unique_ptr<Tokenizer>> chatml =
      Tokenizer::LoadFromModelDir(Dir("metaspace"), std::nullopt, std::nullopt, "chatml");
  REQUIRE(chatml.ok());
  CHECK((*chatml)->chat_layout_name() == "chatml");
  CHECK((*chatml)->EncodeChat({{"user", "hi"}}).ok());
  const absl::Status bad_name =
      Tokenizer::LoadFromModelDir(Dir("metaspace"), std::nullopt, std::nullopt, "alpaca").status();
  CHECK(bad_name.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad_name.message()),
             Catch::Contains("--chat_template: 'alpaca'") && Catch::Contains("chatml"));

  // Ids given by the engine (config.json's) win.
  absl::StatusOr<std::unique_ptr<Tokenizer>> given =
      Tokenizer::LoadFromModelDir(Dir("llama3"), 128000, 128001);
  REQUIRE(given.ok());
  CHECK((*given)->eos_id() == 128001);
  absl::StatusOr<std::unique_ptr<Tokenizer>> outside =
      Tokenizer::LoadFromModelDir(Dir("llama3"), 1, 999999);
  CHECK(outside.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("bpe: gpt-oss's o200k_harmony tokenizer: ids, harmony tokens, chat layout", "[bpe]") {
  const Tokenizer& tok = Tok("gpt-oss");
  CHECK(tok.vocab_size() == 200019);  // 199,998 o200k_base ranks + 21 added tokens
  CHECK(tok.bos_id() == 199998);      // <|startoftext|>
  CHECK(tok.eos_id() == 200002);      // <|return|>
  const std::vector<std::pair<const char*, int32_t>> harmony = {
      {"<|startoftext|>", 199998}, {"<|endoftext|>", 199999},
      {"<|return|>", 200002},      {"<|constrain|>", 200003},
      {"<|channel|>", 200005},     {"<|start|>", 200006},
      {"<|end|>", 200007},         {"<|message|>", 200008},
      {"<|call|>", 200012},        {"<|reserved_200013|>", 200013},
      {"<|endofprompt|>", 200018}};
  for (const auto& [text, id] : harmony) {
    INFO(text);
    CHECK(tok.TokenToId(text) == id);
    CHECK(tok.TokenBytes(id) == text);
  }
  // No BOS is added (a ByteLevel post-processor): apply_chat_template's text starts with <|start|>.
  CHECK(tok.Encode("Hi", true) == tok.Encode("Hi", false));
  // Raw harmony output: the special ids decode to nothing unless asked for.
  const std::string raw =
      "<|channel|>analysis<|message|>2+2 is 4.<|end|><|start|>assistant<|channel|>final"
      "<|message|>**4** 😀<|return|>";
  const std::vector<int32_t> ids = tok.Encode(raw, false);
  CHECK(std::count(ids.begin(), ids.end(), 200005) == 2);
  CHECK(ids.back() == 200002);
  CHECK(tok.Decode(ids) == "analysis2+2 is 4.assistantfinal**4** 😀");
  CHECK(tok.bpe()->Decode(ids, /*skip_special_tokens=*/false) == raw);

  // The chat layout is recognised from chat_template.jinja (gpt-oss's template) and rendered as
  // text whose special tokens are matched.
  CHECK(tok.chat_layout_name() == "harmony");
  const absl::StatusOr<std::vector<int32_t>> chat =
      tok.EncodeChat({{"system", "Be brief."}, {"user", "hi"}});
  REQUIRE(chat.ok());
  const std::string text = tok.bpe()->Decode(*chat, /*skip_special_tokens=*/false);
  CHECK_THAT(text, Catch::StartsWith("<|start|>system<|message|>You are ChatGPT, a large language "
                                     "model trained by OpenAI.\nKnowledge cutoff: 2024-06\n"
                                     "Current date: ") &&
                       Catch::EndsWith("<|start|>developer<|message|># Instructions\n\nBe brief."
                                       "\n\n<|end|><|start|>user<|message|>hi<|end|>"
                                       "<|start|>assistant"));
  CHECK(chat->front() == 200006);
  CHECK(chat->back() == tok.Encode("assistant", false).back());
  CHECK(*chat == tok.Encode(text, EncodeOptions{false, true}));
}

TEST_CASE("bpe: gpt-oss replies split into content and reasoning as vLLM splits them", "[bpe]") {
  const Tokenizer& tok = Tok("gpt-oss");
  REQUIRE(WritesHarmony(tok));
  CHECK_FALSE(WritesHarmony(Tok("llama3")));
  using Opt = std::optional<std::string>;
  struct Case {
    std::string raw;  // generated text, special tokens written as text
    Opt reasoning, content;
  };
  const std::vector<Case> cases = {
      // analysis then final, the usual shape; <|endoftext|> after the end is ignored.
      {"<|channel|>analysis<|message|>User greets. Reply.<|end|><|start|>assistant<|channel|>"
       "final<|message|>Hello! 日本語 😀<|return|><|endoftext|>",
       "User greets. Reply.", "Hello! 日本語 😀"},
      // Several analysis messages and a preamble (commentary without a recipient) join with "\n";
      // a tool call (commentary to=functions.f) is neither.
      {"<|channel|>analysis<|message|>a1<|end|><|start|>assistant<|channel|>commentary"
       "<|message|>Checking.<|end|><|start|>assistant<|channel|>analysis<|message|>a2<|end|>"
       "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
       "<|message|>{\"city\": \"Paris\"}<|call|>",
       "a1\na2", "Checking."},
      // Cut by max_tokens: inside the final message, inside its header, inside the analysis.
      {"<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>"
       "Partial answ",
       "think", "Partial answ"},
      {"<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>fin", "think",
       std::nullopt},
      {"<|channel|>analysis<|message|>thi", "thi", std::nullopt},
      // Empty texts are null; no channel header gives nothing.
      {"<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>"
       "<|return|>",
       std::nullopt, std::nullopt},
      {"plain text, no harmony at all", std::nullopt, std::nullopt},
      {"", std::nullopt, std::nullopt},
      // A final message straight away; a <|start|> inside a text ends that message.
      {"<|channel|>final<|message|>Direct.<|return|>", std::nullopt, "Direct."},
      {"<|channel|>analysis<|message|>x<|start|>assistant<|channel|>final<|message|>y", "x", "y"},
  };
  for (const Case& c : cases) {
    INFO(c.raw);
    const HarmonyReply r = ParseHarmonyReply(tok, tok.Encode(c.raw, EncodeOptions{false, true}));
    CHECK(r.reasoning_content == c.reasoning);
    CHECK(r.content == c.content);
  }
}

TEST_CASE("bpe: a model directory with tokenizer.model loads sentencepiece as before", "[bpe]") {
  const std::string dir = std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral";
  absl::StatusOr<std::unique_ptr<Tokenizer>> by_dir = Tokenizer::LoadFromModelDir(dir, 1, 2);
  absl::StatusOr<std::unique_ptr<Tokenizer>> by_file =
      Tokenizer::Load(dir + "/tokenizer.model", 1, 2);
  REQUIRE(by_dir.ok());
  REQUIRE(by_file.ok());
  CHECK((*by_dir)->kind() == TokenizerKind::kSentencePiece);
  CHECK((*by_dir)->bpe() == nullptr);
  const std::string text = "Hello, world! こんにちは [INST]";
  CHECK((*by_dir)->Encode(text, true) == (*by_file)->Encode(text, true));
  CHECK((*by_dir)->chat_format() == ChatFormat::kMistralV1);
  absl::StatusOr<std::unique_ptr<Tokenizer>> from_config = Tokenizer::LoadFromModelDir(dir);
  REQUIRE(from_config.ok());  // bos/eos from the directory's config.json
  CHECK((*from_config)->bos_id() == 1);
  CHECK((*from_config)->eos_id() == 2);
}

// A scratch directory with the given files.
class ScratchDir {
 public:
  ScratchDir() {
    std::random_device rd;
    path_ =
        (std::filesystem::temp_directory_path() / ("bpe_test_" + std::to_string(rd()))).string();
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ + "/" + name, std::ios::binary) << text;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

json TinyBpe() {
  return json::parse(R"({"version": "1.0", "added_tokens": [], "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                      "use_regex": true},
    "post_processor": null, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
              "byte_fallback": false, "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": ["a b"]}})");
}

absl::Status LoadStatus(const ScratchDir& dir) {
  return BpeTokenizer::LoadFromDirectory(dir.path()).status();
}

TEST_CASE("bpe: bad files are refused naming the file and the field", "[bpe]") {
  using Catch::Matchers::Contains;
  {
    ScratchDir dir;  // nothing in it
    const absl::Status s = LoadStatus(dir);
    CHECK(s.code() == absl::StatusCode::kNotFound);
    CHECK_THAT(std::string(s.message()), Contains(dir.path() + "/tokenizer.json"));
    const absl::Status facade = Tokenizer::LoadFromModelDir(dir.path()).status();
    CHECK(facade.code() == absl::StatusCode::kNotFound);
    CHECK_THAT(std::string(facade.message()),
               Contains("tokenizer.json") && Contains("tokenizer.model"));
    CHECK(Tokenizer::LoadFromModelDir(dir.path() + "/nope").status().code() ==
          absl::StatusCode::kNotFound);
  }
  {
    ScratchDir dir;
    dir.Write("tokenizer.json", TinyBpe().dump());
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> ok = BpeTokenizer::LoadFromDirectory(dir.path());
    REQUIRE(ok.ok());
    CHECK((*ok)->Encode("ab a") == std::vector<int32_t>{2, 3, 0});
    CHECK((*ok)->Decode({2, 3, 0}) == "ab a");
  }
  struct Bad {
    const char* what;
    std::string text;
    const char* field;
    const char* message;
  };
  std::vector<Bad> bad;
  bad.push_back({"corrupt JSON", TinyBpe().dump().substr(0, 100), "", "not valid JSON"});
  json j = TinyBpe();
  j["model"]["type"] = "WordPiece";
  bad.push_back({"unknown model type", j.dump(), "model.type", "'WordPiece' is not supported"});
  j = TinyBpe();
  j["model"]["merges"] = json::array({"a b", "a c"});
  bad.push_back({"a merge naming an unknown token", j.dump(), "model.merges[1]",
                 "'c' is not in model.vocab"});
  j = TinyBpe();
  j["model"]["merges"] = json::array({json::array({"b", "a"})});
  bad.push_back({"a merge whose result is unknown", j.dump(), "model.merges[0]",
                 "the merged token 'ba' is not in model.vocab"});
  j = TinyBpe();
  j["model"]["merges"] = json::array({"a  b"});
  bad.push_back({"a malformed merge", j.dump(), "model.merges[0]", "two tokens"});
  j = TinyBpe();
  j["model"].erase("vocab");
  bad.push_back({"no vocabulary", j.dump(), "model.vocab", "expected an object"});
  j = TinyBpe();
  j["model"]["unk_token"] = "<unk>";
  bad.push_back(
      {"an unknown unk_token", j.dump(), "model.unk_token", "'<unk>' is not in model.vocab"});
  j = TinyBpe();
  j["pre_tokenizer"] = json::parse(R"({"type": "Whitespace"})");
  bad.push_back({"an unsupported pre-tokenizer", j.dump(), "pre_tokenizer.type", "'Whitespace'"});
  j = TinyBpe();
  j["pre_tokenizer"] = json::parse(
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(\\p{L"},
          "behavior": "Isolated", "invert": false}]})");
  bad.push_back(
      {"a bad regex", j.dump(), "pre_tokenizer.pretokenizers[0].pattern.Regex", "bad regex"});
  j = TinyBpe();
  j["pre_tokenizer"] =
      json::parse(R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways"})");
  bad.push_back({"an unknown split behavior", j.dump(), "pre_tokenizer.behavior", "Sideways"});
  j = TinyBpe();
  j["normalizer"] = json::parse(R"({"type": "Lowercase"})");
  bad.push_back({"an unsupported normalizer", j.dump(), "normalizer.type", "'Lowercase'"});
  j = TinyBpe();
  j["decoder"] = json::parse(R"({"type": "WordPiece"})");
  bad.push_back({"an unsupported decoder", j.dump(), "decoder.type", "'WordPiece'"});
  j = TinyBpe();
  j["post_processor"] = json::parse(
      R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
          {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {}})");
  bad.push_back(
      {"a template token without ids", j.dump(), "post_processor.special_tokens", "'<s>'"});
  j = TinyBpe();
  j["added_tokens"] = json::parse(R"([{"id": 4, "special": true}])");
  bad.push_back({"an added token without content", j.dump(), "added_tokens[0].content", "missing"});
  for (const Bad& b : bad) {
    INFO(b.what);
    ScratchDir dir;
    dir.Write("tokenizer.json", b.text);
    const absl::Status s = LoadStatus(dir);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    const std::string message(s.message());
    CHECK_THAT(message, Contains(dir.path() + "/tokenizer.json"));
    CHECK_THAT(message, Contains(b.field));
    CHECK_THAT(message, Contains(b.message));
    // The facade passes the error on.
    CHECK(Tokenizer::LoadFromModelDir(dir.path()).status() == s);
  }
  {
    ScratchDir dir;
    dir.Write("tokenizer.json", TinyBpe().dump());
    dir.Write("tokenizer_config.json", "{\"bos_token\": ");
    const absl::Status s = LoadStatus(dir);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Contains(dir.path() + "/tokenizer_config.json"));
    dir.Write("tokenizer_config.json", R"({"add_bos_token": true, "bos_token": "<s>"})");
    const absl::Status missing = LoadStatus(dir);
    CHECK(missing.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(missing.message()), Contains("bos_token") && Contains("'<s>'"));
    dir.Write("tokenizer_config.json", R"({"bos_token": 7})");
    CHECK_THAT(std::string(LoadStatus(dir).message()), Contains("bos_token"));
  }
}

TEST_CASE("bpe: one tokenizer encodes and decodes from several threads at once", "[bpe]") {
  const Tokenizer& tok = Tok("qwen2");
  const Cases& cases = CasesOf("qwen2");
  constexpr int kThreads = 4;
  std::vector<size_t> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < cases.encode.size(); i += 1 + t) {  // overlapping strides
        const json& c = cases.encode[i];
        const std::vector<int32_t> ids = tok.Encode(c.at("text").get<std::string>(), true);
        if (ids != Ids(c.at("ids")) || tok.Decode(ids) != c.at("decode").get<std::string>())
          ++wrong[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) CHECK(wrong[t] == 0);
}

TEST_CASE("bpe: text that is not UTF-8 is encoded as its lossy conversion", "[bpe]") {
  const Tokenizer& tok = Tok("qwen2");
  const std::string bad = std::string("ok \xE3\x81 then \xFF end");
  std::string lossy;
  AppendUtf8Lossy(bad, &lossy);
  CHECK(lossy == "ok \xEF\xBF\xBD then \xEF\xBF\xBD end");
  CHECK(tok.Encode(bad, true) == tok.Encode(lossy, true));
}

TEST_CASE("bpe: very long runs (whitespace, digits, one word) encode and round-trip", "[bpe]") {
  for (const char* name : {"llama3", "qwen2", "gpt2", "llama2", "gpt-oss"}) {
    const Tokenizer& tok = Tok(name);
    INFO(name);
    for (const std::string& text :
         {std::string(100000, ' ') + "x", std::string(50000, '\n'), std::string(30000, '7'),
          std::string(20000, 'a'), "x" + std::string(40000, '\t') + "y"}) {
      const std::vector<int32_t> ids = tok.Encode(text, false);
      CHECK(!ids.empty());
      CHECK(tok.Decode(ids) == text);
    }
  }
}

}  // namespace
}  // namespace moebatch
