// libFuzzer target: config.json text through ParseModelConfig (engine/model/model_config.h). Bad
// input must give InvalidArgument; an accepted config must satisfy what the parser promises, and
// the sizes derived from it (ModelConfig::q_size, kv_size) must be computable.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "engine/model/family.h"
#include "engine/model/model_config.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using moebatch::ModelConfig;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<ModelConfig> parsed = moebatch::ParseModelConfig(text);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               parsed.status().ToString().c_str());
    return 0;
  }
  const ModelConfig& c = *parsed;
  // Any supported family (config.json's model_type, else its architectures), named consistently.
  const moebatch::ModelFamily* family = moebatch::FindModelFamily(c.model_type);
  FUZZ_CHECK(family != nullptr && c.architecture == family->architecture, "%s / %s",
             c.model_type.c_str(), c.architecture.c_str());
  for (const int64_t v : {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers,
                          c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                          c.num_local_experts, c.num_experts_per_tok, c.max_position_embeddings}) {
    FUZZ_CHECK(v > 0, "a size is %lld", static_cast<long long>(v));
  }
  FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, "GQA");
  FUZZ_CHECK(c.num_experts_per_tok <= c.num_local_experts, "top-k");
  FUZZ_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0, "rope_theta %g", c.rope_theta);
  FUZZ_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0, "rms_norm_eps %g",
             c.rms_norm_eps);
  FUZZ_CHECK(!c.sliding_window || *c.sliding_window > 0, "sliding_window");
  FUZZ_CHECK(c.bos_token_id >= 0 && c.eos_token_id >= 0, "token ids");
  // The derived sizes the checkpoint and the engine use (UBSan checks they do not overflow).
  FUZZ_CHECK(c.q_size() > 0 && c.kv_size() > 0, "q/kv size");
  return 0;
}
