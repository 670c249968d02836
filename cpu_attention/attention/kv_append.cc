#include "cpu_attention/attention/kv_append.h"

#include "cpu_attention/attention/decode_attention_internal.h"
#include "engine/model/dtype.h"

namespace moebatch {

void AppendKv(CpuIsa isa, const KvLayerView& kv, const KvAppendRow* rows, int64_t num_rows,
              const float* k, const float* v) {
  namespace dai = decode_attention_internal;
  dai::ConvertRowFn convert = nullptr;
  if (isa == CpuIsa::kAvx2) convert = dai::ConvertRowAvx2;
  if (isa == CpuIsa::kAvx512) convert = dai::ConvertRowAvx512;
  const int64_t d = kv.head_dim;
  const size_t elem = DTypeSize(kv.dtype);
  const size_t head_stride = static_cast<size_t>(kv.block_size) * d * elem;
  // A row is kv_heads x head_dim x 2 (K and V) elements: threads pay off only for many rows.
#pragma omp parallel for schedule(static) if (num_rows * kv.num_kv_heads * d > (1 << 15))
  for (int64_t i = 0; i < num_rows; ++i) {
    const int64_t pos = rows[i].position;
    const int64_t block = pos / kv.block_size;
    std::byte* slot = kv.base +
                      static_cast<size_t>(rows[i].block_table[block]) * kv.block_stride_bytes +
                      static_cast<size_t>(pos - block * kv.block_size) * d * elem;
    for (int64_t h = 0; h < kv.num_kv_heads; ++h) {
      const float* ks = k + (i * kv.num_kv_heads + h) * d;
      const float* vs = v + (i * kv.num_kv_heads + h) * d;
      std::byte* kd = slot + h * head_stride;
      const bool store_v = kv.value_dim <= 0;  // else the value is part of the key row
      if (convert != nullptr) {
        convert(kv.dtype, ks, kd, d);
        if (store_v) convert(kv.dtype, vs, kd + kv.value_offset_bytes, d);
      } else {
        ConvertFromF32(kv.dtype, ks, kd, static_cast<size_t>(d));
        if (store_v) {
          ConvertFromF32(kv.dtype, vs, kd + kv.value_offset_bytes, static_cast<size_t>(d));
        }
      }
    }
  }
}

}  // namespace moebatch
