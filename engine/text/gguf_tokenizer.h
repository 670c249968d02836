// The tokenizer of a GGUF file: llama.cpp's tokenizer.ggml.* metadata (the keys
// convert_hf_to_gguf.py writes, read as llama.cpp's src/llama-vocab.cpp reads them) turned into
// moebatch's two tokenizers. Tokenizer::LoadFromGguf (engine/text/tokenizer.h) is the entry point;
// these are its two halves.
//
// tokenizer.ggml.model "gpt2" (byte-level BPE: GPT-2, Llama 3, Qwen2, SmolLM2, ...): the
// equivalent Hugging Face tokenizer.json is built in memory and loaded by BpeTokenizer's own
// loader, so encoding and decoding are exactly those of engine/text/bpe_tokenizer.h:
//   model       BPE over every token of tokenizer.ggml.tokens at its index (byte-level strings),
//               the merges of tokenizer.ggml.merges ("a b", rank = position), no unk token, no
//               byte fallback; ignore_merges where llama.cpp sets it (llama3, tekken).
//   added       token_type 3 (control) and 2 (unknown): special added tokens; 4 (user-defined):
//               non-special added tokens (matched in the raw text, as llama.cpp matches them);
//               1 normal, 5 unused, 6 byte, 0 undefined: the vocabulary only.
//   pre         tokenizer.ggml.pre's regex list as llama.cpp's llm_tokenizer_bpe defines it (one
//               Split step per regex, then ByteLevel without its own regex). Where llama.cpp
//               "adapted" a tokenizer.json regex ('[sS]' for '(?i:s)', look-aheads for the
//               o200k letter classes), the tokenizer.json original is used, as Hugging Face
//               `tokenizers` runs it. Missing: "default", as llama.cpp. Qwen2's tokenizer.json
//               NFC normalizer is applied for "qwen2" (llama.cpp applies none); other pre types
//               get no normalizer.
//   post        tokenizer.ggml.add_bos_token / add_eos_token (defaults as llama.cpp: true for the
//               llama3 and tekken pre types, else false) with the tokens of bos_token_id /
//               eos_token_id: "[bos] $A [eos]".
//   decoder     ByteLevel. tokenizer.ggml.add_space_prefix is not read (llama.cpp ignores it for
//               BPE vocabularies too).
//   chat        tokenizer.chat_template (the BpeTokenizer's chat_template(), its file named
//               "<path> (tokenizer.chat_template)").
// tokenizer.ggml.model "llama" (sentencepiece BPE: Llama 2, Mistral, Mixtral): a sentencepiece
// model built from tokens, scores and token_type (SentencePieceModel::FromPieces), the normalizer
// as tokenizer.ggml.add_space_prefix (default true) and tokenizer.ggml.remove_extra_whitespaces
// (default false) say; user-defined tokens' spaces written back as "▁" (convert_hf_to_gguf.py
// wrote "▁" as " " for them); without a token of type 2, tokenizer.ggml.unknown_token_id (default
// 0, as llama.cpp) is the unknown piece.
//
// Both: an empty token string becomes "[EMPTY_<i>]" (as llama.cpp). Errors are InvalidArgument
// "<path>: <key>: <what>": a missing or mistyped key (tokens; merges for gpt2; scores and
// token_type for llama), a repeated token, token_type or scores of another length than tokens, a
// token type outside 0..6, a merge that is not two tokens or whose result is not a token, bos/eos
// ids (and a "llama" vocabulary's unknown_token_id) outside the vocabulary, add_bos_token /
// add_eos_token without the id, a pre type not in GgufPreTokenizerNames(), a vocabulary
// sentencepiece refuses (named by tokenizer.ggml.token_type: two unknown tokens, a missing
// <0xNN> byte token, ...).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/gguf.h"
#include "engine/text/bpe_tokenizer.h"
#include "engine/text/sentencepiece_model.h"

namespace moebatch {

// The tokenizer.ggml.pre values a "gpt2" vocabulary may have, joined by ", ".
std::string GgufPreTokenizerNames();

// tokenizer.ggml.model "gpt2": the tokenizer the metadata describes (see above). Its bos_token /
// eos_token are the tokens of tokenizer.ggml.bos_token_id / eos_token_id (empty when absent).
absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizerFromGguf(const GgufFile& file);

// tokenizer.ggml.model "llama": the sentencepiece model and what the metadata says around it.
struct GgufSentencePiece {
  std::unique_ptr<SentencePieceModel> model;
  std::optional<int32_t> bos_id, eos_id;  // tokenizer.ggml.bos_token_id / eos_token_id
  bool add_bos = true;                    // tokenizer.ggml.add_bos_token (default true)
  bool add_eos = false;                   // tokenizer.ggml.add_eos_token (default false)
  std::string chat_template;              // tokenizer.chat_template, or empty
};
absl::StatusOr<GgufSentencePiece> SentencePieceFromGguf(const GgufFile& file);

}  // namespace moebatch
