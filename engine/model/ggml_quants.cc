#include "engine/model/ggml_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/model/dtype.h"

namespace moebatch {
namespace {

constexpr int kQK = 32;     // elements of a Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / MXFP4 block
constexpr int kQK_K = 256;  // elements of a K-quant super-block

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

void Q4_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = (qs[j] & 0x0F) - 8;
    const int x1 = (qs[j] >> 4) - 8;
    y[j] = x0 * d;
    y[j + kQK / 2] = x1 * d;
  }
}

void Q4_1(const uint8_t* b, float* y) {
  const float d = Half(b), m = Half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = qs[j] & 0x0F;
    const int x1 = qs[j] >> 4;
    y[j] = x0 * d + m;
    y[j + kQK / 2] = x1 * d + m;
  }
}

void Q5_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < kQK / 2; ++j) {
    const uint8_t xh0 = ((qh >> (j + 0)) << 4) & 0x10;
    const uint8_t xh1 = ((qh >> (j + 12))) & 0x10;
    const int x0 = ((qs[j] & 0x0F) | xh0) - 16;
    const int x1 = ((qs[j] >> 4) | xh1) - 16;
    y[j] = x0 * d;
    y[j + kQK / 2] = x1 * d;
  }
}

void Q5_1(const uint8_t* b, float* y) {
  const float d = Half(b), m = Half(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < kQK / 2; ++j) {
    const uint8_t xh0 = ((qh >> (j + 0)) << 4) & 0x10;
    const uint8_t xh1 = ((qh >> (j + 12))) & 0x10;
    const int x0 = (qs[j] & 0x0F) | xh0;
    const int x1 = (qs[j] >> 4) | xh1;
    y[j] = x0 * d + m;
    y[j + kQK / 2] = x1 * d + m;
  }
}

void Q8_0(const uint8_t* b, float* y) {
  const float d = Half(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < kQK; ++j) y[j] = qs[j] * d;
}

// ggml-quants.c's get_scale_min_k4: the j-th 6-bit scale and min of a Q4_K / Q5_K block.
void ScaleMinK4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

void Q4_K(const uint8_t* b, float* y) {
  const float d = Half(b), min = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  int is = 0;
  uint8_t sc, m;
  for (int j = 0; j < kQK_K; j += 64) {
    ScaleMinK4(is + 0, scales, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    ScaleMinK4(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

void Q5_K(const uint8_t* b, float* y) {
  const float d = Half(b), min = Half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  int is = 0;
  uint8_t sc, m;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < kQK_K; j += 64) {
    ScaleMinK4(is + 0, scales, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    ScaleMinK4(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    ql += 32;
    is += 2;
    u1 <<= 2;
    u2 <<= 2;
  }
}

void Q6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  for (int n = 0; n < kQK_K; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l + 0] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// ggml's kvalues_mxfp4: the FP4 (E2M1) values, doubled.
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// GGML_E8M0_TO_FP32_HALF: 2^(e - 128) (half the E8M0 scale 2^(e - 127), for the doubled values).
float E8M0Half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void Mxfp4(const uint8_t* b, float* y) {
  const float d = E8M0Half(b[0]);
  const uint8_t* qs = b + 1;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = kMxfp4Values[qs[j] & 0x0F] * d;
    y[j + kQK / 2] = kMxfp4Values[qs[j] >> 4] * d;
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn BlockDecoder(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return Q4_0;
    case GgmlType::kQ4_1:
      return Q4_1;
    case GgmlType::kQ5_0:
      return Q5_0;
    case GgmlType::kQ5_1:
      return Q5_1;
    case GgmlType::kQ8_0:
      return Q8_0;
    case GgmlType::kQ4_K:
      return Q4_K;
    case GgmlType::kQ5_K:
      return Q5_K;
    case GgmlType::kQ6_K:
      return Q6_K;
    case GgmlType::kMXFP4:
      return Mxfp4;
    default:
      return nullptr;
  }
}

}  // namespace

bool CanDequantize(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16 ||
         BlockDecoder(type) != nullptr;
}

absl::Status DequantizeRow(GgmlType type, const std::byte* src, int64_t n, float* dst) {
  const std::optional<GgmlTypeTraits> traits = GgmlTypeInfo(static_cast<uint32_t>(type));
  if (!traits || !CanDequantize(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DequantizeRow: ggml type ", traits ? traits->name : "unknown", " (",
                     static_cast<uint32_t>(type), ") is not decoded"));
  }
  if (n < 0 || n % traits->block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("DequantizeRow: ", n, " elements of ",
                                                   traits->name, " (blocks of ", traits->block_size,
                                                   ")"));
  }
  if (n == 0) return absl::OkStatus();
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return absl::OkStatus();
    case GgmlType::kF16:
      ConvertToF32(DType::kF16, src, dst, static_cast<size_t>(n));
      return absl::OkStatus();
    case GgmlType::kBF16:
      ConvertToF32(DType::kBF16, src, dst, static_cast<size_t>(n));
      return absl::OkStatus();
    default:
      break;
  }
  const BlockFn decode = BlockDecoder(type);
  const auto* b = reinterpret_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / traits->block_size; ++i) {
    decode(b + i * traits->type_size, dst + i * traits->block_size);
  }
  return absl::OkStatus();
}

absl::Status QuantizeRow(GgmlType type, const float* src, int64_t n, int64_t group_size,
                         std::byte* dst) {
  if (type != GgmlType::kQ8_0 && type != GgmlType::kQ4_1) {
    return absl::InvalidArgumentError(absl::StrCat("QuantizeRow: type ", GgmlTypeInfoOf(type).name,
                                                   " (only Q8_0 and Q4_1 are made at load)"));
  }
  if (n % kQK != 0 || group_size <= 0 || group_size % kQK != 0) {
    return absl::InvalidArgumentError(absl::StrCat("QuantizeRow: ", n, " elements in groups of ",
                                                   group_size, " (both must be multiples of 32)"));
  }
  auto* out = reinterpret_cast<uint8_t*>(dst);
  for (int64_t g0 = 0; g0 < n; g0 += group_size) {
    const int64_t g1 = std::min(n, g0 + group_size);
    if (type == GgmlType::kQ8_0) {
      float amax = 0.0f;
      for (int64_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(src[i]));
      const float d = amax / ((1 << 7) - 1);
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const uint16_t dh = F32ToF16(d);
      for (int64_t b = g0; b < g1; b += kQK) {
        uint8_t* block = out + b / kQK * 34;
        std::memcpy(block, &dh, 2);
        for (int j = 0; j < kQK; ++j) {
          block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(src[b + j] * id)));
        }
      }
    } else {
      float lo = std::numeric_limits<float>::max(), hi = -std::numeric_limits<float>::max();
      for (int64_t i = g0; i < g1; ++i) {
        lo = std::min(lo, src[i]);
        hi = std::max(hi, src[i]);
      }
      const float d = (hi - lo) / ((1 << 4) - 1);
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const uint16_t dh = F32ToF16(d), mh = F32ToF16(lo);
      for (int64_t b = g0; b < g1; b += kQK) {
        uint8_t* block = out + b / kQK * 20;
        std::memcpy(block, &dh, 2);
        std::memcpy(block + 2, &mh, 2);
        for (int j = 0; j < kQK / 2; ++j) {
          const float x0 = (src[b + j] - lo) * id;
          const float x1 = (src[b + kQK / 2 + j] - lo) * id;
          const uint8_t q0 = std::min<int>(15, static_cast<int8_t>(x0 + 0.5f));
          const uint8_t q1 = std::min<int>(15, static_cast<int8_t>(x1 + 0.5f));
          block[4 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace moebatch
