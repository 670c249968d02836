// The AVX2 decode attention tile kernel (cpu_attention/attention/decode_attention_avx2.cc, its
// Avx2Tile::Tile) timed alone on L1-resident rows, for bench_attention_tile_cycles. This file
// includes the kernel's source, so it is compiled with the kernel's flags (-mavx2 -mfma -mf16c)
// and linked only into that program, never beside moebatch_cpu_attention (the kernel's external
// symbols would be defined twice).
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "bench/attention_tile_cycles.h"
#include "cpu_attention/attention/decode_attention_avx2.cc"

namespace moebatch {
namespace {

using decode_attention_internal::Avx2Tile;
using decode_attention_internal::kTile;
using decode_attention_internal::PrefetchQueue;

// The engine's alignment: KV blocks start on pages, the queries and accumulators on 64 bytes
// (decode_attention_tiled.h); a 32-byte load that crosses a line costs Zen 3 two load slots.
struct alignas(64) TileData {
  uint16_t kv[2 * kTile * decode_attention_internal::kMaxTiledHeadDim];  // K rows, then V rows
  float qp[decode_attention_internal::kMaxGroup * decode_attention_internal::kMaxTiledHeadDim];
  float acc[decode_attention_internal::kMaxGroup * decode_attention_internal::kMaxTiledHeadDim];
};

template <int G>
TileTiming TimeTile(int64_t head_dim, int64_t calls, int repeats) {
  const size_t row_bytes = static_cast<size_t>(head_dim) * 2;  // bf16
  auto data = std::make_unique<TileData>();
  // One tile of kTile keys, random bf16 in about [-1, 1); queries in about [-0.1, 0.1).
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int64_t kv_count = 2 * kTile * head_dim, q_count = G * head_dim;
  for (int64_t i = 0; i < kv_count; ++i) {
    const float x = uniform(rng);
    uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    data->kv[i] = static_cast<uint16_t>(u >> 16);
  }
  for (int64_t i = 0; i < q_count; ++i) {
    data->qp[i] = uniform(rng) * 0.1f;
    data->acc[i] = 0.0f;
  }
  float* qp = data->qp;
  float* acc = data->acc;
  float m[G];
  __m256 l[G];
  for (int g = 0; g < G; ++g) {
    m[g] = -__builtin_inff();
    l[g] = _mm256_setzero_ps();
  }
  const auto* keys = reinterpret_cast<const std::byte*>(data->kv);
  const size_t value_offset = static_cast<size_t>(kTile) * row_bytes;
  // Opaque to the compiler, as in the engine, where n and d are run-time values.
  volatile int64_t n_opaque = kTile, d_opaque = head_dim;
  const int64_t n = n_opaque, d = d_opaque;
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < calls; ++i) {
      PrefetchQueue pq;  // empty: the rows are in L1 already
      Avx2Tile::Tile<DType::kBF16, G>(keys, value_offset, n, row_bytes, d, pq, qp, acc, m, l);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best) best = s;
  }
  TileTiming t;
  t.ns_per_key_row = best * 1e9 / (static_cast<double>(calls) * static_cast<double>(n));
  uint64_t h = 1469598103934665603ull;  // FNV-1a over acc's bits
  for (int64_t i = 0; i < q_count; ++i) {
    const float v = acc[i];
    uint32_t u;
    std::memcpy(&u, &v, sizeof(u));
    for (int b = 0; b < 4; ++b) h = (h ^ ((u >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  t.acc_hash = h;
  return t;
}

}  // namespace

absl::StatusOr<TileTiming> TimeAvx2BF16Tile(int group, int64_t head_dim, int64_t calls,
                                            int repeats) {
  if (head_dim <= 0 || head_dim % 16 != 0 ||
      head_dim > decode_attention_internal::kMaxTiledHeadDim) {
    return absl::InvalidArgumentError(
        "--head_dim: the tiled kernel takes positive multiples of 16 up to " +
        std::to_string(decode_attention_internal::kMaxTiledHeadDim));
  }
  if (group < 1 || group > decode_attention_internal::kMaxGroup) {
    return absl::InvalidArgumentError("--groups: query heads per KV head are 1..8");
  }
  TileTiming t;
  decode_attention_internal::WithGroup(
      group, [&](auto tag) { t = TimeTile<decltype(tag)::value>(head_dim, calls, repeats); });
  return t;
}

}  // namespace moebatch
