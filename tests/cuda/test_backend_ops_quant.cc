// DequantizeRows (cuda/kernels_quant.cu) against engine/model/ggml_quants.h's DequantizeRow, every
// ggml block type x output dtype; the method and tolerances: tests/cuda/test_backend_ops.cc,
// tests/cuda/backend_ops_testing.h.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <iomanip>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cpu_attention/gemm/matmul.h"
#include "cpu_attention/ops/deepseek_ops.h"
#include "cpu_attention/ops/ops.h"
#include "cuda/kernels.h"
#include "engine/model/ggml_quants.h"
#include "tests/cuda/backend_ops_testing.h"
#include "tests/cuda/cuda_test_util.h"

using namespace moebatch;
using namespace moebatch::gpu;
using namespace moebatch::gpu::testing;

namespace {

// --- Quantized weights ---------------------------------------------------------------------------

// The ggml block types DequantizeRows decodes, and the byte offsets of each block's f16 scale
// fields (tests/fixtures/make_gguf_cases.py's F16_FIELDS): set to finite values, every other byte
// random, as gguf-py's tests make random blocks. MXFP4's E8M0 scale byte stays random: its largest
// values overflow to infinity in f32 (and f16), the same on both.
struct QuantCase {
  GgmlType type;
  std::vector<int> f16_fields;
};
const std::vector<QuantCase>& QuantCases() {
  static const std::vector<QuantCase> cases = {
      {GgmlType::kQ4_0, {0}},    {GgmlType::kQ4_1, {0, 2}}, {GgmlType::kQ5_0, {0}},
      {GgmlType::kQ5_1, {0, 2}}, {GgmlType::kQ8_0, {0}},    {GgmlType::kQ4_K, {0, 2}},
      {GgmlType::kQ5_K, {0, 2}}, {GgmlType::kQ6_K, {208}},  {GgmlType::kMXFP4, {}}};
  return cases;
}

// `blocks` random blocks of `c`'s type: random bytes, the f16 fields N(0, 0.05) rounded to f16.
std::vector<unsigned char> RandomBlocks(std::mt19937& rng, const QuantCase& c, int64_t blocks) {
  const GgmlTypeTraits t = GgmlTypeInfoOf(c.type);
  std::vector<unsigned char> bytes(static_cast<size_t>(blocks * t.type_size));
  std::uniform_int_distribution<int> byte(0, 255);
  for (unsigned char& b : bytes) b = static_cast<unsigned char>(byte(rng));
  std::normal_distribution<float> scale(0.0f, 0.05f);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int at : c.f16_fields) {
      const float v = scale(rng);
      STATUS_REQUIRE(cpu_ops::ConvertF32To(&v, 1, &bytes[b * t.type_size + at], DType::kF16));
    }
  }
  return bytes;
}

}  // namespace

TEST_CASE("backend ops: DequantizeRows against DequantizeRow (every type x output dtype)",
          "[backend_ops]") {
  // What DequantizeRow (engine/model/ggml_quants.h, bit-equal to gguf-py's dequantizers) gives in
  // f32, rounded by the cpu op's conversion: exact, the f32 operations being the same ones.
  struct Row {
    QuantCase c;
    GpuDType dtype;
    int64_t rows, cols;
  };
  static const std::vector<Row> rows = [] {
    std::vector<Row> r;
    for (const QuantCase& c : QuantCases()) {
      const int64_t block = GgmlTypeInfoOf(c.type).block_size;
      for (GpuDType dtype : kAllDTypes) {
        for (auto [n, k] : {std::pair<int64_t, int64_t>{1, block}, {3, 2 * block}, {7, 512}}) {
          r.push_back({c, dtype, n, k});
        }
      }
      r.push_back({c, GpuDType::kBF16, 2, 14336});  // a Mixtral w2 row (56 super-blocks)
    }
    return r;
  }();
  const Row row = GENERATE(from_range(rows));
  const GgmlTypeTraits t = GgmlTypeInfoOf(row.c.type);
  CAPTURE(t.name, Name(row.dtype), row.rows, row.cols);
  std::mt19937 rng(static_cast<uint32_t>(row.c.type) * 131 + static_cast<uint32_t>(row.cols));
  const int64_t n = row.rows * row.cols;
  const std::vector<unsigned char> blocks = RandomBlocks(rng, row.c, n / t.block_size);
  std::vector<float> wide(n);
  STATUS_REQUIRE(
      DequantizeRow(row.c.type, reinterpret_cast<const std::byte*>(blocks.data()), n, wide.data()));
  std::vector<unsigned char> want(n * GpuDTypeSize(row.dtype));
  STATUS_REQUIRE(cpu_ops::ConvertF32To(wide.data(), n, want.data(), CpuDType(row.dtype)));
  Stream stream;
  DeviceBuffer<unsigned char> blocks_d(blocks);
  DeviceBuffer<unsigned char> out_d(want.size());
  STATUS_REQUIRE(DequantizeRows(blocks_d.get(), row.c.type, row.rows, row.cols, out_d.get(),
                                row.dtype, stream.get()));
  stream.Sync();
  CheckOutput("DequantizeRows", row.dtype, out_d.Download(), want, Exact());
}

TEST_CASE("backend ops: DequantizeRows of gathered rows (an embedding of a quantized table)",
          "[backend_ops]") {
  // The cuda backend gathers a quantized table's rows on the host and decodes them to f32 on the
  // device; the cpu backend decodes each row with DequantizeRow. Q8_0 is what load-time
  // quantization gives embed_tokens; Q6_K and Q4_K what GGUF files often do.
  const GgmlType type = GENERATE(GgmlType::kQ8_0, GgmlType::kQ6_K, GgmlType::kQ4_K);
  const QuantCase& c = *std::find_if(QuantCases().begin(), QuantCases().end(),
                                     [&](const QuantCase& q) { return q.type == type; });
  const GgmlTypeTraits t = GgmlTypeInfoOf(type);
  CAPTURE(t.name);
  std::mt19937 rng(3);
  const int64_t vocab = 50, hidden = 512, tokens = 9;
  const int64_t row_bytes = GgmlRowBytes(t, hidden);
  const std::vector<unsigned char> table = RandomBlocks(rng, c, vocab * hidden / t.block_size);
  std::vector<unsigned char> gathered;
  std::vector<float> want(tokens * hidden);
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t id = (i * 17 + 3) % vocab;
    const unsigned char* src = table.data() + id * row_bytes;
    gathered.insert(gathered.end(), src, src + row_bytes);
    STATUS_REQUIRE(DequantizeRow(type, reinterpret_cast<const std::byte*>(src), hidden,
                                 want.data() + i * hidden));
  }
  Stream stream;
  DeviceBuffer<unsigned char> gathered_d(gathered);
  DeviceBuffer<float> h_d(tokens * hidden);
  STATUS_REQUIRE(DequantizeRows(gathered_d.get(), type, tokens, hidden, h_d.get(), GpuDType::kF32,
                                stream.get()));
  stream.Sync();
  CheckOutput("DequantizeRows (gathered rows)", h_d.Download(), want, Exact());
}
