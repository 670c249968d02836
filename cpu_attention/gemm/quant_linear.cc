// QuantLinear's checks, activation quantization, dispatch and work split (quant_linear.h). Compiled
// for baseline x86-64; the per-ISA files hold the kernels.
#include "cpu_attention/gemm/quant_linear.h"

#include <emmintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cpu_attention/gemm/quant_linear_internal.h"

namespace moebatch {

namespace qli = quant_linear_internal;

namespace {

bool CpuHasAvx512Vnni() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return has;
#else
  return false;
#endif
}

bool IsaSupported(CpuIsa isa) {
  static const std::vector<CpuIsa> supported = SupportedCpuIsas();
  return std::find(supported.begin(), supported.end(), isa) != supported.end();
}

// kAvx512 without VNNI runs the AVX2 kernels (same bits).
qli::Kernel KernelFor(CpuIsa isa, GgmlType type) {
  switch (isa) {
    case CpuIsa::kAvx512:
      if (CpuHasAvx512Vnni()) return qli::Avx512VnniKernel(type);
      return qli::Avx2Kernel(type);
    case CpuIsa::kAvx2:
      return qli::Avx2Kernel(type);
    case CpuIsa::kPortable:
      break;
  }
  return qli::PortableKernel(type);
}

std::string TypeName(GgmlType type) {
  const std::optional<GgmlTypeTraits> traits = GgmlTypeInfo(static_cast<uint32_t>(type));
  if (traits) return traits->name;
  return absl::StrCat("unknown (", static_cast<uint32_t>(type), ")");
}

// Round to nearest, ties to even (the SSE conversion in the default rounding mode).
int RoundToInt(float v) { return _mm_cvtss_si32(_mm_set_ss(v)); }

// One row of x (k = blocks · 32 floats) to int8 blocks, into the records x[g · stride], g < groups
// (qli::QuantizedRows's layout), padded with zero blocks: d = amax / 127, q = round(x · (1 / d)),
// |q| <= 127 (ggml's quantize_row_q8_0, rounding half to even).
void QuantizeRow(const float* x, int64_t blocks, int64_t groups, int bias, qli::XGroup* out,
                 int64_t stride) {
  for (int64_t g = 0; g < groups; ++g) {
    qli::XGroup& rec = out[g * stride];
    for (int64_t i = 0; i < qli::kGroupBlocks; ++i) {
      const int64_t b = g * qli::kGroupBlocks + i;
      int8_t* qb = rec.q + i * qli::kBlock;
      if (b >= blocks) {
        std::fill(qb, qb + qli::kBlock, int8_t{0});
        std::fill(rec.d8 + i * 8, rec.d8 + i * 8 + 8, 0.0f);
        std::fill(rec.corr + i * 8, rec.corr + i * 8 + 8, 0);
        rec.s[i] = 0.0f;
        continue;
      }
      const float* xb = x + b * qli::kBlock;
      float amax = 0.0f;
      for (int e = 0; e < qli::kBlock; ++e) amax = std::max(amax, std::fabs(xb[e]));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      int sum = 0;
      for (int e = 0; e < qli::kBlock; ++e) {
        const int v = std::clamp(RoundToInt(xb[e] * id), -127, 127);
        qb[e] = static_cast<int8_t>(v);
        sum += v;
      }
      std::fill(rec.d8 + i * 8, rec.d8 + i * 8 + 8, d);
      rec.s[i] = d * static_cast<float>(sum);
      for (int l = 0; l < 8; ++l) {
        rec.corr[i * 8 + l] = -bias * (qb[4 * l] + qb[4 * l + 1] + qb[4 * l + 2] + qb[4 * l + 3]);
      }
    }
  }
}

qli::QuantizedRows QuantizeRows(const float* x, int64_t m, int64_t k, int bias,
                                std::vector<qli::XGroup>* scratch) {
  qli::QuantizedRows xq;
  xq.blocks = k / qli::kBlock;
  xq.groups = (xq.blocks + qli::kGroupBlocks - 1) / qli::kGroupBlocks;
  xq.rows = m;
  scratch->resize(static_cast<size_t>(xq.groups * m));
  qli::XGroup* out = scratch->data();
#pragma omp parallel for schedule(static) if (m * k >= (int64_t{1} << 16))
  for (int64_t r = 0; r < m; ++r) {
    QuantizeRow(x + r * k, xq.blocks, xq.groups, bias, out + r, m);
  }
  xq.x = out;
  return xq;
}

}  // namespace

bool QuantLinearSupports(GgmlType type) { return IsComputedBlockType(type); }

absl::Status QuantLinear(CpuIsa isa, const float* x, int64_t m, int64_t k, const std::byte* w,
                         GgmlType type, int64_t n, float* y) {
  if (!QuantLinearSupports(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantLinear: weights of ggml type ", TypeName(type),
                     " are not supported (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K and "
                     "MXFP4 are)"));
  }
  const GgmlTypeTraits traits = *GgmlTypeInfo(static_cast<uint32_t>(type));
  if (m < 0 || k < 0 || n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("QuantLinear: negative size (m ", m, ", k ", k,
                                                   ", n ", n, ") for ", traits.name, " weights"));
  }
  if (k % traits.block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("QuantLinear: k = ", k,
                                                   " is not a multiple of the block size of ",
                                                   traits.name, " (", traits.block_size, ")"));
  }
  if (!IsaSupported(isa)) {
    return absl::InvalidArgumentError(absl::StrCat("QuantLinear: ISA level ", CpuIsaName(isa),
                                                   " is not supported by this CPU (", traits.name,
                                                   " weights)"));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  if (y == nullptr || (k > 0 && (x == nullptr || w == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("QuantLinear: null x, w or y with m ", m, ", k ",
                                                   k, ", n ", n, " (", traits.name, " weights)"));
  }
  if (k == 0) {
    std::fill(y, y + m * n, 0.0f);
    return absl::OkStatus();
  }
  const qli::Kernel kernel = KernelFor(isa, type);
  if (kernel.tile == nullptr) {
    return absl::InternalError(
        absl::StrCat("QuantLinear: no ", CpuIsaName(isa), " kernel for ", traits.name));
  }
  thread_local std::vector<qli::XGroup> scratch;  // the calling thread's, grown to the largest call
  const qli::QuantizedRows xq = QuantizeRows(x, m, k, kernel.bias, &scratch);
  const int64_t row_bytes = k / traits.block_size * traits.type_size;

  // Tiles. Decode-sized m: all rows, and weight-row tiles small enough that each thread takes
  // about 8 of them (dynamic scheduling evens out the threads; each tile streams contiguous weight
  // rows). Larger m: 64 rows by as many weight rows as fit, unpacked, in ~256 KiB (within a core's
  // L2). Tiles sharing weight rows are adjacent in the order, so concurrent threads read the same
  // packed weights. The split changes which thread computes an element, never how.
  const int64_t threads = std::max(1, omp_get_max_threads());
  int64_t tile_m, tile_n;
  if (m <= qli::kStreamRows) {
    tile_m = m;
    tile_n = std::clamp<int64_t>((n + threads * 8 - 1) / (threads * 8), 4, 512);
  } else {
    constexpr int64_t kUnpackedTileBytes = int64_t{256} << 10;
    tile_m = 64;
    tile_n =
        std::clamp<int64_t>(kUnpackedTileBytes / (xq.groups * kernel.decoded_group_bytes), 4, 512);
  }
  const int64_t tiles_m = (m + tile_m - 1) / tile_m;
  const int64_t tiles_n = (n + tile_n - 1) / tile_n;
  const int64_t tiles = tiles_m * tiles_n;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t m0 = t % tiles_m * tile_m;
    const int64_t n0 = t / tiles_m * tile_n;
    kernel.tile(xq, m0, std::min(m, m0 + tile_m), w, row_bytes, n0, std::min(n, n0 + tile_n), y, n);
  }
  return absl::OkStatus();
}

}  // namespace moebatch
