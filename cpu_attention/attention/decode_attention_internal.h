// Internals of decode_attention.cc shared with the per-ISA kernel files and the tests.
//
// The kernel (AttendGroupKernel below) is one template written against a small "Ops" struct of
// vector primitives; decode_attention_avx2.cc and decode_attention_avx512.cc each define their Ops
// in an anonymous namespace and instantiate it there, compiled with their own -m flags. Because
// the Ops types have internal linkage, every instantiation is local to its file: no inline symbol
// compiled for AVX-512 can be picked by the linker for code that runs on an AVX2-only host. For the
// same reason the kernel uses no std:: templates.
//
// Algorithm for each KV head of one call (one query row, `group` <= kMaxGroup query heads per KV
// head, keys [first, last] in absolute positions): the keys are walked in tiles of up to kTile rows
// that lie within one KV block. Per tile: scores s[g][t] = q_g . K_t (each K row widened to f32
// once and used by every head of the group), the tile's max per head, the running accumulators
// rescaled by exp(old max - new max), p = exp(s - max) with a vectorised polynomial exp, then
// acc_g += sum_t p[g][t] V_t with each V row widened once per tile. fp32 throughout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu_attention/attention/decode_attention.h"

namespace moebatch {
namespace decode_attention_internal {

inline constexpr int kMaxGroup = 8;  // query heads of one KV head per work item
inline constexpr int kTile = 16;     // keys per tile
// A work item may take several KV heads (all their query heads, when a KV head has at most
// kMaxGroup): at most kMaxUnitQueryHeads query heads and kMaxUnitFloats = query heads x head_dim
// floats (the kernels' per-item state: 16 KiB of scaled queries and 16 KiB of accumulators).
inline constexpr int kMaxUnitQueryHeads = 64;
inline constexpr int64_t kMaxUnitFloats = 4096;

// One ISA's kernel: attends keys [first, last] of the KV heads [kv_head, kv_head + num_kv_heads)
// for `group` query heads each, whose scaled query vectors are q[num_kv_heads][group][head_dim]
// (already multiplied by the softmax scale). Writes the unnormalised accumulators
// acc[num_kv_heads][group][head_dim], the running max m[num_kv_heads][group] and sum
// l[num_kv_heads][group] (out = acc / l). Each head's result is bitwise the same whatever
// num_kv_heads is (the order the heads are taken in is the kernel's own). Requires head_dim % lanes
// == 0, 1 <= group <= kMaxGroup, num_kv_heads * group <= kMaxUnitQueryHeads and
// num_kv_heads * group * head_dim <= max(kMaxUnitFloats, group * head_dim), and, with
// kv.value_dim > 0 (the value is the key row's first value_dim values), value_dim % lanes == 0;
// acc's values past value_dim are then 0.
using AttendGroupFn = void (*)(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head,
                               int num_kv_heads, int64_t first, int64_t last, const float* q,
                               int group, float* acc, float* m, float* l);
void AttendGroupAvx2(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head,
                     int num_kv_heads, int64_t first, int64_t last, const float* q, int group,
                     float* acc, float* m, float* l);
void AttendGroupAvx512(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head,
                       int num_kv_heads, int64_t first, int64_t last, const float* q, int group,
                       float* acc, float* m, float* l);

// MLA's bf16 latent cache on AMX tiles (mla_attention_amx.cc; only where CpuAmxUsable()): keys
// [first, last] of the cache's single KV head (kv.num_kv_heads == 1, kv.value_dim > 0) for
// kAmxHeads query heads whose scaled queries are q[kAmxHeads][head_dim]. Writes acc[kAmxHeads]
// [head_dim] (0 past value_dim), m[kAmxHeads] and l[kAmxHeads] as AttendGroupFn does. Requires
// kv.dtype bf16, head_dim and value_dim multiples of 32 and at most kAmxMaxDim; any number of keys
// (m is the max the exponentials were taken against: at most the largest score and within 16 of it;
// l and acc are relative to it). Each head's result depends on its own query and the keys only.
inline constexpr int kAmxHeads = 16;
inline constexpr int64_t kAmxMaxDim = 1024;
void AttendMlaAmx(const KvLayerView& kv, const int32_t* block_table, int64_t first, int64_t last,
                  const float* q, float* acc, float* m, float* l);

// Whether a call with this cache and head count takes AttendMlaAmx (given the CPU may).
inline bool MlaAmxApplies(const KvLayerView& kv, int64_t num_heads) {
  return kv.dtype == DType::kBF16 && kv.num_kv_heads == 1 && kv.value_dim > 0 &&
         kv.head_dim % 32 == 0 && kv.value_dim % 32 == 0 && kv.head_dim <= kAmxMaxDim &&
         num_heads % kAmxHeads == 0;
}

// PagedAttention with the AMX path allowed or not (amx requires CpuAmxUsable() and isa kAvx512):
// what the tests and the benchmark use to run both paths on one host.
void PagedAttentionWith(CpuIsa isa, bool amx, const KvLayerView& kv, const AttentionSequence* seqs,
                        int64_t num_seqs, const float* q, int64_t num_heads, float scale,
                        std::optional<int64_t> sliding_window, float* out,
                        const float* sinks = nullptr);

// The KV append path's row conversion (kv_append.cc): n f32 -> n elements of `dtype` at dst,
// round to nearest even, the same bits as ConvertFromF32 for every non-NaN input.
using ConvertRowFn = void (*)(DType dtype, const float* src, std::byte* dst, int64_t n);
void ConvertRowAvx2(DType dtype, const float* src, std::byte* dst, int64_t n);
void ConvertRowAvx512(DType dtype, const float* src, std::byte* dst, int64_t n);

// --- The kernel template, instantiated only in the ISA files
// --------------------------------------
//
// Ops provides: using V; kLanes; Zero(), Set1(float), LoadF(const float*), StoreF(float*, V),
// Add, Mul, Fma(a, b, c) = a*b + c, Max, ReduceAdd(V), ReduceMax(V), Exp(V) (f32 lanes, ~1e-7
// relative, 0 for -inf), and template <DType T> LoadKv(const std::byte*) (kLanes elements -> f32).
template <class Ops, DType T, int G>
void AttendGroupT(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head, int64_t first,
                  int64_t last, const float* q, float* acc, float* m_out, float* l_out) {
  using V = typename Ops::V;
  constexpr int W = Ops::kLanes;
  constexpr size_t elem = DTypeSize(T);
  const int64_t d = kv.head_dim;
  const int64_t chunks = d / W;
  // Value chunks: the whole row, or (kv.value_dim > 0, MLA's latent cache) the key row's first
  // value_dim values; acc keeps its [G][d] layout, its values past value_dim stay 0.
  const int64_t value_chunks = kv.value_dim > 0 ? kv.value_dim / W : chunks;
  const int64_t bs = kv.block_size;
  const size_t row_bytes = static_cast<size_t>(d) * elem;
  const size_t head_offset = static_cast<size_t>(kv_head) * bs * row_bytes;

  float m[G], l[G];
  for (int g = 0; g < G; ++g) {
    m[g] = -__builtin_inff();
    l[g] = 0.0f;
  }
  for (int64_t i = 0; i < G * d; i += W) Ops::StoreF(acc + i, Ops::Zero());

  alignas(64) float s[G][kTile];
  alignas(64) float p[G][kTile];
  float corr[G];

  int64_t j = first;
  while (j <= last) {
    const int64_t block = j / bs;
    const int64_t off = j - block * bs;
    int64_t n = bs - off;
    if (n > kTile) n = kTile;
    if (n > last - j + 1) n = last - j + 1;
    const std::byte* keys = kv.base +
                            static_cast<size_t>(block_table[block]) * kv.block_stride_bytes +
                            head_offset + static_cast<size_t>(off) * row_bytes;
    const std::byte* values = keys + kv.value_offset_bytes;
    // Prefetch the next tile's first rows (the next block, when this tile ends one).
    {
      const int64_t nj = j + n;
      if (nj <= last) {
        const int64_t nb = nj / bs;
        const std::byte* nk = kv.base +
                              static_cast<size_t>(block_table[nb]) * kv.block_stride_bytes +
                              head_offset + static_cast<size_t>(nj - nb * bs) * row_bytes;
        for (size_t x = 0; x < row_bytes * 2 && x < 512; x += 64) {
          __builtin_prefetch(nk + x);
          if (kv.value_offset_bytes != 0) __builtin_prefetch(nk + kv.value_offset_bytes + x);
        }
      }
    }

    // Scores.
    for (int64_t t = 0; t < n; ++t) {
      const std::byte* krow = keys + static_cast<size_t>(t) * row_bytes;
      V dot[G];
      for (int g = 0; g < G; ++g) dot[g] = Ops::Zero();
      for (int64_t c = 0; c < chunks; ++c) {
        const V k = Ops::template LoadKv<T>(krow + static_cast<size_t>(c) * W * elem);
        for (int g = 0; g < G; ++g) dot[g] = Ops::Fma(Ops::LoadF(q + g * d + c * W), k, dot[g]);
      }
      for (int g = 0; g < G; ++g) s[g][t] = Ops::ReduceAdd(dot[g]);
    }
    for (int g = 0; g < G; ++g) {
      for (int64_t t = n; t < kTile; ++t) s[g][t] = -__builtin_inff();
    }

    // Online softmax update.
    for (int g = 0; g < G; ++g) {
      V mx = Ops::LoadF(&s[g][0]);
      for (int t = W; t < kTile; t += W) mx = Ops::Max(mx, Ops::LoadF(&s[g][t]));
      float tile_max = Ops::ReduceMax(mx);
      const float new_max = tile_max > m[g] ? tile_max : m[g];
      // exp(-inf) = 0 on the first tile, where acc and l are 0 anyway.
      corr[g] = new_max > m[g] ? __builtin_expf(m[g] - new_max) : 1.0f;
      m[g] = new_max;
      const V vmax = Ops::Set1(new_max);
      V sum = Ops::Zero();
      for (int t = 0; t < kTile; t += W) {
        const V e = Ops::Exp(Ops::Sub(Ops::LoadF(&s[g][t]), vmax));
        Ops::StoreF(&p[g][t], e);
        sum = Ops::Add(sum, e);
      }
      l[g] = l[g] * corr[g] + Ops::ReduceAdd(sum);
    }

    // acc_g = acc_g * corr_g + sum_t p[g][t] V_t.
    for (int64_t c = 0; c < value_chunks; ++c) {
      V a[G];
      for (int g = 0; g < G; ++g)
        a[g] = Ops::Mul(Ops::LoadF(acc + g * d + c * W), Ops::Set1(corr[g]));
      const std::byte* vcol = values + static_cast<size_t>(c) * W * elem;
      for (int64_t t = 0; t < n; ++t) {
        const V v = Ops::template LoadKv<T>(vcol + static_cast<size_t>(t) * row_bytes);
        for (int g = 0; g < G; ++g) a[g] = Ops::Fma(Ops::Set1(p[g][t]), v, a[g]);
      }
      for (int g = 0; g < G; ++g) Ops::StoreF(acc + g * d + c * W, a[g]);
    }
    j += n;
  }
  for (int g = 0; g < G; ++g) {
    m_out[g] = m[g];
    l_out[g] = l[g];
  }
}

// Runtime group -> compile-time G: calls f(GroupTag<group>{}) for group in 1..kMaxGroup, nothing
// otherwise. F is always a lambda of an ISA file, so every instantiation stays local to that file.
template <int G>
struct GroupTag {
  static constexpr int value = G;
};
template <class F>
void WithGroup(int group, F&& f) {
  switch (group) {
    case 1:
      return f(GroupTag<1>{});
    case 2:
      return f(GroupTag<2>{});
    case 3:
      return f(GroupTag<3>{});
    case 4:
      return f(GroupTag<4>{});
    case 5:
      return f(GroupTag<5>{});
    case 6:
      return f(GroupTag<6>{});
    case 7:
      return f(GroupTag<7>{});
    case 8:
      return f(GroupTag<8>{});
    default:
      return;
  }
}

// Runtime (dtype, group) -> compile-time instantiation.
template <class Ops, DType T>
void AttendGroupDispatchG(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head,
                          int64_t first, int64_t last, const float* q, int group, float* acc,
                          float* m, float* l) {
  WithGroup(group, [&](auto tag) {
    AttendGroupT<Ops, T, decltype(tag)::value>(kv, block_table, kv_head, first, last, q, acc, m, l);
  });
}

// The generic kernels take the KV heads one after another (heads outer).
template <class Ops>
void AttendGroupDispatch(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head,
                         int num_kv_heads, int64_t first, int64_t last, const float* q, int group,
                         float* acc, float* m, float* l) {
  const int64_t floats = static_cast<int64_t>(group) * kv.head_dim;
  for (int i = 0; i < num_kv_heads; ++i) {
    const float* qi = q + i * floats;
    float* ai = acc + i * floats;
    float* mi = m + i * group;
    float* li = l + i * group;
    switch (kv.dtype) {
      case DType::kF32:
        AttendGroupDispatchG<Ops, DType::kF32>(kv, block_table, kv_head + i, first, last, qi, group,
                                               ai, mi, li);
        break;
      case DType::kBF16:
        AttendGroupDispatchG<Ops, DType::kBF16>(kv, block_table, kv_head + i, first, last, qi,
                                                group, ai, mi, li);
        break;
      case DType::kF16:
        AttendGroupDispatchG<Ops, DType::kF16>(kv, block_table, kv_head + i, first, last, qi, group,
                                               ai, mi, li);
        break;
    }
  }
}

}  // namespace decode_attention_internal
}  // namespace moebatch
