// libFuzzer target: safetensors file images through ParseSafetensors (engine/model/safetensors.h), the
// header validation SafetensorsFile::Open applies to the mapped file. Each input is tried twice:
//   1. as a whole file (8-byte little-endian header length, header, data), so the length field is
//      fuzzed too;
//   2. as "<header JSON>[\0<data>]": the length field is written here, so mutations of the JSON
//      keep a well-framed file and reach the per-tensor checks.
// An accepted file must hold every tensor inside its data section, with numel * element size
// bytes; the first and last byte of each are read (ASan checks the bounds).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

size_t ElementSize(const std::string& dtype) {
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2") {
    return 1;
  }
  if (dtype == "I16" || dtype == "U16" || dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "I32" || dtype == "U32" || dtype == "F32") return 4;
  if (dtype == "I64" || dtype == "U64" || dtype == "F64") return 8;
  return 0;
}

void Check(const std::byte* bytes, size_t size) {
  const auto tensors = moebatch::ParseSafetensors(bytes, size, "fuzz.safetensors");
  if (!tensors.ok()) {
    const absl::StatusCode code = tensors.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kDataLoss,
               "%s", tensors.status().ToString().c_str());
    return;
  }
  FUZZ_CHECK(size >= 8, "accepted %zu bytes", size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  const std::byte* data_begin = bytes + 8 + header_len;
  const std::byte* end = bytes + size;
  for (const auto& [name, info] : *tensors) {
    FUZZ_CHECK(name == info.name && name != "__metadata__", "name %s", name.c_str());
    const size_t elem = ElementSize(info.dtype_name);
    FUZZ_CHECK(elem > 0, "dtype %s", info.dtype_name.c_str());
    const int64_t numel = info.numel();  // UBSan: no overflow
    FUZZ_CHECK(numel >= 0 && static_cast<uint64_t>(numel) * elem == info.nbytes,
               "%s: numel %lld, %zu bytes", name.c_str(), static_cast<long long>(numel),
               info.nbytes);
    FUZZ_CHECK(info.data >= data_begin && info.data <= end &&
                   info.nbytes <= static_cast<size_t>(end - info.data),
               "%s: data outside the data section", name.c_str());
    if (info.nbytes > 0) {
      volatile std::byte first = info.data[0];
      volatile std::byte last = info.data[info.nbytes - 1];
      (void)first;
      (void)last;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Check(reinterpret_cast<const std::byte*>(data), size);

  const void* nul = std::memchr(data, 0, size);
  const size_t header_len =
      nul ? static_cast<size_t>(static_cast<const uint8_t*>(nul) - data) : size;
  const size_t data_len = nul ? size - header_len - 1 : 0;
  std::vector<std::byte> file(8 + header_len + data_len);  // exactly sized: ASan sees overreads
  for (int i = 0; i < 8; ++i)
    file[i] = static_cast<std::byte>((uint64_t{header_len} >> (8 * i)) & 0xff);
  if (header_len > 0) std::memcpy(file.data() + 8, data, header_len);
  if (data_len > 0) std::memcpy(file.data() + 8 + header_len, data + header_len + 1, data_len);
  Check(file.data(), file.size());
  return 0;
}
