// CUDA kernel of the quantized weights: ggml's block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
// Q5_K, Q6_K, MXFP4) decoded to the compute dtype on the GPU, so that a layer crosses PCIe in its
// blocks (a quarter to a half of its bf16 bytes) and its GEMMs stay cuBLAS's.
//
// Algorithm: one thread per run of 8 consecutive elements of the flat [rows, cols] tensor (a run
// never straddles a block: every block size is a multiple of 32, and within a K-quant sub-block of
// 16 or 32 elements). The thread reads its block's scale fields byte by byte (blocks of 18, 22, 34,
// 210 or 17 bytes leave them unaligned), decodes its 8 elements with the float operations of
// engine/model/ggml_quants.cc (ggml-quants.c's dequantize_row_<type>) in the same order, each
// product and sum rounded on its own (__fmul_rn / __fadd_rn / __fsub_rn: nvcc may not contract
// them into an FMA, so the f32 value is DequantizeRow's bit for bit), rounds it once to the output
// dtype and stores the run in 16-byte stores (one for bf16/f16, two for f32; a warp writes 512 or
// 1024 contiguous bytes). Grid-stride over the runs.
// Shapes: src rows * cols / block_size blocks, row after row (a row is cols / block_size blocks,
// no padding, as WeightStore and GGUF keep them); dst [rows, cols] dense, 16-byte aligned.
// Run: tests/cuda/test_backend_ops_quant.cc ("DequantizeRows") against DequantizeRow on random
// blocks of every type and output dtype (ctest -L gpu; -L emulated on the CUDA emulator).
#include "cuda/kernels_common.cuh"

namespace moebatch::gpu {
namespace {

constexpr int kRun = 8;  // elements per thread

// The ggml types decoded here: block size (elements) and type size (bytes), as GgmlTypeInfoOf.
struct QuantLayout {
  int block;
  int bytes;
};

__host__ __device__ constexpr QuantLayout LayoutOf(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0:
      return {32, 18};
    case GgmlType::kQ4_1:
      return {32, 20};
    case GgmlType::kQ5_0:
      return {32, 22};
    case GgmlType::kQ5_1:
      return {32, 24};
    case GgmlType::kQ8_0:
      return {32, 34};
    case GgmlType::kQ4_K:
      return {256, 144};
    case GgmlType::kQ5_K:
      return {256, 176};
    case GgmlType::kQ6_K:
      return {256, 210};
    case GgmlType::kMXFP4:
      return {32, 17};
    default:
      break;
  }
  return {0, 0};
}

// The f16 at p (little-endian, any alignment), widened exactly.
__device__ __forceinline__ float HalfAt(const uint8_t* p) {
  __half_raw raw;
  raw.x = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__half(raw));
}

// ggml-quants.c's get_scale_min_k4: the j-th 6-bit scale and min of a Q4_K / Q5_K block.
__device__ __forceinline__ void ScaleMinK4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

// GGML_E8M0_TO_FP32_HALF: 2^(e - 128).
__device__ __forceinline__ float E8M0Half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// Elements j0 .. j0 + 7 of block b (j0 a multiple of 8) into y, in DequantizeRow's float
// operations.
template <GgmlType kType>
__device__ __forceinline__ void DecodeRun(const uint8_t* b, int j0, float* y) {
  if constexpr (kType == GgmlType::kQ4_0 || kType == GgmlType::kQ4_1) {
    const bool has_min = kType == GgmlType::kQ4_1;
    const float d = HalfAt(b);
    const float m = has_min ? HalfAt(b + 2) : 0.0f;
    const uint8_t* qs = b + (has_min ? 4 : 2);
    for (int i = 0; i < kRun; ++i) {
      const int j = j0 + i;
      const int q = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
      y[i] = has_min ? __fadd_rn(__fmul_rn(static_cast<float>(q), d), m)
                     : __fmul_rn(static_cast<float>(q - 8), d);
    }
  } else if constexpr (kType == GgmlType::kQ5_0 || kType == GgmlType::kQ5_1) {
    const bool has_min = kType == GgmlType::kQ5_1;
    const float d = HalfAt(b);
    const float m = has_min ? HalfAt(b + 2) : 0.0f;
    const uint8_t* qh = b + (has_min ? 4 : 2);
    const uint32_t high =
        qh[0] | (qh[1] << 8) | (qh[2] << 16) | (static_cast<uint32_t>(qh[3]) << 24);
    const uint8_t* qs = qh + 4;
    for (int i = 0; i < kRun; ++i) {
      const int j = j0 + i;  // element j's fifth bit is bit j of qh
      const int low = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
      const int q = low | static_cast<int>(((high >> j) & 1u) << 4);
      y[i] = has_min ? __fadd_rn(__fmul_rn(static_cast<float>(q), d), m)
                     : __fmul_rn(static_cast<float>(q - 16), d);
    }
  } else if constexpr (kType == GgmlType::kQ8_0) {
    const float d = HalfAt(b);
    const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int i = 0; i < kRun; ++i) y[i] = __fmul_rn(static_cast<float>(qs[j0 + i]), d);
  } else if constexpr (kType == GgmlType::kQ4_K || kType == GgmlType::kQ5_K) {
    // 4 chunks of 64: the low nibbles of 32 bytes (sub-block 2c), then their high nibbles (2c + 1).
    const float d = HalfAt(b), dmin = HalfAt(b + 2);
    const uint8_t* scales = b + 4;
    const int chunk = j0 / 64, half = (j0 % 64) / 32, l0 = j0 % 32;
    int sc, mn;
    ScaleMinK4(2 * chunk + half, scales, &sc, &mn);
    const float d1 = __fmul_rn(d, static_cast<float>(sc));
    const float m1 = __fmul_rn(dmin, static_cast<float>(mn));
    const uint8_t* qs = b + (kType == GgmlType::kQ4_K ? 16 : 48) + 32 * chunk;
    for (int i = 0; i < kRun; ++i) {
      const int l = l0 + i;
      int q = half ? (qs[l] >> 4) : (qs[l] & 0xF);
      if constexpr (kType == GgmlType::kQ5_K) {
        const uint8_t* qh = b + 16;
        q += ((qh[l] >> (2 * chunk + half)) & 1) ? 16 : 0;
      }
      y[i] = __fsub_rn(__fmul_rn(d1, static_cast<float>(q)), m1);
    }
  } else if constexpr (kType == GgmlType::kQ6_K) {
    // 2 halves of 128, each 4 groups of 32: group g takes the low (g < 2) or high nibbles of
    // ql[l + 32 (g & 1)], bits 2g of qh[l] and the scale of its 16 elements.
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = HalfAt(b + 208);
    const int h = j0 / 128, g = (j0 % 128) / 32, l0 = j0 % 32;
    const float ds = __fmul_rn(d, static_cast<float>(sc[8 * h + l0 / 16 + 2 * g]));
    for (int i = 0; i < kRun; ++i) {
      const int l = l0 + i;
      const uint8_t lq = ql[64 * h + l + 32 * (g & 1)];
      const int low = (g >> 1) ? (lq >> 4) : (lq & 0xF);
      const int high = (qh[32 * h + l] >> (2 * g)) & 3;
      const int q = static_cast<int8_t>(low | (high << 4)) - 32;
      y[i] = __fmul_rn(ds, static_cast<float>(q));
    }
  } else {  // kMXFP4: FP4 (E2M1) values, doubled, times half the E8M0 scale
    constexpr int8_t kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const float d = E8M0Half(b[0]);
    const uint8_t* qs = b + 1;
    for (int i = 0; i < kRun; ++i) {
      const int j = j0 + i;
      const int q = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
      y[i] = __fmul_rn(static_cast<float>(kValues[q]), d);
    }
  }
}

// out[0..8) = y rounded to T, in 16-byte stores (out 16-byte aligned).
template <typename T>
__device__ __forceinline__ void StoreRun(T* out, const float* y) {
  constexpr int kPerStore = 16 / sizeof(T);
  for (int i0 = 0; i0 < kRun; i0 += kPerStore) {
    union {
      uint4 bits;
      T values[kPerStore];
    } pack;
    for (int i = 0; i < kPerStore; ++i) pack.values[i] = FromF32<T>(y[i0 + i]);
    *reinterpret_cast<uint4*>(out + i0) = pack.bits;
  }
}

template <GgmlType kType, typename T>
__global__ void __launch_bounds__(kElementwiseThreads)
    DequantizeKernel(const uint8_t* __restrict__ src, int64_t runs, T* __restrict__ dst) {
  constexpr QuantLayout kLayout = LayoutOf(kType);
  constexpr int kRunsPerBlock = kLayout.block / kRun;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < runs;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t block = r / kRunsPerBlock;
    const int j0 = static_cast<int>(r % kRunsPerBlock) * kRun;
    float y[kRun];
    DecodeRun<kType>(src + block * kLayout.bytes, j0, y);
    StoreRun(dst + r * kRun, y);
  }
}

template <GgmlType kType>
void LaunchDequantize(const void* src, int64_t runs, void* dst, GpuDType dtype,
                      cudaStream_t stream) {
  const unsigned blocks = ElementwiseBlocks(runs);
  Dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DequantizeKernel<kType, T><<<blocks, kElementwiseThreads, 0, stream>>>(
        static_cast<const uint8_t*>(src), runs, static_cast<T*>(dst));
  });
}

}  // namespace

bool GpuDequantizes(GgmlType type) { return LayoutOf(type).block > 0; }

absl::Status DequantizeRows(const void* src, GgmlType type, int64_t rows, int64_t cols, void* dst,
                            GpuDType dst_dtype, cudaStream_t stream) {
  constexpr const char* kFn = "DequantizeRows";
  const QuantLayout layout = LayoutOf(type);
  if (layout.block == 0) {
    return Invalid(kFn, "ggml type ", static_cast<uint32_t>(type), " is not decoded on the GPU");
  }
  if (auto st = CheckDType(kFn, "dst_dtype", dst_dtype); !st.ok()) return st;
  if (rows < 0 || cols < 1 || cols % layout.block != 0 || rows > (int64_t{1} << 62) / cols) {
    return Invalid(kFn, "bad sizes rows=", rows, " cols=", cols, " (cols a positive multiple of ",
                   layout.block, ")");
  }
  if (rows == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) return Invalid(kFn, "null pointer");
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0) return Invalid(kFn, "dst not 16-byte aligned");
  const int64_t runs = rows * cols / kRun;
  switch (type) {
    case GgmlType::kQ4_0:
      LaunchDequantize<GgmlType::kQ4_0>(src, runs, dst, dst_dtype, stream);
      break;
    case GgmlType::kQ4_1:
      LaunchDequantize<GgmlType::kQ4_1>(src, runs, dst, dst_dtype, stream);
      break;
    case GgmlType::kQ5_0:
      LaunchDequantize<GgmlType::kQ5_0>(src, runs, dst, dst_dtype, stream);
      break;
    case GgmlType::kQ5_1:
      LaunchDequantize<GgmlType::kQ5_1>(src, runs, dst, dst_dtype, stream);
      break;
    case GgmlType::kQ8_0:
      LaunchDequantize<GgmlType::kQ8_0>(src, runs, dst, dst_dtype, stream);
      break;
    case GgmlType::kQ4_K:
      LaunchDequantize<GgmlType::kQ4_K>(src, runs, dst, dst_dtype, stream);
      break;
    case GgmlType::kQ5_K:
      LaunchDequantize<GgmlType::kQ5_K>(src, runs, dst, dst_dtype, stream);
      break;
    case GgmlType::kQ6_K:
      LaunchDequantize<GgmlType::kQ6_K>(src, runs, dst, dst_dtype, stream);
      break;
    default:
      LaunchDequantize<GgmlType::kMXFP4>(src, runs, dst, dst_dtype, stream);
      break;
  }
  return CheckLaunch(kFn);
}

}  // namespace moebatch::gpu
