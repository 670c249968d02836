// QuantLinear's checks, activation quantization, dispatch and work split (quant_linear.h). Compiled
// for baseline x86-64; the per-ISA files hold the kernels.
#include "cpu_attention/gemm/quant_linear.h"

#include <emmintrin.h>
#include <omp.h>
#include <unistd.h>

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

// One block of 32 floats at x to int8 (ggml's quantize_row_q8_0, rounding half to even): d = amax /
// 127, q = x · (1 / d) rounded to nearest even (the SSE conversion in the current rounding mode,
// by default that one), clamped to [-127, 127] (a no-op for finite x); into block i of rec. SSE2
// (baseline x86-64) only: every ISA's kernels read the same bytes.
void QuantizeBlock(const float* x, int bias, int i, qli::XGroup* rec) {
  __m128 v[8];
  __m128 amax = _mm_setzero_ps();
  for (int j = 0; j < 8; ++j) {
    v[j] = _mm_loadu_ps(x + 4 * j);
    amax = _mm_max_ps(amax, _mm_andnot_ps(_mm_set1_ps(-0.0f), v[j]));
  }
  amax = _mm_max_ps(amax, _mm_shuffle_ps(amax, amax, _MM_SHUFFLE(1, 0, 3, 2)));
  amax = _mm_max_ps(amax, _mm_shuffle_ps(amax, amax, _MM_SHUFFLE(2, 3, 0, 1)));
  const float d = _mm_cvtss_f32(amax) / 127.0f;
  const __m128 id = _mm_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
  // Pairs of 4-element lanes as int16 (saturated, then clamped), their lane sums, then int8.
  __m128i h[4];
  int32_t lane[8];
  for (int j = 0; j < 4; ++j) {
    h[j] = _mm_packs_epi32(_mm_cvtps_epi32(_mm_mul_ps(v[2 * j], id)),
                           _mm_cvtps_epi32(_mm_mul_ps(v[2 * j + 1], id)));
    h[j] = _mm_min_epi16(_mm_max_epi16(h[j], _mm_set1_epi16(-127)), _mm_set1_epi16(127));
    const __m128i pairs = _mm_madd_epi16(h[j], _mm_set1_epi16(1));  // e0+e1, e2+e3, e4+e5, e6+e7
    const __m128i sums = _mm_add_epi32(pairs, _mm_shuffle_epi32(pairs, _MM_SHUFFLE(2, 3, 0, 1)));
    lane[2 * j] = _mm_cvtsi128_si32(sums);
    lane[2 * j + 1] = _mm_cvtsi128_si32(_mm_srli_si128(sums, 8));
  }
  int8_t* q = rec->q + i * qli::kBlock;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(h[0], h[1]));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm_packs_epi16(h[2], h[3]));
  int sum = 0;
  for (int l = 0; l < 8; ++l) {
    rec->corr[i * 8 + l] = -bias * lane[l];
    sum += lane[l];
  }
  _mm_storeu_ps(rec->d8 + i * 8, _mm_set1_ps(d));
  _mm_storeu_ps(rec->d8 + i * 8 + 4, _mm_set1_ps(d));
  rec->s[i] = d * static_cast<float>(sum);
}

// One row of x (k = blocks · 32 floats) into the records x[g · stride], g < groups
// (qli::QuantizedRows's layout), padded with zero blocks.
void QuantizeRow(const float* x, int64_t blocks, int64_t groups, int bias, qli::XGroup* out,
                 int64_t stride) {
  for (int64_t g = 0; g < groups; ++g) {
    qli::XGroup& rec = out[g * stride];
    for (int i = 0; i < qli::kGroupBlocks; ++i) {
      const int64_t b = g * qli::kGroupBlocks + i;
      if (b < blocks) {
        QuantizeBlock(x + b * qli::kBlock, bias, i, &rec);
        continue;
      }
      std::fill(rec.q + i * qli::kBlock, rec.q + (i + 1) * qli::kBlock, int8_t{0});
      std::fill(rec.d8 + i * 8, rec.d8 + i * 8 + 8, 0.0f);
      std::fill(rec.corr + i * 8, rec.corr + i * 8 + 8, 0);
      rec.s[i] = 0.0f;
    }
  }
}

// One super-block of 256 floats at x to int8 as ggml's quantize_row_q8_K_ref: max is the element
// of largest |x| (the first of equals), iscale = -127 / max, q = min(127, nearest_int(iscale · x))
// (nearest_int rounds half to even, as the SSE conversion does in the default rounding mode),
// dx = 1 / iscale; all zero when x is. Block b's values go to slot KSlot(paired, b) of rec->q (as
// q + 128, unsigned bytes, with unsigned_q); bsum[b] = Σ of block b's q; with a bias and signed q,
// corr16[t] = -bias · (q[2t] + q[2t + 1]) over the stored q. SSE2 only, like QuantizeBlock.
void QuantizeSuperBlock(const float* x, int bias, bool paired, bool unsigned_q, qli::XGroup* rec) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < qli::kGroup; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  if (amax == 0.0f) {
    std::fill(rec->q, rec->q + qli::kGroup, unsigned_q ? int8_t{-128} : int8_t{0});
    std::fill(rec->bsum, rec->bsum + qli::kGroupBlocks, int16_t{0});
    std::fill(rec->corr16, rec->corr16 + qli::kGroup / 2, int16_t{0});
    rec->dx = 0.0f;
    return;
  }
  const float iscale = -127.0f / max;
  const __m128 is = _mm_set1_ps(iscale);
  for (int b = 0; b < qli::kGroupBlocks; ++b) {
    const float* xb = x + b * qli::kBlock;
    int8_t* q = rec->q + qli::KSlot(paired, b) * qli::kBlock;
    __m128i h[4];
    for (int j = 0; j < 4; ++j) {
      h[j] = _mm_packs_epi32(_mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(xb + 8 * j), is)),
                             _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(xb + 8 * j + 4), is)));
      h[j] = _mm_min_epi16(_mm_max_epi16(h[j], _mm_set1_epi16(-127)), _mm_set1_epi16(127));
    }
    const __m128i flip = _mm_set1_epi8(unsigned_q ? static_cast<char>(0x80) : 0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q),
                     _mm_xor_si128(_mm_packs_epi16(h[0], h[1]), flip));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16),
                     _mm_xor_si128(_mm_packs_epi16(h[2], h[3]), flip));
    __m128i sum = _mm_madd_epi16(
        _mm_add_epi16(_mm_add_epi16(h[0], h[1]), _mm_add_epi16(h[2], h[3])), _mm_set1_epi16(1));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(1, 0, 3, 2)));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(2, 3, 0, 1)));
    rec->bsum[b] = static_cast<int16_t>(_mm_cvtsi128_si32(sum));
  }
  if (bias != 0 && !unsigned_q) {
    for (int t = 0; t < qli::kGroup / 2; ++t) {
      rec->corr16[t] = static_cast<int16_t>(-bias * (rec->q[2 * t] + rec->q[2 * t + 1]));
    }
  }
  rec->dx = 1.0f / iscale;
}

// One row of x (k = groups · 256 floats) into the records x[g · stride] as K-quant activations.
void QuantizeRowK(const float* x, int64_t groups, int bias, bool paired, bool unsigned_q,
                  qli::XGroup* out, int64_t stride) {
  for (int64_t g = 0; g < groups; ++g) {
    QuantizeSuperBlock(x + g * qli::kGroup, bias, paired, unsigned_q, &out[g * stride]);
  }
}

// The bytes of unpacked weight rows a prefill-sized tile holds: 3/4 of a core's L2 (the rest for
// the slices of x in flight, the parked sums and y), at most 384 KiB. Each slice of x passes over
// all of the tile's weight rows, so the tile's width sets how often x is read from beyond L2: on
// Zen 3 (512 KiB L2), one thread's Q4_K / Q6_K GEMMs at m 2048 ran 0.90-1.45x as fast as with
// 256 KiB (bench_quant_linear, shapes 2048 x 5632 and 5632 x 2048, 2 alternated rounds: faster in 7
// of 8 pairs); larger L2s were not measured, hence the cap.
int64_t UnpackedTileBytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    constexpr int64_t kCap = int64_t{384} << 10;
    if (l2 <= 0) return kCap;
    return std::clamp<int64_t>(int64_t{l2} * 3 / 4, int64_t{128} << 10, kCap);
  }();
  return bytes;
}

qli::QuantizedRows QuantizeRows(const float* x, int64_t m, int64_t k, const qli::Kernel& kernel,
                                std::vector<qli::XGroup>* scratch) {
  const int bias = kernel.bias;
  qli::QuantizedRows xq;
  xq.blocks = k / qli::kBlock;
  xq.groups = (xq.blocks + qli::kGroupBlocks - 1) / qli::kGroupBlocks;
  xq.stride = qli::GroupStride(m);
  xq.unsigned_q = kernel.unsigned_prefill && m > qli::kStreamRows;
  scratch->resize(static_cast<size_t>(xq.groups * xq.stride));
  qli::XGroup* out = scratch->data();
#pragma omp parallel for schedule(static) if (m * k >= (int64_t{1} << 16))
  for (int64_t r = 0; r < m; ++r) {
    if (kernel.superblock) {
      QuantizeRowK(x + r * k, xq.groups, bias, kernel.paired_slots, xq.unsigned_q, out + r,
                   xq.stride);
    } else {
      QuantizeRow(x + r * k, xq.blocks, xq.groups, bias, out + r, xq.stride);
    }
  }
  xq.x = out;
  return xq;
}

}  // namespace

bool QuantLinearSupports(GgmlType type) { return IsComputedBlockType(type); }

bool QuantLinearUsesVnni(CpuIsa isa) { return isa == CpuIsa::kAvx512 && CpuHasAvx512Vnni(); }

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
  const qli::QuantizedRows xq = QuantizeRows(x, m, k, kernel, &scratch);
  const int64_t row_bytes = k / traits.block_size * traits.type_size;

  // Tiles. Decode-sized m: all rows, and weight-row tiles small enough that each thread takes
  // about 8 of them (dynamic scheduling evens out the threads; each tile streams contiguous weight
  // rows). Larger m: 64 rows by as many weight rows as fit, unpacked, in UnpackedTileBytes()
  // (within a core's L2). Tiles sharing weight rows are adjacent in the order, so concurrent
  // threads read the same packed weights. The split changes which thread computes an element, never
  // how.
  const int64_t threads = std::max(1, omp_get_max_threads());
  int64_t tile_m, tile_n;
  if (m <= qli::kStreamRows) {
    tile_m = m;
    tile_n = std::clamp<int64_t>((n + threads * 8 - 1) / (threads * 8), 4, 512);
  } else {
    tile_m = 64;
    tile_n =
        std::clamp<int64_t>(UnpackedTileBytes() / (xq.groups * kernel.decoded_group_bytes), 4, 512);
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
