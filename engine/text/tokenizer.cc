// Tokenizer: Mixtral's sentencepiece tokenizer.model or a Hugging Face tokenizer.json BPE
// tokenizer (bpe_tokenizer.cc) behind moebatch's API, the Mistral instruct chat layouts
// (mistral-common v1 and v3), and streaming detokenization.
//
// The rest of this comment is about sentencepiece; tokenizer.json tokenizers stream through
// BpeDecodeStream (bpe_tokenizer.h).
//
// Streaming detokenization. sentencepiece's Decode concatenates piece surfaces left to right with
// two kinds of context: (1) the leading "▁" of the first non-control piece is dropped; (2) a run of
// byte-fallback pieces (<0xE3><0x81><0x82>) is joined and split greedily into UTF-8 characters,
// each byte that forms none becoming U+FFFD. So the text of ids[0, m) is final -- a prefix of the
// text of every longer sequence -- once m is a character boundary: ids[m-1] is not a byte piece, or
// the byte run before m ends with a complete character or with bytes that can never become one.
// StreamingDetokenizer keeps read_offset_ at such a boundary. Add() finds the last boundary m (it
// holds back at most the 3 bytes of an unfinished character), decodes only ids[read_offset_, m) and
// releases that text. Decoded out of context, that window would lose the space of its first piece
// whenever the released ids already hold a non-control piece. vLLM and HF's TextStreamer keep some
// released ids in front of the window for this (prefix_offset); we put one fixed piece there
// instead, <unk>: its surface (" ⁇ ") does not depend on context, it is neither control nor byte
// (so it ends the "first piece" state and starts no byte run), and it is cut off again. Work per
// Add(): one decode of at most 5 ids, independent of the sequence length.

#include "engine/text/tokenizer.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <system_error>
#include <tuple>
#include <utility>

#include "absl/base/config.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/gguf.h"
#include "engine/text/chat_layout.h"
#include "engine/text/gguf_tokenizer.h"
#include "engine/text/sentencepiece_model.h"
#include "nlohmann/json.hpp"

namespace moebatch {
namespace {

constexpr char kSystem[] = "system";
constexpr char kUser[] = "user";
constexpr char kAssistant[] = "assistant";

// Returns the offset of the first byte that is not part of well-formed UTF-8, or npos.
size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
    } else {
      return i;
    }
    if (i + len > s.size()) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char t = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (t < lo || t > hi) : (t & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

absl::Status CheckContent(const std::vector<ChatMessage>& messages, size_t i) {
  const size_t bad = FindInvalidUtf8(messages[i].content);
  if (bad == std::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("messages[", i, "].content: not valid UTF-8 (byte ", bad, ")"));
}

// The byte of a byte-fallback piece ("<0xE3>" -> 0xE3), or -1 for any other id.
int ByteOf(const SentencePieceModel& sp, int id) {
  if (!sp.IsByte(id)) return -1;
  const std::string& piece = sp.IdToPiece(id);
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  int value = 0;
  for (size_t k = 3; k < 5; ++k) {
    const char h = piece[k];
    const int digit = h >= '0' && h <= '9'   ? h - '0'
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10
                      : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                             : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// Decodes ids[begin, end) as they decode inside the whole sequence, given that `begin` is a
// character boundary and `*started` says whether ids[0, begin) holds a non-control piece (then
// <unk> stands in front for that released text and its surface is cut off again). Ids outside the
// vocabulary decode as <unk>, as in Tokenizer::Decode. Updates *started.
std::string DecodeWindow(const SentencePieceModel& sp, const std::string& unk_surface,
                         const std::vector<int32_t>& ids, size_t begin, size_t end, bool* started) {
  const int32_t vocab = sp.GetPieceSize();
  const bool anchored = *started;
  std::vector<int32_t> window;
  window.reserve(end - begin + 1);
  if (anchored) window.push_back(sp.unk_id());
  for (size_t i = begin; i < end; ++i) {
    const int piece = ids[i] >= 0 && ids[i] < vocab ? ids[i] : sp.unk_id();
    window.push_back(piece);
    if (!sp.IsControl(piece)) *started = true;
  }
  std::string text = sp.DecodeIds(window);
  if (anchored) text.erase(0, std::min(unk_surface.size(), text.size()));
  return text;
}

}  // namespace

const char* ChatFormatName(ChatFormat format) {
  switch (format) {
    case ChatFormat::kMistralV1:
      return "mistral-v1";
    case ChatFormat::kMistralV3:
      return "mistral-v3";
    case ChatFormat::kNone:
      return "none";
  }
  return "?";
}

namespace {

// config.json's `key` (an id, or the first of a list of ids) in `dir`, or nullopt.
std::optional<int32_t> ConfigTokenId(const std::string& dir, const char* key) {
  std::ifstream in(dir + "/config.json", std::ios::binary);
  if (!in) return std::nullopt;
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return std::nullopt;
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  const nlohmann::json& v = it->is_array() && !it->empty() ? (*it)[0] : *it;
  if (!v.is_number_integer()) return std::nullopt;
  return v.get<int32_t>();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadFromModelDir(
    const std::string& model_dir, std::optional<int32_t> bos_id, std::optional<int32_t> eos_id,
    const std::string& chat_template_name) {
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("missing model directory: ", model_dir));
  }
  const std::string json_path = model_dir + "/tokenizer.json";
  const std::string model_path = model_dir + "/tokenizer.model";
  if (std::filesystem::exists(json_path, ec)) {
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> bpe = BpeTokenizer::LoadFromDirectory(model_dir);
    if (!bpe.ok()) return bpe.status();
    return FromBpe(*std::move(bpe), bos_id, eos_id, chat_template_name, json_path, model_dir);
  }
  if (!chat_template_name.empty() && chat_template_name != "mistral-v1" &&
      chat_template_name != "mistral-v3") {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat_template: ", model_dir,
                     " has a sentencepiece tokenizer, whose chat layout is "
                     "chosen from its vocabulary (mistral-v1 or mistral-v3); '",
                     chat_template_name, "' is for tokenizer.json models"));
  }
  if (!std::filesystem::exists(model_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("no tokenizer in ", model_dir,
                     ": expected tokenizer.json (Hugging Face tokenizers) or "
                     "tokenizer.model (sentencepiece)"));
  }
  // sentencepiece: the ids given, else config.json's, else the pieces <s> and </s>.
  if (!bos_id) bos_id = ConfigTokenId(model_dir, "bos_token_id");
  if (!eos_id) eos_id = ConfigTokenId(model_dir, "eos_token_id");
  if (!bos_id || !eos_id) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> probe = Load(model_path, 0, 0);
    if (!probe.ok()) return probe.status();
    if (!bos_id) bos_id = (*probe)->sp_->PieceToId("<s>");
    if (!eos_id) eos_id = (*probe)->sp_->PieceToId("</s>");
  }
  return Load(model_path, *bos_id, *eos_id);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromBpe(std::unique_ptr<BpeTokenizer> bpe,
                                                              std::optional<int32_t> bos_id,
                                                              std::optional<int32_t> eos_id,
                                                              const std::string& chat_template_name,
                                                              const std::string& source,
                                                              const std::string& model_dir) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->bpe_ = std::move(bpe);
  tok->chat_format_ = ChatFormat::kNone;
  const int32_t n = tok->bpe_->vocab_size();
  for (auto [name, given, from_config, key, out] :
       {std::tuple<const char*, std::optional<int32_t>, int32_t, const char*, int32_t*>{
            "bos_id", bos_id, tok->bpe_->bos_token_id(), "bos_token_id", &tok->bos_id_},
        {"eos_id", eos_id, tok->bpe_->eos_token_id(), "eos_token_id", &tok->eos_id_}}) {
    if (given) {
      if (*given < 0 || *given >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " ", *given, " is outside the vocabulary [0, ", n, ") of ", source));
      }
      *out = *given;
    } else if (from_config >= 0) {
      *out = from_config;
    } else {
      const std::optional<int32_t> id =
          model_dir.empty() ? std::nullopt : ConfigTokenId(model_dir, key);
      *out = id && *id >= 0 && *id < n ? *id : -1;
    }
  }
  // The chat layout: the override, else the model's template recognised.
  if (!chat_template_name.empty()) {
    const std::optional<ChatLayout> named = ChatLayoutFromName(chat_template_name);
    if (!named) {
      return absl::InvalidArgumentError(absl::StrCat("--chat_template: '", chat_template_name,
                                                     "' is not a chat layout; one of ",
                                                     ChatLayoutNameList()));
    }
    tok->chat_layout_ = static_cast<int>(*named);
  } else if (!tok->bpe_->chat_template().empty()) {
    absl::StatusOr<ChatLayout> found = RecogniseChatTemplate(tok->bpe_->chat_template());
    if (found.ok()) {
      tok->chat_layout_ = static_cast<int>(*found);
    } else {
      // Prompts still run; chat requests are refused with this reason (EncodeChat), which
      // names the file the template came from and the override flag.
      tok->chat_layout_error_ =
          absl::StrCat(tok->bpe_->chat_template_file(), ": ", found.status().message());
    }
  }
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadFromGguf(
    const GgufFile& file, std::optional<int32_t> bos_id, std::optional<int32_t> eos_id,
    const std::string& chat_template_name) {
  constexpr char kModelKey[] = "tokenizer.ggml.model";
  const GgufValue* model = file.Find(kModelKey);
  if (model == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(file.path(), ": ", kModelKey, ": missing (no tokenizer in this GGUF file)"));
  }
  if (model->type != GgufValueType::kString) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", kModelKey,
                                                   ": expected a string, found ",
                                                   GgufValueTypeName(model->type)));
  }
  if (model->s == "gpt2") {
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> bpe = BpeTokenizerFromGguf(file);
    if (!bpe.ok()) return bpe.status();
    return FromBpe(*std::move(bpe), bos_id, eos_id, chat_template_name, file.path(),
                   /*model_dir=*/"");
  }
  if (model->s != "llama") {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": ", kModelKey, ": '", model->s,
                     "' is not supported (gpt2: byte-level BPE, llama: sentencepiece)"));
  }
  if (!chat_template_name.empty() && chat_template_name != "mistral-v1" &&
      chat_template_name != "mistral-v3") {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat_template: ", file.path(),
                     " has a sentencepiece tokenizer, whose chat layout is "
                     "chosen from its vocabulary (mistral-v1 or mistral-v3); '",
                     chat_template_name, "' is for byte-level BPE models"));
  }
  absl::StatusOr<GgufSentencePiece> sp = SentencePieceFromGguf(file);
  if (!sp.ok()) return sp.status();
  for (auto [given, from_file, piece, key] :
       {std::tuple<std::optional<int32_t>*, std::optional<int32_t>, const char*, const char*>{
            &bos_id, sp->bos_id, "<s>", "tokenizer.ggml.bos_token_id"},
        {&eos_id, sp->eos_id, "</s>", "tokenizer.ggml.eos_token_id"}}) {
    if (*given) continue;
    *given = from_file ? *from_file : sp->model->PieceToId(piece);
    if (**given < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": ", key, ": missing, and no piece is '", piece, "'"));
    }
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      FromSentencePiece(std::move(sp->model), *bos_id, *eos_id, file.path());
  if (!tok.ok()) return tok.status();
  (*tok)->sp_add_bos_ = sp->add_bos;
  (*tok)->sp_add_eos_ = sp->add_eos;
  return tok;
}

std::string Tokenizer::chat_layout_name() const {
  if (bpe_ != nullptr) {
    if (chat_layout_) return ChatLayoutName(static_cast<ChatLayout>(*chat_layout_));
    return chat_layout_error_.empty() ? "none" : "none (the chat template is not recognised)";
  }
  return ChatFormatName(chat_format_);
}

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_path,
                                                           int32_t bos_id, int32_t eos_id) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(model_path, ec);
  if (!std::filesystem::exists(st)) {
    return absl::NotFoundError(absl::StrCat("missing tokenizer: ", model_path));
  }
  if (!std::filesystem::is_regular_file(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a sentencepiece model: ", model_path, " is not a regular file"));
  }
  std::ifstream in(model_path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("cannot open tokenizer: ", model_path));
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};

  std::string error;
  std::unique_ptr<SentencePieceModel> sp = SentencePieceModel::FromSerialized(bytes, &error);
  if (sp == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a sentencepiece model: ", model_path, ": ", error));
  }
  return FromSentencePiece(std::move(sp), bos_id, eos_id, model_path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromSentencePiece(
    std::unique_ptr<SentencePieceModel> sp_model, int32_t bos_id, int32_t eos_id,
    const std::string& source) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->sp_ = std::move(sp_model);
  const int32_t n = tok->sp_->GetPieceSize();
  if (n <= 0 || tok->sp_->unk_id() < 0 || tok->sp_->unk_id() >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a usable sentencepiece model: ", source, " (", n, " pieces)"));
  }
  for (const auto& [name, id] : {std::pair<const char*, int32_t>{"bos_id", bos_id},
                                 std::pair<const char*, int32_t>{"eos_id", eos_id}}) {
    if (id < 0 || id >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " ", id, " is outside the vocabulary [0, ", n, ") of ", source));
    }
  }
  tok->bos_id_ = bos_id;
  tok->eos_id_ = eos_id;
  tok->unk_surface_ = tok->sp_->DecodeIds({tok->sp_->unk_id()});
  // The instruct layout: [INST]/[/INST] as control pieces mean mistral-common v2+ (tokens, not
  // text); without them, v1.
  const SentencePieceModel& sp = *tok->sp_;
  auto control = [&](const char* piece) {
    const int32_t id = sp.PieceToId(piece);
    return id >= 0 && sp.IsControl(id) ? id : -1;
  };
  tok->inst_id_ = control("[INST]");
  tok->end_inst_id_ = control("[/INST]");
  if (tok->inst_id_ >= 0 && tok->end_inst_id_ >= 0) {
    tok->chat_format_ = ChatFormat::kMistralV3;
    tok->system_prompt_tokens_ = control("[SYSTEM_PROMPT]") >= 0;
  }
  return tok;
}

int32_t Tokenizer::vocab_size() const {
  return bpe_ != nullptr ? bpe_->vocab_size() : sp_->GetPieceSize();
}

int32_t Tokenizer::TokenToId(std::string_view token) const {
  return bpe_ != nullptr ? bpe_->TokenToId(token) : sp_->PieceToId(token);
}

const std::string& Tokenizer::chat_template() const {
  static const std::string kNoTemplate;
  return bpe_ != nullptr ? bpe_->chat_template() : kNoTemplate;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  if (bpe_ != nullptr) {
    return bpe_->Encode(text,
                        BpeEncodeOptions{options.add_special_tokens, options.parse_special_tokens});
  }
  return Encode(text, options.add_special_tokens);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  if (bpe_ != nullptr) {
    return bpe_->Encode(text, BpeEncodeOptions{add_bos, !bpe_->split_special_tokens()});
  }
  const std::vector<int32_t> pieces = sp_->Encode(text);
  std::vector<int32_t> ids;
  ids.reserve(pieces.size() + (add_bos ? 2 : 0));
  if (add_bos && sp_add_bos_) ids.push_back(bos_id_);
  ids.insert(ids.end(), pieces.begin(), pieces.end());
  if (add_bos && sp_add_eos_) ids.push_back(eos_id_);
  return ids;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeChat(
    const std::vector<ChatMessage>& messages) const {
  if (bpe_ != nullptr) {
    if (!chat_layout_) {
      if (!chat_layout_error_.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("messages: ", chat_layout_error_, " (or send prompts)"));
      }
      return absl::InvalidArgumentError(
          "messages: this model has no chat template (tokenizer_config.json chat_template, "
          "chat_template.jinja, or a GGUF file's tokenizer.chat_template): send prompts, or start "
          "the engine with --chat_template NAME (" +
          ChatLayoutNameList() + ")");
    }
    absl::StatusOr<std::string> text = RenderChat(static_cast<ChatLayout>(*chat_layout_), messages,
                                                  /*add_generation_prompt=*/true);
    if (!text.ok()) return text.status();
    EncodeOptions options;
    options.add_special_tokens = false;  // apply_chat_template's tokenization
    options.parse_special_tokens = true;
    return Encode(*text, options);
  }
  // Validate everything before encoding anything.
  size_t first = 0;  // index of the first user message
  if (!messages.empty() && messages[0].role == kSystem) {
    if (absl::Status s = CheckContent(messages, 0); !s.ok()) return s;
    first = 1;
  }
  if (messages.size() == first) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages[", first, "]: missing; expected a 'user' message",
                     first == 0 ? " (the conversation is empty)" : " after the system message"));
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    const char* expected = (i - first) % 2 == 0 ? kUser : kAssistant;
    if (role != kUser && role != kAssistant && role != kSystem) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].role: unknown role '", role,
                                                     "'; expected '", expected, "'"));
    }
    if (role != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role: expected '", expected, "', found '", role, "'",
                       role == kSystem ? " (a system message may only be messages[0])" : ""));
    }
    if (role == kAssistant && messages[i].content.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].content: an assistant message must not be empty"));
    }
    if (absl::Status s = CheckContent(messages, i); !s.ok()) return s;
  }
  if (messages.back().role != kUser) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages[", messages.size() - 1, "].role: the conversation must end with a ",
                     "'user' message, found '", messages.back().role, "'"));
  }

  const std::string no_system;
  const std::string& system = first == 1 ? messages[0].content : no_system;
  if (first == 1 && system_prompt_tokens_) {
    return absl::InvalidArgumentError(
        "messages[0].role: this model's tokenizer encodes system prompts as [SYSTEM_PROMPT] "
        "tokens (mistral-common v7), which moebatch does not implement; put the instructions in "
        "the user message");
  }
  // kMistralV1 prepends the system prompt to the first user message, kMistralV3 to the last.
  const size_t system_at = chat_format_ == ChatFormat::kMistralV1 ? first : messages.size() - 1;
  std::vector<int32_t> ids = {bos_id_};
  for (size_t i = first; i < messages.size(); ++i) {
    std::vector<int32_t> part;
    if (messages[i].role == kUser) {
      std::string content;
      if (i == system_at && !system.empty()) absl::StrAppend(&content, system, "\n\n");
      absl::StrAppend(&content, messages[i].content);
      if (chat_format_ == ChatFormat::kMistralV1) {
        part = Encode(absl::StrCat("[INST] ", content, " [/INST]"), /*add_bos=*/false);
      } else {
        part.push_back(inst_id_);
        const std::vector<int32_t> text = Encode(content, /*add_bos=*/false);
        part.insert(part.end(), text.begin(), text.end());
        part.push_back(end_inst_id_);
      }
    } else {
      part = Encode(messages[i].content, /*add_bos=*/false);
      part.push_back(eos_id_);
    }
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  if (bpe_ != nullptr) return bpe_->Decode(ids, /*skip_special_tokens=*/true);
  const int32_t n = sp_->GetPieceSize();
  const int unk = sp_->unk_id();
  std::vector<int32_t> pieces;
  pieces.reserve(ids.size());
  for (int32_t id : ids) pieces.push_back(id >= 0 && id < n ? id : unk);
  return sp_->DecodeIds(pieces);
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (bpe_ != nullptr) return bpe_->TokenBytes(id);
  if (id < 0 || id >= sp_->GetPieceSize()) return std::string();
  if (const int byte = ByteOf(*sp_, id); byte >= 0) return std::string(1, static_cast<char>(byte));
  const std::string& piece = sp_->IdToPiece(id);
  if (sp_->IsControl(id) || id == sp_->unk_id()) return piece;
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, sentencepiece's space
  std::string out;
  out.reserve(piece.size());
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpace.size(), kSpace) == 0) {
      out.push_back(' ');
      i += kSpace.size();
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {
  if (tokenizer.bpe_ != nullptr) bpe_.emplace(*tokenizer.bpe_, /*skip_special_tokens=*/true);
}

std::string StreamingDetokenizer::Add(int32_t id) {
  ids_.push_back(id);
  if (bpe_) {
    std::string delta = bpe_->Add(id);
    text_ += delta;
    return delta;
  }
  const SentencePieceModel& sp = *tokenizer_.sp_;
  const size_t n = ids_.size();
  const int32_t vocab = sp.GetPieceSize();
  auto byte_at = [&](size_t i) {
    return ids_[i] >= 0 && ids_[i] < vocab ? ByteOf(sp, ids_[i]) : -1;
  };

  // The last character boundary m <= n. Only a trailing run of byte pieces can end unfinished; it
  // starts at a boundary (read_offset_, or just after a non-byte piece).
  size_t m = n;
  if (byte_at(n - 1) >= 0) {
    size_t o = n - 1;
    while (o > read_offset_ && byte_at(o - 1) >= 0) --o;
    // Split the run the way sentencepiece does: a lead byte and the continuation bytes it asks for
    // form one unit, whether or not they turn out to be a valid character; any other byte is a
    // unit of its own. A lead byte whose continuation bytes have not all arrived yet (and none
    // of those present rules them out) starts an unfinished unit: hold back from there.
    while (o < n) {
      const int b = byte_at(o);
      const size_t len = (b & 0xE0) == 0xC0   ? 2
                         : (b & 0xF0) == 0xE0 ? 3
                         : (b & 0xF8) == 0xF0 ? 4
                                              : 1;
      size_t k = 1;
      while (k < len && o + k < n && (byte_at(o + k) & 0xC0) == 0x80) ++k;
      if (k == len) {
        o += len;
      } else if (o + k == n) {
        m = o;
        break;
      } else {
        ++o;  // a non-continuation byte arrived early: the lead byte alone is invalid
      }
    }
  }
  if (m == read_offset_) return std::string();

  std::string delta = DecodeWindow(sp, tokenizer_.unk_surface_, ids_, read_offset_, m, &started_);
  read_offset_ = m;
  text_ += delta;
  return delta;
}

std::string StreamingDetokenizer::Finish() {
  if (bpe_) {
    std::string delta = bpe_->Finish();
    text_ += delta;
    return delta;
  }
  // An unfinished character at the end decodes as sentencepiece decodes it there (U+FFFD per byte).
  if (read_offset_ == ids_.size()) return std::string();
  std::string delta = DecodeWindow(*tokenizer_.sp_, tokenizer_.unk_surface_, ids_, read_offset_,
                                   ids_.size(), &started_);
  read_offset_ = ids_.size();
  text_ += delta;
  return delta;
}

}  // namespace moebatch
