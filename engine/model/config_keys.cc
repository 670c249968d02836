#include "engine/model/config_keys.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace moebatch::config_keys {

using Json = nlohmann::json;

absl::Status KeyError(std::string_view key, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("key \"", std::string(key), "\" ", std::string(why)));
}

absl::Status ReadInt(const Json& j, const char* key, std::optional<int64_t> fallback,
                     int64_t* out) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (!fallback) return KeyError(key, "is required but missing");
    *out = *fallback;
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) {
    return KeyError(key, absl::StrCat("must be an integer, got ", it->dump()));
  }
  if (it->is_number_unsigned() &&
      it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return KeyError(key, absl::StrCat("is out of range: ", it->dump()));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadPositiveInt(const Json& j, const char* key, std::optional<int64_t> fallback,
                             int64_t* out) {
  if (absl::Status s = ReadInt(j, key, fallback, out); !s.ok()) return s;
  if (*out <= 0) return KeyError(key, absl::StrCat("must be positive, got ", *out));
  return absl::OkStatus();
}

absl::Status ReadPositiveDouble(const Json& j, const char* key, double fallback, double* out) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    *out = fallback;
    return absl::OkStatus();
  }
  if (!it->is_number()) return KeyError(key, absl::StrCat("must be a number, got ", it->dump()));
  *out = it->get<double>();
  if (!(*out > 0)) return KeyError(key, absl::StrCat("must be positive, got ", it->dump()));
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& j, const char* key, bool fallback, bool* out) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    *out = fallback;
    return absl::OkStatus();
  }
  if (!it->is_boolean())
    return KeyError(key, absl::StrCat("must be true or false, got ", it->dump()));
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadIntList(const Json& j, const char* key, std::vector<int64_t>* out) {
  out->clear();
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return KeyError(key, absl::StrCat("must be a list, got ", it->dump()));
  for (const Json& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return KeyError(key, absl::StrCat("must hold non-negative integers, got ", it->dump()));
    }
    out->push_back(v.get<int64_t>());
  }
  return absl::OkStatus();
}

}  // namespace moebatch::config_keys
