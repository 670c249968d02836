// CUDA kernels of GPU task A (MoE-Lens §6.4) and the embedding: embedding gather, RMSNorm, RoPE,
// prefill attention. Shapes and semantics: cuda/kernels.h; numerics and launch conventions:
// cuda/kernels_common.cuh. Checked against the cpu ops by tests/cuda/test_backend_ops.cc and by
// tests/cuda/test_cuda_kernels_task_a.cc (ctest -L gpu; -L emulated on the CUDA emulator).
#include "cuda/kernels_common.cuh"

namespace moebatch::gpu {

// --- Embedding gather ----------------------------------------------------------------------------

namespace {

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    EmbeddingGatherKernel(const T* __restrict__ table, int64_t vocab, int64_t hidden,
                          const int32_t* __restrict__ token_ids, float* __restrict__ h) {
  const int64_t t = blockIdx.x;
  const int32_t id = token_ids[t];
  const bool valid = id >= 0 && id < vocab;
  const T* src = table + (valid ? static_cast<int64_t>(id) : 0) * hidden;
  float* dst = h + t * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    dst[i] = valid ? ToF32(src[i]) : 0.0f;
  }
}

}  // namespace

absl::Status EmbeddingGather(const void* table, GpuDType table_dtype, int64_t vocab, int64_t hidden,
                             const int32_t* token_ids, int64_t tokens, float* h,
                             cudaStream_t stream) {
  constexpr const char* kFn = "EmbeddingGather";
  if (auto st = CheckDType(kFn, "table_dtype", table_dtype); !st.ok()) return st;
  if (vocab < 1 || hidden < 1 || tokens < 0 || tokens > kMaxGridX) {
    return Invalid(kFn, "bad sizes vocab=", vocab, " hidden=", hidden, " tokens=", tokens);
  }
  if (tokens == 0) return absl::OkStatus();
  if (table == nullptr || token_ids == nullptr || h == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  Dispatch(table_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    EmbeddingGatherKernel<T><<<static_cast<unsigned>(tokens), kRowThreads, 0, stream>>>(
        static_cast<const T*>(table), vocab, hidden, token_ids, h);
  });
  return CheckLaunch(kFn);
}

// --- RMSNorm and LayerNorm (no bias) -------------------------------------------------------------

namespace {

// RMSNorm, or with kCentered LayerNorm without bias (its mean first, then the centered sum of
// squares: two block reductions). No __restrict__: out may alias in (f32). Every read of a row
// precedes BlockSum's barrier, and the last pass reads x[i] before writing y[i] in the same thread.
template <typename W, typename O, bool kCentered>
__global__ void __launch_bounds__(kRowThreads)
    NormKernel(const float* in, const W* weight, int64_t n, int64_t stride, float eps, O* out) {
  const int64_t r = blockIdx.x;
  const float* x = in + r * stride;
  float mean = 0.0f;
  if constexpr (kCentered) {
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += x[i];
    mean = BlockSum(sum) / static_cast<float>(n);
  }
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float c = kCentered ? __fsub_rn(x[i], mean) : x[i];
    sum_sq += c * c;
  }
  sum_sq = BlockSum(sum_sq);
  const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(n) + eps);
  O* y = out + r * stride;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float c = kCentered ? __fsub_rn(x[i], mean) : x[i];
    y[i] = FromF32<O>(__fmul_rn(ToF32(weight[i]), __fmul_rn(c, inv)));
  }
}

// Rows `stride` elements apart in both in and out (n: dense rows).
template <bool kCentered>
absl::Status Norm(const char* kFn, const float* in, const void* weight, GpuDType weight_dtype,
                  int64_t rows, int64_t n, int64_t stride, float eps, void* out, GpuDType out_dtype,
                  cudaStream_t stream) {
  if (auto st = CheckDType(kFn, "weight_dtype", weight_dtype); !st.ok()) return st;
  if (auto st = CheckDType(kFn, "out_dtype", out_dtype); !st.ok()) return st;
  if (rows < 0 || rows > kMaxGridX || n < 1 || stride < n) {
    return Invalid(kFn, "bad sizes rows=", rows, " n=", n, " stride=", stride);
  }
  if (!(eps >= 0.0f) || !std::isfinite(eps)) return Invalid(kFn, "bad eps ", eps);
  if (rows == 0) return absl::OkStatus();
  if (in == nullptr || weight == nullptr || out == nullptr) return Invalid(kFn, "null pointer");
  if (out_dtype != GpuDType::kF32 && out == static_cast<const void*>(in)) {
    return Invalid(kFn, "in-place only with out_dtype f32");
  }
  Dispatch(weight_dtype, [&](auto wtag) {
    using W = typename decltype(wtag)::type;
    Dispatch(out_dtype, [&](auto otag) {
      using O = typename decltype(otag)::type;
      NormKernel<W, O, kCentered><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
          in, static_cast<const W*>(weight), n, stride, eps, static_cast<O*>(out));
    });
  });
  return CheckLaunch(kFn);
}

}  // namespace

absl::Status RmsNorm(const float* in, const void* weight, GpuDType weight_dtype, int64_t rows,
                     int64_t n, float eps, void* out, GpuDType out_dtype, cudaStream_t stream) {
  return Norm<false>("RmsNorm", in, weight, weight_dtype, rows, n, n, eps, out, out_dtype, stream);
}

absl::Status RmsNormStrided(float* x, int64_t stride, const void* weight, GpuDType weight_dtype,
                            int64_t rows, int64_t n, float eps, cudaStream_t stream) {
  return Norm<false>("RmsNormStrided", x, weight, weight_dtype, rows, n, stride, eps, x,
                     GpuDType::kF32, stream);
}

absl::Status LayerNorm(const float* in, const void* weight, GpuDType weight_dtype, int64_t rows,
                       int64_t n, float eps, void* out, GpuDType out_dtype, cudaStream_t stream) {
  return Norm<true>("LayerNorm", in, weight, weight_dtype, rows, n, n, eps, out, out_dtype, stream);
}

// --- RoPE ----------------------------------------------------------------------------------------

namespace {

constexpr int kRopeThreads = 128;
constexpr int64_t kMaxRopeHeadDim = 1024;

// cos_sin [2 half] (shared) = cos, then sin, of position `pos` times inv_freq, times
// attention_scaling; the block's threads share the work (a barrier must follow).
__device__ void RopeCosSin(float* cos_sin, int64_t pos, const float* inv_freq, int half,
                           float attention_scaling) {
  const float p = static_cast<float>(pos);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float freq = __fmul_rn(p, inv_freq[i]);
    cos_sin[i] = __fmul_rn(cosf(freq), attention_scaling);
    cos_sin[half + i] = __fmul_rn(sinf(freq), attention_scaling);
  }
}

// One block per token: cos/sin of the token's position into shared memory, then every (head, i)
// pair of the row.
__global__ void __launch_bounds__(kRopeThreads)
    RopeKernel(float* __restrict__ x, int heads, int half, const int64_t* __restrict__ positions,
               const float* __restrict__ inv_freq, float attention_scaling) {
  extern __shared__ float cos_sin[];  // cos [half], then sin [half]
  const int64_t t = blockIdx.x;
  RopeCosSin(cos_sin, positions[t], inv_freq, half, attention_scaling);
  __syncthreads();
  float* row = x + t * heads * 2 * half;
  const int work = heads * half;
  for (int w = threadIdx.x; w < work; w += blockDim.x) {
    const int h = w / half, i = w - h * half;
    float* v = row + h * 2 * half;
    const float a = v[i], b = v[i + half];
    const float c = cos_sin[i], s = cos_sin[half + i];
    v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

}  // namespace

absl::Status ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t d, const int64_t* positions,
                       const float* inv_freq, float attention_scaling, cudaStream_t stream) {
  constexpr const char* kFn = "ApplyRope";
  if (tokens < 0 || tokens > kMaxGridX || heads < 1 || d < 2 || d % 2 != 0 || d > kMaxRopeHeadDim ||
      heads * d > kMaxInt) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " heads=", heads, " d=", d,
                   " (d even, 2 <= d <= ", kMaxRopeHeadDim, ")");
  }
  if (tokens == 0) return absl::OkStatus();
  if (x == nullptr || positions == nullptr || inv_freq == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  const int half = static_cast<int>(d / 2);
  RopeKernel<<<static_cast<unsigned>(tokens), kRopeThreads, 2 * half * sizeof(float), stream>>>(
      x, static_cast<int>(heads), half, positions, inv_freq, attention_scaling);
  return CheckLaunch(kFn);
}

// --- MLA's decoupled RoPE -----------------------------------------------------------------------

namespace {

// One block per token: the token's `heads` vectors of d values read into shared memory (the pairs
// (2i, 2i + 1) moved to (i, i + d/2) with interleave), cos/sin of its position, then every
// (head, i) pair rotated as RopeKernel does and written to out. Every read of `in` precedes the
// barrier, so out may be in.
__global__ void __launch_bounds__(kRopeThreads)
    MlaRopeKernel(const float* in, int64_t in_stride, float* out, int64_t out_stride, int heads,
                  int half, const int64_t* __restrict__ positions,
                  const float* __restrict__ inv_freq, float attention_scaling, bool interleave) {
  extern __shared__ float mla_rope_shared[];  // cos [half], sin [half], then [heads, 2 half]
  float* cos_sin = mla_rope_shared;
  float* vec = mla_rope_shared + 2 * half;
  const int64_t t = blockIdx.x;
  RopeCosSin(cos_sin, positions[t], inv_freq, half, attention_scaling);
  const int work = heads * half;
  for (int w = threadIdx.x; w < work; w += blockDim.x) {
    const int h = w / half, i = w - h * half;
    const float* src = in + (t * heads + h) * in_stride;
    vec[h * 2 * half + i] = interleave ? src[2 * i] : src[i];
    vec[h * 2 * half + i + half] = interleave ? src[2 * i + 1] : src[i + half];
  }
  __syncthreads();
  for (int w = threadIdx.x; w < work; w += blockDim.x) {
    const int h = w / half, i = w - h * half;
    const float a = vec[h * 2 * half + i], b = vec[h * 2 * half + i + half];
    const float c = cos_sin[i], s = cos_sin[half + i];
    float* dst = out + (t * heads + h) * out_stride;
    dst[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    dst[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

}  // namespace

absl::Status MlaRope(const float* in, int64_t in_stride, float* out, int64_t out_stride,
                     int64_t tokens, int64_t heads, int64_t d, const int64_t* positions,
                     const float* inv_freq, float attention_scaling, bool interleave,
                     cudaStream_t stream) {
  constexpr const char* kFn = "MlaRope";
  if (tokens < 0 || tokens > kMaxGridX || heads < 1 || d < 2 || d % 2 != 0 ||
      heads * d > kMaxMlaRopeValues || in_stride < d || out_stride < d) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " heads=", heads, " d=", d,
                   " in_stride=", in_stride, " out_stride=", out_stride,
                   " (d even, heads * d <= ", kMaxMlaRopeValues, ", strides >= d)");
  }
  if (tokens == 0) return absl::OkStatus();
  if (in == nullptr || out == nullptr || positions == nullptr || inv_freq == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  const int half = static_cast<int>(d / 2);
  const size_t shared = (2 * half + heads * d) * sizeof(float);
  MlaRopeKernel<<<static_cast<unsigned>(tokens), kRopeThreads, shared, stream>>>(
      in, in_stride, out, out_stride, static_cast<int>(heads), half, positions, inv_freq,
      attention_scaling, interleave);
  return CheckLaunch(kFn);
}

// --- Prefill attention ---------------------------------------------------------------------------

namespace {

constexpr int kAttnThreads = 128;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kAttnTile = 64;  // keys per tile

// One block per (query row, head). Per tile of keys: warps compute scores (a warp per key, lanes
// over d), every thread takes the tile max and the new running max, threads < n_keys write
// p = exp(score - max), then each thread rescales and accumulates its output dimensions. Two
// barriers per tile suffice: scores are last read before the second, probabilities are next
// written after the first barrier of the following tile. Each thread owns up to kDims output
// dimensions (tid + i * kAttnThreads); those of value_dim and beyond are written as 0.
template <int kDims>
__global__ void __launch_bounds__(kAttnThreads)
    PrefillAttentionKernel(const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, const int32_t* __restrict__ cu_seqlens,
                           int num_seqs, int heads, int kv_heads, int d, int value_dim, float scale,
                           int64_t window, const float* __restrict__ sinks,
                           float* __restrict__ out) {
  __shared__ float q_s[kMaxAttentionHeadDim];
  __shared__ float score[kAttnTile];
  __shared__ float prob[kAttnTile];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row = blockIdx.x / heads;
  const int head = static_cast<int>(blockIdx.x % heads);

  // The sequence holding `row`: u = first index with cu_seqlens[u] > row; the sequence is u - 1.
  int lo = 0, hi = num_seqs + 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (cu_seqlens[mid] <= row) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo == 0 || lo > num_seqs) return;  // outside every sequence (uniform over the block)
  const int64_t start = cu_seqlens[lo - 1];
  const int64_t pos = row - start;
  const int64_t first = start + (window > 0 && pos >= window ? pos - window + 1 : 0);
  const int64_t last = row;

  const int kv_head = head / (heads / kv_heads);
  const int64_t kv_stride = static_cast<int64_t>(kv_heads) * d;  // between consecutive tokens
  const float* k_head = k + static_cast<int64_t>(kv_head) * d;
  const float* v_head = v + static_cast<int64_t>(kv_head) * d;
  const float* q_row = q + (row * heads + head) * d;
  for (int c = tid; c < d; c += kAttnThreads) q_s[c] = q_row[c];
  __syncthreads();

  float running_max = -INFINITY, running_sum = 0.0f;
  float acc[kDims];
#pragma unroll
  for (int i = 0; i < kDims; ++i) acc[i] = 0.0f;

  for (int64_t tile = first; tile <= last; tile += kAttnTile) {
    const int n_keys = last + 1 - tile < kAttnTile ? static_cast<int>(last + 1 - tile) : kAttnTile;
    for (int kk = warp; kk < n_keys; kk += kAttnWarps) {
      const float* key = k_head + (tile + kk) * kv_stride;
      float dot = 0.0f;
      for (int c = lane; c < d; c += 32) dot += q_s[c] * key[c];
      dot = WarpSum(dot);
      if (lane == 0) score[kk] = dot * scale;
    }
    __syncthreads();
    float tile_max = -INFINITY;
    for (int kk = 0; kk < n_keys; ++kk) tile_max = fmaxf(tile_max, score[kk]);
    const float new_max = fmaxf(running_max, tile_max);
    const float correction = expf(running_max - new_max);  // 0 on the first tile
    if (tid < n_keys) prob[tid] = expf(score[tid] - new_max);
    __syncthreads();
    float tile_sum = 0.0f;
    for (int kk = 0; kk < n_keys; ++kk) tile_sum += prob[kk];
    running_sum = running_sum * correction + tile_sum;
    running_max = new_max;
#pragma unroll
    for (int i = 0; i < kDims; ++i) {
      const int c = tid + i * kAttnThreads;
      if (c < value_dim) {
        float a = acc[i] * correction;
        const float* value = v_head + tile * kv_stride + c;
        for (int kk = 0; kk < n_keys; ++kk) a += prob[kk] * value[kk * kv_stride];
        acc[i] = a;
      }
    }
  }
  // The sink's logit joins the denominator only, as cpu_attention's SoftmaxNormalizer.
  float inv = 1.0f / running_sum;
  if (sinks != nullptr) {
    const float sink = sinks[head];
    if (sink <= running_max) {
      inv = 1.0f / (running_sum + expf(sink - running_max));
    } else {
      const float w = expf(running_max - sink);
      inv = w / __fadd_rn(__fmul_rn(running_sum, w), 1.0f);
    }
  }
  float* out_row = out + (row * heads + head) * d;
#pragma unroll
  for (int i = 0; i < kDims; ++i) {
    const int c = tid + i * kAttnThreads;
    if (c < d) out_row[c] = c < value_dim ? acc[i] * inv : 0.0f;
  }
}

template <int kDims>
void LaunchPrefillAttentionKernel(const float* q, const float* k, const float* v,
                                  const int32_t* cu_seqlens, int64_t num_seqs, int64_t tokens,
                                  int64_t heads, int64_t kv_heads, int64_t d, int64_t value_dim,
                                  float scale, int64_t sliding_window, const float* sinks,
                                  float* out, cudaStream_t stream) {
  PrefillAttentionKernel<kDims><<<static_cast<unsigned>(tokens * heads), kAttnThreads, 0, stream>>>(
      q, k, v, cu_seqlens, static_cast<int>(num_seqs), static_cast<int>(heads),
      static_cast<int>(kv_heads), static_cast<int>(d), static_cast<int>(value_dim), scale,
      sliding_window, sinks, out);
}

// The kernel for head_dim d: kDims = ceil(d / kAttnThreads) rounded up to 1, 2, 5 or 8.
absl::Status LaunchPrefillAttention(const char* kFn, const float* q, const float* k, const float* v,
                                    const int32_t* cu_seqlens, int64_t num_seqs, int64_t tokens,
                                    int64_t heads, int64_t kv_heads, int64_t d, int64_t value_dim,
                                    float scale, int64_t sliding_window, const float* sinks,
                                    float* out, cudaStream_t stream) {
  static_assert(kMaxAttentionHeadDim <= 8 * kAttnThreads);
  auto* launch = d <= kAttnThreads       ? &LaunchPrefillAttentionKernel<1>
                 : d <= 2 * kAttnThreads ? &LaunchPrefillAttentionKernel<2>
                 : d <= 5 * kAttnThreads ? &LaunchPrefillAttentionKernel<5>
                                         : &LaunchPrefillAttentionKernel<8>;
  launch(q, k, v, cu_seqlens, num_seqs, tokens, heads, kv_heads, d, value_dim, scale,
         sliding_window, sinks, out, stream);
  return CheckLaunch(kFn);
}

}  // namespace

absl::Status PrefillAttention(const float* q, const float* k, const float* v,
                              const int32_t* cu_seqlens, int64_t num_seqs, int64_t tokens,
                              int64_t heads, int64_t kv_heads, int64_t d, float scale,
                              int64_t sliding_window, const float* sinks, float* out,
                              cudaStream_t stream) {
  constexpr const char* kFn = "PrefillAttention";
  if (tokens < 0 || num_seqs < 0 || num_seqs >= kMaxInt || heads < 1 || kv_heads < 1 ||
      heads > kMaxInt || heads % kv_heads != 0 || d < 1 || d > kMaxAttentionHeadDim ||
      sliding_window < 0 || tokens > kMaxGridX / heads) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " num_seqs=", num_seqs, " heads=", heads,
                   " kv_heads=", kv_heads, " d=", d, " sliding_window=", sliding_window,
                   " (heads a multiple of kv_heads, 1 <= d <= ", kMaxAttentionHeadDim, ")");
  }
  if (!std::isfinite(scale)) return Invalid(kFn, "bad scale ", scale);
  if (tokens == 0 || num_seqs == 0) return absl::OkStatus();
  if (q == nullptr || k == nullptr || v == nullptr || cu_seqlens == nullptr || out == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  return LaunchPrefillAttention(kFn, q, k, v, cu_seqlens, num_seqs, tokens, heads, kv_heads, d, d,
                                scale, sliding_window, sinks, out, stream);
}

absl::Status PrefillAttentionLatent(const float* q, const float* latent, const int32_t* cu_seqlens,
                                    int64_t num_seqs, int64_t tokens, int64_t heads, int64_t d,
                                    int64_t value_dim, float scale, float* out,
                                    cudaStream_t stream) {
  constexpr const char* kFn = "PrefillAttentionLatent";
  if (tokens < 0 || num_seqs < 0 || num_seqs >= kMaxInt || heads < 1 || heads > kMaxInt || d < 1 ||
      d > kMaxAttentionHeadDim || value_dim < 1 || value_dim > d || tokens > kMaxGridX / heads) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " num_seqs=", num_seqs, " heads=", heads,
                   " d=", d, " value_dim=", value_dim,
                   " (1 <= value_dim <= d <= ", kMaxAttentionHeadDim, ")");
  }
  if (!std::isfinite(scale)) return Invalid(kFn, "bad scale ", scale);
  if (tokens == 0 || num_seqs == 0) return absl::OkStatus();
  if (q == nullptr || latent == nullptr || cu_seqlens == nullptr || out == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  return LaunchPrefillAttention(kFn, q, latent, latent, cu_seqlens, num_seqs, tokens, heads, 1, d,
                                value_dim, scale, 0, nullptr, out, stream);
}

}  // namespace moebatch::gpu
