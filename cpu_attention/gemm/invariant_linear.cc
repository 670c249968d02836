// InvariantLinear's dispatch and work split (invariant_linear.h). Compiled for baseline x86-64; the
// per-ISA files hold the tiles.
#include "cpu_attention/gemm/invariant_linear.h"

#include <omp.h>

#include <algorithm>

#include "cpu_attention/gemm/invariant_linear_internal.h"

namespace moebatch {

namespace ili = invariant_linear_internal;

void InvariantLinear(CpuIsa isa, const float* x, int64_t m, int64_t k, const void* w, DType w_dtype,
                     int64_t n, float* y) {
  if (m <= 0 || n <= 0) return;
  ili::TileFn tile = isa == CpuIsa::kAvx512 ? ili::Avx512Tile(w_dtype)
                     : isa == CpuIsa::kAvx2 ? ili::Avx2Tile(w_dtype)
                                            : ili::PortableTile(w_dtype);
  // Tiles: 64 rows of x by as many weight rows as fit in ~256 KiB (within a core's L2), so the
  // weights are read from memory once per 64 rows and from cache for each block of rows in them.
  // The split changes which thread computes an element, never how.
  constexpr int64_t kTileRows = 64;
  constexpr int64_t kTileWeightBytes = int64_t{256} << 10;
  const int64_t row_bytes = std::max<int64_t>(1, k * static_cast<int64_t>(DTypeSize(w_dtype)));
  const int64_t tile_cols = std::clamp<int64_t>(kTileWeightBytes / row_bytes / 4 * 4, 4, 256);
  const int64_t tiles_m = (m + kTileRows - 1) / kTileRows;
  const int64_t tiles_n = (n + tile_cols - 1) / tile_cols;
  const int64_t tiles = tiles_m * tiles_n;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t m0 = t / tiles_n * kTileRows;
    const int64_t n0 = t % tiles_n * tile_cols;
    tile(x, m0, std::min(m, m0 + kTileRows), k, w, n0, std::min(n, n0 + tile_cols), y, n);
  }
}

}  // namespace moebatch
