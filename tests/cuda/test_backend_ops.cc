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
// Tolerances (GPU against CPU; the reasons are kernels.h's and kernels_common.cuh's promises):
//   exact          copies, index ops and conversions (EmbeddingGather, GatherRows,
//                  BuildExpertPermutation, ArgmaxRows, RouterTopK's ids, AddResidual,
//                  ConvertF32To, ConvertToF32), DequantizeRows (DequantizeRow's f32 operations,
//                  then one rounding) and CombineExperts (the CPU's products and sums,
//                  each rounded, in the CPU's order); bitwise, a NaN matching any NaN
//   ulp(n)         elementwise, n units in the last place of the output dtype: SiLU-mul f32 4 and
//                  router weights 16 (CUDA's expf is within 2 ulp of glibc's), 16-bit outputs 1
//                  (the f32 values before the rounding may differ in their last bits)
//   relative(x)    max |gpu - cpu| / max |cpu|: RMSNorm f32 1e-5 (a block tree against the CPU's
//                  sequential sum of squares), RoPE 2e-6 (cosf/sinf within 2 ulp, then a
//                  difference of products), prefill attention 1e-5 (tiles of 64 keys and warp-tree
//                  dot products against the CPU's per-key online softmax), the task B chain 1e-5
// On the emulator the device's expf/cosf are the host's, so the ulp and RoPE rows are met exactly
// there; the bounds are for a GPU.
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
#include "tests/cuda/cuda_test_util.h"

using namespace moebatch;
using namespace moebatch::gpu;
using namespace moebatch::gpu::testing;

namespace {

// The backends compared with the cpu ops: this program's CUDA device.
constexpr const char* kBackend = "cuda";

// How close a backend's output must be to the cpu op's.
struct Tolerance {
  enum Kind { kExact, kUlp, kRelative } kind = kExact;
  double bound = 0;  // kUlp: units in the last place of the output dtype; kRelative: see above
};
constexpr Tolerance Exact() { return {Tolerance::kExact, 0}; }
constexpr Tolerance Ulp(double n) { return {Tolerance::kUlp, n}; }
constexpr Tolerance Relative(double x) { return {Tolerance::kRelative, x}; }

std::string Describe(Tolerance t) {
  std::ostringstream out;
  out << (t.kind == Tolerance::kExact ? "exact" : t.kind == Tolerance::kUlp ? "ulp" : "relative");
  if (t.kind != Tolerance::kExact) out << " " << t.bound;
  return out.str();
}

// Index of the first element of a and b (`dtype` bytes) whose bits differ, unless both are NaN;
// -1 when none does.
int64_t FirstMismatch(GpuDType dtype, const std::vector<unsigned char>& a,
                      const std::vector<unsigned char>& b) {
  const size_t elem = GpuDTypeSize(dtype);
  const std::vector<float> fa = Load(dtype, a), fb = Load(dtype, b);
  for (size_t i = 0; i < a.size(); i += elem) {
    if (std::memcmp(a.data() + i, b.data() + i, elem) == 0) continue;
    if (std::isnan(fa[i / elem]) && std::isnan(fb[i / elem])) continue;
    return static_cast<int64_t>(i / elem);
  }
  return -1;
}

// The backend's output against the cpu op's, both `dtype` elements.
void CheckOutput(const char* what, GpuDType dtype, const std::vector<unsigned char>& got,
                 const std::vector<unsigned char>& want, Tolerance tol) {
  INFO(kBackend << " " << what << " (" << Name(dtype) << ") against the cpu op, " << Describe(tol));
  REQUIRE(got.size() == want.size());
  switch (tol.kind) {
    case Tolerance::kExact: {
      const int64_t at = FirstMismatch(dtype, got, want);
      std::ostringstream first;
      if (at >= 0) {
        first << "first difference at element " << at << ": " << std::setprecision(9)
              << Load(dtype, got)[at] << " against " << Load(dtype, want)[at];
      }
      INFO(first.str());
      CHECK(at < 0);
      break;
    }
    case Tolerance::kUlp: {
      const int64_t ulp = MaxUlpDistance(dtype, got, want);
      CAPTURE(ulp);
      CHECK(ulp <= tol.bound);
      break;
    }
    case Tolerance::kRelative: {
      const double err = MaxRelError(Load(dtype, got), Load(dtype, want));
      CAPTURE(err);
      CHECK(err <= tol.bound);
      break;
    }
  }
}

void CheckOutput(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                 Tolerance tol) {
  CheckOutput(what, GpuDType::kF32, Bytes(got), Bytes(want), tol);
}

void CheckIds(const char* what, const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  INFO(kBackend << " " << what << " against the cpu op, exact");
  CHECK(got == want);
}

// The tolerance of an output that is an f32 value rounded to `out` (f32: `f32`; 16-bit: 1 ulp).
Tolerance Rounded(GpuDType out, Tolerance f32) { return out == GpuDType::kF32 ? f32 : Ulp(1); }

// top_k distinct random experts per token.
std::vector<int32_t> RandomChoices(std::mt19937& rng, int64_t tokens, int64_t top_k,
                                   int64_t experts) {
  std::vector<int32_t> all(experts), ids;
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + top_k);
  }
  return ids;
}

std::vector<float> RopeInvFreq(int64_t d, float theta) {  // as CpuDevice::Create
  std::vector<float> inv_freq(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(d));
  }
  return inv_freq;
}

}  // namespace

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

// --- Task B --------------------------------------------------------------------------------------

TEST_CASE("backend ops: RouterDeepseek (greedy, group_limited_greedy, noaux_tc)", "[backend_ops]") {
  struct Row {
    RouterMethod method;
    int64_t experts, top_k, n_group, topk_group;
    bool renormalize;
    float scaling;
  };
  static const std::vector<Row> rows = {
      {RouterMethod::kGreedy, 64, 6, 1, 1, false, 1.0f},                // V2-Lite
      {RouterMethod::kGroupLimitedGreedy, 160, 6, 8, 3, false, 16.0f},  // V2
      {RouterMethod::kNoauxTc, 256, 8, 8, 4, true, 2.5f},               // V3
      {RouterMethod::kNoauxTc, 8, 3, 4, 2, false, 1.0f},                // groups of 2
      {RouterMethod::kGroupLimitedGreedy, 12, 4, 3, 1, true, 1.0f},     // all in one group
  };
  const Row row = GENERATE(from_range(rows));
  const int64_t tokens = GENERATE(1, 300);
  CAPTURE(static_cast<int>(row.method), row.experts, row.top_k, row.n_group, row.topk_group,
          tokens);
  std::mt19937 rng(24);
  const std::vector<float> logits = Normal(rng, tokens * row.experts, 2.0f);
  const std::vector<float> bias = Normal(rng, row.experts, 0.5f);
  const TopkMethod cpu_method = row.method == RouterMethod::kGreedy ? TopkMethod::kGreedy
                                : row.method == RouterMethod::kGroupLimitedGreedy
                                    ? TopkMethod::kGroupLimitedGreedy
                                    : TopkMethod::kNoauxTc;
  Stream stream;
  DeviceBuffer<float> logits_d(logits), bias_d(bias);
  DeviceBuffer<int32_t> ids_d(tokens * row.top_k);
  DeviceBuffer<float> weights_d(tokens * row.top_k);
  STATUS_REQUIRE(RouterDeepseek(logits_d.get(), bias_d.get(), tokens, row.experts, row.top_k,
                                row.method, row.n_group, row.topk_group, row.renormalize,
                                row.scaling, ids_d.get(), weights_d.get(), stream.get()));
  std::vector<int32_t> want_ids(tokens * row.top_k);
  std::vector<float> want_weights(tokens * row.top_k);
  STATUS_REQUIRE(cpu_ops::RouterDeepseek(logits.data(), bias.data(), tokens, row.experts, row.top_k,
                                         cpu_method, row.n_group, row.topk_group, row.renormalize,
                                         row.scaling, want_ids.data(), want_weights.data()));
  stream.Sync();
  CheckIds("RouterDeepseek ids", ids_d.Download(), want_ids);
  // expf within 2 ulp of glibc's, then sums and a division (as RouterTopK's).
  CheckOutput("RouterDeepseek weights", weights_d.Download(), want_weights, Ulp(16));
  CHECK(RouterDeepseek(logits_d.get(), nullptr, tokens, row.experts, row.top_k,
                       RouterMethod::kNoauxTc, row.n_group, row.topk_group, true, 1.0f, ids_d.get(),
                       weights_d.get(), stream.get())
            .code() == absl::StatusCode::kInvalidArgument);  // noaux_tc without its bias
}

TEST_CASE("backend ops: RouterTopK (with tied logits)", "[backend_ops]") {
  struct Row {
    int64_t experts, top_k, tokens;
  };
  static const std::vector<Row> rows = [] {
    std::vector<Row> r;
    // Mixtral 8/2, OLMoE 64/8, Qwen1.5-MoE 60/4, Qwen3-30B-A3B 128/8, DeepSeek-V3's 256/8.
    const std::pair<int64_t, int64_t> shapes[] = {{8, 2},   {64, 6}, {5, 5},   {1, 1},  {33, 1},
                                                  {64, 64}, {60, 4}, {128, 8}, {256, 8}};
    for (auto [experts, top_k] : shapes) {
      for (int64_t tokens : {1, 37, 300}) r.push_back({experts, top_k, tokens});
    }
    return r;
  }();
  const Row row = GENERATE(from_range(rows));
  const bool renormalize = GENERATE(true, false);  // norm_topk_prob
  const Tolerance weight_tol = Ulp(16);
  CAPTURE(row.experts, row.top_k, row.tokens, renormalize, Describe(weight_tol));
  std::mt19937 rng(4);
  std::vector<float> logits = Normal(rng, row.tokens * row.experts, 2.0f);
  if (row.tokens >= 37 && row.experts >= 3) {
    float* l = logits.data();
    std::fill(l, l + row.experts, 0.0f);  // token 0: all tied
    l += row.experts;
    l[1] = l[2] = l[row.experts - 1] = 9.0f;  // token 1: three tied at the top
    l += row.experts;
    l[0] = 5.0f;  // token 2: one top, then a tie
    l[1] = l[row.experts - 1] = 4.0f;
    l += row.experts;
    for (int64_t e = 0; e < row.experts; ++e) l[e] = e % 2 ? 80.0f : -80.0f;  // token 3: far apart
  }
  Stream stream;
  DeviceBuffer<float> logits_d(logits);
  DeviceBuffer<int32_t> ids_d(row.tokens * row.top_k);
  DeviceBuffer<float> weights_d(row.tokens * row.top_k);
  STATUS_REQUIRE(RouterTopK(logits_d.get(), row.tokens, row.experts, row.top_k, ids_d.get(),
                            weights_d.get(), renormalize, stream.get()));
  std::vector<int32_t> want_ids(row.tokens * row.top_k);
  std::vector<float> want_weights(row.tokens * row.top_k);
  STATUS_REQUIRE(cpu_ops::RouterTopK(logits.data(), row.tokens, row.experts, row.top_k,
                                     want_ids.data(), want_weights.data(), renormalize));
  stream.Sync();
  CheckIds("RouterTopK ids", ids_d.Download(), want_ids);
  CheckOutput("RouterTopK weights", weights_d.Download(), want_weights, weight_tol);
}

TEST_CASE("backend ops: BuildExpertPermutation (skewed, ids out of range, zero tokens)",
          "[backend_ops]") {
  struct Row {
    int64_t tokens, top_k, experts;
    bool skewed;   // every token picks experts 5 and 3 first
    bool bad_ids;  // a few ids outside [0, experts)
  };
  static const std::vector<Row> rows = {
      {1, 2, 8, false, false},    {37, 2, 8, false, false},  {300, 6, 64, false, false},
      {8192, 2, 8, false, false}, {1000, 2, 8, true, false}, {5000, 1, 256, false, false},
      {77, 2, 8, false, true},    {0, 2, 8, false, false},   {3, 8, 8, false, false},
  };
  const Row row = GENERATE(from_range(rows));
  CAPTURE(row.tokens, row.top_k, row.experts, row.skewed, row.bad_ids);
  std::mt19937 rng(5);
  std::vector<int32_t> ids = RandomChoices(rng, row.tokens, row.top_k, row.experts);
  if (row.skewed) {
    for (int64_t t = 0; t < row.tokens; ++t) {
      ids[t * row.top_k] = 5;
      ids[t * row.top_k + 1] = 3;
    }
  }
  if (row.bad_ids) {
    ids[3] = -1;
    ids[10] = static_cast<int32_t>(row.experts);
    ids[11] = 1000;
  }
  const int64_t pairs = row.tokens * row.top_k;
  Stream stream;
  DeviceBuffer<int32_t> ids_d(ids), offsets_d(row.experts + 1), sorted_d(pairs), slot_of_d(pairs);
  STATUS_REQUIRE(BuildExpertPermutation(ids_d.get(), row.tokens, row.top_k, row.experts,
                                        offsets_d.get(), sorted_d.get(), slot_of_d.get(),
                                        stream.get()));
  std::vector<int32_t> offsets(row.experts + 1, -1), sorted(pairs, -1), slot_of(pairs, -1);
  STATUS_REQUIRE(cpu_ops::BuildExpertPermutation(ids.data(), row.tokens, row.top_k, row.experts,
                                                 offsets.data(), sorted.data(), slot_of.data()));
  stream.Sync();
  CheckIds("BuildExpertPermutation offsets", offsets_d.Download(), offsets);
  std::vector<int32_t> got_sorted = sorted_d.Download();
  got_sorted.resize(offsets.back());  // rows past the valid ones are not written
  sorted.resize(offsets.back());
  CheckIds("BuildExpertPermutation sorted_token", got_sorted, sorted);
  CheckIds("BuildExpertPermutation slot_of", slot_of_d.Download(), slot_of);
}

TEST_CASE("backend ops: GatherRows (aligned and unaligned rows, indices out of range)",
          "[backend_ops]") {
  struct Row {
    GpuDType dtype;
    int64_t n;
    bool offset_dst;  // dst 2 or 4 bytes off 16-byte alignment: the element-wise copy path
  };
  static const std::vector<Row> rows = [] {
    std::vector<Row> r;
    for (GpuDType dtype : kAllDTypes) {
      for (int64_t n : {4096, 100, 3, 1}) {
        for (bool offset : {false, true}) r.push_back({dtype, n, offset});
      }
    }
    return r;
  }();
  const Row row = GENERATE(from_range(rows));
  CAPTURE(Name(row.dtype), row.n, row.offset_dst);
  std::mt19937 rng(6);
  const int64_t src_rows = 37, rows_out = 74;
  const HostTensor src = Store(row.dtype, Normal(rng, src_rows * row.n));
  std::uniform_int_distribution<int32_t> pick(0, src_rows - 1);
  std::vector<int32_t> index(rows_out);
  for (int32_t& i : index) i = pick(rng);
  index[7] = -1;
  index[8] = static_cast<int32_t>(src_rows);
  const size_t elem = GpuDTypeSize(row.dtype), bytes = rows_out * row.n * elem;
  const size_t skip = row.offset_dst ? elem : 0;
  Stream stream;
  DeviceBuffer<unsigned char> src_d(src.bytes), dst_d(bytes + elem);
  DeviceBuffer<int32_t> index_d(index);
  STATUS_REQUIRE(GatherRows(src_d.get(), row.dtype, src_rows, row.n, index_d.get(), rows_out,
                            dst_d.get() + skip, stream.get()));
  std::vector<unsigned char> want(bytes, 0xab);
  STATUS_REQUIRE(cpu_ops::GatherRows(src.bytes.data(), CpuDType(row.dtype), src_rows, row.n,
                                     index.data(), rows_out, want.data()));
  stream.Sync();
  const std::vector<unsigned char> all = dst_d.Download();
  const std::vector<unsigned char> got(all.begin() + skip, all.begin() + skip + bytes);
  CheckOutput("GatherRows", row.dtype, got, want, Exact());
}

TEST_CASE("backend ops: SiluMul (every input x output dtype, in place, NaN)", "[backend_ops]") {
  struct Row {
    int64_t rows, inter;
    GpuDType in, out;
    Tolerance tol;
  };
  static const std::vector<Row> table = [] {
    std::vector<Row> r;
    for (int64_t rows : {1, 37}) {
      for (int64_t inter : {14336, 100, 1}) {
        for (GpuDType in : kAllDTypes) {
          for (GpuDType out : kAllDTypes) r.push_back({rows, inter, in, out, Rounded(out, Ulp(4))});
        }
      }
    }
    return r;
  }();
  const Row row = GENERATE(from_range(table));
  CAPTURE(row.rows, row.inter, Name(row.in), Name(row.out), Describe(row.tol));
  std::mt19937 rng(7);
  std::vector<float> gate32 = Normal(rng, row.rows * row.inter, 3.0f);
  const std::vector<float> up32 = Normal(rng, row.rows * row.inter);
  if (gate32.size() >= 4) {
    gate32[1] = -100.0f;  // expf(100) overflows: -0
    gate32[2] = 100.0f;
    gate32[3] = NAN;
  }
  const HostTensor gate = Store(row.in, gate32), up = Store(row.in, up32);
  const size_t out_bytes = row.rows * row.inter * GpuDTypeSize(row.out);
  Stream stream;
  DeviceBuffer<unsigned char> gate_d(gate.bytes), up_d(up.bytes), out_d(out_bytes);
  STATUS_REQUIRE(SiluMul(gate_d.get(), up_d.get(), row.in, row.rows, row.inter, out_d.get(),
                         row.out, stream.get()));
  std::vector<unsigned char> want(out_bytes);
  STATUS_REQUIRE(cpu_ops::SiluMul(gate.bytes.data(), up.bytes.data(), CpuDType(row.in), row.rows,
                                  row.inter, want.data(), CpuDType(row.out)));
  stream.Sync();
  CheckOutput("SiluMul", row.out, out_d.Download(), want, row.tol);
  if (row.out == row.in) {  // in place into gate
    STATUS_REQUIRE(SiluMul(gate_d.get(), up_d.get(), row.in, row.rows, row.inter, gate_d.get(),
                           row.in, stream.get()));
    stream.Sync();
    CheckOutput("SiluMul in place", row.in, gate_d.Download(), want, row.tol);
  }
}

TEST_CASE("backend ops: CombineExperts (expert id order, slots out of range skipped)",
          "[backend_ops]") {
  struct Row {
    int64_t tokens, experts, top_k, hidden;
    bool bad_slots;
  };
  // With top_k 2 any order gives the same bits ((0 + a) + b == (0 + b) + a): the order is tested
  // by the rows with top_k 6 and 8 (a kernel summing in choice order fails them).
  static const std::vector<Row> rows = {
      {1, 8, 2, 4096, false},   {37, 8, 2, 4096, false}, {37, 8, 2, 100, true},
      {300, 64, 6, 100, false}, {5, 8, 8, 33, false},    {3, 4, 1, 5, true},
  };
  const Row row = GENERATE(from_range(rows));
  const bool with_shared = GENERATE(false, true);  // Qwen2-MoE's shared expert output added
  const Tolerance tol = Exact();
  CAPTURE(row.tokens, row.experts, row.top_k, row.hidden, row.bad_slots, with_shared);
  std::mt19937 rng(8);
  const int64_t pairs = row.tokens * row.top_k;
  // Routing from the cpu ops (choices in descending weight order, so not in id order).
  const std::vector<float> logits = Normal(rng, row.tokens * row.experts, 2.0f);
  std::vector<int32_t> ids(pairs), offsets(row.experts + 1), sorted(pairs), slot_of(pairs);
  std::vector<float> weights(pairs);
  STATUS_REQUIRE(cpu_ops::RouterTopK(logits.data(), row.tokens, row.experts, row.top_k, ids.data(),
                                     weights.data()));
  STATUS_REQUIRE(cpu_ops::BuildExpertPermutation(ids.data(), row.tokens, row.top_k, row.experts,
                                                 offsets.data(), sorted.data(), slot_of.data()));
  if (row.bad_slots) {
    slot_of[0] = -1;
    slot_of[pairs - 1] = static_cast<int32_t>(pairs);
  }
  const std::vector<float> expert_out = Normal(rng, pairs * row.hidden);
  const std::vector<float> h = Normal(rng, row.tokens * row.hidden, 4.0f);
  const std::vector<float> shared = Normal(rng, row.tokens * row.hidden);
  Stream stream;
  DeviceBuffer<float> expert_out_d(expert_out), weights_d(weights), h_d(h), shared_d(shared);
  DeviceBuffer<int32_t> slot_of_d(slot_of), ids_d(ids);
  STATUS_REQUIRE(CombineExperts(expert_out_d.get(), slot_of_d.get(), ids_d.get(), weights_d.get(),
                                row.tokens, row.top_k, row.hidden, h_d.get(),
                                with_shared ? shared_d.get() : nullptr, stream.get()));
  std::vector<float> want = h;
  STATUS_REQUIRE(cpu_ops::CombineExperts(expert_out.data(), slot_of.data(), ids.data(),
                                         weights.data(), row.tokens, row.top_k, row.hidden,
                                         want.data(), with_shared ? shared.data() : nullptr));
  stream.Sync();
  CheckOutput("CombineExperts", h_d.Download(), want, tol);
}

// --- Greedy decoding -----------------------------------------------------------------------------

TEST_CASE("backend ops: ArgmaxRows (ties: the first maximum wins)", "[backend_ops]") {
  const int64_t n = GENERATE(32000, 257, 3, 1);
  CAPTURE(n);
  std::mt19937 rng(12);
  const int64_t rows = 9;
  std::vector<float> x = Normal(rng, rows * n);
  // Row 1: the maximum twice, far apart; row 2: a tie inside one thread's stride and another
  // across warps; row 3: all -inf; row 4: the maximum last; row 5: all equal; row 6: +inf twice.
  if (n >= 3) {
    float* r1 = x.data() + 1 * n;
    r1[n - 1] = r1[1] = 100.0f;
    float* r2 = x.data() + 2 * n;
    r2[n / 2] = r2[n / 2 + 1] = r2[n - 1] = 50.0f;
    x[4 * n + n - 1] = 1000.0f;
    x[6 * n + 2] = x[6 * n + n - 1] = INFINITY;
  }
  std::fill(x.begin() + 3 * n, x.begin() + 4 * n, -INFINITY);
  std::fill(x.begin() + 5 * n, x.begin() + 6 * n, 0.25f);
  Stream stream;
  DeviceBuffer<float> x_d(x);
  DeviceBuffer<int32_t> ids_d(rows);
  STATUS_REQUIRE(ArgmaxRows(x_d.get(), rows, n, ids_d.get(), stream.get()));
  std::vector<int32_t> want(rows, -1);
  STATUS_REQUIRE(cpu_ops::ArgmaxRows(x.data(), rows, n, want.data()));
  stream.Sync();
  CheckIds("ArgmaxRows", ids_d.Download(), want);
}

// --- Elementwise ---------------------------------------------------------------------------------

TEST_CASE(
    "backend ops: the families' elementwise ops (AddBias, strided too, ClampedSwiglu, ClampAbs, "
    "ScaleBySigmoid)",
    "[backend_ops]") {
  struct Row {
    int64_t rows, n;
  };
  static const std::vector<Row> rows = {{1, 1}, {37, 96}, {5, 4096}, {300, 33}};
  const Row row = GENERATE(from_range(rows));
  CAPTURE(row.rows, row.n);
  std::mt19937 rng(14);
  std::vector<float> x = Normal(rng, row.rows * row.n, 3.0f);
  x[0] = NAN;  // clamp keeps a NaN (torch.clamp), sigmoid scaling propagates it
  if (x.size() > 2) x[1] = -INFINITY;
  Stream stream;
  // AddBias, the bias in each storage dtype: the cpu op gets the same values widened to f32.
  const std::vector<float> bias = Normal(rng, row.n);
  for (GpuDType dtype : kAllDTypes) {
    CAPTURE(Name(dtype));
    std::vector<unsigned char> typed(row.n * GpuDTypeSize(dtype));
    STATUS_REQUIRE(cpu_ops::ConvertF32To(bias.data(), row.n, typed.data(), CpuDType(dtype)));
    std::vector<float> wide(row.n);
    STATUS_REQUIRE(cpu_ops::ConvertToF32(typed.data(), CpuDType(dtype), row.n, wide.data()));
    DeviceBuffer<float> x_d(x);
    DeviceBuffer<unsigned char> bias_d(typed);
    STATUS_REQUIRE(AddBias(x_d.get(), row.rows, row.n, bias_d.get(), dtype, stream.get()));
    std::vector<float> want = x;
    STATUS_REQUIRE(cpu_ops::AddBias(want.data(), row.rows, row.n, wide.data()));
    stream.Sync();
    CheckOutput("AddBias", x_d.Download(), want, Exact());
  }
  {
    // gpt-oss's interleaved gate_up bias: the odd elements of a [2 n] row, read every second one;
    // the cpu op gets them de-interleaved.
    const std::vector<float> gate_up = Normal(rng, 2 * row.n);
    std::vector<float> odd(row.n);
    for (int64_t i = 0; i < row.n; ++i) odd[i] = gate_up[2 * i + 1];
    DeviceBuffer<float> x_d(x), bias_d(gate_up);
    STATUS_REQUIRE(AddBiasStrided(x_d.get(), row.rows, row.n, bias_d.get() + 1, GpuDType::kF32, 2,
                                  stream.get()));
    std::vector<float> want = x;
    STATUS_REQUIRE(cpu_ops::AddBias(want.data(), row.rows, row.n, odd.data()));
    stream.Sync();
    CheckOutput("AddBiasStrided", x_d.Download(), want, Exact());
    CHECK(AddBiasStrided(x_d.get(), row.rows, row.n, bias_d.get(), GpuDType::kF32, 0, stream.get())
              .code() == absl::StatusCode::kInvalidArgument);
  }
  for (GpuDType out : kAllDTypes) {
    // gpt-oss's clamped SwiGLU with its limit 7: values beyond it on both sides, NaN, -inf.
    CAPTURE(Name(out));
    const std::vector<float> up = Normal(rng, row.rows * row.n, 6.0f);
    const size_t bytes = row.rows * row.n * GpuDTypeSize(out);
    DeviceBuffer<float> gate_d(x), up_d(up);
    DeviceBuffer<unsigned char> out_d(bytes);
    STATUS_REQUIRE(ClampedSwiglu(gate_d.get(), up_d.get(), row.rows, row.n, 7.0f, out_d.get(), out,
                                 stream.get()));
    std::vector<float> want32(row.rows * row.n);
    STATUS_REQUIRE(
        cpu_ops::ClampedSwiglu(x.data(), up.data(), row.rows, row.n, 7.0f, want32.data()));
    std::vector<unsigned char> want(bytes);
    STATUS_REQUIRE(
        cpu_ops::ConvertF32To(want32.data(), row.rows * row.n, want.data(), CpuDType(out)));
    stream.Sync();
    // expf within 2 ulp of glibc's, then a division and two products: as SiluMul's.
    CheckOutput("ClampedSwiglu", out, out_d.Download(), want, Rounded(out, Ulp(4)));
  }
  {
    DeviceBuffer<float> x_d(x);
    STATUS_REQUIRE(ClampAbs(x_d.get(), row.rows * row.n, 2.0f, stream.get()));  // OLMoE-style
    std::vector<float> want = x;
    STATUS_REQUIRE(cpu_ops::ClampAbs(want.data(), row.rows * row.n, 2.0f));
    stream.Sync();
    CheckOutput("ClampAbs", x_d.Download(), want, Exact());
  }
  {
    const std::vector<float> gate = Normal(rng, row.rows, 4.0f);
    DeviceBuffer<float> x_d(x), gate_d(gate);
    STATUS_REQUIRE(ScaleBySigmoid(x_d.get(), row.rows, row.n, gate_d.get(), stream.get()));
    std::vector<float> want = x;
    STATUS_REQUIRE(cpu_ops::ScaleBySigmoid(want.data(), row.rows, row.n, gate.data()));
    stream.Sync();
    // expf within 2 ulp of glibc's, then a division and a product.
    CheckOutput("ScaleBySigmoid", x_d.Download(), want, Ulp(8));
  }
}

TEST_CASE("backend ops: AddResidual and the conversions (rounding corners, NaN)", "[backend_ops]") {
  const int64_t n = GENERATE(1, 101, 37 * 4096);
  CAPTURE(n);
  std::mt19937 rng(9);
  std::vector<float> x = Normal(rng, n, 100.0f);
  const std::vector<float> h = Normal(rng, n);
  Stream stream;
  {
    DeviceBuffer<float> h_d(h), x_d(x);
    STATUS_REQUIRE(AddResidual(h_d.get(), x_d.get(), n, stream.get()));
    std::vector<float> want = h;
    STATUS_REQUIRE(cpu_ops::AddResidual(want.data(), x.data(), n));
    stream.Sync();
    CheckOutput("AddResidual", h_d.Download(), want, Exact());
  }
  // Signed zero, infinities, f16 overflow and its halfway point, subnormals of f16 and f32,
  // halfway points of bf16 and f16, the largest f32, NaN.
  const std::vector<float> corners = {
      0.0f,  -0.0f,  INFINITY,          -INFINITY,          70000.0f, -65520.0f, 65504.0f,
      1e-7f, -3e-8f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 2048, 1e-40f,   3.4e38f,   NAN};
  std::copy_n(corners.begin(), std::min<size_t>(corners.size(), x.size()), x.begin());
  DeviceBuffer<float> x_d(x);
  for (GpuDType dtype : kAllDTypes) {
    CAPTURE(Name(dtype));
    DeviceBuffer<unsigned char> typed_d(n * GpuDTypeSize(dtype));
    STATUS_REQUIRE(ConvertF32To(x_d.get(), n, typed_d.get(), dtype, stream.get()));
    std::vector<unsigned char> want_typed(n * GpuDTypeSize(dtype));
    STATUS_REQUIRE(cpu_ops::ConvertF32To(x.data(), n, want_typed.data(), CpuDType(dtype)));
    stream.Sync();
    const std::vector<unsigned char> typed = typed_d.Download();
    CheckOutput("ConvertF32To", dtype, typed, want_typed, Exact());
    // Back from the same bytes.
    DeviceBuffer<float> back_d(n);
    STATUS_REQUIRE(ConvertToF32(typed_d.get(), dtype, n, back_d.get(), stream.get()));
    std::vector<float> want_back(n);
    STATUS_REQUIRE(cpu_ops::ConvertToF32(typed.data(), CpuDType(dtype), n, want_back.data()));
    stream.Sync();
    CheckOutput("ConvertToF32", back_d.Download(), want_back, Exact());
  }
}

TEST_CASE("backend ops: ConvertToF32 of every bf16 and f16 pattern", "[backend_ops]") {
  const GpuDType dtype = GENERATE(GpuDType::kBF16, GpuDType::kF16);
  CAPTURE(Name(dtype));
  std::vector<uint16_t> all(65536);
  std::iota(all.begin(), all.end(), uint16_t{0});
  Stream stream;
  DeviceBuffer<uint16_t> all_d(all);
  DeviceBuffer<float> wide_d(all.size());
  STATUS_REQUIRE(ConvertToF32(all_d.get(), dtype, 65536, wide_d.get(), stream.get()));
  std::vector<float> want(all.size());
  STATUS_REQUIRE(cpu_ops::ConvertToF32(all.data(), CpuDType(dtype), 65536, want.data()));
  stream.Sync();
  CheckOutput("ConvertToF32", wide_d.Download(), want, Exact());
}

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

// --- Composition ---------------------------------------------------------------------------------

TEST_CASE("backend ops: the task B chain equals CpuDevice::TaskB's sequence of cpu ops",
          "[backend_ops]") {
  // Router -> permutation -> gather -> w1, w3 GEMMs -> SiLU-mul -> w2 GEMM -> combine, once with
  // the kernels and once with the cpu ops, the GEMMs in both by the cpu backend's Matmul (f32,
  // batch-invariant) in place of cuBLAS: the chain's indices must line up (each expert's rows of
  // the sorted buffer, the slots the combine reads).
  const Tolerance tol = Relative(1e-5);
  std::mt19937 rng(11);
  const int64_t tokens = 37, hidden = 64, inter = 48, experts = 8, top_k = 2;
  const int64_t pairs = tokens * top_k;
  const std::vector<float> x = Normal(rng, tokens * hidden);
  const std::vector<float> logits = Normal(rng, tokens * experts, 2.0f);
  std::vector<std::vector<float>> w1(experts), w3(experts), w2(experts);
  for (int64_t e = 0; e < experts; ++e) {
    w1[e] = Normal(rng, inter * hidden, 0.1f);
    w3[e] = Normal(rng, inter * hidden, 0.1f);
    w2[e] = Normal(rng, hidden * inter, 0.1f);
  }
  const std::vector<float> h = Normal(rng, tokens * hidden);
  auto matmul = Matmul::Create(DType::kF32, 0, /*batch_invariant=*/true);
  REQUIRE(matmul.ok());
  // y [rows, n] = in [rows, k] wᵀ for each expert's rows [offsets[e], offsets[e + 1]).
  auto expert_gemms = [&](const std::vector<int32_t>& offsets, const std::vector<float>& in,
                          int64_t k, const std::vector<std::vector<float>>& w, int64_t n,
                          std::vector<float>* y) {
    y->assign(pairs * n, 0.0f);
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
      STATUS_REQUIRE((*matmul)->Linear(in.data() + begin * k, rows, k, w[e].data(), DType::kF32, n,
                                       y->data() + begin * n));
    }
  };

  // The cpu ops, as CpuDevice::TaskB calls them.
  std::vector<int32_t> ids(pairs), offsets(experts + 1), sorted(pairs), slot_of(pairs);
  std::vector<float> weights(pairs), expert_in(pairs * hidden), gate, up, expert_out;
  STATUS_REQUIRE(
      cpu_ops::RouterTopK(logits.data(), tokens, experts, top_k, ids.data(), weights.data()));
  STATUS_REQUIRE(cpu_ops::BuildExpertPermutation(ids.data(), tokens, top_k, experts, offsets.data(),
                                                 sorted.data(), slot_of.data()));
  STATUS_REQUIRE(cpu_ops::GatherRows(x.data(), DType::kF32, tokens, hidden, sorted.data(), pairs,
                                     expert_in.data()));
  expert_gemms(offsets, expert_in, hidden, w1, inter, &gate);
  expert_gemms(offsets, expert_in, hidden, w3, inter, &up);
  STATUS_REQUIRE(cpu_ops::SiluMul(gate.data(), up.data(), DType::kF32, pairs, inter, gate.data(),
                                  DType::kF32));
  expert_gemms(offsets, gate, inter, w2, hidden, &expert_out);
  std::vector<float> want = h;
  STATUS_REQUIRE(cpu_ops::CombineExperts(expert_out.data(), slot_of.data(), ids.data(),
                                         weights.data(), tokens, top_k, hidden, want.data()));

  // The kernels.
  Stream stream;
  DeviceBuffer<float> logits_d(logits), x_d(x), h_d(h);
  DeviceBuffer<int32_t> ids_d(pairs), offsets_d(experts + 1), sorted_d(pairs), slot_of_d(pairs);
  DeviceBuffer<float> weights_d(pairs), expert_in_d(pairs * hidden);
  STATUS_REQUIRE(RouterTopK(logits_d.get(), tokens, experts, top_k, ids_d.get(), weights_d.get(),
                            true, stream.get()));
  STATUS_REQUIRE(BuildExpertPermutation(ids_d.get(), tokens, top_k, experts, offsets_d.get(),
                                        sorted_d.get(), slot_of_d.get(), stream.get()));
  STATUS_REQUIRE(GatherRows(x_d.get(), GpuDType::kF32, tokens, hidden, sorted_d.get(), pairs,
                            expert_in_d.get(), stream.get()));
  stream.Sync();
  const std::vector<int32_t> gpu_offsets = offsets_d.Download();
  REQUIRE(gpu_offsets.back() == pairs);
  std::vector<float> gpu_gate, gpu_up, gpu_out;
  expert_gemms(gpu_offsets, expert_in_d.Download(), hidden, w1, inter, &gpu_gate);
  expert_gemms(gpu_offsets, expert_in_d.Download(), hidden, w3, inter, &gpu_up);
  DeviceBuffer<float> gate_d(gpu_gate), up_d(gpu_up);
  STATUS_REQUIRE(SiluMul(gate_d.get(), up_d.get(), GpuDType::kF32, pairs, inter, gate_d.get(),
                         GpuDType::kF32, stream.get()));
  stream.Sync();
  expert_gemms(gpu_offsets, gate_d.Download(), inter, w2, hidden, &gpu_out);
  DeviceBuffer<float> expert_out_d(gpu_out);
  STATUS_REQUIRE(CombineExperts(expert_out_d.get(), slot_of_d.get(), ids_d.get(), weights_d.get(),
                                tokens, top_k, hidden, h_d.get(), nullptr, stream.get()));
  stream.Sync();
  CheckIds("task B chain: router ids", ids_d.Download(), ids);
  CheckOutput("task B chain: h", h_d.Download(), want, tol);
}
