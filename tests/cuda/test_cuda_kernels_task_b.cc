// cuda/kernels.h, task B (router top-k, expert permutation, gather, SiLU-mul, combine, and the
// chain of them) against the cpu backend's loops (cpu_attention/backend/cpu_device.cc) on random inputs. Same
// tolerances and GPU rule as test_cuda_kernels_task_a.cc.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/kernels.h"
#include "tests/cuda/cuda_test_util.h"

using namespace moebatch::gpu;
using namespace moebatch::gpu::testing;

namespace {

// The cpu backend's router (cpu_attention/backend/cpu_device.cc, CpuDevice::TaskB), verbatim in float.
void RouterReference(const std::vector<float>& logits, int64_t tokens, int64_t experts,
                     int64_t top_k, std::vector<int32_t>* ids, std::vector<float>* weights) {
  ids->assign(tokens * top_k, -1);
  weights->assign(tokens * top_k, 0.0f);
  std::vector<int64_t> order(experts);
  std::vector<float> probs(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* logit = logits.data() + t * experts;
    const float max_logit = *std::max_element(logit, logit + experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < experts; ++e) sum += probs[e] = std::exp(logit[e] - max_logit);
    for (int64_t e = 0; e < experts; ++e) probs[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int64_t a, int64_t b) {
      return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
    });
    float top_sum = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) top_sum += probs[order[j]];
    for (int64_t j = 0; j < top_k; ++j) {
      (*ids)[t * top_k + j] = static_cast<int32_t>(order[j]);
      (*weights)[t * top_k + j] = probs[order[j]] / top_sum;
    }
  }
}

struct Permutation {
  std::vector<int32_t> offsets, sorted_token, slot_of;
};

// Counting sort of the (token, choice) pairs by expert, pairs in order; invalid ids get slot -1.
Permutation PermutationReference(const std::vector<int32_t>& ids, int64_t top_k, int64_t experts) {
  const int64_t pairs = static_cast<int64_t>(ids.size());
  Permutation p;
  p.offsets.assign(experts + 1, 0);
  for (int32_t e : ids) {
    if (e >= 0 && e < experts) ++p.offsets[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) p.offsets[e + 1] += p.offsets[e];
  std::vector<int32_t> cursor(p.offsets.begin(), p.offsets.end() - 1);
  p.sorted_token.assign(p.offsets[experts], -1);
  p.slot_of.assign(pairs, -1);
  for (int64_t i = 0; i < pairs; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= experts) continue;
    const int32_t slot = cursor[e]++;
    p.sorted_token[slot] = static_cast<int32_t>(i / top_k);
    p.slot_of[i] = slot;
  }
  return p;
}

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

// The CPU backend's combine: experts in id order into a zeroed sum, then h += sum (float).
void CombineReference(const std::vector<float>& expert_out, const std::vector<int32_t>& slot_of,
                      const std::vector<int32_t>& ids, const std::vector<float>& weights,
                      int64_t tokens, int64_t top_k, int64_t experts, int64_t hidden,
                      std::vector<float>* h) {
  std::vector<float> moe(hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    std::fill(moe.begin(), moe.end(), 0.0f);
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t j = 0; j < top_k; ++j) {
        if (ids[t * top_k + j] != e) continue;
        const float* src = expert_out.data() + slot_of[t * top_k + j] * hidden;
        const float w = weights[t * top_k + j];
        for (int64_t c = 0; c < hidden; ++c) moe[c] += src[c] * w;
      }
    }
    for (int64_t c = 0; c < hidden; ++c) (*h)[t * hidden + c] += moe[c];
  }
}

// y [rows, n] = x [rows, k] wᵀ (w [n, k]), float, in order (stands in for cuBLAS in the task B
// pipeline test; the reference uses the same function).
void HostLinear(const float* x, int64_t rows, int64_t k, const std::vector<float>& w, int64_t n,
                float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < k; ++i) acc += x[r * k + i] * w[j * k + i];
      y[r * n + j] = acc;
    }
  }
}

}  // namespace

TEST_CASE("RouterTopK matches the CPU router", "[cuda]") {
  std::mt19937 rng(4);
  Stream stream;
  struct Shape {
    int64_t experts, top_k;
  };
  for (Shape s : {Shape{8, 2}, Shape{64, 6}, Shape{5, 5}, Shape{1, 1}, Shape{33, 1}}) {
    for (int64_t tokens : {1, 37, 300}) {
      CAPTURE(s.experts, s.top_k, tokens);
      const std::vector<float> logits = Normal(rng, tokens * s.experts, 2.0f);
      std::vector<int32_t> want_ids;
      std::vector<float> want_weights;
      RouterReference(logits, tokens, s.experts, s.top_k, &want_ids, &want_weights);
      DeviceBuffer<float> logits_d(logits);
      DeviceBuffer<int32_t> ids_d(tokens * s.top_k);
      DeviceBuffer<float> weights_d(tokens * s.top_k);
      STATUS_REQUIRE(RouterTopK(logits_d.get(), tokens, s.experts, s.top_k, ids_d.get(),
                                weights_d.get(), stream.get()));
      stream.Sync();
      CHECK(ids_d.Download() == want_ids);
      const double err = MaxRelError(weights_d.Download(), want_weights);
      CAPTURE(err);
      CHECK(err <= 1e-5);
    }
  }
}

TEST_CASE("RouterTopK breaks ties to the lower expert id, descending order", "[cuda]") {
  Stream stream;
  const int64_t experts = 8, top_k = 3;
  const std::vector<float> logits = {
      0,    0,    0,    0,    0,  0, 0,  0,   // all tied: 0, 1, 2
      1,    3,    3,    0,    3,  0, 0,  0,   // three tied at the top: 1, 2, 4
      0.1f, 0.5f, 0.3f, 0.7f, 0,  0, 0,  -1,  // distinct: 3, 1, 2
      -5,   -5,   2,    -5,   -5, 1, -5, 1,   // one top, then a tie: 2, 5, 7
  };
  const int64_t tokens = static_cast<int64_t>(logits.size()) / experts;
  std::vector<int32_t> want_ids;
  std::vector<float> want_weights;
  RouterReference(logits, tokens, experts, top_k, &want_ids, &want_weights);
  REQUIRE(want_ids == std::vector<int32_t>{0, 1, 2, 1, 2, 4, 3, 1, 2, 2, 5, 7});
  DeviceBuffer<float> logits_d(logits);
  DeviceBuffer<int32_t> ids_d(tokens * top_k);
  DeviceBuffer<float> weights_d(tokens * top_k);
  STATUS_REQUIRE(RouterTopK(logits_d.get(), tokens, experts, top_k, ids_d.get(), weights_d.get(),
                            stream.get()));
  stream.Sync();
  CHECK(ids_d.Download() == want_ids);
  const std::vector<float> weights = weights_d.Download();
  CHECK(MaxRelError(weights, want_weights) <= 1e-5);
  for (int64_t t = 0; t < tokens; ++t) {
    CHECK(std::abs(weights[t * top_k] + weights[t * top_k + 1] + weights[t * top_k + 2] - 1.0f) <=
          1e-6f);
  }
}

TEST_CASE("BuildExpertPermutation sorts the pairs by expert, tokens in order", "[cuda]") {
  std::mt19937 rng(5);
  Stream stream;
  struct Case {
    int64_t tokens, top_k, experts;
    bool skewed;   // every token picks the same experts
    bool bad_ids;  // a few ids outside [0, experts)
  };
  for (Case c : {Case{1, 2, 8, false, false}, Case{37, 2, 8, false, false},
                 Case{300, 6, 64, false, false}, Case{8192, 2, 8, false, false},
                 Case{1000, 2, 8, true, false}, Case{5000, 1, 256, false, false},
                 Case{77, 2, 8, false, true}, Case{0, 2, 8, false, false}}) {
    CAPTURE(c.tokens, c.top_k, c.experts, c.skewed, c.bad_ids);
    std::vector<int32_t> ids = RandomChoices(rng, c.tokens, c.top_k, c.experts);
    if (c.skewed) {
      for (int64_t t = 0; t < c.tokens; ++t) {
        ids[t * c.top_k] = 5;
        ids[t * c.top_k + 1] = 3;
      }
    }
    if (c.bad_ids) {
      ids[3] = -1;
      ids[10] = static_cast<int32_t>(c.experts);
      ids[11] = 1000;
    }
    const Permutation want = PermutationReference(ids, c.top_k, c.experts);
    const int64_t pairs = c.tokens * c.top_k;
    DeviceBuffer<int32_t> ids_d(ids);
    DeviceBuffer<int32_t> offsets_d(c.experts + 1);
    DeviceBuffer<int32_t> sorted_d(pairs);
    DeviceBuffer<int32_t> slot_of_d(pairs);
    STATUS_REQUIRE(BuildExpertPermutation(ids_d.get(), c.tokens, c.top_k, c.experts,
                                          offsets_d.get(), sorted_d.get(), slot_of_d.get(),
                                          stream.get()));
    stream.Sync();
    CHECK(offsets_d.Download() == want.offsets);
    std::vector<int32_t> sorted = sorted_d.Download();
    sorted.resize(want.offsets.back());  // rows past the valid ones are not written
    CHECK(sorted == want.sorted_token);
    CHECK(slot_of_d.Download() == want.slot_of);
  }
}

TEST_CASE("GatherRows copies the indexed rows, zero rows for bad indices", "[cuda]") {
  std::mt19937 rng(6);
  Stream stream;
  const int64_t src_rows = 37;
  for (GpuDType dtype : kAllDTypes) {
    for (int64_t n : {4096, 100, 3}) {
      for (bool offset_dst : {false, true}) {  // a dst 2 or 4 bytes off 16-byte alignment
        CAPTURE(Name(dtype), n, offset_dst);
        const HostTensor src = Store(dtype, Normal(rng, src_rows * n));
        const int64_t rows = 74;
        std::uniform_int_distribution<int32_t> pick(0, src_rows - 1);
        std::vector<int32_t> index(rows);
        for (int32_t& i : index) i = pick(rng);
        index[7] = -1;
        index[8] = static_cast<int32_t>(src_rows);
        const size_t elem = GpuDTypeSize(dtype), row_bytes = n * elem;
        DeviceBuffer<unsigned char> src_d(src.bytes);
        DeviceBuffer<int32_t> index_d(index);
        DeviceBuffer<unsigned char> dst_d(rows * row_bytes + elem);
        unsigned char* dst = dst_d.get() + (offset_dst ? elem : 0);
        STATUS_REQUIRE(
            GatherRows(src_d.get(), dtype, src_rows, n, index_d.get(), rows, dst, stream.get()));
        stream.Sync();
        const std::vector<unsigned char> all = dst_d.Download();
        const std::vector<unsigned char> got(
            all.begin() + (offset_dst ? elem : 0),
            all.begin() + (offset_dst ? elem : 0) + rows * row_bytes);
        std::vector<unsigned char> want(rows * row_bytes, 0);
        for (int64_t r = 0; r < rows; ++r) {
          if (index[r] < 0 || index[r] >= src_rows) continue;
          std::memcpy(want.data() + r * row_bytes, src.bytes.data() + index[r] * row_bytes,
                      row_bytes);
        }
        CHECK(got == want);
      }
    }
  }
}

TEST_CASE("ArgmaxRows is std::max_element per row: the first maximum wins", "[cuda]") {
  std::mt19937 rng(12);
  Stream stream;
  for (int64_t n : {32000, 257, 3, 1}) {
    CAPTURE(n);
    const int64_t rows = 9;
    std::vector<float> x = Normal(rng, rows * n);
    // Row 1: the maximum twice, far apart (the lower index wins); row 2: a tie inside one thread's
    // stride and another across warps; row 3: all -inf; row 4: the maximum at the last index.
    if (n >= 3) {
      float* r1 = x.data() + 1 * n;
      r1[n - 1] = r1[1] = 100.0f;
      float* r2 = x.data() + 2 * n;
      r2[n / 2] = r2[n / 2 + 1] = r2[n - 1] = 50.0f;
      float* r4 = x.data() + 4 * n;
      r4[n - 1] = 1000.0f;
    }
    std::fill(x.begin() + 3 * n, x.begin() + 4 * n, -INFINITY);
    DeviceBuffer<float> x_d(x);
    DeviceBuffer<int32_t> ids_d(rows);
    STATUS_REQUIRE(ArgmaxRows(x_d.get(), rows, n, ids_d.get(), stream.get()));
    stream.Sync();
    const std::vector<int32_t> got = ids_d.Download();
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x.data() + r * n;
      CHECK(got[r] == std::max_element(row, row + n) - row);
    }
  }
}

TEST_CASE("SiluMul computes silu(gate) * up in f32", "[cuda]") {
  std::mt19937 rng(7);
  Stream stream;
  for (int64_t rows : {1, 37}) {
    for (int64_t inter : {14336, 100}) {
      const std::vector<float> gate32 = Normal(rng, rows * inter, 3.0f);
      const std::vector<float> up32 = Normal(rng, rows * inter);
      for (GpuDType in : kAllDTypes) {
        const HostTensor gate = Store(in, gate32), up = Store(in, up32);
        std::vector<double> want(rows * inter);
        for (size_t i = 0; i < want.size(); ++i) {
          const double g = gate.values[i];
          want[i] = g / (1.0 + std::exp(-g)) * up.values[i];
        }
        DeviceBuffer<unsigned char> gate_d(gate.bytes), up_d(up.bytes);
        for (GpuDType out : kAllDTypes) {
          CAPTURE(rows, inter, Name(in), Name(out));
          DeviceBuffer<unsigned char> out_d(rows * inter * GpuDTypeSize(out));
          STATUS_REQUIRE(
              SiluMul(gate_d.get(), up_d.get(), in, rows, inter, out_d.get(), out, stream.get()));
          stream.Sync();
          const double err = MaxRelError(Load(out, out_d.Download()), want);
          CAPTURE(err);
          CHECK(err <= Tolerance(out));
        }
        // In place into gate.
        STATUS_REQUIRE(
            SiluMul(gate_d.get(), up_d.get(), in, rows, inter, gate_d.get(), in, stream.get()));
        stream.Sync();
        CHECK(MaxRelError(Load(in, gate_d.Download()), want) <= Tolerance(in));
      }
    }
  }
}

TEST_CASE("CombineExperts adds the weighted expert rows in expert id order", "[cuda]") {
  std::mt19937 rng(8);
  Stream stream;
  struct Shape {
    int64_t tokens, experts, top_k, hidden;
  };
  for (Shape s : {Shape{1, 8, 2, 4096}, Shape{37, 8, 2, 4096}, Shape{37, 8, 2, 100},
                  Shape{300, 64, 6, 100}, Shape{5, 8, 8, 33}}) {
    CAPTURE(s.tokens, s.experts, s.top_k, s.hidden);
    const std::vector<float> logits = Normal(rng, s.tokens * s.experts, 2.0f);
    std::vector<int32_t> ids;
    std::vector<float> weights;
    RouterReference(logits, s.tokens, s.experts, s.top_k, &ids, &weights);
    const Permutation perm = PermutationReference(ids, s.top_k, s.experts);
    const std::vector<float> expert_out = Normal(rng, s.tokens * s.top_k * s.hidden);
    const std::vector<float> h = Normal(rng, s.tokens * s.hidden, 4.0f);
    std::vector<float> want = h;
    CombineReference(expert_out, perm.slot_of, ids, weights, s.tokens, s.top_k, s.experts, s.hidden,
                     &want);
    DeviceBuffer<float> expert_out_d(expert_out), weights_d(weights), h_d(h);
    DeviceBuffer<int32_t> slot_of_d(perm.slot_of), ids_d(ids);
    STATUS_REQUIRE(CombineExperts(expert_out_d.get(), slot_of_d.get(), ids_d.get(), weights_d.get(),
                                  s.tokens, s.top_k, s.hidden, h_d.get(), stream.get()));
    stream.Sync();
    const double err = MaxRelError(h_d.Download(), want);
    CAPTURE(err);
    CHECK(err <= 1e-5);
  }
}

TEST_CASE("Task B kernels compose like CpuDevice::TaskB", "[cuda]") {
  // Router -> permutation -> gather -> (host GEMMs standing in for cuBLAS) -> SiLU-mul ->
  // (host GEMM) -> combine, against the CPU backend's MoE loop with the same host GEMMs.
  std::mt19937 rng(11);
  Stream stream;
  const int64_t tokens = 37, hidden = 64, inter = 48, experts = 8, top_k = 2;
  const std::vector<float> x = Normal(rng, tokens * hidden);
  const std::vector<float> logits = Normal(rng, tokens * experts, 2.0f);
  std::vector<std::vector<float>> w1(experts), w3(experts), w2(experts);
  for (int64_t e = 0; e < experts; ++e) {
    w1[e] = Normal(rng, inter * hidden, 0.1f);
    w3[e] = Normal(rng, inter * hidden, 0.1f);
    w2[e] = Normal(rng, hidden * inter, 0.1f);
  }
  const std::vector<float> h = Normal(rng, tokens * hidden);

  // The CPU backend: experts in id order over their tokens, into a zeroed buffer, then h += it.
  std::vector<int32_t> ids;
  std::vector<float> weights;
  RouterReference(logits, tokens, experts, top_k, &ids, &weights);
  std::vector<float> moe(tokens * hidden, 0.0f);
  for (int64_t e = 0; e < experts; ++e) {
    std::vector<float> gate(inter), up(inter), out(hidden);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t j = 0; j < top_k; ++j) {
        if (ids[t * top_k + j] != e) continue;
        HostLinear(x.data() + t * hidden, 1, hidden, w1[e], inter, gate.data());
        HostLinear(x.data() + t * hidden, 1, hidden, w3[e], inter, up.data());
        for (int64_t i = 0; i < inter; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
        HostLinear(gate.data(), 1, inter, w2[e], hidden, out.data());
        for (int64_t c = 0; c < hidden; ++c) moe[t * hidden + c] += out[c] * weights[t * top_k + j];
      }
    }
  }
  std::vector<float> want = h;
  for (int64_t i = 0; i < tokens * hidden; ++i) want[i] += moe[i];

  // The GPU path.
  const int64_t pairs = tokens * top_k;
  DeviceBuffer<float> logits_d(logits), x_d(x), h_d(h);
  DeviceBuffer<int32_t> ids_d(pairs), offsets_d(experts + 1), sorted_d(pairs), slot_of_d(pairs);
  DeviceBuffer<float> weights_d(pairs), expert_in_d(pairs * hidden);
  STATUS_REQUIRE(RouterTopK(logits_d.get(), tokens, experts, top_k, ids_d.get(), weights_d.get(),
                            stream.get()));
  STATUS_REQUIRE(BuildExpertPermutation(ids_d.get(), tokens, top_k, experts, offsets_d.get(),
                                        sorted_d.get(), slot_of_d.get(), stream.get()));
  STATUS_REQUIRE(GatherRows(x_d.get(), GpuDType::kF32, tokens, hidden, sorted_d.get(), pairs,
                            expert_in_d.get(), stream.get()));
  stream.Sync();
  const std::vector<int32_t> offsets = offsets_d.Download();
  REQUIRE(offsets.back() == pairs);
  const std::vector<float> expert_in = expert_in_d.Download();
  std::vector<float> gate(pairs * inter), up(pairs * inter);
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets[e], n = offsets[e + 1] - offsets[e];
    HostLinear(expert_in.data() + begin * hidden, n, hidden, w1[e], inter,
               gate.data() + begin * inter);
    HostLinear(expert_in.data() + begin * hidden, n, hidden, w3[e], inter,
               up.data() + begin * inter);
  }
  DeviceBuffer<float> gate_d(gate), up_d(up);
  STATUS_REQUIRE(SiluMul(gate_d.get(), up_d.get(), GpuDType::kF32, pairs, inter, gate_d.get(),
                         GpuDType::kF32, stream.get()));
  stream.Sync();
  const std::vector<float> act = gate_d.Download();
  std::vector<float> expert_out(pairs * hidden);
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets[e], n = offsets[e + 1] - offsets[e];
    HostLinear(act.data() + begin * inter, n, inter, w2[e], hidden,
               expert_out.data() + begin * hidden);
  }
  DeviceBuffer<float> expert_out_d(expert_out);
  STATUS_REQUIRE(CombineExperts(expert_out_d.get(), slot_of_d.get(), ids_d.get(), weights_d.get(),
                                tokens, top_k, hidden, h_d.get(), stream.get()));
  stream.Sync();
  CHECK(ids_d.Download() == ids);
  const double err = MaxRelError(h_d.Download(), want);
  CAPTURE(err);
  CHECK(err <= 1e-5);
}
