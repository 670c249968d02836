// libFuzzer target: GGUF file images through ParseGguf (engine/model/gguf.h), the validation
// GgufFile::Open applies to the mapped file. An accepted file must hold every tensor inside the
// image, at an aligned offset, with ne[0] whole blocks and numel / block_size x type_size bytes;
// each tensor's first and last byte are read (ASan checks the bounds) and a decodable one's first
// block is decoded (DequantizeRow, engine/model/ggml_quants.h). Metadata values are walked whole.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/ggml_quants.h"
#include "engine/model/gguf.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

size_t Walk(const moebatch::GgufValue& v, int depth) {
  FUZZ_CHECK(depth <= 9, "nested %d deep", depth);
  size_t n = v.s.size();
  for (const moebatch::GgufValue& e : v.elements) {
    FUZZ_CHECK(e.type == v.element_type, "an element of another type");
    n += Walk(e, depth + 1);
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  const auto file = moebatch::ParseGguf(bytes, size, "fuzz.gguf");
  if (!file.ok()) {
    const absl::StatusCode code = file.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kDataLoss,
               "%s", file.status().ToString().c_str());
    return 0;
  }
  const moebatch::GgufFile& f = **file;
  FUZZ_CHECK(f.alignment() > 0 && (f.alignment() & (f.alignment() - 1)) == 0, "alignment %lld",
             static_cast<long long>(f.alignment()));
  FUZZ_CHECK(f.data_offset() % f.alignment() == 0, "data offset");
  for (const auto& [key, value] : f.metadata()) (void)Walk(value, 0);
  std::vector<float> block;
  volatile std::byte sink{};
  for (const moebatch::GgufTensor& t : f.tensors()) {
    FUZZ_CHECK(t.offset % f.alignment() == 0, "tensor offset");
    FUZZ_CHECK(t.ne[0] % t.type.block_size == 0, "row of partial blocks");
    FUZZ_CHECK(t.numel() / t.type.block_size * t.type.type_size == t.nbytes, "byte size");
    FUZZ_CHECK(t.data >= bytes && t.data + t.nbytes <= bytes + size, "data outside the image");
    FUZZ_CHECK(f.FindTensor(t.name) == &t, "name index");
    if (t.nbytes > 0) sink = t.data[0], sink = t.data[t.nbytes - 1];
    if (moebatch::CanDequantize(t.type.type)) {
      block.resize(static_cast<size_t>(t.type.block_size));
      FUZZ_CHECK(moebatch::DequantizeRow(t.type.type, t.data, t.type.block_size, block.data()).ok(),
                 "decoding one block");
    }
  }
  return 0;
}
