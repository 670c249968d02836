// Task B's kernels of cuda/kernels.h against the cpu ops (routers, expert permutation, gather,
// SiLU-mul and the clamped SwiGLU, combine), greedy argmax, the elementwise ops and conversions,
// and task B's chain against CpuDevice::TaskB's sequence; the method and tolerances:
// tests/cuda/test_backend_ops.cc, tests/cuda/backend_ops_testing.h.
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
