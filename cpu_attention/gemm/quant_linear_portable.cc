// QuantLinear's kernels in plain C++: the lane-exact model of quant_linear.h's two schemes (types
// of 32-blocks: 16 + 8 scalar partial sums; K-quants: 8 + 4; std::fma, the same reduction trees)
// that the AVX2 and AVX-512 kernels equal bit for bit, and the level for CPUs without AVX2. Weights
// are unpacked to their signed values w (no bias), so the integer lanes are Σ w·q directly.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu_attention/gemm/quant_linear_internal.h"
#include "engine/model/dtype.h"

namespace moebatch {
namespace quant_linear_internal {
namespace {

// A group of 8 blocks: signed weights, the scale of each lane of 4, and c per block.
struct DG {
  int8_t w[kGroupBlocks][kBlock];
  float scale[kGroupBlocks][8];
  float c[kGroupBlocks];
};

struct Acc {
  float a[16];  // step 2
  float e[8];   // step 3
};

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

// ggml's get_scale_min_k4: the j-th 6-bit scale and min of a Q4_K / Q5_K super-block.
void ScaleMinK4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// GGML_E8M0_TO_FP32_HALF: 2^(e - 128).
float E8M0Half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ggml's kvalues_mxfp4: the FP4 (E2M1) values, doubled.
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Per type: kBytes (of a 32-block) or kGroupBytes (of a 256 super-block), kHasC, and the unpacking
// of one 32-block (Block) or of a super-block (Super).
template <GgmlType T>
struct Type;

// The low nibbles of 16 bytes are elements 0..15, the high nibbles 16..31.
inline void Nibbles(const uint8_t* qs, int* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0x0F;
    q[j + 16] = qs[j] >> 4;
  }
}

// Bit e of the 32 bits at p (Q5_0 / Q5_1 qh) as 16 on element e.
inline void AddFifthBits(const uint8_t* p, int* q) {
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  for (int e = 0; e < 32; ++e) q[e] |= ((qh >> e) & 1) << 4;
}

template <>
struct Type<GgmlType::kQ4_0> {
  static constexpr int64_t kBytes = 18;
  static constexpr bool kHasC = false;
  static void Block(const uint8_t* b, int8_t* w, float* scale, float* c) {
    int q[32];
    Nibbles(b + 2, q);
    for (int e = 0; e < 32; ++e) w[e] = static_cast<int8_t>(q[e] - 8);
    *scale = Half(b);
  }
};

template <>
struct Type<GgmlType::kQ4_1> {
  static constexpr int64_t kBytes = 20;
  static constexpr bool kHasC = true;
  static void Block(const uint8_t* b, int8_t* w, float* scale, float* c) {
    int q[32];
    Nibbles(b + 4, q);
    for (int e = 0; e < 32; ++e) w[e] = static_cast<int8_t>(q[e]);
    *scale = Half(b);
    *c = Half(b + 2);
  }
};

template <>
struct Type<GgmlType::kQ5_0> {
  static constexpr int64_t kBytes = 22;
  static constexpr bool kHasC = false;
  static void Block(const uint8_t* b, int8_t* w, float* scale, float* c) {
    int q[32];
    Nibbles(b + 6, q);
    AddFifthBits(b + 2, q);
    for (int e = 0; e < 32; ++e) w[e] = static_cast<int8_t>(q[e] - 16);
    *scale = Half(b);
  }
};

template <>
struct Type<GgmlType::kQ5_1> {
  static constexpr int64_t kBytes = 24;
  static constexpr bool kHasC = true;
  static void Block(const uint8_t* b, int8_t* w, float* scale, float* c) {
    int q[32];
    Nibbles(b + 8, q);
    AddFifthBits(b + 4, q);
    for (int e = 0; e < 32; ++e) w[e] = static_cast<int8_t>(q[e]);
    *scale = Half(b);
    *c = Half(b + 2);
  }
};

template <>
struct Type<GgmlType::kQ8_0> {
  static constexpr int64_t kBytes = 34;
  static constexpr bool kHasC = false;
  static void Block(const uint8_t* b, int8_t* w, float* scale, float* c) {
    std::memcpy(w, b + 2, 32);
    *scale = Half(b);
  }
};

template <>
struct Type<GgmlType::kMXFP4> {
  static constexpr int64_t kBytes = 17;
  static constexpr bool kHasC = false;
  static void Block(const uint8_t* b, int8_t* w, float* scale, float* c) {
    int q[32];
    Nibbles(b + 1, q);
    for (int e = 0; e < 32; ++e) w[e] = kMxfp4Values[q[e]];
    *scale = E8M0Half(b[0]);
  }
};

// A K-quant super-block unpacked: signed weights (natural block order), the integer scale of each
// 16 elements, the mins (Q4_K / Q5_K) and the two f16 factors.
struct DGK {
  int8_t w[kGroupBlocks][kBlock];
  int16_t sc[kGroupBlocks][2];
  int16_t m[kGroupBlocks];
  float d, dmin;
};

struct AccK {
  float a[8];  // per lane of 4 elements
  float e[4];  // the mins, per pair of blocks
};

template <>
struct Type<GgmlType::kQ4_K> {  // {f16 d, dmin; u8 scales[12]; u8 qs[128]}
  static constexpr int64_t kGroupBytes = 144;
  static constexpr bool kHasC = true;
  static void Super(const uint8_t* b, DGK* dg) {
    dg->d = Half(b);
    dg->dmin = Half(b + 2);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      ScaleMinK4(j, b + 4, &sc, &m);
      dg->sc[j][0] = dg->sc[j][1] = static_cast<int16_t>(sc);
      dg->m[j] = static_cast<int16_t>(m);
      const uint8_t* qs = b + 16 + 32 * (j / 2);  // block 2i: low nibbles, 2i + 1: high
      for (int e = 0; e < 32; ++e)
        dg->w[j][e] = static_cast<int8_t>(j % 2 ? qs[e] >> 4 : qs[e] & 0xF);
    }
  }
};

template <>
struct Type<GgmlType::kQ5_K> {  // {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
  static constexpr int64_t kGroupBytes = 176;
  static constexpr bool kHasC = true;
  static void Super(const uint8_t* b, DGK* dg) {
    dg->d = Half(b);
    dg->dmin = Half(b + 2);
    const uint8_t* qh = b + 16;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      ScaleMinK4(j, b + 4, &sc, &m);
      dg->sc[j][0] = dg->sc[j][1] = static_cast<int16_t>(sc);
      dg->m[j] = static_cast<int16_t>(m);
      const uint8_t* qs = b + 48 + 32 * (j / 2);
      for (int e = 0; e < 32; ++e) {
        const int low = j % 2 ? qs[e] >> 4 : qs[e] & 0xF;
        dg->w[j][e] = static_cast<int8_t>(low | (((qh[e] >> j) & 1) << 4));
      }
    }
  }
};

template <>
struct Type<GgmlType::kQ6_K> {  // {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
  static constexpr int64_t kGroupBytes = 210;
  static constexpr bool kHasC = false;
  static void Super(const uint8_t* b, DGK* dg) {
    dg->d = Half(b + 208);
    dg->dmin = 0.0f;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int j = 0; j < 8; ++j) {
      // Block j = 4h + i of half h: ql[64h + 32(i % 2) + e] (low nibble for i < 2, high after),
      // bits 2i, 2i + 1 of qh[32h + e].
      const int h = j / 4, i = j % 4;
      const uint8_t* ql = b + 64 * h + 32 * (i % 2);
      const uint8_t* qh = b + 128 + 32 * h;
      for (int e = 0; e < 32; ++e) {
        const int low = i < 2 ? ql[e] & 0xF : ql[e] >> 4;
        dg->w[j][e] = static_cast<int8_t>((low | (((qh[e] >> (2 * i)) & 3) << 4)) - 32);
      }
      dg->sc[j][0] = sc[2 * j];
      dg->sc[j][1] = sc[2 * j + 1];
      dg->m[j] = 0;
    }
  }
};

template <GgmlType T, class = void>
struct IsSuper : std::false_type {};
template <GgmlType T>
struct IsSuper<T, std::void_t<decltype(Type<T>::kGroupBytes)>> : std::true_type {};

float Tree(float* lanes, int n) {
  for (int s = n / 2; s >= 1; s >>= 1) {
    for (int i = 0; i < s; ++i) lanes[i] += lanes[i + s];
  }
  return lanes[0];
}

template <GgmlType T>
struct Policy {
  using DG = quant_linear_internal::DG;
  using Acc = quant_linear_internal::Acc;
  static constexpr int kMR = 4;
  static constexpr int kBias = 0;  // the weights are unpacked signed
  static constexpr int64_t kGroupBytes = kGroupBlocks * Type<T>::kBytes;
  static constexpr bool kHasC = Type<T>::kHasC;

  static void Decode(const uint8_t* row, int64_t g, int nblk, DG* dg) {
    const uint8_t* b = row + g * kGroupBlocks * Type<T>::kBytes;
    for (int i = 0; i < kGroupBlocks; ++i) {
      float scale = 0.0f, c = 0.0f;
      if (i < nblk) {
        Type<T>::Block(b + i * Type<T>::kBytes, dg->w[i], &scale, &c);
      } else {
        std::memset(dg->w[i], 0, kBlock);
      }
      for (float& s : dg->scale[i]) s = scale;
      dg->c[i] = c;
    }
  }

  static Acc Zero() { return Acc{}; }

  template <bool kFull, int MR>
  static void Accumulate(Acc* acc, const DG& dg, int nblk, const XRow* x) {
    RowAfterRow<Policy, kFull, MR>(acc, dg, nblk, x);
  }

  template <bool kFull>
  static void AccumulateRow(Acc* acc, const DG& dg, int nblk, const XRow& x) {
    for (int i = 0; i < nblk; ++i) {
      const int8_t* q = x.q + i * kBlock;
      const float d = x.d8[i * 8];
      float* a = acc->a + 8 * (i % 2);  // blocks alternate between the two halves
      for (int l = 0; l < 8; ++l) {
        int32_t p = 0;  // step 1: the integer lane (elements 4l..4l+3)
        for (int e = 4 * l; e < 4 * l + 4; ++e) p += dg.w[i][e] * q[e];
        const float s = dg.scale[i][l] * d;  // rounded to float before the fma
        a[l] = std::fma(s, static_cast<float>(p), a[l]);
      }
    }
    if constexpr (kHasC) {
      for (int i = 0; i < nblk; ++i) acc->e[i] = std::fma(dg.c[i], x.s[i], acc->e[i]);
    }
  }

  static float Finish(const Acc& acc) {
    Acc t = acc;
    const float a = Tree(t.a, 16);
    if constexpr (kHasC) return a + Tree(t.e, 8);
    return a;
  }
};

// The K-quant types (quant_linear.h, "K-quants"): activations per super-block, integer scales.
template <GgmlType T>
struct PolicyK {
  static constexpr bool kSuperblock = true;
  using DG = DGK;
  using Acc = AccK;
  static constexpr int kMR = 4;
  static constexpr int kBias = 0;
  static constexpr int64_t kGroupBytes = Type<T>::kGroupBytes;
  static constexpr bool kHasC = Type<T>::kHasC;

  static void Decode(const uint8_t* row, int64_t g, int /*nblk*/, DG* dg) {
    Type<T>::Super(row + g * kGroupBytes, dg);
  }

  static Acc Zero() { return Acc{}; }

  template <bool kFull, int MR>
  static void Accumulate(Acc* acc, const DG& dg, int nblk, const XRow* x) {
    RowAfterRow<PolicyK, kFull, MR>(acc, dg, nblk, x);
  }

  template <bool kFull>
  static void AccumulateRow(Acc* acc, const DG& dg, int /*nblk*/, const XRow& x) {
    int32_t lane[8] = {};  // step 1: exact integers
    for (int b = 0; b < kGroupBlocks; ++b) {
      const int8_t* q = x.q + KSlot(false, b) * kBlock;
      for (int l = 0; l < 8; ++l) {
        int32_t p = 0;
        for (int e = 4 * l; e < 4 * l + 4; ++e) p += dg.w[b][e] * q[e];
        lane[l] += dg.sc[b][l / 4] * p;
      }
    }
    const float dd = dg.d * x.dx;  // rounded to float before the fma
    for (int l = 0; l < 8; ++l) acc->a[l] = std::fma(dd, static_cast<float>(lane[l]), acc->a[l]);
    if constexpr (kHasC) {
      const float em = dg.dmin * x.dx;
      for (int j = 0; j < 4; ++j) {
        const int32_t mins = dg.m[2 * j] * x.bsum[2 * j] + dg.m[2 * j + 1] * x.bsum[2 * j + 1];
        acc->e[j] = std::fma(em, static_cast<float>(mins), acc->e[j]);
      }
    }
  }

  static float Finish(const Acc& acc) {
    Acc t = acc;
    const float a = Tree(t.a, 8);
    if constexpr (kHasC) return a - Tree(t.e, 4);
    return a;
  }
};

template <GgmlType T>
Kernel KernelOf() {
  if constexpr (IsSuper<T>::value) {
    Kernel k{Tile<PolicyK<T>>, 0, static_cast<int64_t>(sizeof(DGK))};
    k.superblock = true;
    return k;
  } else {
    return Kernel{Tile<Policy<T>>, 0, static_cast<int64_t>(sizeof(DG))};
  }
}

}  // namespace

Kernel PortableKernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return KernelOf<GgmlType::kQ4_0>();
    case GgmlType::kQ4_1:
      return KernelOf<GgmlType::kQ4_1>();
    case GgmlType::kQ5_0:
      return KernelOf<GgmlType::kQ5_0>();
    case GgmlType::kQ5_1:
      return KernelOf<GgmlType::kQ5_1>();
    case GgmlType::kQ8_0:
      return KernelOf<GgmlType::kQ8_0>();
    case GgmlType::kQ4_K:
      return KernelOf<GgmlType::kQ4_K>();
    case GgmlType::kQ5_K:
      return KernelOf<GgmlType::kQ5_K>();
    case GgmlType::kQ6_K:
      return KernelOf<GgmlType::kQ6_K>();
    case GgmlType::kMXFP4:
      return KernelOf<GgmlType::kMXFP4>();
    default:
      return Kernel{};
  }
}

void PortableWidenMxfp4Row(const std::byte* row, int64_t k, float* dst) {
  const auto* b = reinterpret_cast<const uint8_t*>(row);
  for (int64_t i = 0; i < k; i += kBlock, b += 17, dst += kBlock) {
    const float d = E8M0Half(b[0]);
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>(kMxfp4Values[b[1 + j] & 0x0F]) * d;
      dst[j + 16] = static_cast<float>(kMxfp4Values[b[1 + j] >> 4]) * d;
    }
  }
}

}  // namespace quant_linear_internal
}  // namespace moebatch
