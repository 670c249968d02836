// A small safetensors writer for tests: builds valid files from tensors, and raw files from a
// header string (to build corrupt ones). Format (https://huggingface.co/docs/safetensors): 8-byte
// little-endian header length N, N bytes of JSON header, then the tensor bytes, with data_offsets
// relative to the end of the header.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace moebatch::testing {

struct TestTensor {
  std::string dtype;  // safetensors spelling: "BF16", "F32", "I64", ...
  std::vector<int64_t> shape;
  std::string bytes;  // the raw little-endian elements
};

// A file of `header` (JSON text, written as is) and `data`; `header_len` overrides the length
// field.
inline std::string RawSafetensors(const std::string& header, const std::string& data = "",
                                  std::optional<uint64_t> header_len = std::nullopt) {
  const uint64_t n = header_len.value_or(header.size());
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// A valid file holding `tensors`, packed in name order. The header is padded with spaces to a
// multiple of 8 bytes, as the reference (Rust) writer does, so the data is 8-byte aligned.
inline std::string SafetensorsBytes(const std::map<std::string, TestTensor>& tensors,
                                    const nlohmann::json& metadata = nullptr) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype},
                    {"shape", t.shape},
                    {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  return RawSafetensors(text, data);
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace moebatch::testing
