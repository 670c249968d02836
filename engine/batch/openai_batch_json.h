// What openai_batch.cc (input lines) and openai_batch_output.cc (output lines) share: string
// views for Abseil and nlohmann-json's replacing dump. Include only from those two files.
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace moebatch {
namespace openai_batch_internal {

// Debian's Abseil is built with its own absl::string_view, which std::string_view does not convert
// to; StrCat and StartsWith get their arguments through this.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

template <typename Json>
inline std::string Dump(const Json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

// `s` with ill-formed UTF-8 replaced by U+FFFD (a round trip through nlohmann's replacing dump).
inline std::string ValidUtf8(const std::string& s) {
  return nlohmann::json::parse(Dump(nlohmann::json(s))).get<std::string>();
}

}  // namespace openai_batch_internal
}  // namespace moebatch
