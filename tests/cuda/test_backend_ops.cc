// Every kernel of cuda/kernels.h against the cpu backend's op of the same name
// (cpu_attention/ops/ops.h, the steps CpuDevice runs), as ggml's test-backend-ops checks each
// backend against its CPU backend: the same random inputs through both, the outputs compared under
// the op's tolerance. The cpu ops have their own test against float64 formulas
// (tests/cpu_attention/test_ops.cc); nothing here computes a reference itself.
//
// Parameters: each op's TEST_CASE takes its rows from a table (Catch2 GENERATE): backend x shape x
// dtype(s) x tolerance. The backend is this program's CUDA device: a GPU (test_backend_ops, label
// gpu; exits 77 without one, tests/cuda/gpu_catch_main.cc) or the CUDA emulator
// (test_backend_ops_emulated, label emulated, tests/cuda_emulation/). Shapes include Mixtral's
// (hidden 4096, intermediate 14336, head_dim 128, GQA 4, 8 experts top-2, vocab 32000), one row,
// odd sizes, edge cases (ids out of range where the API defines the answer, router ties, sliding
// windows, rows outside every sequence, NaN inputs).
//
// The ops of each part of a pass have a file of their own: this one the embedding, task A (norms,
// RoPE, prefill attention, MLA's pieces) and the sizes every op refuses; test_backend_ops_task_b.cc
// the router, expert and elementwise ops and their composition; test_backend_ops_quant.cc the
// dequantization of ggml blocks. Tolerances and helpers: tests/cuda/backend_ops_testing.h.
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

// --- Embedding -----------------------------------------------------------------------------------

TEST_CASE("backend ops: EmbeddingGather (ids out of range give zero rows)", "[backend_ops]") {
  struct Row {
    GpuDType dtype;
    int64_t hidden, tokens;
  };
  static const std::vector<Row> rows = [] {
    std::vector<Row> r;
    for (GpuDType dtype : kAllDTypes) {
      for (int64_t hidden : {4096, 100, 1}) {
        for (int64_t tokens : {1, 37}) r.push_back({dtype, hidden, tokens});
      }
    }
    return r;
  }();
  const Row row = GENERATE(from_range(rows));
  CAPTURE(Name(row.dtype), row.hidden, row.tokens);
  std::mt19937 rng(1);
  const int64_t vocab = 50;
  const HostTensor table = Store(row.dtype, Normal(rng, vocab * row.hidden));
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> ids(row.tokens);
  for (int32_t& id : ids) id = pick(rng);
  if (row.tokens > 7) {
    ids[5] = -1;
    ids[6] = static_cast<int32_t>(vocab);
    ids[7] = std::numeric_limits<int32_t>::max();
  }
  Stream stream;
  DeviceBuffer<unsigned char> table_d(table.bytes);
  DeviceBuffer<int32_t> ids_d(ids);
  DeviceBuffer<float> h_d(row.tokens * row.hidden);
  STATUS_REQUIRE(EmbeddingGather(table_d.get(), row.dtype, vocab, row.hidden, ids_d.get(),
                                 row.tokens, h_d.get(), stream.get()));
  std::vector<float> want(row.tokens * row.hidden, 7.0f);
  STATUS_REQUIRE(cpu_ops::EmbeddingGather(table.bytes.data(), CpuDType(row.dtype), vocab,
                                          row.hidden, ids.data(), row.tokens, want.data()));
  stream.Sync();
  CheckOutput("EmbeddingGather", h_d.Download(), want, Exact());
}

// --- Task A --------------------------------------------------------------------------------------

struct NormRow {
  int64_t rows, n;
  GpuDType weight, out;
  Tolerance tol;
};

// Every weight x output dtype for each shape. RmsNorm: 1 ulp of a rounded output. LayerNorm
// (`centered`): x - mean cancels for the elements near the mean, whose relative error is then the
// mean's (two f32 summation orders) over |x - mean|, so outputs are compared relative to the
// largest: 1e-5 in f32, one unit of the output dtype at that value in f16 / bf16.
std::vector<NormRow> NormRows(std::initializer_list<std::pair<int64_t, int64_t>> shapes,
                              bool centered) {
  std::vector<NormRow> r;
  for (auto [rows, n] : shapes) {
    for (GpuDType w : kAllDTypes) {
      for (GpuDType out : kAllDTypes) {
        const Tolerance rounded = out == GpuDType::kF16    ? Relative(1e-3)
                                  : out == GpuDType::kBF16 ? Relative(8e-3)
                                                           : Relative(1e-5);
        r.push_back({rows, n, w, out, centered ? rounded : Rounded(out, Relative(1e-5))});
      }
    }
  }
  return r;
}

// The GPU's RmsNorm or LayerNorm (`gpu_op`) against the CPU's (`cpu_op`) on one row of the table,
// out of place and in place; x shifted by `offset` (a mean far from 0 for LayerNorm). With 3 rows
// or more, row 1 holds a NaN: it becomes NaN, the others must not.
template <typename GpuOp, typename CpuOp>
void CheckNorm(const char* what, GpuOp gpu_op, CpuOp cpu_op, const NormRow& row, uint32_t seed,
               float offset) {
  CAPTURE(row.rows, row.n, Name(row.weight), Name(row.out), Describe(row.tol));
  std::mt19937 rng(seed);
  const float eps = 1e-5f;
  std::vector<float> x = Normal(rng, row.rows * row.n, 3.0f);
  for (float& v : x) v += offset;
  if (row.rows >= 3) x[row.n + row.n / 2] = NAN;
  const HostTensor w = Store(row.weight, Normal(rng, row.n));
  const size_t out_bytes = row.rows * row.n * GpuDTypeSize(row.out);
  Stream stream;
  DeviceBuffer<float> x_d(x);
  DeviceBuffer<unsigned char> w_d(w.bytes), out_d(out_bytes);
  STATUS_REQUIRE(gpu_op(x_d.get(), w_d.get(), row.weight, row.rows, row.n, eps, out_d.get(),
                        row.out, stream.get()));
  std::vector<unsigned char> want(out_bytes);
  STATUS_REQUIRE(cpu_op(x.data(), w.bytes.data(), CpuDType(row.weight), row.rows, row.n, eps,
                        want.data(), CpuDType(row.out)));
  stream.Sync();
  CheckOutput(what, row.out, out_d.Download(), want, row.tol);
  if (row.out == GpuDType::kF32) {  // in place
    STATUS_REQUIRE(gpu_op(x_d.get(), w_d.get(), row.weight, row.rows, row.n, eps, x_d.get(),
                          GpuDType::kF32, stream.get()));
    stream.Sync();
    CheckOutput(what, GpuDType::kF32, Bytes(x_d.Download()), want, row.tol);
  }
}

TEST_CASE("backend ops: RmsNorm (every weight x output dtype, in place, a NaN row)",
          "[backend_ops]") {
  static const std::vector<NormRow> table =
      NormRows({{1, 4096}, {37, 100}, {5, 4096}, {3, 1}, {2, 6144}, {4, 7}}, false);
  const NormRow row = GENERATE(from_range(table));
  CheckNorm("RmsNorm", RmsNorm, cpu_ops::RmsNorm, row, 2, 0.0f);
}

TEST_CASE("backend ops: LayerNorm without bias (every weight x output dtype, in place, a NaN row)",
          "[backend_ops]") {
  static const std::vector<NormRow> table = NormRows({{1, 6144}, {37, 72}, {3, 1}, {4, 7}}, true);
  const NormRow row = GENERATE(from_range(table));
  CheckNorm("LayerNorm", LayerNorm, cpu_ops::LayerNorm, row, 12, 2.5f);
}

TEST_CASE("backend ops: NormalizeTopKWeights (p = 2 and others)", "[backend_ops]") {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  const int64_t tokens = 300;
  for (int64_t top_k : {1, 3, 8}) {
    for (float p : {2.0f, 3.0f, 0.5f}) {
      CAPTURE(top_k, p);
      std::vector<float> w(tokens * top_k);
      for (float& v : w) v = u(rng);
      Stream stream;
      DeviceBuffer<float> w_d(w);
      STATUS_REQUIRE(NormalizeTopKWeights(w_d.get(), tokens, top_k, p, stream.get()));
      STATUS_REQUIRE(cpu_ops::NormalizeTopKWeights(w.data(), tokens, top_k, p));
      stream.Sync();
      CheckOutput("NormalizeTopKWeights", w_d.Download(), w, Relative(1e-6));
    }
  }
}

TEST_CASE("backend ops: ApplyRope", "[backend_ops]") {
  struct Row {
    int64_t tokens, heads, d;
  };
  static const std::vector<Row> rows = {{37, 32, 128}, {37, 8, 128}, {1, 8, 128}, {37, 8, 64},
                                        {5, 3, 2},     {4, 2, 256},  {3, 1, 1024}};
  const Row row = GENERATE(from_range(rows));
  // 1, and yarn's attention factor for factor 4 (0.1 ln 4 + 1, Qwen3's rope_scaling).
  const float scaling = GENERATE(1.0f, 1.1386294f);
  const Tolerance tol = Relative(2e-6);
  CAPTURE(row.tokens, row.heads, row.d, scaling, Describe(tol));
  std::mt19937 rng(3);
  const std::vector<float> inv_freq = RopeInvFreq(row.d, 1e6f);  // Mixtral's rope_theta
  std::uniform_int_distribution<int64_t> pick(0, 32767);
  std::vector<int64_t> positions(row.tokens);
  for (int64_t& p : positions) p = pick(rng);
  positions[0] = 0;
  if (row.tokens > 2) positions[2] = 131071;  // past Mixtral-8x22B's 65536 context
  const std::vector<float> x = Normal(rng, row.tokens * row.heads * row.d);
  Stream stream;
  DeviceBuffer<float> x_d(x), inv_freq_d(inv_freq);
  DeviceBuffer<int64_t> positions_d(positions);
  STATUS_REQUIRE(ApplyRope(x_d.get(), row.tokens, row.heads, row.d, positions_d.get(),
                           inv_freq_d.get(), scaling, stream.get()));
  std::vector<float> want = x;
  STATUS_REQUIRE(cpu_ops::ApplyRope(want.data(), row.tokens, row.heads, row.d, positions.data(),
                                    inv_freq.data(), scaling));
  stream.Sync();
  CheckOutput("ApplyRope", x_d.Download(), want, tol);
}

TEST_CASE(
    "backend ops: PrefillAttention (GQA, sliding windows, rows outside every sequence, sinks)",
    "[backend_ops]") {
  struct Row {
    int64_t heads, kv_heads, d, window;
    std::vector<int32_t> cu_seqlens;
    int64_t tokens;
  };
  static const std::vector<Row> rows = {
      {32, 8, 128, 0, {0, 1, 18, 318}, 318},  // Mixtral: GQA 4, lengths 1, 17, 300
      {8, 2, 64, 32, {0, 1, 18, 318}, 318},   // sliding window 32
      {4, 4, 256, 0, {0, 37, 37, 42}, 42},    // MHA, an empty sequence, d 256
      {6, 3, 80, 5, {0, 70}, 70},             // small window, d not a power of two
      {1, 1, 33, 0, {0, 130}, 130},           // odd d, several key tiles
      {8, 1, 16, 1, {0, 20, 45}, 45},         // GQA 8, window 1 (each query sees itself)
      {2, 1, 64, 200, {3, 10, 140}, 143},     // rows 0-2 and 140-142 in no sequence
  };
  const Row row = GENERATE(from_range(rows));
  // gpt-oss's sinks: one per head, head 0's above every score (the normaliser's other branch); on
  // the rows under 200 tokens (the emulator's time: windows, GQA, d 256 and rows outside every
  // sequence are among them).
  const bool with_sinks = GENERATE(false, true);
  if (with_sinks && row.tokens > 200) return;
  const Tolerance tol = Relative(1e-5);
  CAPTURE(row.heads, row.kv_heads, row.d, row.window, row.tokens, with_sinks, Describe(tol));
  std::mt19937 rng(10);
  std::vector<float> sinks;
  if (with_sinks) {
    sinks = Normal(rng, row.heads, 2.0f);
    sinks[0] = 40.0f;
  }
  const int64_t num_seqs = static_cast<int64_t>(row.cu_seqlens.size()) - 1;
  const std::vector<float> q = Normal(rng, row.tokens * row.heads * row.d);
  const std::vector<float> k = Normal(rng, row.tokens * row.kv_heads * row.d);
  const std::vector<float> v = Normal(rng, row.tokens * row.kv_heads * row.d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(row.d));
  const std::vector<float> untouched(row.tokens * row.heads * row.d, 7.0f);
  Stream stream;
  DeviceBuffer<float> q_d(q), k_d(k), v_d(v), out_d(untouched);
  DeviceBuffer<int32_t> cu_d(row.cu_seqlens);
  DeviceBuffer<float> sinks_d(with_sinks ? sinks : std::vector<float>(1));
  STATUS_REQUIRE(PrefillAttention(q_d.get(), k_d.get(), v_d.get(), cu_d.get(), num_seqs, row.tokens,
                                  row.heads, row.kv_heads, row.d, scale, row.window,
                                  with_sinks ? sinks_d.get() : nullptr, out_d.get(), stream.get()));
  std::vector<float> want = untouched;
  STATUS_REQUIRE(cpu_ops::PrefillAttention(
      q.data(), k.data(), v.data(), row.cu_seqlens.data(), num_seqs, row.tokens, row.heads,
      row.kv_heads, row.d, scale, row.window, want.data(), with_sinks ? sinks.data() : nullptr));
  stream.Sync();
  CheckOutput("PrefillAttention", out_d.Download(), want, tol);
}

// DeepSeek's multi-head latent attention (cpu_attention/ops/deepseek_ops.h): the kv_a_layernorm
// over strided rows, the decoupled RoPE (in place and into another buffer), and the absorbed
// attention over the segments' latent rows.
TEST_CASE("backend ops: RmsNormStrided (the c_kv part of latent rows)", "[backend_ops]") {
  const int64_t rows = GENERATE(1, 37), n = GENERATE(int64_t{16}, int64_t{512});
  const int64_t stride = n + 64;  // DeepSeek's [c_kv | k_pe] rows: 512 + 64
  CAPTURE(rows, n);
  std::mt19937 rng(21);
  const std::vector<float> x = Normal(rng, rows * stride, 2.0f);
  const std::vector<float> weight = Normal(rng, n);
  Stream stream;
  DeviceBuffer<float> x_d(x), w_d(weight);
  STATUS_REQUIRE(
      RmsNormStrided(x_d.get(), stride, w_d.get(), GpuDType::kF32, rows, n, 1e-6f, stream.get()));
  std::vector<float> want = x;  // each row's first n values normed, the rest as they were
  for (int64_t r = 0; r < rows; ++r) {
    STATUS_REQUIRE(cpu_ops::RmsNorm(x.data() + r * stride, weight.data(), DType::kF32, 1, n, 1e-6f,
                                    want.data() + r * stride, DType::kF32));
  }
  stream.Sync();
  // As RmsNorm's: the GPU's block reduction sums in another order.
  CheckOutput("RmsNormStrided", x_d.Download(), want, Relative(2e-6));
}

TEST_CASE("backend ops: MlaRope (interleaved and halves, in place and into another buffer)",
          "[backend_ops]") {
  struct Row {
    int64_t tokens, heads, d, in_stride, out_stride;
  };
  static const std::vector<Row> rows = {
      {1, 1, 64, 576, 576},    // a key: the k_pe of a latent row, in place
      {37, 16, 64, 192, 576},  // V2-Lite's queries: q_pe of [nope 128 | rope 64] into latent rows
      {5, 128, 64, 192, 576},  // V3's 128 heads
      {9, 3, 2, 7, 2},         // the smallest d, odd strides
  };
  const Row row = GENERATE(from_range(rows));
  const bool interleave = GENERATE(true, false);
  const float scaling = GENERATE(1.0f, 1.2079442f);  // yarn's mscale for factor 40
  CAPTURE(row.tokens, row.heads, row.d, row.in_stride, row.out_stride, interleave, scaling);
  std::mt19937 rng(22);
  const std::vector<float> inv_freq = RopeInvFreq(row.d, 10000.0f);
  std::vector<int64_t> positions(row.tokens);
  for (int64_t t = 0; t < row.tokens; ++t) positions[t] = (t * 7919) % 40960;
  const int64_t n = row.tokens * row.heads;
  const std::vector<float> in = Normal(rng, n * row.in_stride);
  const std::vector<float> out0 = Normal(rng, n * row.out_stride);
  Stream stream;
  DeviceBuffer<float> in_d(in), out_d(out0), inv_freq_d(inv_freq);
  DeviceBuffer<int64_t> positions_d(positions);
  const bool in_place = row.in_stride == row.out_stride;
  float* out_ptr = in_place ? in_d.get() : out_d.get();
  STATUS_REQUIRE(MlaRope(in_d.get(), row.in_stride, out_ptr, row.out_stride, row.tokens, row.heads,
                         row.d, positions_d.get(), inv_freq_d.get(), scaling, interleave,
                         stream.get()));
  // The cpu op rotates in place: on a copy of the vectors, then placed as the GPU's output.
  std::vector<float> rotated = in;
  STATUS_REQUIRE(cpu_ops::MlaRope(rotated.data(), row.tokens, row.heads, row.in_stride, row.d,
                                  positions.data(), inv_freq.data(), scaling, interleave));
  std::vector<float> want = in_place ? in : out0;
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(rotated.data() + r * row.in_stride, row.d, want.data() + r * row.out_stride);
  }
  stream.Sync();
  // cosf/sinf within 2 ulp of glibc's (as ApplyRope's check).
  CheckOutput("MlaRope", in_place ? in_d.Download() : out_d.Download(), want, Relative(2e-6));
}

TEST_CASE("backend ops: PrefillAttentionLatent (MQA over latent rows, value_dim < d)",
          "[backend_ops]") {
  struct Row {
    int64_t heads, d, value_dim;
    std::vector<int32_t> cu_seqlens;
    int64_t tokens;
  };
  static const std::vector<Row> rows = {
      {16, 576, 512, {0, 1, 18, 90}, 90},  // V2-Lite: latent 512 + 64, 16 heads
      {4, 48, 32, {0, 70}, 70},            // a tiny model's latent 32 + 16
      {3, 1024, 1000, {2, 9, 66}, 68},     // the largest d; rows outside every sequence
  };
  const Row row = GENERATE(from_range(rows));
  CAPTURE(row.heads, row.d, row.value_dim, row.tokens);
  std::mt19937 rng(23);
  const int64_t num_seqs = static_cast<int64_t>(row.cu_seqlens.size()) - 1;
  const std::vector<float> q = Normal(rng, row.tokens * row.heads * row.d, 0.2f);
  const std::vector<float> latent = Normal(rng, row.tokens * row.d);
  const float scale = 0.1352f;
  const std::vector<float> untouched(row.tokens * row.heads * row.d, 7.0f);
  Stream stream;
  DeviceBuffer<float> q_d(q), latent_d(latent), out_d(untouched);
  DeviceBuffer<int32_t> cu_d(row.cu_seqlens);
  STATUS_REQUIRE(PrefillAttentionLatent(q_d.get(), latent_d.get(), cu_d.get(), num_seqs, row.tokens,
                                        row.heads, row.d, row.value_dim, scale, out_d.get(),
                                        stream.get()));
  // The cpu op with one KV head whose key and value are the latent row, then the values from
  // value_dim on set to 0 in the rows attended.
  std::vector<float> want = untouched;
  STATUS_REQUIRE(cpu_ops::PrefillAttention(q.data(), latent.data(), latent.data(),
                                           row.cu_seqlens.data(), num_seqs, row.tokens, row.heads,
                                           1, row.d, scale, 0, want.data()));
  for (int64_t t = row.cu_seqlens.front(); t < row.cu_seqlens.back(); ++t) {
    for (int64_t h = 0; h < row.heads; ++h) {
      float* o = want.data() + (t * row.heads + h) * row.d;
      std::fill(o + row.value_dim, o + row.d, 0.0f);
    }
  }
  stream.Sync();
  CheckOutput("PrefillAttentionLatent", out_d.Download(), want, Relative(1e-5));
}

// --- Bad sizes -----------------------------------------------------------------------------------

TEST_CASE("backend ops: sizes outside the API are InvalidArgument on both", "[backend_ops]") {
  // The limits kernels.h states for every backend (the GPU's launch limits, kMax*, are the kernel
  // tests' business: the cpu ops do not have them).
  Stream stream;
  DeviceBuffer<float> f(1024);
  DeviceBuffer<int32_t> i32(1024);
  DeviceBuffer<int64_t> i64(16);
  std::vector<float> hf(1024);
  std::vector<int32_t> hi32(1024);
  std::vector<int64_t> hi64(16);
  const cudaStream_t s = stream.get();
  const std::vector<int32_t> decreasing = {0, 3, 2};
  struct Check {
    const char* what;
    absl::Status gpu, cpu;
  };
  const Check checks[] = {
      {"EmbeddingGather vocab 0",
       EmbeddingGather(f.get(), GpuDType::kF32, 0, 4, i32.get(), 1, f.get(), s),
       cpu_ops::EmbeddingGather(hf.data(), DType::kF32, 0, 4, hi32.data(), 1, hf.data())},
      {"RmsNorm n 0",
       RmsNorm(f.get(), f.get(), GpuDType::kF32, 1, 0, 1e-5f, f.get(), GpuDType::kF32, s),
       cpu_ops::RmsNorm(hf.data(), hf.data(), DType::kF32, 1, 0, 1e-5f, hf.data(), DType::kF32)},
      {"RmsNorm eps < 0",
       RmsNorm(f.get(), f.get(), GpuDType::kF32, 1, 4, -1.0f, f.get(), GpuDType::kF32, s),
       cpu_ops::RmsNorm(hf.data(), hf.data(), DType::kF32, 1, 4, -1.0f, hf.data(), DType::kF32)},
      {"RmsNorm in place into bf16",
       RmsNorm(f.get(), f.get(), GpuDType::kF32, 1, 4, 1e-5f, f.get(), GpuDType::kBF16, s),
       cpu_ops::RmsNorm(hf.data(), hf.data(), DType::kF32, 1, 4, 1e-5f, hf.data(), DType::kBF16)},
      {"ApplyRope odd d", ApplyRope(f.get(), 1, 1, 3, i64.get(), f.get(), 1.0f, s),
       cpu_ops::ApplyRope(hf.data(), 1, 1, 3, hi64.data(), hf.data())},
      {"PrefillAttention heads % kv_heads",
       PrefillAttention(f.get(), f.get(), f.get(), i32.get(), 1, 4, 6, 4, 64, 0.125f, 0, nullptr,
                        f.get(), s),
       cpu_ops::PrefillAttention(hf.data(), hf.data(), hf.data(), hi32.data(), 1, 4, 6, 4, 64,
                                 0.125f, 0, hf.data())},
      {"PrefillAttention window < 0",
       PrefillAttention(f.get(), f.get(), f.get(), i32.get(), 1, 4, 8, 2, 64, 0.125f, -1, nullptr,
                        f.get(), s),
       cpu_ops::PrefillAttention(hf.data(), hf.data(), hf.data(), hi32.data(), 1, 4, 8, 2, 64,
                                 0.125f, -1, hf.data())},
      {"RouterTopK top_k 0", RouterTopK(f.get(), 1, 8, 0, i32.get(), f.get(), true, s),
       cpu_ops::RouterTopK(hf.data(), 1, 8, 0, hi32.data(), hf.data())},
      {"RouterTopK top_k > experts", RouterTopK(f.get(), 1, 8, 9, i32.get(), f.get(), true, s),
       cpu_ops::RouterTopK(hf.data(), 1, 8, 9, hi32.data(), hf.data())},
      {"BuildExpertPermutation no offsets",
       BuildExpertPermutation(i32.get(), 1, 2, 8, nullptr, i32.get(), i32.get(), s),
       cpu_ops::BuildExpertPermutation(hi32.data(), 1, 2, 8, nullptr, hi32.data(), hi32.data())},
      {"GatherRows n 0", GatherRows(f.get(), GpuDType::kF32, 4, 0, i32.get(), 1, f.get(), s),
       cpu_ops::GatherRows(hf.data(), DType::kF32, 4, 0, hi32.data(), 1, hf.data())},
      {"SiluMul in place into f16",
       SiluMul(f.get(), f.get(), GpuDType::kF32, 1, 4, f.get(), GpuDType::kF16, s),
       cpu_ops::SiluMul(hf.data(), hf.data(), DType::kF32, 1, 4, hf.data(), DType::kF16)},
      {"CombineExperts top_k 0",
       CombineExperts(f.get(), i32.get(), i32.get(), f.get(), 1, 0, 4, f.get(), nullptr, s),
       cpu_ops::CombineExperts(hf.data(), hi32.data(), hi32.data(), hf.data(), 1, 0, 4, hf.data())},
      {"ArgmaxRows n 0", ArgmaxRows(f.get(), 1, 0, i32.get(), s),
       cpu_ops::ArgmaxRows(hf.data(), 1, 0, hi32.data())},
      {"AddResidual n < 0", AddResidual(f.get(), f.get(), -1, s),
       cpu_ops::AddResidual(hf.data(), hf.data(), -1)},
      {"AddBias n 0", AddBias(f.get(), 1, 0, f.get(), GpuDType::kF32, s),
       cpu_ops::AddBias(hf.data(), 1, 0, hf.data())},
      {"ClampAbs limit 0", ClampAbs(f.get(), 4, 0.0f, s), cpu_ops::ClampAbs(hf.data(), 4, 0.0f)},
      {"ClampedSwiglu limit NaN",
       ClampedSwiglu(f.get(), f.get(), 1, 4, NAN, f.get(), GpuDType::kF32, s),
       cpu_ops::ClampedSwiglu(hf.data(), hf.data(), 1, 4, NAN, hf.data())},
      {"ClampedSwiglu inter 0",
       ClampedSwiglu(f.get(), f.get(), 1, 0, 7.0f, f.get(), GpuDType::kF32, s),
       cpu_ops::ClampedSwiglu(hf.data(), hf.data(), 1, 0, 7.0f, hf.data())},
      {"ScaleBySigmoid null gate", ScaleBySigmoid(f.get(), 1, 4, nullptr, s),
       cpu_ops::ScaleBySigmoid(hf.data(), 1, 4, nullptr)},
      {"ConvertToF32 null source", ConvertToF32(nullptr, GpuDType::kBF16, 4, f.get(), s),
       cpu_ops::ConvertToF32(nullptr, DType::kBF16, 4, hf.data())},
      {"DequantizeRows a row of Q4_K not whole blocks",
       DequantizeRows(f.get(), GgmlType::kQ4_K, 1, 128, f.get(), GpuDType::kF32, s),
       DequantizeRow(GgmlType::kQ4_K, reinterpret_cast<const std::byte*>(hf.data()), 128,
                     hf.data())},
      {"DequantizeRows a type neither decodes (Q2_K)",
       DequantizeRows(f.get(), GgmlType::kQ2_K, 1, 256, f.get(), GpuDType::kF32, s),
       DequantizeRow(GgmlType::kQ2_K, reinterpret_cast<const std::byte*>(hf.data()), 256,
                     hf.data())},
  };
  for (const Check& c : checks) {
    INFO(c.what << ": " << kBackend << " " << c.gpu.ToString() << ", cpu " << c.cpu.ToString());
    CHECK(c.gpu.code() == absl::StatusCode::kInvalidArgument);
    CHECK(c.cpu.code() == absl::StatusCode::kInvalidArgument);
  }
  stream.Sync();
}
