// cuda/kernels.h against straightforward CPU loops (float64, or float in the CPU backend's order
// where the kernel promises the CPU's rounding), on random inputs of several sizes, odd ones
// included. Tolerances: 1e-5 relative (max abs error / max abs reference) for f32 outputs, 1e-2 for
// bf16/f16 outputs; exact for indices, copies and conversions. Needs a CUDA GPU: without one the
// binary exits 77 (tests/gpu_catch_main.cc) and ctest shows the tests as skipped.
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

using namespace moebatch::gpu;

namespace {

#define CUDA_REQUIRE(expr)                                \
  do {                                                    \
    const cudaError_t cuda_err_ = (expr);                 \
    INFO(#expr << ": " << cudaGetErrorString(cuda_err_)); \
    REQUIRE(cuda_err_ == cudaSuccess);                    \
  } while (0)

#define STATUS_REQUIRE(expr)                   \
  do {                                         \
    const absl::Status status_ = (expr);       \
    INFO(#expr << ": " << status_.ToString()); \
    REQUIRE(status_.ok());                     \
  } while (0)

constexpr GpuDType kAllDTypes[] = {GpuDType::kF32, GpuDType::kBF16, GpuDType::kF16};

const char* Name(GpuDType t) {
  return t == GpuDType::kF32 ? "f32" : t == GpuDType::kBF16 ? "bf16" : "f16";
}

double Tolerance(GpuDType out) { return out == GpuDType::kF32 ? 1e-5 : 1e-2; }

// A CUDA stream for the kernels under test.
class Stream {
 public:
  Stream() { CUDA_REQUIRE(cudaStreamCreate(&stream_)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void Sync() const { CUDA_REQUIRE(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

// n elements of T in device memory.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    CUDA_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  void Upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    CUDA_REQUIRE(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    CUDA_REQUIRE(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// Values stored as `dtype`: the bytes to upload and the exact f32 value of each element.
struct HostTensor {
  GpuDType dtype;
  std::vector<unsigned char> bytes;
  std::vector<float> values;
};

HostTensor Store(GpuDType dtype, const std::vector<float>& x) {
  HostTensor t{dtype, std::vector<unsigned char>(x.size() * GpuDTypeSize(dtype)),
               std::vector<float>(x.size())};
  for (size_t i = 0; i < x.size(); ++i) {
    unsigned char* dst = t.bytes.data() + i * GpuDTypeSize(dtype);
    if (dtype == GpuDType::kF32) {
      t.values[i] = x[i];
      std::memcpy(dst, &x[i], 4);
    } else if (dtype == GpuDType::kBF16) {
      const __nv_bfloat16 b = __float2bfloat16_rn(x[i]);
      t.values[i] = __bfloat162float(b);
      std::memcpy(dst, &b, 2);
    } else {
      const __half h = __float2half_rn(x[i]);
      t.values[i] = __half2float(h);
      std::memcpy(dst, &h, 2);
    }
  }
  return t;
}

// The f32 values of n elements of `dtype` held in `bytes`.
std::vector<float> Load(GpuDType dtype, const std::vector<unsigned char>& bytes) {
  const size_t n = bytes.size() / GpuDTypeSize(dtype);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* src = bytes.data() + i * GpuDTypeSize(dtype);
    if (dtype == GpuDType::kF32) {
      std::memcpy(&out[i], src, 4);
    } else if (dtype == GpuDType::kBF16) {
      __nv_bfloat16 b;
      std::memcpy(&b, src, 2);
      out[i] = __bfloat162float(b);
    } else {
      __half h;
      std::memcpy(&h, src, 2);
      out[i] = __half2float(h);
    }
  }
  return out;
}

std::vector<float> Normal(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// max |got - want| / max |want|; infinite when got holds a NaN or an infinity.
template <typename Want>
double MaxRelError(const std::vector<float>& got, const std::vector<Want>& want) {
  REQUIRE(got.size() == want.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
    ref = std::max(ref, std::abs(static_cast<double>(want[i])));
  }
  return ref > 0 ? err / ref : err;
}

// The cpu backend's router (engine/cpu_device.cc, CpuDevice::TaskB), verbatim in float.
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

TEST_CASE("EmbeddingGather widens the rows of the ids, zero rows for bad ids", "[cuda]") {
  std::mt19937 rng(1);
  Stream stream;
  const int64_t vocab = 50;
  for (GpuDType dtype : kAllDTypes) {
    for (int64_t hidden : {4096, 100}) {
      const HostTensor table = Store(dtype, Normal(rng, vocab * hidden));
      DeviceBuffer<unsigned char> table_d(table.bytes);
      for (int64_t tokens : {1, 37}) {
        CAPTURE(Name(dtype), hidden, tokens);
        std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
        std::vector<int32_t> ids(tokens);
        for (int32_t& id : ids) id = pick(rng);
        if (tokens > 7) {
          ids[5] = -1;
          ids[6] = static_cast<int32_t>(vocab);
        }
        DeviceBuffer<int32_t> ids_d(ids);
        DeviceBuffer<float> h_d(tokens * hidden);
        STATUS_REQUIRE(EmbeddingGather(table_d.get(), dtype, vocab, hidden, ids_d.get(), tokens,
                                       h_d.get(), stream.get()));
        stream.Sync();
        std::vector<float> want(tokens * hidden, 0.0f);
        for (int64_t t = 0; t < tokens; ++t) {
          if (ids[t] < 0 || ids[t] >= vocab) continue;
          std::copy_n(table.values.data() + ids[t] * hidden, hidden, want.data() + t * hidden);
        }
        CHECK(h_d.Download() == want);
      }
    }
  }
}

TEST_CASE("RmsNorm matches MixtralRMSNorm in float64", "[cuda]") {
  std::mt19937 rng(2);
  Stream stream;
  const float eps = 1e-5f;
  struct Shape {
    int64_t rows, n;
  };
  for (Shape s : {Shape{1, 4096}, Shape{37, 100}, Shape{5, 4096}, Shape{3, 1}, Shape{2, 6144}}) {
    const std::vector<float> x = Normal(rng, s.rows * s.n, 3.0f);
    DeviceBuffer<float> x_d(x);
    for (GpuDType wtype : kAllDTypes) {
      const HostTensor w = Store(wtype, Normal(rng, s.n));
      DeviceBuffer<unsigned char> w_d(w.bytes);
      std::vector<double> want(s.rows * s.n);
      for (int64_t r = 0; r < s.rows; ++r) {
        double sum_sq = 0;
        for (int64_t i = 0; i < s.n; ++i) sum_sq += double(x[r * s.n + i]) * x[r * s.n + i];
        const double inv = 1.0 / std::sqrt(sum_sq / s.n + eps);
        for (int64_t i = 0; i < s.n; ++i) {
          want[r * s.n + i] = w.values[i] * (x[r * s.n + i] * inv);
        }
      }
      for (GpuDType otype : kAllDTypes) {
        CAPTURE(s.rows, s.n, Name(wtype), Name(otype));
        DeviceBuffer<unsigned char> out_d(s.rows * s.n * GpuDTypeSize(otype));
        STATUS_REQUIRE(RmsNorm(x_d.get(), w_d.get(), wtype, s.rows, s.n, eps, out_d.get(), otype,
                               stream.get()));
        stream.Sync();
        const double err = MaxRelError(Load(otype, out_d.Download()), want);
        CAPTURE(err);
        CHECK(err <= Tolerance(otype));
      }
      // In place (f32 out).
      DeviceBuffer<float> inplace_d(x);
      STATUS_REQUIRE(RmsNorm(inplace_d.get(), w_d.get(), wtype, s.rows, s.n, eps, inplace_d.get(),
                             GpuDType::kF32, stream.get()));
      stream.Sync();
      CHECK(MaxRelError(inplace_d.Download(), want) <= 1e-5);
    }
  }
}

TEST_CASE("ApplyRope matches rotate_half with f32 angles", "[cuda]") {
  std::mt19937 rng(3);
  Stream stream;
  struct Shape {
    int64_t tokens, heads, d;
  };
  for (Shape s :
       {Shape{37, 32, 128}, Shape{1, 8, 128}, Shape{37, 8, 64}, Shape{5, 3, 2}, Shape{4, 2, 256}}) {
    CAPTURE(s.tokens, s.heads, s.d);
    const int64_t half = s.d / 2;
    std::vector<float> inv_freq(half);  // as CpuDevice::Create, rope_theta 1e6 (Mixtral)
    for (int64_t i = 0; i < half; ++i) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(s.d);
      inv_freq[i] = 1.0f / std::pow(1e6f, exponent);
    }
    std::uniform_int_distribution<int64_t> pick(0, 32767);
    std::vector<int64_t> positions(s.tokens);
    for (int64_t& p : positions) p = pick(rng);
    positions[0] = 0;
    const std::vector<float> x = Normal(rng, s.tokens * s.heads * s.d);
    std::vector<double> want(x.size());
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const float freq = static_cast<float>(positions[t]) * inv_freq[i];  // f32, as the CPU
        const double c = std::cos(static_cast<double>(freq));
        const double sn = std::sin(static_cast<double>(freq));
        for (int64_t h = 0; h < s.heads; ++h) {
          const int64_t base = (t * s.heads + h) * s.d;
          const double a = x[base + i], b = x[base + i + half];
          want[base + i] = a * c - b * sn;
          want[base + i + half] = b * c + a * sn;
        }
      }
    }
    DeviceBuffer<float> x_d(x);
    DeviceBuffer<int64_t> pos_d(positions);
    DeviceBuffer<float> inv_freq_d(inv_freq);
    STATUS_REQUIRE(
        ApplyRope(x_d.get(), s.tokens, s.heads, s.d, pos_d.get(), inv_freq_d.get(), stream.get()));
    stream.Sync();
    const double err = MaxRelError(x_d.Download(), want);
    CAPTURE(err);
    CHECK(err <= 1e-5);
  }
}

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

TEST_CASE("AddResidual and the dtype conversions", "[cuda]") {
  std::mt19937 rng(9);
  Stream stream;
  for (int64_t n : {1, 101, 37 * 4096}) {
    CAPTURE(n);
    std::vector<float> x = Normal(rng, n, 100.0f);
    const std::vector<float> h = Normal(rng, n);
    DeviceBuffer<float> h_d(h), x_d(x);
    STATUS_REQUIRE(AddResidual(h_d.get(), x_d.get(), n, stream.get()));
    stream.Sync();
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = h[i] + x[i];
    CHECK(h_d.Download() == want);

    // Rounding corner cases: signed zero, infinity, f16 overflow, subnormals, halfway points.
    const std::vector<float> corners = {
        0.0f,  -0.0f,  INFINITY,          -INFINITY,          70000.0f, -65520.0f,
        1e-7f, -3e-8f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 2048, 1e-40f,   3.4e38f};
    std::copy_n(corners.begin(), std::min<size_t>(corners.size(), x.size()), x.begin());
    x_d.Upload(x);
    for (GpuDType dtype : kAllDTypes) {
      CAPTURE(Name(dtype));
      const HostTensor want_typed = Store(dtype, x);
      DeviceBuffer<unsigned char> typed_d(n * GpuDTypeSize(dtype));
      STATUS_REQUIRE(ConvertF32To(x_d.get(), n, typed_d.get(), dtype, stream.get()));
      stream.Sync();
      CHECK(typed_d.Download() == want_typed.bytes);
      DeviceBuffer<float> back_d(n);
      STATUS_REQUIRE(ConvertToF32(typed_d.get(), dtype, n, back_d.get(), stream.get()));
      stream.Sync();
      const std::vector<float> back = back_d.Download();
      CHECK(std::memcmp(back.data(), want_typed.values.data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("PrefillAttention matches causal GQA attention in float64", "[cuda]") {
  std::mt19937 rng(10);
  Stream stream;
  struct Case {
    int64_t heads, kv_heads, d, window;
    std::vector<int32_t> cu_seqlens;
    int64_t tokens;
  };
  const std::vector<Case> cases = {
      {32, 8, 128, 0, {0, 1, 18, 318}, 318},  // lengths 1, 17, 300; GQA 4
      {8, 2, 64, 32, {0, 1, 18, 318}, 318},   // sliding window 32
      {4, 4, 256, 0, {0, 37, 37, 42}, 42},    // MHA, an empty sequence, d 256
      {6, 3, 80, 5, {0, 70}, 70},             // small window, d not a power of two
      {1, 1, 33, 0, {0, 130}, 130},           // odd d, several tiles
      {2, 1, 64, 200, {3, 10, 140}, 143},     // rows 0-2 and 140-142 in no sequence
  };
  for (const Case& c : cases) {
    CAPTURE(c.heads, c.kv_heads, c.d, c.window, c.tokens);
    const int64_t num_seqs = static_cast<int64_t>(c.cu_seqlens.size()) - 1;
    const std::vector<float> q = Normal(rng, c.tokens * c.heads * c.d);
    const std::vector<float> k = Normal(rng, c.tokens * c.kv_heads * c.d);
    const std::vector<float> v = Normal(rng, c.tokens * c.kv_heads * c.d);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    const float untouched = 7.0f;
    std::vector<double> want(c.tokens * c.heads * c.d, untouched);
    const int64_t group = c.heads / c.kv_heads;
    std::vector<double> scores;
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t start = c.cu_seqlens[s], end = c.cu_seqlens[s + 1];
      for (int64_t i = start; i < end; ++i) {
        const int64_t first = c.window > 0 ? std::max(start, i - c.window + 1) : start;
        for (int64_t h = 0; h < c.heads; ++h) {
          const int64_t g = h / group;
          const float* qi = q.data() + (i * c.heads + h) * c.d;
          scores.assign(i - first + 1, 0.0);
          double max_score = -INFINITY;
          for (int64_t j = first; j <= i; ++j) {
            const float* kj = k.data() + (j * c.kv_heads + g) * c.d;
            double dot = 0;
            for (int64_t x = 0; x < c.d; ++x) dot += double(qi[x]) * kj[x];
            scores[j - first] = dot * scale;
            max_score = std::max(max_score, scores[j - first]);
          }
          double sum = 0;
          for (double& sc : scores) sum += sc = std::exp(sc - max_score);
          double* o = want.data() + (i * c.heads + h) * c.d;
          std::fill(o, o + c.d, 0.0);
          for (int64_t j = first; j <= i; ++j) {
            const float* vj = v.data() + (j * c.kv_heads + g) * c.d;
            const double p = scores[j - first] / sum;
            for (int64_t x = 0; x < c.d; ++x) o[x] += p * vj[x];
          }
        }
      }
    }
    DeviceBuffer<float> q_d(q), k_d(k), v_d(v);
    DeviceBuffer<int32_t> cu_d(c.cu_seqlens);
    DeviceBuffer<float> out_d(std::vector<float>(c.tokens * c.heads * c.d, untouched));
    STATUS_REQUIRE(PrefillAttention(q_d.get(), k_d.get(), v_d.get(), cu_d.get(), num_seqs, c.tokens,
                                    c.heads, c.kv_heads, c.d, scale, c.window, out_d.get(),
                                    stream.get()));
    stream.Sync();
    const double err = MaxRelError(out_d.Download(), want);
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

TEST_CASE("Bad sizes are InvalidArgument and launch nothing", "[cuda]") {
  Stream stream;
  DeviceBuffer<float> f(1024);
  DeviceBuffer<int32_t> i32(1024);
  DeviceBuffer<int64_t> i64(16);
  const cudaStream_t s = stream.get();
  const auto bad_dtype = static_cast<GpuDType>(7);
  auto invalid = [](const absl::Status& st) {
    INFO(st.ToString());
    return st.code() == absl::StatusCode::kInvalidArgument;
  };
  CHECK(invalid(EmbeddingGather(f.get(), bad_dtype, 4, 4, i32.get(), 1, f.get(), s)));
  CHECK(invalid(EmbeddingGather(f.get(), GpuDType::kF32, 0, 4, i32.get(), 1, f.get(), s)));
  CHECK(invalid(EmbeddingGather(nullptr, GpuDType::kF32, 4, 4, i32.get(), 1, f.get(), s)));
  CHECK(
      invalid(RmsNorm(f.get(), f.get(), GpuDType::kF32, 1, 0, 1e-5f, f.get(), GpuDType::kF32, s)));
  CHECK(
      invalid(RmsNorm(f.get(), f.get(), GpuDType::kF32, -1, 4, 1e-5f, f.get(), GpuDType::kF32, s)));
  CHECK(invalid(RmsNorm(f.get(), f.get(), GpuDType::kF32, 1, 4, 1e-5f, f.get(), GpuDType::kBF16,
                        s)));  // in place into another dtype
  CHECK(invalid(ApplyRope(f.get(), 1, 1, 3, i64.get(), f.get(), s)));     // odd d
  CHECK(invalid(ApplyRope(f.get(), 1, 1, 2048, i64.get(), f.get(), s)));  // d too large
  CHECK(invalid(RouterTopK(f.get(), 1, 65, 2, i32.get(), f.get(), s)));
  CHECK(invalid(RouterTopK(f.get(), 1, 8, 0, i32.get(), f.get(), s)));
  CHECK(invalid(RouterTopK(f.get(), 1, 8, 9, i32.get(), f.get(), s)));
  CHECK(invalid(BuildExpertPermutation(i32.get(), 1, 2, 257, i32.get(), i32.get(), i32.get(), s)));
  CHECK(invalid(BuildExpertPermutation(i32.get(), 1, 2, 8, nullptr, i32.get(), i32.get(), s)));
  CHECK(invalid(GatherRows(f.get(), GpuDType::kF32, 4, 0, i32.get(), 1, f.get(), s)));
  CHECK(invalid(SiluMul(f.get(), f.get(), GpuDType::kF32, 1, 4, f.get(), GpuDType::kF16, s)));
  CHECK(invalid(CombineExperts(f.get(), i32.get(), i32.get(), f.get(), 1, 65, 4, f.get(), s)));
  CHECK(invalid(AddResidual(f.get(), f.get(), -1, s)));
  CHECK(invalid(ConvertF32To(f.get(), 4, f.get(), bad_dtype, s)));
  CHECK(invalid(ConvertToF32(nullptr, GpuDType::kBF16, 4, f.get(), s)));
  CHECK(invalid(PrefillAttention(f.get(), f.get(), f.get(), i32.get(), 1, 4, 6, 4, 64, 0.125f, 0,
                                 f.get(), s)));  // heads not a multiple of kv_heads
  CHECK(invalid(PrefillAttention(f.get(), f.get(), f.get(), i32.get(), 1, 4, 8, 2, 257, 0.125f, 0,
                                 f.get(), s)));
  CHECK(invalid(PrefillAttention(f.get(), f.get(), f.get(), i32.get(), 1, 4, 8, 2, 64, 0.125f, -1,
                                 f.get(), s)));
  // Zero rows is fine and launches nothing.
  CHECK(RmsNorm(nullptr, nullptr, GpuDType::kF32, 0, 4, 1e-5f, nullptr, GpuDType::kF32, s).ok());
  CHECK(PrefillAttention(nullptr, nullptr, nullptr, nullptr, 0, 0, 8, 2, 64, 0.125f, 0, nullptr, s)
            .ok());
  stream.Sync();
}
