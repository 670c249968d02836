// CUDA kernels of GPU task B (MoE-Lens §6.4) and the rest: router top-k, expert permutation, row
// gather, greedy argmax, SiLU-mul, combine, residual add and dtype conversions. Shapes and
// semantics: cuda/kernels.h; numerics and launch conventions: cuda/kernels_common.cuh. Checked
// against the cpu ops by tests/cuda/test_backend_ops_task_b.cc and by
// tests/cuda/test_cuda_kernels_task_b.cc (ctest -L gpu; -L emulated on the CUDA emulator).
#include "cuda/kernels_common.cuh"

namespace moebatch::gpu {

// --- Router top-k --------------------------------------------------------------------------------

namespace {

constexpr int kRouterThreads = 128;

// One thread per token, in the CPU's order of operations: max, exp and sum in expert order,
// divide, then top_k passes of "largest untaken, lower id on ties", summing the chosen
// probabilities in descending order.
__global__ void __launch_bounds__(kRouterThreads)
    RouterTopKKernel(const float* __restrict__ logits, int64_t tokens, int experts, int top_k,
                     int32_t* __restrict__ ids, float* __restrict__ weights, bool renormalize) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float* logit = logits + t * experts;
  float probs[kMaxRouterExperts];
  float max_logit = logit[0];
  for (int e = 1; e < experts; ++e) {
    if (logit[e] > max_logit) max_logit = logit[e];
  }
  float sum = 0.0f;
  for (int e = 0; e < experts; ++e) {
    probs[e] = expf(logit[e] - max_logit);
    sum += probs[e];
  }
  for (int e = 0; e < experts; ++e) probs[e] /= sum;

  uint64_t taken[kMaxRouterExperts / 64] = {};
  float chosen[kMaxCombineTopK];
  float top_sum = 0.0f;
  int32_t* id_row = ids + t * top_k;
  for (int j = 0; j < top_k; ++j) {
    int best = -1;
    for (int e = 0; e < experts; ++e) {
      if ((taken[e / 64] >> (e % 64)) & 1u) continue;
      if (best < 0 || probs[e] > probs[best]) best = e;  // strict: ties keep the lower id
    }
    taken[best / 64] |= uint64_t{1} << (best % 64);
    chosen[j] = probs[best];
    top_sum += chosen[j];
    id_row[j] = best;
  }
  float* weight_row = weights + t * top_k;
  for (int j = 0; j < top_k; ++j) weight_row[j] = renormalize ? chosen[j] / top_sum : chosen[j];
}

}  // namespace

absl::Status RouterTopK(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                        int32_t* ids, float* weights, bool renormalize, cudaStream_t stream) {
  constexpr const char* kFn = "RouterTopK";
  if (tokens < 0 || experts < 1 || experts > kMaxRouterExperts || top_k < 1 || top_k > experts ||
      top_k > kMaxCombineTopK) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " experts=", experts, " top_k=", top_k,
                   " (1 <= top_k <= experts <= ", kMaxRouterExperts, ", top_k <= ", kMaxCombineTopK,
                   ")");
  }
  const int64_t blocks = (tokens + kRouterThreads - 1) / kRouterThreads;
  if (blocks > kMaxGridX) return Invalid(kFn, "too many tokens: ", tokens);
  if (tokens == 0) return absl::OkStatus();
  if (logits == nullptr || ids == nullptr || weights == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  RouterTopKKernel<<<static_cast<unsigned>(blocks), kRouterThreads, 0, stream>>>(
      logits, tokens, static_cast<int>(experts), static_cast<int>(top_k), ids, weights,
      renormalize);
  return CheckLaunch(kFn);
}

// --- DeepSeek's routers -------------------------------------------------------------------------

namespace {

// One thread per token, cpu_ops::RouterDeepseek's operations in its order: the scores (softmax,
// or sigmoid plus the correction bias for noaux_tc), the groups' scores and the topk_group best
// groups (descending, lower group id on ties), the other groups' choices zeroed, then top_k
// passes of "largest untaken choice, lower id on ties".
__global__ void __launch_bounds__(kRouterThreads)
    RouterDeepseekKernel(const float* __restrict__ logits, const float* __restrict__ bias,
                         int64_t tokens, int experts, int top_k, RouterMethod method, int n_group,
                         int topk_group, bool renormalize, float scaling, int32_t* __restrict__ ids,
                         float* __restrict__ weights) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float* logit = logits + t * experts;
  float scores[kMaxRouterExperts], choice[kMaxRouterExperts];
  const bool noaux = method == RouterMethod::kNoauxTc;
  if (noaux) {
    for (int e = 0; e < experts; ++e) {
      scores[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-logit[e])));  // router_logits.sigmoid()
      choice[e] = __fadd_rn(scores[e], bias[e]);
    }
  } else {  // logits.softmax(dim=-1, dtype=float32)
    float max_logit = logit[0];
    for (int e = 1; e < experts; ++e) max_logit = logit[e] > max_logit ? logit[e] : max_logit;
    float sum = 0.0f;
    for (int e = 0; e < experts; ++e) {
      scores[e] = expf(logit[e] - max_logit);
      sum += scores[e];
    }
    for (int e = 0; e < experts; ++e) choice[e] = scores[e] = __fdiv_rn(scores[e], sum);
  }
  if (method != RouterMethod::kGreedy) {
    const int per_group = experts / n_group;
    float group_score[kMaxRouterGroups];
    for (int g = 0; g < n_group; ++g) {
      const float* c = choice + g * per_group;
      float first = -INFINITY, second = -INFINITY;
      for (int i = 0; i < per_group; ++i) {
        if (c[i] > first) {
          second = first;
          first = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group_score[g] = noaux ? first + second : first;  // topk(2).sum(), or max
    }
    uint64_t keep = 0;
    for (int j = 0; j < topk_group; ++j) {
      int best = -1;
      for (int g = 0; g < n_group; ++g) {
        if ((keep >> g) & 1u) continue;
        if (best < 0 || group_score[g] > group_score[best]) best = g;
      }
      keep |= uint64_t{1} << best;
    }
    for (int e = 0; e < experts; ++e) {
      if (!((keep >> (e / per_group)) & 1u)) choice[e] = 0.0f;  // masked_fill(~score_mask, 0.0)
    }
  }
  uint64_t taken[kMaxRouterExperts / 64] = {};
  int32_t* id_row = ids + t * top_k;
  float top_sum = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    int best = -1;
    for (int e = 0; e < experts; ++e) {
      if ((taken[e / 64] >> (e % 64)) & 1u) continue;
      if (best < 0 || choice[e] > choice[best]) best = e;  // strict: ties keep the lower id
    }
    taken[best / 64] |= uint64_t{1} << (best % 64);
    id_row[j] = best;
    top_sum += scores[best];
  }
  if (noaux) top_sum += 1e-20f;
  float* weight_row = weights + t * top_k;
  for (int j = 0; j < top_k; ++j) {
    float w = scores[id_row[j]];
    if (renormalize) w = __fdiv_rn(w, top_sum);
    weight_row[j] = __fmul_rn(w, scaling);
  }
}

}  // namespace

absl::Status RouterDeepseek(const float* logits, const float* bias, int64_t tokens, int64_t experts,
                            int64_t top_k, RouterMethod method, int64_t n_group, int64_t topk_group,
                            bool renormalize, float scaling, int32_t* ids, float* weights,
                            cudaStream_t stream) {
  constexpr const char* kFn = "RouterDeepseek";
  if (method == RouterMethod::kGreedy) n_group = topk_group = 1;
  if (tokens < 0 || experts < 1 || experts > kMaxRouterExperts || n_group < 1 ||
      n_group > kMaxRouterGroups || experts % n_group != 0 || topk_group < 1 ||
      topk_group > n_group || top_k < 1 || top_k > kMaxCombineTopK ||
      top_k > topk_group * (experts / n_group) ||
      (method == RouterMethod::kNoauxTc && experts / n_group < 2)) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " experts=", experts, " top_k=", top_k,
                   " n_group=", n_group, " topk_group=", topk_group,
                   " (experts <= ", kMaxRouterExperts, ", n_group <= ", kMaxRouterGroups,
                   ", top_k <= ", kMaxCombineTopK, ")");
  }
  if (!std::isfinite(scaling)) return Invalid(kFn, "bad scaling ", scaling);
  const int64_t blocks = (tokens + kRouterThreads - 1) / kRouterThreads;
  if (blocks > kMaxGridX) return Invalid(kFn, "too many tokens: ", tokens);
  if (tokens == 0) return absl::OkStatus();
  if (logits == nullptr || ids == nullptr || weights == nullptr ||
      (method == RouterMethod::kNoauxTc && bias == nullptr)) {
    return Invalid(kFn, "null pointer");
  }
  RouterDeepseekKernel<<<static_cast<unsigned>(blocks), kRouterThreads, 0, stream>>>(
      logits, bias, tokens, static_cast<int>(experts), static_cast<int>(top_k), method,
      static_cast<int>(n_group), static_cast<int>(topk_group), renormalize, scaling, ids, weights);
  return CheckLaunch(kFn);
}

namespace {

__global__ void __launch_bounds__(kRouterThreads)
    NormalizeTopKKernel(float* __restrict__ weights, int64_t tokens, int top_k, float p) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  float* w = weights + t * top_k;
  float s = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    s = __fadd_rn(s, p == 2.0f ? __fmul_rn(w[j], w[j]) : powf(fabsf(w[j]), p));
  }
  const float norm = p == 2.0f ? sqrtf(s) : powf(s, 1.0f / p);
  for (int j = 0; j < top_k; ++j) w[j] = __fdiv_rn(w[j], norm);
}

}  // namespace

absl::Status NormalizeTopKWeights(float* weights, int64_t tokens, int64_t top_k, float p,
                                  cudaStream_t stream) {
  constexpr const char* kFn = "NormalizeTopKWeights";
  if (tokens < 0 || top_k < 1 || top_k > kMaxCombineTopK) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " top_k=", top_k);
  }
  if (!(p > 0.0f) || !std::isfinite(p)) return Invalid(kFn, "bad p ", p);
  const int64_t blocks = (tokens + kRouterThreads - 1) / kRouterThreads;
  if (blocks > kMaxGridX) return Invalid(kFn, "too many tokens: ", tokens);
  if (tokens == 0) return absl::OkStatus();
  if (weights == nullptr) return Invalid(kFn, "null pointer");
  NormalizeTopKKernel<<<static_cast<unsigned>(blocks), kRouterThreads, 0, stream>>>(
      weights, tokens, static_cast<int>(top_k), p);
  return CheckLaunch(kFn);
}

// --- Expert permutation --------------------------------------------------------------------------

namespace {

constexpr int kPermThreads = 1024;
constexpr int kPermWarps = kPermThreads / 32;

// One block. (1) counts per expert (shared atomics: the counts do not depend on their order),
// (2) exclusive scan by thread 0, (3) the pairs in chunks of 1024 in pair order: within a warp a
// pair's rank among the lanes with the same expert comes from __match_any_sync; per-warp counts go
// to shared memory and one thread per expert turns them into each warp's first row, continuing
// from the expert's running cursor. Pair order is token order, so each expert's rows are in
// increasing token order.
__global__ void __launch_bounds__(kPermThreads)
    ExpertPermutationKernel(const int32_t* __restrict__ ids, int pairs, int top_k, int experts,
                            int32_t* __restrict__ expert_offsets,
                            int32_t* __restrict__ sorted_token, int32_t* __restrict__ slot_of) {
  __shared__ int cursor[kMaxPermutationExperts];                  // counts, then next free row
  __shared__ int warp_rows[kPermWarps * kMaxPermutationExperts];  // [warp][expert]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  for (int e = tid; e < experts; e += kPermThreads) cursor[e] = 0;
  __syncthreads();
  for (int p = tid; p < pairs; p += kPermThreads) {
    const int e = ids[p];
    if (e >= 0 && e < experts) atomicAdd(&cursor[e], 1);
  }
  __syncthreads();
  if (tid == 0) {
    int run = 0;
    for (int e = 0; e < experts; ++e) {
      const int count = cursor[e];
      expert_offsets[e] = run;
      cursor[e] = run;
      run += count;
    }
    expert_offsets[experts] = run;
  }
  __syncthreads();

  for (int base = 0; base < pairs; base += kPermThreads) {
    for (int i = tid; i < kPermWarps * experts; i += kPermThreads) warp_rows[i] = 0;
    __syncthreads();
    const int p = base + tid;
    int e = p < pairs ? ids[p] : -1;
    const bool valid = e >= 0 && e < experts;
    if (!valid) e = -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(same & ((1u << lane) - 1u));
    if (valid && rank == 0) warp_rows[warp * experts + e] = __popc(same);
    __syncthreads();
    if (tid < experts) {
      int run = cursor[tid];
      for (int w = 0; w < kPermWarps; ++w) {
        const int count = warp_rows[w * experts + tid];
        warp_rows[w * experts + tid] = run;
        run += count;
      }
      cursor[tid] = run;
    }
    __syncthreads();
    if (valid) {
      const int slot = warp_rows[warp * experts + e] + rank;
      sorted_token[slot] = p / top_k;
      slot_of[p] = slot;
    } else if (p < pairs) {
      slot_of[p] = -1;
    }
    __syncthreads();
  }
}

}  // namespace

absl::Status BuildExpertPermutation(const int32_t* ids, int64_t tokens, int64_t top_k,
                                    int64_t experts, int32_t* expert_offsets, int32_t* sorted_token,
                                    int32_t* slot_of, cudaStream_t stream) {
  constexpr const char* kFn = "BuildExpertPermutation";
  // The kernel's int loop counters step past the last pair by up to kPermThreads.
  if (tokens < 0 || top_k < 1 || top_k > kMaxInt || experts < 1 ||
      experts > kMaxPermutationExperts || tokens > (kMaxInt - kPermThreads) / top_k) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " top_k=", top_k, " experts=", experts,
                   " (1 <= experts <= ", kMaxPermutationExperts, ", tokens * top_k < 2^31 - ",
                   kPermThreads, ")");
  }
  if (expert_offsets == nullptr) return Invalid(kFn, "null pointer");
  if (tokens > 0 && (ids == nullptr || sorted_token == nullptr || slot_of == nullptr)) {
    return Invalid(kFn, "null pointer");
  }
  // Launched even for zero tokens: expert_offsets becomes all zeros.
  ExpertPermutationKernel<<<1, kPermThreads, 0, stream>>>(
      ids, static_cast<int>(tokens * top_k), static_cast<int>(top_k), static_cast<int>(experts),
      expert_offsets, sorted_token, slot_of);
  return CheckLaunch(kFn);
}

// --- Row gather ----------------------------------------------------------------------------------

namespace {

// V: the copy unit (uint4 when rows are 16-byte multiples and aligned, else one element).
template <typename V>
__global__ void __launch_bounds__(kRowThreads)
    GatherRowsKernel(const V* __restrict__ src, int64_t src_rows, int64_t row_units,
                     const int32_t* __restrict__ row_index, V* __restrict__ dst) {
  const int64_t r = blockIdx.x;
  const int32_t s = row_index[r];
  const bool valid = s >= 0 && s < src_rows;
  const V* from = src + (valid ? static_cast<int64_t>(s) : 0) * row_units;
  V* to = dst + r * row_units;
  for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) to[i] = valid ? from[i] : V{};
}

}  // namespace

absl::Status GatherRows(const void* src, GpuDType dtype, int64_t src_rows, int64_t n,
                        const int32_t* row_index, int64_t rows, void* dst, cudaStream_t stream) {
  constexpr const char* kFn = "GatherRows";
  if (auto st = CheckDType(kFn, "dtype", dtype); !st.ok()) return st;
  if (src_rows < 0 || n < 1 || rows < 0 || rows > kMaxGridX) {
    return Invalid(kFn, "bad sizes src_rows=", src_rows, " n=", n, " rows=", rows);
  }
  if (rows == 0) return absl::OkStatus();
  if (src == nullptr || row_index == nullptr || dst == nullptr) return Invalid(kFn, "null pointer");
  const int64_t row_bytes = n * static_cast<int64_t>(GpuDTypeSize(dtype));
  const bool vector = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const unsigned blocks = static_cast<unsigned>(rows);
  if (vector) {
    GatherRowsKernel<uint4><<<blocks, kRowThreads, 0, stream>>>(static_cast<const uint4*>(src),
                                                                src_rows, row_bytes / 16, row_index,
                                                                static_cast<uint4*>(dst));
  } else if (GpuDTypeSize(dtype) == 4) {
    GatherRowsKernel<uint32_t><<<blocks, kRowThreads, 0, stream>>>(
        static_cast<const uint32_t*>(src), src_rows, n, row_index, static_cast<uint32_t*>(dst));
  } else {
    GatherRowsKernel<uint16_t><<<blocks, kRowThreads, 0, stream>>>(
        static_cast<const uint16_t*>(src), src_rows, n, row_index, static_cast<uint16_t*>(dst));
  }
  return CheckLaunch(kFn);
}

// --- Argmax --------------------------------------------------------------------------------------

namespace {

// (value, index) of the better of two candidates: the larger value, the lower index on a tie.
__device__ __forceinline__ void TakeBetter(float& v, int& i, float other_v, int other_i) {
  if (other_v > v || (other_v == v && other_i < i)) {
    v = other_v;
    i = other_i;
  }
}

__global__ void __launch_bounds__(kRowThreads)
    ArgmaxRowsKernel(const float* __restrict__ x, int n, int32_t* __restrict__ ids) {
  __shared__ float warp_v[kRowThreads / 32];
  __shared__ int warp_i[kRowThreads / 32];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // Each thread's first maximum over its strided indices (visited in increasing order); a thread
  // with no index holds (-inf, n), which any real element beats or ties with a lower index.
  __shared__ int warp_bad[kRowThreads / 32];
  float v = -INFINITY;
  int i = n;
  int bad = 0;  // a NaN or an infinity seen
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    bad |= !isfinite(row[j]);
    TakeBetter(v, i, row[j], j);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_v = __shfl_xor_sync(0xffffffffu, v, offset);
    const int other_i = __shfl_xor_sync(0xffffffffu, i, offset);
    bad |= __shfl_xor_sync(0xffffffffu, bad, offset);
    TakeBetter(v, i, other_v, other_i);
  }
  if (lane == 0) {
    warp_v[warp] = v;
    warp_i[warp] = i;
    warp_bad[warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
      TakeBetter(v, i, warp_v[w], warp_i[w]);
      bad |= warp_bad[w];
    }
    ids[blockIdx.x] = bad ? -1 : i;
  }
}

}  // namespace

absl::Status ArgmaxRows(const float* x, int64_t rows, int64_t n, int32_t* ids,
                        cudaStream_t stream) {
  constexpr const char* kFn = "ArgmaxRows";
  // The strided loop's int counter passes n by up to a block.
  if (rows < 0 || rows > kMaxGridX || n < 1 || n > kMaxInt - kRowThreads) {
    return Invalid(kFn, "bad sizes rows=", rows, " n=", n);
  }
  if (rows == 0) return absl::OkStatus();
  if (x == nullptr || ids == nullptr) return Invalid(kFn, "null pointer");
  ArgmaxRowsKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, static_cast<int>(n),
                                                                            ids);
  return CheckLaunch(kFn);
}

// --- SiLU-mul ------------------------------------------------------------------------------------

namespace {

// No __restrict__: out may alias gate or up (same dtype); each element is read before it is
// written, by the same thread.
template <typename I, typename O>
__global__ void __launch_bounds__(kElementwiseThreads)
    SiluMulKernel(const I* gate, const I* up, int64_t n, O* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float g = ToF32(gate[i]), u = ToF32(up[i]);
    out[i] = FromF32<O>(__fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u));
  }
}

}  // namespace

absl::Status SiluMul(const void* gate, const void* up, GpuDType in_dtype, int64_t rows,
                     int64_t inter, void* out, GpuDType out_dtype, cudaStream_t stream) {
  constexpr const char* kFn = "SiluMul";
  if (auto st = CheckDType(kFn, "in_dtype", in_dtype); !st.ok()) return st;
  if (auto st = CheckDType(kFn, "out_dtype", out_dtype); !st.ok()) return st;
  if (rows < 0 || inter < 1 || rows > std::numeric_limits<int64_t>::max() / inter) {
    return Invalid(kFn, "bad sizes rows=", rows, " inter=", inter);
  }
  if (rows == 0) return absl::OkStatus();
  if (gate == nullptr || up == nullptr || out == nullptr) return Invalid(kFn, "null pointer");
  if (out_dtype != in_dtype && (out == gate || out == up)) {
    return Invalid(kFn, "in-place only with out_dtype == in_dtype");
  }
  const int64_t n = rows * inter;
  Dispatch(in_dtype, [&](auto itag) {
    using I = typename decltype(itag)::type;
    Dispatch(out_dtype, [&](auto otag) {
      using O = typename decltype(otag)::type;
      SiluMulKernel<I, O><<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(
          static_cast<const I*>(gate), static_cast<const I*>(up), n, static_cast<O*>(out));
    });
  });
  return CheckLaunch(kFn);
}

namespace {

constexpr float kSwigluAlpha = 1.702f;  // GptOssExperts.alpha

template <typename O>
__global__ void __launch_bounds__(kElementwiseThreads)
    ClampedSwigluKernel(const float* gate, const float* up, int64_t n, float limit, O* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    // std::min / std::max as the CPU's: a NaN gate stays NaN (torch.clamp).
    const float gi = gate[i], ui = up[i];
    const float g = limit < gi ? limit : gi;
    float u = ui < -limit ? -limit : ui;
    u = limit < u ? limit : u;
    const float glu =
        __fmul_rn(g, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(g, kSwigluAlpha)))));
    out[i] = FromF32<O>(__fmul_rn(__fadd_rn(u, 1.0f), glu));
  }
}

}  // namespace

absl::Status ClampedSwiglu(const float* gate, const float* up, int64_t rows, int64_t inter,
                           float limit, void* out, GpuDType out_dtype, cudaStream_t stream) {
  constexpr const char* kFn = "ClampedSwiglu";
  if (auto st = CheckDType(kFn, "out_dtype", out_dtype); !st.ok()) return st;
  if (rows < 0 || inter < 1 || rows > std::numeric_limits<int64_t>::max() / inter) {
    return Invalid(kFn, "bad sizes rows=", rows, " inter=", inter);
  }
  if (!(limit > 0.0f) || !std::isfinite(limit)) return Invalid(kFn, "bad limit ", limit);
  if (rows == 0) return absl::OkStatus();
  if (gate == nullptr || up == nullptr || out == nullptr) return Invalid(kFn, "null pointer");
  if (out_dtype != GpuDType::kF32 && (out == gate || out == up)) {
    return Invalid(kFn, "in-place only with an f32 out_dtype");
  }
  const int64_t n = rows * inter;
  Dispatch(out_dtype, [&](auto otag) {
    using O = typename decltype(otag)::type;
    ClampedSwigluKernel<O><<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(
        gate, up, n, limit, static_cast<O*>(out));
  });
  return CheckLaunch(kFn);
}

// --- Combine -------------------------------------------------------------------------------------

namespace {

// One block per token: thread 0 orders the token's choices by expert id (stable insertion sort
// of at most 64), then each thread sums its columns in that order, adds the shared expert's output
// when there is one, and adds the sum to h.
__global__ void __launch_bounds__(kRowThreads)
    CombineExpertsKernel(const float* __restrict__ expert_out, const int32_t* __restrict__ slot_of,
                         const int32_t* __restrict__ ids, const float* __restrict__ weights,
                         int top_k, int64_t hidden, int64_t num_slots,
                         const float* __restrict__ shared, float* __restrict__ h) {
  __shared__ int32_t slots[kMaxCombineTopK];
  __shared__ float slot_weight[kMaxCombineTopK];
  __shared__ int count;
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    int32_t expert[kMaxCombineTopK];
    int m = 0;
    for (int j = 0; j < top_k; ++j) {
      const int32_t slot = slot_of[t * top_k + j];
      if (slot < 0 || slot >= num_slots) continue;
      const int32_t id = ids[t * top_k + j];
      const float w = weights[t * top_k + j];
      int at = m;
      while (at > 0 && expert[at - 1] > id) {
        expert[at] = expert[at - 1];
        slots[at] = slots[at - 1];
        slot_weight[at] = slot_weight[at - 1];
        --at;
      }
      expert[at] = id;
      slots[at] = slot;
      slot_weight[at] = w;
      ++m;
    }
    count = m;
  }
  __syncthreads();
  const int m = count;
  float* row = h + t * hidden;
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    float moe = 0.0f;
    for (int j = 0; j < m; ++j) {
      moe = __fadd_rn(moe, __fmul_rn(expert_out[slots[j] * hidden + c], slot_weight[j]));
    }
    if (shared != nullptr) moe = __fadd_rn(moe, shared[t * hidden + c]);
    row[c] = __fadd_rn(row[c], moe);
  }
}

}  // namespace

absl::Status CombineExperts(const float* expert_out, const int32_t* slot_of, const int32_t* ids,
                            const float* weights, int64_t tokens, int64_t top_k, int64_t hidden,
                            float* h, const float* shared, cudaStream_t stream) {
  constexpr const char* kFn = "CombineExperts";
  if (tokens < 0 || tokens > kMaxGridX || top_k < 1 || top_k > kMaxCombineTopK || hidden < 1 ||
      tokens > kMaxInt / top_k) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " top_k=", top_k, " hidden=", hidden,
                   " (1 <= top_k <= ", kMaxCombineTopK, ")");
  }
  if (tokens == 0) return absl::OkStatus();
  if (expert_out == nullptr || slot_of == nullptr || ids == nullptr || weights == nullptr ||
      h == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  CombineExpertsKernel<<<static_cast<unsigned>(tokens), kRowThreads, 0, stream>>>(
      expert_out, slot_of, ids, weights, static_cast<int>(top_k), hidden, tokens * top_k, shared,
      h);
  return CheckLaunch(kFn);
}

// --- Elementwise ---------------------------------------------------------------------------------

namespace {

__global__ void __launch_bounds__(kElementwiseThreads)
    AddResidualKernel(float* __restrict__ h, const float* __restrict__ x, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    h[i] = __fadd_rn(h[i], x[i]);
  }
}

// x [rows, n]: element i of the flattened array gets bias[(i % n) * step].
template <typename B>
__global__ void __launch_bounds__(kElementwiseThreads)
    AddBiasKernel(float* __restrict__ x, int64_t total, int64_t n, const B* __restrict__ bias,
                  int64_t step) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    x[i] = __fadd_rn(x[i], ToF32(bias[(i % n) * step]));
  }
}

__global__ void __launch_bounds__(kElementwiseThreads)
    ClampAbsKernel(float* __restrict__ x, int64_t n, float limit) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    // std::min(std::max(x, -limit), limit) as the CPU: a NaN stays a NaN (torch.clamp).
    float v = x[i];
    v = v < -limit ? -limit : v;
    x[i] = limit < v ? limit : v;
  }
}

// x [tokens, n]: element i is scaled by the sigmoid of its row's gate logit.
__global__ void __launch_bounds__(kElementwiseThreads)
    ScaleBySigmoidKernel(float* __restrict__ x, int64_t total, int64_t n,
                         const float* __restrict__ gate_logit) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const float g = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gate_logit[i / n])));
    x[i] = __fmul_rn(g, x[i]);
  }
}

template <typename I, typename O>
__global__ void __launch_bounds__(kElementwiseThreads)
    ConvertKernel(const I* __restrict__ src, int64_t n, O* __restrict__ dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = FromF32<O>(ToF32(src[i]));
  }
}

}  // namespace

absl::Status AddResidual(float* h, const float* x, int64_t n, cudaStream_t stream) {
  constexpr const char* kFn = "AddResidual";
  if (n < 0) return Invalid(kFn, "bad size n=", n);
  if (n == 0) return absl::OkStatus();
  if (h == nullptr || x == nullptr) return Invalid(kFn, "null pointer");
  AddResidualKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(h, x, n);
  return CheckLaunch(kFn);
}

absl::Status AddBias(float* x, int64_t rows, int64_t n, const void* bias, GpuDType bias_dtype,
                     cudaStream_t stream) {
  return AddBiasStrided(x, rows, n, bias, bias_dtype, 1, stream);
}

absl::Status AddBiasStrided(float* x, int64_t rows, int64_t n, const void* bias,
                            GpuDType bias_dtype, int64_t bias_step, cudaStream_t stream) {
  constexpr const char* kFn = "AddBias";
  if (auto st = CheckDType(kFn, "bias_dtype", bias_dtype); !st.ok()) return st;
  if (rows < 0 || n < 1 || rows > std::numeric_limits<int64_t>::max() / n || bias_step < 1 ||
      n > std::numeric_limits<int64_t>::max() / bias_step) {
    return Invalid(kFn, "bad sizes rows=", rows, " n=", n, " bias_step=", bias_step);
  }
  if (rows == 0) return absl::OkStatus();
  if (x == nullptr || bias == nullptr) return Invalid(kFn, "null pointer");
  const int64_t total = rows * n;
  Dispatch(bias_dtype, [&](auto tag) {
    using B = typename decltype(tag)::type;
    AddBiasKernel<B><<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(
        x, total, n, static_cast<const B*>(bias), bias_step);
  });
  return CheckLaunch(kFn);
}

absl::Status ClampAbs(float* x, int64_t n, float limit, cudaStream_t stream) {
  constexpr const char* kFn = "ClampAbs";
  if (n < 0 || !(limit > 0)) return Invalid(kFn, "bad arguments n=", n, " limit=", limit);
  if (n == 0) return absl::OkStatus();
  if (x == nullptr) return Invalid(kFn, "null pointer");
  ClampAbsKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(x, n, limit);
  return CheckLaunch(kFn);
}

absl::Status ScaleBySigmoid(float* x, int64_t tokens, int64_t n, const float* gate_logit,
                            cudaStream_t stream) {
  constexpr const char* kFn = "ScaleBySigmoid";
  if (tokens < 0 || n < 1 || tokens > std::numeric_limits<int64_t>::max() / n) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " n=", n);
  }
  if (tokens == 0) return absl::OkStatus();
  if (x == nullptr || gate_logit == nullptr) return Invalid(kFn, "null pointer");
  const int64_t total = tokens * n;
  ScaleBySigmoidKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(x, total, n,
                                                                                     gate_logit);
  return CheckLaunch(kFn);
}

absl::Status ConvertF32To(const float* src, int64_t n, void* dst, GpuDType dst_dtype,
                          cudaStream_t stream) {
  constexpr const char* kFn = "ConvertF32To";
  if (auto st = CheckDType(kFn, "dst_dtype", dst_dtype); !st.ok()) return st;
  if (n < 0) return Invalid(kFn, "bad size n=", n);
  if (n == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) return Invalid(kFn, "null pointer");
  Dispatch(dst_dtype, [&](auto tag) {
    using O = typename decltype(tag)::type;
    ConvertKernel<float, O>
        <<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(src, n, static_cast<O*>(dst));
  });
  return CheckLaunch(kFn);
}

absl::Status ConvertToF32(const void* src, GpuDType src_dtype, int64_t n, float* dst,
                          cudaStream_t stream) {
  constexpr const char* kFn = "ConvertToF32";
  if (auto st = CheckDType(kFn, "src_dtype", src_dtype); !st.ok()) return st;
  if (n < 0) return Invalid(kFn, "bad size n=", n);
  if (n == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) return Invalid(kFn, "null pointer");
  Dispatch(src_dtype, [&](auto tag) {
    using I = typename decltype(tag)::type;
    ConvertKernel<I, float><<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(
        static_cast<const I*>(src), n, dst);
  });
  return CheckLaunch(kFn);
}

}  // namespace moebatch::gpu
