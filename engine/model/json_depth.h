// A nesting limit for the JSON moebatch reads from outside (request lines, config.json,
// safetensors headers and indexes). nlohmann::json parses any depth without recursion, but dump(),
// copies and comparisons of the parsed value recurse once per level, so a line of 100,000 '[' and
// ']' overflows the stack when one of those touches it. The parsers refuse text nested deeper
// than kMaxJsonDepth, serde_json's default limit (the safetensors reference implementation's
// parser); no config, header, index or request moebatch reads nests near it.
#pragma once

#include <cstddef>
#include <string_view>

namespace moebatch {

inline constexpr int kMaxJsonDepth = 128;

// Whether `text` opens more than `max_depth` arrays/objects inside one another (brackets inside
// strings do not count). A linear scan without allocation; it does not validate the JSON.
inline bool JsonNestsDeeperThan(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

}  // namespace moebatch
