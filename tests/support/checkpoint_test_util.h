// Helpers shared by the checkpoint tests (test_checkpoint.cc, test_model_config.cc).
#pragma once

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"

// Checks that `status_expr` failed with `expected_code` and that its message contains every
// substring.
#define CHECK_ERROR(status_expr, expected_code, ...)                                            \
  do {                                                                                          \
    const absl::Status status_ = (status_expr);                                                 \
    INFO("status: " << status_.ToString());                                                     \
    CHECK(absl::StatusCodeToString(status_.code()) == absl::StatusCodeToString(expected_code)); \
    for (const std::string& sub_ : std::vector<std::string>{__VA_ARGS__}) {                     \
      CHECK_THAT(std::string(status_.message()), Catch::Contains(sub_));                        \
    }                                                                                           \
  } while (0)

namespace moebatch {
namespace testing {

// config.json of a tiny Mixtral, as transformers' save_pretrained writes it (subset of keys).
inline nlohmann::json TinyConfig() {
  return nlohmann::json{{"architectures", {"MixtralForCausalLM"}},
                        {"model_type", "mixtral"},
                        {"vocab_size", 32},
                        {"hidden_size", 8},
                        {"intermediate_size", 12},
                        {"num_hidden_layers", 2},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"num_local_experts", 4},
                        {"num_experts_per_tok", 2},
                        {"max_position_embeddings", 256},
                        {"rope_theta", 1000000.0},
                        {"rms_norm_eps", 1e-05},
                        {"sliding_window", nullptr},
                        {"tie_word_embeddings", false},
                        {"bos_token_id", 1},
                        {"eos_token_id", 2},
                        {"torch_dtype", "bfloat16"}};
}

}  // namespace testing
}  // namespace moebatch
