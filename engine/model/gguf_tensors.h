// Where each Hugging Face tensor of a model (engine/model/family.h's ModelTensors) is in a GGUF
// file: llama.cpp's tensor names (gguf-py's TENSOR_NAMES, what convert_hf_to_gguf.py writes), the
// experts of a layer merged into one [experts, rows, cols] tensor (ffn_gate_exps, ...) or, in
// older Mixtral files, one per expert (ffn_gate.<e>), and the row order convert_hf_to_gguf.py gives
// llama-architecture q/k projections for ggml's interleaved RoPE.
//
//   model.embed_tokens.weight                      token_embd.weight
//   model.norm.weight, lm_head.weight              output_norm.weight, output.weight
//   model.layers.L.input_layernorm.weight          blk.L.attn_norm.weight
//   ....self_attn.{q,k,v,o}_proj.{weight,bias}     blk.L.attn_{q,k,v,output}.{weight,bias}
//   ....self_attn.{q,k}_norm.weight                blk.L.attn_{q,k}_norm.weight
//   ....post_attention_layernorm.weight            blk.L.ffn_norm.weight
//   ....mlp.{gate,up,down}_proj.weight (dense)     blk.L.ffn_{gate,up,down}.weight
//   ....<moe>.gate.weight (router)                 blk.L.ffn_gate_inp.weight
//   ....<moe>.experts.E.<gate|up|down>.weight      blk.L.ffn_{gate,up,down}_exps.weight [E]
//   ....mlp.shared_expert.{gate,up,down}_proj      blk.L.ffn_{gate,up,down}_shexp.weight
//   ....mlp.shared_expert_gate.weight              blk.L.ffn_gate_inp_shexp.weight
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/family.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"

namespace moebatch {

struct GgufTensorSource {
  const GgufTensor* tensor = nullptr;  // the GGUF tensor holding the Hugging Face one
  // >= 0: the expert's slice of a merged [experts, rows, cols] tensor: its rows start at
  // expert * rows of the tensor's rows.
  int64_t expert = -1;
  int64_t rows = 0;  // the Hugging Face tensor's rows (its first dimension; 1 for a vector)
  int64_t cols = 0;  // elements per row (the GGUF tensor's ne[0])
  // > 0: the rows are in the order convert_hf_to_gguf.py permutes llama q/k projections into
  // (LlamaModel.permute) for ggml's interleaved RoPE, over this many heads: GgufRowOf maps a
  // Hugging Face row to the GGUF row holding it.
  int64_t rope_heads = 0;
};

// The source of `spec` (a tensor of ModelTensors(config, ...)) in `file`. NotFound naming both
// names when the file lacks it; InvalidArgument naming the tensor when its shape disagrees.
absl::StatusOr<GgufTensorSource> FindGgufSource(const GgufFile& file, const ModelConfig& config,
                                                const TensorSpec& spec);

// The bytes of the model's tensors in `file` as Checkpoint::Load maps them (each in its own type;
// a tied lm_head counted once): all of them, and the largest decoder layer's. FindGgufSource's
// errors.
struct GgufModelBytes {
  int64_t total = 0;
  int64_t max_layer = 0;
  int64_t params = 0;     // elements
  std::string main_type;  // the type holding the most bytes ("Q4_K")
};
absl::StatusOr<GgufModelBytes> GgufTensorBytes(const GgufFile& file, const ModelConfig& config);

// The GGUF row of Hugging Face row `row` of a q/k projection of `rows` rows permuted over `heads`
// heads: with d = rows / heads, row h d + s d/2 + i (head h, half s, index i) is at h d + 2 i + s.
int64_t GgufRowOf(int64_t row, int64_t rows, int64_t heads);

}  // namespace moebatch
