// Reading config.json keys with errors that name the key: shared by model_config.cc (the keys
// every family has) and engine/model/families/*.cc (each family's own).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace moebatch::config_keys {

// InvalidArgument "key \"<key>\" <why>".
absl::Status KeyError(std::string_view key, std::string_view why);

// The integer at `key` into *out; when absent (or null), `fallback`, or an error when there is
// none (a required key).
absl::Status ReadInt(const nlohmann::json& j, const char* key, std::optional<int64_t> fallback,
                     int64_t* out);
// As ReadInt, and > 0.
absl::Status ReadPositiveInt(const nlohmann::json& j, const char* key,
                             std::optional<int64_t> fallback, int64_t* out);
// A number > 0; `fallback` when absent.
absl::Status ReadPositiveDouble(const nlohmann::json& j, const char* key, double fallback,
                                double* out);
// true/false; `fallback` when absent or null.
absl::Status ReadBool(const nlohmann::json& j, const char* key, bool fallback, bool* out);
// A list of non-negative integers; empty when absent or null.
absl::Status ReadIntList(const nlohmann::json& j, const char* key, std::vector<int64_t>* out);

}  // namespace moebatch::config_keys
