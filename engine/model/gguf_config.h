// A GGUF file's model hyper-parameters as the Hugging Face config.json moebatch's families read
// (engine/model/model_config.h): llama.cpp's `<arch>.*` metadata keys (gguf-py's Keys.LLM, the
// names convert_hf_to_gguf.py writes) mapped back to the transformers keys, then parsed and
// validated by ParseModelConfig like any config.json.
//
// Architectures (general.architecture -> model_type): llama -> llama, or mixtral when
// llama.expert_count > 0; qwen2 -> qwen2; qwen3 -> qwen3; qwen2moe -> qwen2_moe; qwen3moe ->
// qwen3_moe; olmoe -> olmoe. Tied embeddings: the file has no output.weight tensor. The vocabulary
// size: <arch>.vocab_size, else the length of tokenizer.ggml.tokens.
#pragma once

#include "absl/status/statusor.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "nlohmann/json.hpp"

namespace moebatch {

// The config.json equivalent of `file`'s metadata. Errors name the file and the GGUF key:
// InvalidArgument for an architecture moebatch does not run (listing those it does), a key of the
// wrong type or a RoPE scheme it does not compute (llama3's rope_freqs tensor); NotFound for a
// required key that is absent.
absl::StatusOr<nlohmann::json> GgufConfigJson(const GgufFile& file);

// GgufConfigJson parsed by ParseModelConfig; its errors are prefixed with the file's path.
absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& file);

}  // namespace moebatch
