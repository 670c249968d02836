// BpeTokenizer's loading: tokenizer.json (model, normalizer, pre-tokenizer, added tokens,
// post-processor, decoder) and tokenizer_config.json into the structures of
// bpe_tokenizer_internal.h; bpe_tokenizer.cc encodes and decodes with them.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/text/bpe_tokenizer.h"
#include "engine/text/bpe_tokenizer_internal.h"
#include "engine/text/text_regex.h"
#include "engine/text/text_unicode.h"
#include "nlohmann/json.hpp"

namespace moebatch {
namespace {

using json = nlohmann::json;
using bpe_internal::AddedToken;
using bpe_internal::Behavior;
using bpe_internal::BytesCharUtf8;
using bpe_internal::DecoderStep;
using bpe_internal::kGpt2Regex;
using bpe_internal::kIdSpecial;
using bpe_internal::kIdUsed;
using bpe_internal::kWordCharRegex;
using bpe_internal::NormalizerStep;
using bpe_internal::PreTokenizerStep;

absl::Status Bad(const std::string& file, const std::string& field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", field, ": ", message));
}

// The member `key` of an object, or nullptr when it is absent or null.
const json* Member(const json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<bool> GetBool(const json& object, const char* key, bool fallback,
                             const std::string& file, const std::string& field) {
  const json* v = Member(object, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return Bad(file, absl::StrCat(field, ".", key), "expected true or false");
  return v->get<bool>();
}

absl::StatusOr<std::string> GetString(const json& object, const char* key, const std::string& file,
                                      const std::string& field) {
  const json* v = Member(object, key);
  if (v == nullptr) return Bad(file, absl::StrCat(field, ".", key), "missing");
  if (!v->is_string()) return Bad(file, absl::StrCat(field, ".", key), "expected a string");
  return v->get<std::string>();
}

// A single character given as a JSON string (Metaspace's replacement, Strip's content).
absl::StatusOr<char32_t> GetChar(const json& object, const char* key, const std::string& file,
                                 const std::string& field) {
  absl::StatusOr<std::string> s = GetString(object, key, file, field);
  if (!s.ok()) return s.status();
  const size_t len = Utf8CharLength(*s, 0);
  if (s->empty() || len != s->size()) {
    return Bad(file, absl::StrCat(field, ".", key), "expected exactly one character");
  }
  return Utf8Decode(*s, 0, len);
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st))
    return absl::NotFoundError(absl::StrCat("missing ", what, ": ", path));
  if (!std::filesystem::is_regular_file(st)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("cannot open ", what, ": ", path));
  return std::string{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

absl::StatusOr<json> ParseJson(const std::string& text, const std::string& path) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    // Parse again with exceptions for nlohmann's message (the byte offset of the error).
    try {
      const json again = json::parse(text);
      (void)again;
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  }
  if (!doc.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a JSON object"));
  return doc;
}

// A {"String": s} or {"Regex": r} pattern (tokenizers' SplitPattern / ReplacePattern).
absl::StatusOr<TextRegex> GetPattern(const json& object, const std::string& file,
                                     const std::string& field) {
  const json* p = Member(object, "pattern");
  const std::string name = absl::StrCat(field, ".pattern");
  if (p == nullptr || !p->is_object())
    return Bad(file, name, "expected {\"String\": ...} or {\"Regex\": ...}");
  bool literal;
  const json* v;
  if ((v = Member(*p, "String")) != nullptr) {
    literal = true;
  } else if ((v = Member(*p, "Regex")) != nullptr) {
    literal = false;
  } else {
    return Bad(file, name, "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  if (!v->is_string()) return Bad(file, name, "expected a string");
  absl::StatusOr<TextRegex> regex = TextRegex::Compile(v->get<std::string>(), literal);
  if (!regex.ok()) {
    return Bad(file, absl::StrCat(name, literal ? ".String" : ".Regex"), regex.status().message());
  }
  return regex;
}

absl::Status ParseNormalizer(const json& node, const std::string& file, const std::string& field,
                             std::vector<NormalizerStep>* out) {
  absl::StatusOr<std::string> type = GetString(node, "type", file, field);
  if (!type.ok()) return type.status();
  NormalizerStep step;
  if (*type == "Sequence") {
    const json* list = Member(node, "normalizers");
    if (list == nullptr || !list->is_array())
      return Bad(file, field + ".normalizers", "expected a list");
    for (size_t i = 0; i < list->size(); ++i) {
      absl::Status s =
          ParseNormalizer((*list)[i], file, absl::StrCat(field, ".normalizers[", i, "]"), out);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  } else if (*type == "NFC" || *type == "NFD" || *type == "NFKC" || *type == "NFKD") {
    step.kind = NormalizerStep::kUnicode;
    step.form = *type == "NFC"    ? NormalizationForm::kNfc
                : *type == "NFD"  ? NormalizationForm::kNfd
                : *type == "NFKC" ? NormalizationForm::kNfkc
                                  : NormalizationForm::kNfkd;
  } else if (*type == "Prepend") {
    absl::StatusOr<std::string> prepend = GetString(node, "prepend", file, field);
    if (!prepend.ok()) return prepend.status();
    step.kind = NormalizerStep::kPrepend;
    step.text = *prepend;
  } else if (*type == "Replace") {
    absl::StatusOr<TextRegex> regex = GetPattern(node, file, field);
    if (!regex.ok()) return regex.status();
    absl::StatusOr<std::string> content = GetString(node, "content", file, field);
    if (!content.ok()) return content.status();
    step.kind = NormalizerStep::kReplace;
    step.regex = *std::move(regex);
    step.text = *content;
  } else {
    return Bad(
        file, field + ".type",
        absl::StrCat("normalizer '", *type,
                     "' is not supported (NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence)"));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

absl::StatusOr<Behavior> ParseBehavior(const json& node, const std::string& file,
                                       const std::string& field) {
  absl::StatusOr<std::string> b = GetString(node, "behavior", file, field);
  if (!b.ok()) return b.status();
  if (*b == "Removed") return Behavior::kRemoved;
  if (*b == "Isolated") return Behavior::kIsolated;
  if (*b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (*b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (*b == "Contiguous") return Behavior::kContiguous;
  return Bad(file, field + ".behavior", absl::StrCat("unknown behavior '", *b, "'"));
}

absl::Status ParsePreTokenizer(const json& node, const std::string& file, const std::string& field,
                               std::vector<PreTokenizerStep>* out) {
  absl::StatusOr<std::string> type = GetString(node, "type", file, field);
  if (!type.ok()) return type.status();
  PreTokenizerStep step;
  if (*type == "Sequence") {
    const json* list = Member(node, "pretokenizers");
    if (list == nullptr || !list->is_array())
      return Bad(file, field + ".pretokenizers", "expected a list");
    for (size_t i = 0; i < list->size(); ++i) {
      absl::Status s =
          ParsePreTokenizer((*list)[i], file, absl::StrCat(field, ".pretokenizers[", i, "]"), out);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  } else if (*type == "Split") {
    absl::StatusOr<TextRegex> regex = GetPattern(node, file, field);
    if (!regex.ok()) return regex.status();
    absl::StatusOr<Behavior> behavior = ParseBehavior(node, file, field);
    if (!behavior.ok()) return behavior.status();
    absl::StatusOr<bool> invert = GetBool(node, "invert", false, file, field);
    if (!invert.ok()) return invert.status();
    step.kind = PreTokenizerStep::kSplit;
    step.regex = *std::move(regex);
    step.behavior = *behavior;
    step.invert = *invert;
  } else if (*type == "ByteLevel") {
    absl::StatusOr<bool> prefix = GetBool(node, "add_prefix_space", true, file, field);
    if (!prefix.ok()) return prefix.status();
    absl::StatusOr<bool> use_regex = GetBool(node, "use_regex", true, file, field);
    if (!use_regex.ok()) return use_regex.status();
    step.kind = PreTokenizerStep::kByteLevel;
    step.add_prefix_space = *prefix;
    step.use_regex = *use_regex;
    if (step.use_regex) step.regex = *TextRegex::Compile(kGpt2Regex);
  } else if (*type == "Digits") {
    absl::StatusOr<bool> individual = GetBool(node, "individual_digits", false, file, field);
    if (!individual.ok()) return individual.status();
    // char::is_numeric (categories Nd, Nl, No), each character its own match.
    step.kind = PreTokenizerStep::kSplit;
    step.regex = *TextRegex::Compile(R"(\p{N})");
    step.behavior = *individual ? Behavior::kIsolated : Behavior::kContiguous;
  } else if (*type == "Metaspace") {
    absl::StatusOr<char32_t> replacement = GetChar(node, "replacement", file, field);
    if (!replacement.ok()) return replacement.status();
    step.kind = PreTokenizerStep::kMetaspace;
    AppendUtf8(*replacement, &step.replacement);
    step.prepend = PreTokenizerStep::kAlways;
    if (const json* scheme = Member(node, "prepend_scheme")) {
      const std::string s = scheme->is_string() ? scheme->get<std::string>() : "";
      if (s == "always")
        step.prepend = PreTokenizerStep::kAlways;
      else if (s == "first")
        step.prepend = PreTokenizerStep::kFirst;
      else if (s == "never")
        step.prepend = PreTokenizerStep::kNever;
      else
        return Bad(file, field + ".prepend_scheme", "expected \"always\", \"first\" or \"never\"");
    }
    // The older add_prefix_space: false means prepend_scheme never.
    absl::StatusOr<bool> prefix = GetBool(node, "add_prefix_space", true, file, field);
    if (!prefix.ok()) return prefix.status();
    if (!*prefix) step.prepend = PreTokenizerStep::kNever;
    absl::StatusOr<bool> split = GetBool(node, "split", true, file, field);
    if (!split.ok()) return split.status();
    step.split = *split;
    step.behavior = Behavior::kMergedWithNext;
    step.regex = *TextRegex::Compile(step.replacement, /*literal=*/true);
  } else {
    return Bad(file, field + ".type",
               absl::StrCat("pre_tokenizer '", *type,
                            "' is not supported (Split, ByteLevel, Digits, Metaspace, Sequence)"));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParseDecoder(const json& node, const std::string& file, const std::string& field,
                          std::vector<DecoderStep>* out) {
  absl::StatusOr<std::string> type = GetString(node, "type", file, field);
  if (!type.ok()) return type.status();
  DecoderStep step;
  if (*type == "Sequence") {
    const json* list = Member(node, "decoders");
    if (list == nullptr || !list->is_array())
      return Bad(file, field + ".decoders", "expected a list");
    for (size_t i = 0; i < list->size(); ++i) {
      absl::Status s =
          ParseDecoder((*list)[i], file, absl::StrCat(field, ".decoders[", i, "]"), out);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  } else if (*type == "ByteLevel") {
    step.kind = DecoderStep::kByteLevel;
  } else if (*type == "ByteFallback") {
    step.kind = DecoderStep::kByteFallback;
  } else if (*type == "Fuse") {
    step.kind = DecoderStep::kFuse;
  } else if (*type == "Replace") {
    absl::StatusOr<TextRegex> regex = GetPattern(node, file, field);
    if (!regex.ok()) return regex.status();
    absl::StatusOr<std::string> content = GetString(node, "content", file, field);
    if (!content.ok()) return content.status();
    step.kind = DecoderStep::kReplace;
    const json& pattern = node["pattern"];
    step.literal = Member(pattern, "String") != nullptr;
    if (step.literal) step.pattern = pattern["String"].get<std::string>();
    step.regex = *std::move(regex);
    step.content = *content;
  } else if (*type == "Strip") {
    absl::StatusOr<char32_t> content = GetChar(node, "content", file, field);
    if (!content.ok()) return content.status();
    const json* start = Member(node, "start");
    const json* stop = Member(node, "stop");
    if (start == nullptr || !start->is_number_unsigned() || stop == nullptr ||
        !stop->is_number_unsigned()) {
      return Bad(file, field, "Strip needs unsigned integers start and stop");
    }
    step.kind = DecoderStep::kStrip;
    step.strip = *content;
    step.start = start->get<size_t>();
    step.stop = stop->get<size_t>();
  } else if (*type == "Metaspace") {
    absl::StatusOr<char32_t> replacement = GetChar(node, "replacement", file, field);
    if (!replacement.ok()) return replacement.status();
    step.kind = DecoderStep::kMetaspace;
    AppendUtf8(*replacement, &step.replacement);
    std::string scheme = "always";
    if (const json* s = Member(node, "prepend_scheme"); s != nullptr && s->is_string()) {
      scheme = s->get<std::string>();
    }
    absl::StatusOr<bool> prefix = GetBool(node, "add_prefix_space", true, file, field);
    if (!prefix.ok()) return prefix.status();
    step.prepend_never = scheme == "never" || !*prefix;
  } else {
    return Bad(file, field + ".type",
               absl::StrCat("decoder '", *type,
                            "' is not supported (ByteLevel, ByteFallback, Fuse, Replace, Strip, "
                            "Metaspace, Sequence)"));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

// The ids one post-processor puts before and after a single sequence.
absl::Status ParsePostProcessor(const json& node, const std::string& file, const std::string& field,
                                std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) {
  absl::StatusOr<std::string> type = GetString(node, "type", file, field);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    const json* list = Member(node, "processors");
    if (list == nullptr || !list->is_array())
      return Bad(file, field + ".processors", "expected a list");
    for (size_t i = 0; i < list->size(); ++i) {
      // Each processor wraps what the previous ones produced.
      std::vector<int32_t> p, s;
      absl::Status st =
          ParsePostProcessor((*list)[i], file, absl::StrCat(field, ".processors[", i, "]"), &p, &s);
      if (!st.ok()) return st;
      prefix->insert(prefix->begin(), p.begin(), p.end());
      suffix->insert(suffix->end(), s.begin(), s.end());
    }
    return absl::OkStatus();
  }
  if (*type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (*type == "RobertaProcessing" || *type == "BertProcessing") {
    // "cls": ["<s>", 0], "sep": ["</s>", 2]
    for (const char* key : {"cls", "sep"}) {
      const json* v = Member(node, key);
      if (v == nullptr || !v->is_array() || v->size() != 2 || !(*v)[1].is_number_integer()) {
        return Bad(file, absl::StrCat(field, ".", key), "expected [token, id]");
      }
      (std::string(key) == "cls" ? prefix : suffix)->push_back((*v)[1].get<int32_t>());
    }
    return absl::OkStatus();
  }
  if (*type == "TemplateProcessing") {
    const json* single = Member(node, "single");
    if (single == nullptr || !single->is_array())
      return Bad(file, field + ".single", "expected a list");
    const json* specials = Member(node, "special_tokens");
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& item = (*single)[i];
      const std::string item_field = absl::StrCat(field, ".single[", i, "]");
      if (Member(item, "Sequence") != nullptr) {
        if (seen_sequence) return Bad(file, item_field, "a second sequence in the single template");
        seen_sequence = true;
        continue;
      }
      const json* special = Member(item, "SpecialToken");
      if (special == nullptr) return Bad(file, item_field, "expected SpecialToken or Sequence");
      absl::StatusOr<std::string> name =
          GetString(*special, "id", file, item_field + ".SpecialToken");
      if (!name.ok()) return name.status();
      const json* entry = specials != nullptr ? Member(*specials, name->c_str()) : nullptr;
      const json* ids = entry != nullptr ? Member(*entry, "ids") : nullptr;
      if (ids == nullptr || !ids->is_array()) {
        return Bad(file, absl::StrCat(field, ".special_tokens"),
                   absl::StrCat("no ids for '", *name, "'"));
      }
      for (const json& id : *ids) {
        if (!id.is_number_integer())
          return Bad(file, absl::StrCat(field, ".special_tokens.", *name), "ids must be integers");
        (seen_sequence ? suffix : prefix)->push_back(id.get<int32_t>());
      }
    }
    return absl::OkStatus();
  }
  return Bad(file, field + ".type",
             absl::StrCat("post_processor '", *type,
                          "' is not supported (TemplateProcessing, RobertaProcessing, "
                          "BertProcessing, ByteLevel, Sequence)"));
}

// A token given as a string or an AddedToken object ({"content": ...}) in tokenizer_config.json.
absl::StatusOr<std::string> ConfigToken(const json& config, const char* key,
                                        const std::string& file) {
  const json* v = Member(config, key);
  if (v == nullptr) return std::string();
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object()) {
    const json* content = Member(*v, "content");
    if (content != nullptr && content->is_string()) return content->get<std::string>();
  }
  return Bad(file, key, "expected a string or an object with \"content\"");
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::LoadFromDirectory(
    const std::string& dir) {
  const std::string config = dir + "/tokenizer_config.json";
  std::error_code ec;
  return Load(dir + "/tokenizer.json",
              std::filesystem::exists(config, ec) ? config : std::string());
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Load(
    const std::string& tokenizer_json_path, const std::string& tokenizer_config_path) {
  const std::string& file = tokenizer_json_path;
  absl::StatusOr<std::string> text = ReadFile(file, "tokenizer.json");
  if (!text.ok()) return text.status();
  absl::StatusOr<json> parsed = ParseJson(*text, file);
  if (!parsed.ok()) return parsed.status();
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> loaded =
      BpeTokenizerLoader::FromTokenizerJson(*parsed, file);
  if (!loaded.ok()) return loaded.status();
  std::unique_ptr<BpeTokenizer> tok = *std::move(loaded);
  if (!tokenizer_config_path.empty()) {
    const std::string& cfile = tokenizer_config_path;
    absl::StatusOr<std::string> ctext = ReadFile(cfile, "tokenizer_config.json");
    if (!ctext.ok()) return ctext.status();
    absl::StatusOr<json> config = ParseJson(*ctext, cfile);
    if (!config.ok()) return config.status();
    absl::Status s = BpeTokenizerLoader::ApplyConfig(*config, cfile, file, tok.get());
    if (!s.ok()) return s;
  }
  if (absl::Status s = BpeTokenizerLoader::CheckSpecialIds(*tok, file); !s.ok()) return s;
  if (tok->chat_template_.empty()) {
    const std::string jinja =
        (std::filesystem::path(file).parent_path() / "chat_template.jinja").string();
    std::error_code jec;
    if (std::filesystem::is_regular_file(jinja, jec)) {
      absl::StatusOr<std::string> t = ReadFile(jinja, "chat_template.jinja");
      if (!t.ok()) return t.status();
      tok->chat_template_ = *t;
      tok->chat_template_file_ = jinja;
    }
  }
  return tok;
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizerLoader::FromTokenizerJson(
    const json& doc, const std::string& file) {
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  using Impl = BpeTokenizer::Impl;
  Impl& m = *tok->impl_;
  m.word_char = *TextRegex::Compile(kWordCharRegex);

  // ---- model
  const json* model = Member(doc, "model");
  if (model == nullptr || !model->is_object()) return Bad(file, "model", "missing");
  absl::StatusOr<std::string> type = GetString(*model, "type", file, "model");
  if (!type.ok()) return type.status();
  if (*type != "BPE") {
    return Bad(
        file, "model.type",
        absl::StrCat("'", *type, "' is not supported (moebatch reads BPE tokenizer.json files)"));
  }
  if (const json* dropout = Member(*model, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return Bad(file, "model.dropout", "BPE dropout is not supported (expected null)");
  }
  const json* vocab = Member(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object())
    return Bad(file, "model.vocab", "expected an object of token: id");
  int32_t max_id = -1;
  m.vocab.reserve(vocab->size());
  std::vector<std::pair<int32_t, const std::string*>> by_id;
  by_id.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > (1 << 30)) {
      return Bad(file, absl::StrCat("model.vocab[\"", it.key(), "\"]"), "expected an id >= 0");
    }
    const int32_t id = it.value().get<int32_t>();
    m.vocab[it.key()] = id;
    max_id = std::max(max_id, id);
    by_id.emplace_back(id, &it.key());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json* v = Member(*model, key)) {
      if (!v->is_string())
        return Bad(file, absl::StrCat("model.", key), "expected a string or null");
      (std::string(key) == "continuing_subword_prefix" ? m.continuing_subword_prefix
                                                       : m.end_of_word_suffix) =
          v->get<std::string>();
    }
  }
  for (auto [key, flag] : {std::pair<const char*, bool*>{"fuse_unk", &m.fuse_unk},
                           {"byte_fallback", &m.byte_fallback},
                           {"ignore_merges", &m.ignore_merges}}) {
    absl::StatusOr<bool> v = GetBool(*model, key, false, file, "model");
    if (!v.ok()) return v.status();
    *flag = *v;
  }
  if (const json* unk = Member(*model, "unk_token")) {
    if (!unk->is_string()) return Bad(file, "model.unk_token", "expected a string or null");
    m.unk_token = unk->get<std::string>();
    const auto it = m.vocab.find(*m.unk_token);
    if (it == m.vocab.end()) {
      return Bad(file, "model.unk_token",
                 absl::StrCat("'", *m.unk_token, "' is not in model.vocab"));
    }
    m.unk_id = it->second;
  }
  // merges: ["a b", ...] (legacy; "#version" lines skipped) or [["a", "b"], ...]
  const json* merges = Member(*model, "merges");
  if (merges == nullptr || !merges->is_array()) return Bad(file, "model.merges", "expected a list");
  const size_t prefix_len = m.continuing_subword_prefix.size();
  uint32_t rank = 0;
  std::string merged;
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& entry = (*merges)[i];
    const std::string field = absl::StrCat("model.merges[", i, "]");
    std::string a, b;
    if (entry.is_string()) {
      const std::string& line = entry.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return Bad(file, field,
                   absl::StrCat("'", line, "' is not two tokens separated by one space"));
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      a = entry[0].get<std::string>();
      b = entry[1].get<std::string>();
    } else {
      return Bad(file, field, "expected \"a b\" or [\"a\", \"b\"]");
    }
    const auto ia = m.vocab.find(a);
    if (ia == m.vocab.end())
      return Bad(file, field, absl::StrCat("'", a, "' is not in model.vocab"));
    const auto ib = m.vocab.find(b);
    if (ib == m.vocab.end())
      return Bad(file, field, absl::StrCat("'", b, "' is not in model.vocab"));
    merged = a;
    merged.append(b, std::min(prefix_len, b.size()), std::string::npos);
    const auto in = m.vocab.find(merged);
    if (in == m.vocab.end()) {
      return Bad(file, field,
                 absl::StrCat("the merged token '", merged, "' is not in model.vocab"));
    }
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                         static_cast<uint32_t>(ib->second);
    m.merges[key] = {rank++, in->second};  // a later duplicate takes its rank, as HF's HashMap
  }
  for (int b = 0; b < 256; ++b) {
    char code[8];
    std::snprintf(code, sizeof(code), "<0x%02X>", b);
    const auto it = m.vocab.find(code);
    m.byte_token[b] = it == m.vocab.end() ? -1 : it->second;
    const auto jt = m.vocab.find(BytesCharUtf8()[b]);
    m.byte_char_id[b] = jt == m.vocab.end() ? -1 : jt->second;
  }

  // ---- normalizer, pre-tokenizer, decoder
  if (const json* n = Member(doc, "normalizer")) {
    absl::Status s = ParseNormalizer(*n, file, "normalizer", &m.normalizer);
    if (!s.ok()) return s;
  }
  if (const json* p = Member(doc, "pre_tokenizer")) {
    absl::Status s = ParsePreTokenizer(*p, file, "pre_tokenizer", &m.pre_tokenizer);
    if (!s.ok()) return s;
  }
  m.last_step_byte_level = !m.pre_tokenizer.empty() &&
                           m.pre_tokenizer.back().kind == PreTokenizerStep::kByteLevel &&
                           prefix_len == 0 && m.end_of_word_suffix.empty();
  if (const json* d = Member(doc, "decoder")) {
    absl::Status s = ParseDecoder(*d, file, "decoder", &m.decoder);
    if (!s.ok()) return s;
  } else {
    DecoderStep join;
    join.kind = DecoderStep::kJoinSpace;
    m.decoder.push_back(std::move(join));
  }
  bool fused = false;
  for (DecoderStep& step : m.decoder) {
    step.fused = fused;
    if (step.kind == DecoderStep::kByteLevel || step.kind == DecoderStep::kFuse ||
        step.kind == DecoderStep::kJoinSpace) {
      fused = true;
    }
  }

  // ---- added tokens (ids as AddedVocabulary::add_tokens assigns them: the vocabulary's id when
  // the content is in it, else the next id after the model's vocabulary)
  int32_t next_id = static_cast<int32_t>(m.vocab.size());
  if (const json* added = Member(doc, "added_tokens")) {
    if (!added->is_array()) return Bad(file, "added_tokens", "expected a list");
    for (size_t i = 0; i < added->size(); ++i) {
      const json& t = (*added)[i];
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      AddedToken token;
      absl::StatusOr<std::string> content = GetString(t, "content", file, field);
      if (!content.ok()) return content.status();
      token.content = *content;
      if (token.content.empty()) continue;
      for (auto [key, flag, fallback] :
           {std::tuple<const char*, bool*, bool>{"single_word", &token.single_word, false},
            {"lstrip", &token.lstrip, false},
            {"rstrip", &token.rstrip, false},
            {"special", &token.special, false}}) {
        absl::StatusOr<bool> v = GetBool(t, key, fallback, file, field);
        if (!v.ok()) return v.status();
        *flag = *v;
      }
      absl::StatusOr<bool> normalized = GetBool(t, "normalized", !token.special, file, field);
      if (!normalized.ok()) return normalized.status();
      token.normalized = *normalized;
      if (const auto it = m.added_ids.find(token.content); it != m.added_ids.end()) {
        token.id = m.added[it->second].id;
        m.added[it->second] = token;  // the later entry's flags win
        continue;
      }
      if (const auto it = m.vocab.find(token.content); it != m.vocab.end()) {
        token.id = it->second;
      } else {
        token.id = next_id++;
      }
      m.added_ids[token.content] = static_cast<int32_t>(m.added.size());
      m.added.push_back(token);
    }
  }
  for (const AddedToken& t : m.added) max_id = std::max(max_id, t.id);

  // Per-id strings: the model's vocabulary, then the added tokens (an added token's decode
  // string is its normalized content when it is normalized, as HF's normalized_cache).
  tok->id_text_.assign(static_cast<size_t>(max_id + 1), std::string());
  tok->id_flags_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [id, token] : by_id) {
    tok->id_text_[id] = *token;
    tok->id_flags_[id] = kIdUsed;
  }
  for (size_t i = 0; i < m.added.size(); ++i) {
    const AddedToken& t = m.added[i];
    std::string surface = t.content;
    if (t.normalized) surface = m.Normalize(t.content);
    (t.normalized ? m.normalized_trie : m.raw_trie).Insert(surface, static_cast<int32_t>(i));
    tok->id_text_[t.id] = surface;
    tok->id_flags_[t.id] |= kIdUsed;
    if (t.special) m.special_contents.insert(t.content);
  }
  for (size_t id = 0; id < tok->id_text_.size(); ++id) {
    if ((tok->id_flags_[id] & kIdUsed) && m.special_contents.contains(tok->id_text_[id])) {
      tok->id_flags_[id] |= kIdSpecial;
    }
  }

  // ---- post-processor
  if (const json* p = Member(doc, "post_processor")) {
    absl::Status s =
        ParsePostProcessor(*p, file, "post_processor", &tok->prefix_ids_, &tok->suffix_ids_);
    if (!s.ok()) return s;
  }

  return tok;
}

absl::Status BpeTokenizerLoader::ApplyConfig(const json& config, const std::string& cfile,
                                             const std::string& file, BpeTokenizer* tok) {
  absl::StatusOr<std::string> bos = ConfigToken(config, "bos_token", cfile);
  if (!bos.ok()) return bos.status();
  absl::StatusOr<std::string> eos = ConfigToken(config, "eos_token", cfile);
  if (!eos.ok()) return eos.status();
  tok->bos_token_ = *bos;
  tok->eos_token_ = *eos;
  absl::StatusOr<bool> split =
      GetBool(config, "split_special_tokens", false, cfile, "tokenizer_config");
  if (!split.ok()) return split.status();
  tok->split_special_tokens_ = *split;
  if (const json* tmpl = Member(config, "chat_template")) {
    if (tmpl->is_string()) {
      tok->chat_template_ = tmpl->get<std::string>();
      tok->chat_template_file_ = cfile;
    } else if (tmpl->is_array()) {
      for (const json& entry : *tmpl) {
        const json* name = Member(entry, "name");
        const json* body = Member(entry, "template");
        if (name != nullptr && name->is_string() && name->get<std::string>() == "default" &&
            body != nullptr && body->is_string()) {
          tok->chat_template_ = body->get<std::string>();
          tok->chat_template_file_ = cfile;
        }
      }
    } else {
      return Bad(cfile, "chat_template", "expected a string or a list of {name, template}");
    }
  }
  const bool has_add_bos = Member(config, "add_bos_token") != nullptr;
  const bool has_add_eos = Member(config, "add_eos_token") != nullptr;
  if (has_add_bos || has_add_eos) {
    absl::StatusOr<bool> add_bos =
        GetBool(config, "add_bos_token", false, cfile, "tokenizer_config");
    if (!add_bos.ok()) return add_bos.status();
    absl::StatusOr<bool> add_eos =
        GetBool(config, "add_eos_token", false, cfile, "tokenizer_config");
    if (!add_eos.ok()) return add_eos.status();
    tok->prefix_ids_.clear();
    tok->suffix_ids_.clear();
    for (auto [flag, token, list, key] :
         {std::tuple<bool, const std::string*, std::vector<int32_t>*, const char*>{
              *add_bos, &tok->bos_token_, &tok->prefix_ids_, "bos_token"},
          {*add_eos, &tok->eos_token_, &tok->suffix_ids_, "eos_token"}}) {
      if (!flag || token->empty()) continue;
      const int32_t id = tok->TokenToId(*token);
      if (id < 0) return Bad(cfile, key, absl::StrCat("'", *token, "' is not a token of ", file));
      list->push_back(id);
    }
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizerLoader::CheckSpecialIds(const BpeTokenizer& tok, const std::string& file) {
  for (const std::vector<int32_t>* list : {&tok.prefix_ids_, &tok.suffix_ids_}) {
    for (int32_t id : *list) {
      if (id < 0 || id >= tok.vocab_size()) {
        return Bad(file, "post_processor", absl::StrCat("id ", id, " is outside the vocabulary"));
      }
    }
  }
  return absl::OkStatus();
}

void BpeTokenizerLoader::SetChatTemplate(std::string text, std::string source, BpeTokenizer* tok) {
  tok->chat_template_ = std::move(text);
  tok->chat_template_file_ = std::move(source);
}

}  // namespace moebatch
