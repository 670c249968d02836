// InvariantLinear's dispatch and work split (invariant_linear.h). Compiled for baseline x86-64; the
// per-ISA files hold the tiles.
#include "cpu_attention/gemm/invariant_linear.h"

#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cpu_attention/gemm/invariant_linear_internal.h"
#include "cpu_attention/gemm/quant_linear_internal.h"

namespace moebatch {

namespace ili = invariant_linear_internal;

namespace invariant_linear_internal {

// MXCSR bits 6 (DAZ) and 15 (FTZ).
constexpr unsigned kDenormalsFlushed = 0x8040;

ScopedDenormalsFlushed::ScopedDenormalsFlushed() : saved_(_mm_getcsr()) {
  _mm_setcsr(saved_ | kDenormalsFlushed);
}
ScopedDenormalsFlushed::~ScopedDenormalsFlushed() { _mm_setcsr(saved_); }

void PermutePairs32(const uint16_t* x, int64_t k, float* dst) {
  const int64_t k32 = k - k % 32;
  for (int64_t c = 0; c < k32; c += 32) {
    for (int64_t j = 0; j < 16; ++j) {
      dst[c + j] = BF16ToF32(x[c + 2 * j + 1]);
      dst[c + 16 + j] = BF16ToF32(x[c + 2 * j]);
    }
  }
  for (int64_t t = k32; t < k; ++t) dst[t] = BF16ToF32(x[t]);
}

}  // namespace invariant_linear_internal

// The lane path of an ISA level (none for the portable one).
static ili::LaneKernel LaneKernelOf(CpuIsa isa, ili::WForm w_form) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return ili::Avx512LaneKernel(w_form);
    case CpuIsa::kAvx2:
      return ili::Avx2LaneKernel(w_form);
    default:
      return ili::LaneKernel{};
  }
}

// Runs fn(m0, m1, n0, n1) over the dot-product path's tiles of y [m, n], in parallel (dynamic):
// 64 rows of x by as many weight rows (of row_bytes each) as fit in ~256 KiB (within a core's L2),
// so the weights are read from memory once per 64 rows and from cache for each block of rows.
template <class Fn>
static void ForEachDotTile(int64_t m, int64_t n, int64_t row_bytes, const Fn& fn) {
  constexpr int64_t kTileRows = 64;
  constexpr int64_t kTileWeightBytes = int64_t{256} << 10;
  const int64_t tile_cols =
      std::clamp<int64_t>(kTileWeightBytes / std::max<int64_t>(1, row_bytes) / 4 * 4, 4, 256);
  const int64_t tiles_m = (m + kTileRows - 1) / kTileRows;
  const int64_t tiles_n = (n + tile_cols - 1) / tile_cols;
  const int64_t tiles = tiles_m * tiles_n;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t m0 = t / tiles_n * kTileRows, n0 = t % tiles_n * tile_cols;
    fn(m0, std::min(m, m0 + kTileRows), n0, std::min(n, n0 + tile_cols));
  }
}

// InvariantLinear over weights read as w_form; kBF16Pairs: x permuted (PermutePairs32), every
// tile under ScopedDenormalsFlushed.
static void RunInvariantLinear(CpuIsa isa, const float* x, int64_t m, int64_t k, const void* w,
                               ili::WForm w_form, int64_t n, float* y) {
  if (m <= 0 || n <= 0) return;
  const bool flush = w_form == ili::WForm::kBF16Pairs;
  // The split into tiles changes which thread computes an element, never how.
  const int threads = omp_get_max_threads();
  const ili::LaneKernel lanes = LaneKernelOf(isa, w_form);
  if (lanes.tile != nullptr && m >= lanes.min_rows) {
    // Many rows, lane by lane: x packed once (in parallel, blocks of mr rows), then tiles of up to
    // 512 rows (split evenly, a multiple of mr) by 256 weight rows, fewer columns when that leaves
    // the threads too few tiles. A tile packs its weight panels once for all its rows (Zen 3, one
    // thread, M 512, best of 5-8 alternated runs: 512-row tiles 87-89 GFLOP/s against 85-88 with
    // two of 256 rows, within the VM's noise; a panel is packed half as often).
    const int64_t mr = lanes.mr, blocks = (m + mr - 1) / mr;
    const int64_t block_floats = 16 * ili::LaneStride(k / 16 * mr);
    // The calling thread's (kept between calls: the largest x seen, in f32); the pool's threads
    // see it through `packed` only.
    thread_local std::vector<float> xp;
    xp.resize(static_cast<size_t>(blocks * block_floats));
    float* packed = xp.data();
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      lanes.pack_rows(x + b * mr * k, std::min(mr, m - b * mr), k, packed + b * block_floats);
    }
    const int64_t row_tiles = (m + 511) / 512;
    const int64_t tile_rows = ((m + row_tiles - 1) / row_tiles + mr - 1) / mr * mr;
    int64_t tile_cols = 256;
    while (tile_cols > 16 && row_tiles * ((n + tile_cols - 1) / tile_cols) < 4 * threads) {
      tile_cols /= 2;
    }
    const int64_t tiles_n = (n + tile_cols - 1) / tile_cols;
    const int64_t tiles = row_tiles * tiles_n;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t m0 = t / tiles_n * tile_rows, n0 = t % tiles_n * tile_cols;
      if (m0 >= m) continue;
      std::optional<ili::ScopedDenormalsFlushed> flushed;
      if (flush) flushed.emplace();
      lanes.tile(x, packed, m0, std::min(m, m0 + tile_rows), k, w, n0, std::min(n, n0 + tile_cols),
                 y, n);
    }
    return;
  }
  // The dot-product tiles load 32- or 64-byte vectors of x at every step, so x's rows start on
  // 64-byte boundaries (all of them when k is a multiple of 16): from malloc's 16-byte alignment
  // half of the 32-byte loads split across two cache lines (Zen 3, 2 threads, Q8_0 [5632, 2048] at
  // 4-8 rows: 1.3x faster aligned; a 4 x 1 block in a one-thread probe, 0.9 FMAs a cycle against
  // 1.6). The copy is m·k floats against the call's m·k·n FMAs.
  if (reinterpret_cast<uintptr_t>(x) % 64 != 0 && k % 16 == 0) {
    thread_local std::vector<float> aligned_x;
    float* copy = ili::Aligned64(aligned_x, m * k);
    std::copy(x, x + m * k, copy);
    x = copy;
  }
  ili::TileFn tile = isa == CpuIsa::kAvx512 ? ili::Avx512Tile(w_form)
                     : isa == CpuIsa::kAvx2 ? ili::Avx2Tile(w_form)
                                            : ili::PortableTile(w_form);
  ForEachDotTile(m, n, ili::WRowBytes(w_form, k),
                 [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
                   std::optional<ili::ScopedDenormalsFlushed> flushed;
                   if (flush) flushed.emplace();
                   tile(x, m0, m1, k, w, n0, n1, y, n);
                 });
}

void InvariantLinear(CpuIsa isa, const float* x, int64_t m, int64_t k, const void* w, DType w_dtype,
                     int64_t n, float* y) {
  RunInvariantLinear(isa, x, m, k, w, ili::WFormOf(w_dtype), n, y);
}

void InvariantLinearBf16(CpuIsa isa, const uint16_t* x, int64_t m, int64_t k, const uint16_t* w,
                         int64_t n, float* y, bool vdpbf16ps) {
  if (m <= 0 || n <= 0) return;
  if (!vdpbf16ps || isa != CpuIsa::kAvx512 || !CpuAvx512Bf16Usable()) {
    // The calling thread's (kept between calls); the pool's threads see it through `permuted`.
    // On a 64-byte boundary, so that the dot-product tiles read it in place (RunInvariantLinear).
    thread_local std::vector<float> xp;
    float* permuted = ili::Aligned64(xp, m * k);
#pragma omp parallel for schedule(static) if (m * k >= (int64_t{1} << 16))
    for (int64_t r = 0; r < m; ++r) ili::PermutePairs32(x + r * k, k, permuted + r * k);
    return RunInvariantLinear(isa, permuted, m, k, w, ili::WForm::kBF16Pairs, n, y);
  }
  const ili::Bf16TileFn tile = ili::Avx512Bf16Tile();
  ForEachDotTile(m, n, 2 * k, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    ili::ScopedDenormalsFlushed flushed;
    tile(x, m0, m1, k, w, n0, n1, y, n);
  });
}

absl::Status InvariantLinearQ8_0(CpuIsa isa, const float* x, int64_t m, int64_t k,
                                 const std::byte* w, int64_t n, float* y) {
  if (m < 0 || n < 0 || k < 0 || k % ili::kQ8_0BlockElems != 0) {
    return absl::InvalidArgumentError(absl::StrCat("InvariantLinearQ8_0: bad sizes m=", m, " k=", k,
                                                   " n=", n, " (k a multiple of 32)"));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k > 0 && (x == nullptr || w == nullptr || y == nullptr)) {
    return absl::InvalidArgumentError("InvariantLinearQ8_0: null pointer");
  }
  RunInvariantLinear(isa, x, m, k, w, ili::WForm::kQ8_0, n, y);
  return absl::OkStatus();
}

absl::Status InvariantLinearMxfp4(CpuIsa isa, const float* x, int64_t m, int64_t k,
                                  const std::byte* w, int64_t n, float* y) {
  if (m < 0 || n < 0 || k < 0 || k % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("InvariantLinearMxfp4: bad sizes m=", m,
                                                   " k=", k, " n=", n, " (k a multiple of 32)"));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k > 0 && (x == nullptr || w == nullptr || y == nullptr)) {
    return absl::InvalidArgumentError("InvariantLinearMxfp4: null pointer");
  }
  namespace qli = quant_linear_internal;
  const int threads = omp_get_max_threads();
  const int64_t block_row_bytes = k / 32 * 17;
  const ili::LaneKernel lanes = LaneKernelOf(isa, ili::WForm::kF32);
  // Few rows: each block widened in registers where it is used (AVX2 code: AVX-512 hosts have
  // AVX2 too, and InvariantLinear's bits are the same at every level). Weight rows split evenly.
  // Below 16 rows at most (the lane path's threshold where lower): from about there its 4-row
  // passes over the weights lose to the widened tiles lane by lane (gpt-oss's [5760, 2880] on the
  // Sapphire Rapids VM, two runs: 12.8 ms at 24 rows by 4-row passes, 10.7 lane by lane).
  constexpr int64_t kMxfp4FewRows = 16;
  if (isa != CpuIsa::kPortable && m < std::min(lanes.min_rows, kMxfp4FewRows)) {
    const int64_t chunk = std::max<int64_t>(1, (n + 4 * threads - 1) / (4 * threads));
    const int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      qli::Avx2Mxfp4Rows(x, m, k, w, c * chunk, std::min(n, (c + 1) * chunk), y, n);
    }
    return absl::OkStatus();
  }
  // Many rows: tiles of weight rows, ~256 KiB once widened (L2), each widened once and then run
  // against every row of x by InvariantLinear's f32 code (lane by lane, x packed once).
  const auto widen = isa == CpuIsa::kPortable ? qli::PortableWidenMxfp4Row : qli::Avx2WidenMxfp4Row;
  const ili::TileFn tile = isa == CpuIsa::kAvx512 ? ili::Avx512Tile(ili::WForm::kF32)
                           : isa == CpuIsa::kAvx2 ? ili::Avx2Tile(ili::WForm::kF32)
                                                  : ili::PortableTile(ili::WForm::kF32);
  float* packed = nullptr;
  if (lanes.tile != nullptr) {
    const int64_t mr = lanes.mr, blocks = (m + mr - 1) / mr;
    const int64_t block_floats = 16 * ili::LaneStride(k / 16 * mr);
    thread_local std::vector<float> xp;
    xp.resize(static_cast<size_t>(blocks * block_floats));
    packed = xp.data();
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      lanes.pack_rows(x + b * mr * k, std::min(mr, m - b * mr), k, packed + b * block_floats);
    }
  }
  constexpr int64_t kTileRows = 64;
  const int64_t lane_tile_rows = lanes.tile != nullptr ? 256 / lanes.mr * lanes.mr : 0;
  constexpr int64_t kTileWeightBytes = int64_t{256} << 10;
  const int64_t row_bytes = std::max<int64_t>(1, k * 4);
  int64_t tile_cols = std::clamp<int64_t>(kTileWeightBytes / row_bytes / 4 * 4, 4, 256);
  while (tile_cols > 16 && (n + tile_cols - 1) / tile_cols < 4 * threads) tile_cols /= 2;
  const int64_t tiles = (n + tile_cols - 1) / tile_cols;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n0 = t * tile_cols, cols = std::min(tile_cols, n - n0);
    thread_local std::vector<float> wide;
    wide.resize(static_cast<size_t>(cols * k));
    for (int64_t j = 0; j < cols; ++j)
      widen(w + (n0 + j) * block_row_bytes, k, wide.data() + j * k);
    if (lanes.tile != nullptr) {
      for (int64_t m0 = 0; m0 < m; m0 += lane_tile_rows) {
        lanes.tile(x, packed, m0, std::min(m, m0 + lane_tile_rows), k, wide.data(), 0, cols, y + n0,
                   n);
      }
    } else {
      for (int64_t m0 = 0; m0 < m; m0 += kTileRows) {
        tile(x, m0, std::min(m, m0 + kTileRows), k, wide.data(), 0, cols, y + n0, n);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace moebatch
