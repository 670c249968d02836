// GGUF tokenizer metadata -> BpeTokenizer (via an in-memory tokenizer.json) or SentencePieceModel
// (via a built ModelProto). gguf_tokenizer.h says what is mapped to what.

#include "engine/text/gguf_tokenizer.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "engine/text/bpe_tokenizer_internal.h"
#include "nlohmann/json.hpp"

namespace moebatch {
namespace {

using json = nlohmann::json;

constexpr char kPre[] = "tokenizer.ggml.pre";
constexpr char kTokens[] = "tokenizer.ggml.tokens";
constexpr char kTokenType[] = "tokenizer.ggml.token_type";
constexpr char kScores[] = "tokenizer.ggml.scores";
constexpr char kMerges[] = "tokenizer.ggml.merges";
constexpr char kBosId[] = "tokenizer.ggml.bos_token_id";
constexpr char kEosId[] = "tokenizer.ggml.eos_token_id";
constexpr char kUnkId[] = "tokenizer.ggml.unknown_token_id";
constexpr char kAddBos[] = "tokenizer.ggml.add_bos_token";
constexpr char kAddEos[] = "tokenizer.ggml.add_eos_token";
constexpr char kAddSpacePrefix[] = "tokenizer.ggml.add_space_prefix";
constexpr char kRemoveExtraWhitespaces[] = "tokenizer.ggml.remove_extra_whitespaces";
constexpr char kChatTemplate[] = "tokenizer.chat_template";

// llama_token_type (llama.h), gguf-py's TokenType.
enum TokenType : int {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// ---- the pre-tokenizers of llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp) ----------------

// GPT-2 (tokenizers' ByteLevel regex; llama.cpp's copy lacks the final "|\s+", which changes no
// split: the text between matches is a piece of its own either way).
constexpr char kGpt2[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3 (and DBRX, Smaug): Meta's tokenizer.json (llama.cpp: "(?:'[sS]|'[tT]|...)").
constexpr char kLlama3[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: Qwen's tokenizer.json; as Llama 3 with single digits.
constexpr char kQwen2[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-4o (o200k; Llama 4): the tokenizer.json original of llama.cpp's look-ahead rewrite.
constexpr char kGpt4o[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Tekken (Mistral Nemo): the tokenizer.json original, as for GPT-4o.
constexpr char kTekken[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreType {
  std::vector<const char*> names;  // tokenizer.ggml.pre values (llama.cpp's aliases)
  std::vector<const char*> regexes;
  bool nfc = false;            // the tokenizer.json normalizer llama.cpp does not apply
  bool ignore_merges = false;  // llama.cpp's vocab.ignore_merges
  bool add_bos = false;        // llama.cpp's add_bos default (tokenizer.ggml.add_bos_token wins)
};

const std::vector<PreType>& PreTypes() {
  static const std::vector<PreType> types = {
      // LLAMA_VOCAB_PRE_TYPE_DEFAULT (also a missing tokenizer.ggml.pre)
      {{"default"},
       {R"([\p{P}\$\+<=>\^~\|]+)",
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))", R"(\p{N}+)",
        R"([0-9][0-9][0-9])"}},
      // _GPT2, _MPT, _OLMO, _JAIS, _TRILLION, _GRANITE_DOCLING
      {{"gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "exaone4", "mpt", "olmo", "jais",
        "trillion", "granite-docling"},
       {kGpt2}},
      // _LLAMA3: ignore_merges, BOS added by default
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
       {kLlama3},
       false,
       true,
       true},
      // _DBRX, _SMAUG: the Llama 3 regex
      {{"dbrx", "smaug-bpe"}, {kLlama3}},
      // _QWEN2 with Qwen2's NFC
      {{"qwen2"}, {kQwen2}, true},
      // _QWEN2 (other aliases), _STABLELM2, _HUNYUAN, _SOLAR_OPEN
      {{"deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"},
       {kQwen2}},
      // _STARCODER, _REFACT, _COMMAND_R, _SMOLLM, _CODESHELL, _EXAONE, _MINERVA, _MELLUM2: single
      // digits, then GPT-2 (tokenizer.json: Digits(individual_digits) + ByteLevel)
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b",
        "mellum2"},
       {R"(\p{N})", kGpt2}},
      // _GPT4O, _MINIMAX_M2
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kGpt4o}},
      // _TEKKEN: ignore_merges, BOS added by default
      {{"tekken"}, {kTekken}, false, true, true},
  };
  return types;
}

const PreType* FindPreType(const std::string& name) {
  for (const PreType& t : PreTypes()) {
    for (const char* n : t.names) {
      if (name == n) return &t;
    }
  }
  return nullptr;
}

// ---- reading the metadata --------------------------------------------------------------------

absl::Status Bad(const GgufFile& f, absl::string_view key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", key, ": ", what));
}

std::string TypeName(const GgufValue& v) {
  if (v.type != GgufValueType::kArray) return GgufValueTypeName(v.type);
  return absl::StrCat("an array of ", GgufValueTypeName(v.element_type));
}

// An optional string key.
absl::StatusOr<std::optional<std::string>> OptionalString(const GgufFile& f, const char* key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->type != GgufValueType::kString) {
    return Bad(f, key, absl::StrCat("expected a string, found ", TypeName(*v)));
  }
  return std::optional<std::string>(v->s);
}

absl::StatusOr<bool> OptionalBool(const GgufFile& f, const char* key, bool fallback) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return fallback;
  if (v->type != GgufValueType::kBool) {
    return Bad(f, key, absl::StrCat("expected a bool, found ", TypeName(*v)));
  }
  return v->b;
}

// An optional token id, inside [0, n).
absl::StatusOr<std::optional<int32_t>> OptionalId(const GgufFile& f, const char* key, size_t n) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return std::optional<int32_t>();
  if (!v->is_integer()) {
    return Bad(f, key, absl::StrCat("expected an integer, found ", TypeName(*v)));
  }
  if (v->i < 0 || static_cast<uint64_t>(v->i) >= n) {
    return Bad(f, key, absl::StrCat("id ", v->i, " is outside the vocabulary [0, ", n, ")"));
  }
  return std::optional<int32_t>(static_cast<int32_t>(v->i));
}

// An array whose elements pass `element_ok`.
template <typename Ok>
absl::StatusOr<const GgufValue*> Array(const GgufFile& f, const char* key, bool required,
                                       const char* expected, Ok element_ok) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    if (!required) return nullptr;
    return Bad(f, key, "missing");
  }
  GgufValue probe;
  probe.type = v->element_type;
  if (v->type != GgufValueType::kArray || !element_ok(probe)) {
    return Bad(f, key, absl::StrCat("expected ", expected, ", found ", TypeName(*v)));
  }
  return v;
}

// tokenizer.ggml.tokens: every token, an empty one named "[EMPTY_<i>]" (llama.cpp); a repeated
// one is an error. Also fills `index` (token -> id).
absl::StatusOr<std::vector<std::string>> ReadTokens(
    const GgufFile& f, absl::flat_hash_map<std::string, int32_t>* index) {
  absl::StatusOr<const GgufValue*> v =
      Array(f, kTokens, true, "an array of strings",
            [](const GgufValue& e) { return e.type == GgufValueType::kString; });
  if (!v.ok()) return v.status();
  const std::vector<GgufValue>& elements = (*v)->elements;
  if (elements.empty()) return Bad(f, kTokens, "empty");
  if (elements.size() > (size_t{1} << 30)) return Bad(f, kTokens, "too many tokens");
  std::vector<std::string> tokens;
  tokens.reserve(elements.size());
  index->reserve(elements.size());
  for (size_t i = 0; i < elements.size(); ++i) {
    std::string t = elements[i].s.empty() ? absl::StrCat("[EMPTY_", i, "]") : elements[i].s;
    const auto [it, inserted] = index->emplace(t, static_cast<int32_t>(i));
    if (!inserted) {
      return Bad(f, absl::StrCat(kTokens, "[", i, "]"),
                 absl::StrCat("'", t, "' is also token ", it->second));
    }
    tokens.push_back(std::move(t));
  }
  return tokens;
}

// tokenizer.ggml.token_type: one type per token (0..6), or all normal when absent and optional.
absl::StatusOr<std::vector<int>> ReadTokenTypes(const GgufFile& f, size_t n, bool required) {
  absl::StatusOr<const GgufValue*> v = Array(f, kTokenType, required, "an array of integers",
                                             [](const GgufValue& e) { return e.is_integer(); });
  if (!v.ok()) return v.status();
  if (*v == nullptr) return std::vector<int>(n, kNormal);
  const std::vector<GgufValue>& elements = (*v)->elements;
  if (elements.size() != n) {
    return Bad(f, kTokenType,
               absl::StrCat(elements.size(), " types for ", n, " tokens (", kTokens, ")"));
  }
  std::vector<int> types(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = elements[i].i;
    if (t < kUndefined || t > kByte) {
      return Bad(f, absl::StrCat(kTokenType, "[", i, "]"),
                 absl::StrCat(t,
                              " is not a token type (0 undefined, 1 normal, 2 unknown, 3 control, "
                              "4 user-defined, 5 unused, 6 byte)"));
    }
    types[i] = static_cast<int>(t);
  }
  return types;
}

}  // namespace

std::string GgufPreTokenizerNames() {
  std::vector<std::string> names;
  for (const PreType& t : PreTypes()) names.insert(names.end(), t.names.begin(), t.names.end());
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizerFromGguf(const GgufFile& file) {
  const GgufFile& f = file;
  absl::StatusOr<std::optional<std::string>> pre_name = OptionalString(f, kPre);
  if (!pre_name.ok()) return pre_name.status();
  const std::string pre = pre_name->value_or("default");
  const PreType* pre_type = FindPreType(pre);
  if (pre_type == nullptr) {
    return Bad(f, kPre,
               absl::StrCat("'", pre, "' is not a pre-tokenizer moebatch knows; one of ",
                            GgufPreTokenizerNames()));
  }
  absl::flat_hash_map<std::string, int32_t> index;
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokens(f, &index);
  if (!tokens.ok()) return tokens.status();
  const size_t n = tokens->size();
  absl::StatusOr<std::vector<int>> types = ReadTokenTypes(f, n, /*required=*/false);
  if (!types.ok()) return types.status();

  // model: every token at its id (json objects are ordered maps: inserting in key order with a
  // hint is linear), then the merges, checked here so that errors name the GGUF key
  std::vector<int32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return (*tokens)[a] < (*tokens)[b]; });
  json vocab = json::object();
  json::object_t& vocab_map = vocab.get_ref<json::object_t&>();
  for (int32_t i : order) vocab_map.emplace_hint(vocab_map.end(), (*tokens)[i], i);
  absl::StatusOr<const GgufValue*> merges_value =
      Array(f, kMerges, true, "an array of strings",
            [](const GgufValue& e) { return e.type == GgufValueType::kString; });
  if (!merges_value.ok()) return merges_value.status();
  json merges = json::array();
  merges.get_ref<json::array_t&>().reserve((*merges_value)->elements.size());
  std::string joined;
  for (size_t i = 0; i < (*merges_value)->elements.size(); ++i) {
    const std::string& m = (*merges_value)->elements[i].s;
    // llama.cpp splits at the first space after the first byte.
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos) {
      return Bad(f, absl::StrCat(kMerges, "[", i, "]"),
                 absl::StrCat("'", m, "' is not two tokens separated by a space"));
    }
    std::string a = m.substr(0, space), b = m.substr(space + 1);
    for (const std::string* part : {&a, &b}) {
      if (!index.contains(*part)) {
        return Bad(f, absl::StrCat(kMerges, "[", i, "]"),
                   absl::StrCat("'", *part, "' is not a token (", kTokens, ")"));
      }
    }
    joined = a + b;
    if (!index.contains(joined)) {
      return Bad(f, absl::StrCat(kMerges, "[", i, "]"),
                 absl::StrCat("the merged token '", joined, "' is not a token (", kTokens, ")"));
    }
    // tokenizer.json's "a b" form when it is unambiguous (byte-level tokens hold no space).
    if (a.find(' ') == std::string::npos && b.find(' ') == std::string::npos) {
      merges.push_back(m);
    } else {
      merges.push_back(json::array({std::move(a), std::move(b)}));
    }
  }
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", pre_type->ignore_merges},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};

  json added = json::array();
  for (size_t i = 0; i < n; ++i) {
    const int t = (*types)[i];
    if (t != kControl && t != kUnknown && t != kUserDefined) continue;
    added.push_back({{"id", i},
                     {"content", (*tokens)[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", t != kUserDefined}});
  }
  json pre_steps = json::array();
  for (const char* regex : pre_type->regexes) {
    pre_steps.push_back({{"type", "Split"},
                         {"pattern", {{"Regex", regex}}},
                         {"behavior", "Isolated"},
                         {"invert", false}});
  }
  pre_steps.push_back({{"type", "ByteLevel"},
                       {"add_prefix_space", false},
                       {"trim_offsets", false},
                       {"use_regex", false}});
  const json doc = {
      {"version", "1.0"},
      {"added_tokens", std::move(added)},
      {"normalizer", pre_type->nfc ? json{{"type", "NFC"}} : json(nullptr)},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", std::move(pre_steps)}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", std::move(model)},
  };

  // tokenizer_config.json's part: BOS/EOS and whether the post-processor adds them
  absl::StatusOr<std::optional<int32_t>> bos = OptionalId(f, kBosId, n);
  if (!bos.ok()) return bos.status();
  absl::StatusOr<std::optional<int32_t>> eos = OptionalId(f, kEosId, n);
  if (!eos.ok()) return eos.status();
  absl::StatusOr<bool> add_bos = OptionalBool(f, kAddBos, pre_type->add_bos);
  if (!add_bos.ok()) return add_bos.status();
  absl::StatusOr<bool> add_eos = OptionalBool(f, kAddEos, false);
  if (!add_eos.ok()) return add_eos.status();
  if (*add_bos && !*bos) {
    return Bad(
        f, kBosId,
        absl::StrCat("missing, but BOS is to be added (", kAddBos,
                     f.Find(kAddBos) != nullptr ? "" : absl::StrCat(" default for '", pre, "'"),
                     ")"));
  }
  if (*add_eos && !*eos) return Bad(f, kEosId, absl::StrCat("missing, but ", kAddEos, " is true"));
  json config = {{"bos_token", *bos ? json((*tokens)[**bos]) : json(nullptr)},
                 {"eos_token", *eos ? json((*tokens)[**eos]) : json(nullptr)},
                 {"add_bos_token", *add_bos},
                 {"add_eos_token", *add_eos}};
  absl::StatusOr<std::optional<std::string>> chat_template = OptionalString(f, kChatTemplate);
  if (!chat_template.ok()) return chat_template.status();

  const std::string source = absl::StrCat(f.path(), " (tokenizer.ggml.* as tokenizer.json)");
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tok =
      BpeTokenizerLoader::FromTokenizerJson(doc, source);
  if (!tok.ok()) return tok.status();
  if (absl::Status s = BpeTokenizerLoader::ApplyConfig(config, source, source, tok->get());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = BpeTokenizerLoader::CheckSpecialIds(**tok, source); !s.ok()) return s;
  if (*chat_template) {
    BpeTokenizerLoader::SetChatTemplate(
        **std::move(chat_template), absl::StrCat(f.path(), " (", kChatTemplate, ")"), tok->get());
  }
  return tok;
}

absl::StatusOr<GgufSentencePiece> SentencePieceFromGguf(const GgufFile& file) {
  const GgufFile& f = file;
  absl::flat_hash_map<std::string, int32_t> index;
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokens(f, &index);
  if (!tokens.ok()) return tokens.status();
  const size_t n = tokens->size();
  absl::StatusOr<std::vector<int>> types = ReadTokenTypes(f, n, /*required=*/true);
  if (!types.ok()) return types.status();
  absl::StatusOr<const GgufValue*> scores =
      Array(f, kScores, true, "an array of numbers",
            [](const GgufValue& e) { return e.is_float() || e.is_integer(); });
  if (!scores.ok()) return scores.status();
  if ((*scores)->elements.size() != n) {
    return Bad(
        f, kScores,
        absl::StrCat((*scores)->elements.size(), " scores for ", n, " tokens (", kTokens, ")"));
  }
  std::vector<SentencePieceModel::Piece> pieces(n);
  for (size_t i = 0; i < n; ++i) {
    SentencePieceModel::Piece& p = pieces[i];
    p.piece = std::move((*tokens)[i]);
    const GgufValue& s = (*scores)->elements[i];
    p.score = static_cast<float>(s.is_float() ? s.f : static_cast<double>(s.i));
    p.type = (*types)[i] == kUndefined ? kNormal : (*types)[i];
    if (p.type == kUserDefined) {  // convert_hf_to_gguf.py wrote their "▁" as " "
      std::string escaped;
      for (char c : p.piece) {
        if (c == ' ')
          escaped += "\xE2\x96\x81";
        else
          escaped.push_back(c);
      }
      p.piece = std::move(escaped);
    }
  }
  GgufSentencePiece out;
  for (auto [key, id] : {std::pair<const char*, std::optional<int32_t>*>{kBosId, &out.bos_id},
                         {kEosId, &out.eos_id}}) {
    absl::StatusOr<std::optional<int32_t>> v = OptionalId(f, key, n);
    if (!v.ok()) return v.status();
    *id = *v;
  }
  // llama.cpp's unknown id (default 0) is the unknown piece when no token has that type.
  absl::StatusOr<std::optional<int32_t>> unk = OptionalId(f, kUnkId, n);
  if (!unk.ok()) return unk.status();
  bool has_unknown = false;
  for (const SentencePieceModel::Piece& p : pieces) has_unknown = has_unknown || p.type == kUnknown;
  if (!has_unknown) pieces[unk->value_or(0)].type = kUnknown;
  for (auto [key, flag, fallback] :
       {std::tuple<const char*, bool*, bool>{kAddBos, &out.add_bos, true},
        {kAddEos, &out.add_eos, false}}) {
    absl::StatusOr<bool> v = OptionalBool(f, key, fallback);
    if (!v.ok()) return v.status();
    *flag = *v;
  }
  absl::StatusOr<bool> add_space_prefix = OptionalBool(f, kAddSpacePrefix, true);
  if (!add_space_prefix.ok()) return add_space_prefix.status();
  absl::StatusOr<bool> remove_extra = OptionalBool(f, kRemoveExtraWhitespaces, false);
  if (!remove_extra.ok()) return remove_extra.status();
  absl::StatusOr<std::optional<std::string>> chat_template = OptionalString(f, kChatTemplate);
  if (!chat_template.ok()) return chat_template.status();
  out.chat_template = chat_template->value_or("");

  std::string error;
  out.model = SentencePieceModel::FromPieces(pieces, *add_space_prefix, *remove_extra, &error);
  if (out.model == nullptr) {
    return Bad(f, kTokenType,
               absl::StrCat("not a usable sentencepiece vocabulary (", kTokens, ", ", kScores,
                            "): ", error));
  }
  return out;
}

}  // namespace moebatch
