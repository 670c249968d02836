// The KV append path of the CPU backend: the K and V rows a forward pass computes for its
// tokens, stored into their slots of the paged KV cache (layout: engine/kv/kv_cache.h) with the
// conversion to the cache dtype done in SIMD (the ISA of runtime/cpu_isa.h's SelectedCpuIsa()).
//
// Conversion: f32 -> bf16 and f32 -> f16 round to nearest even, bit-identical to
// ConvertFromF32 (engine/model/dtype.h) for every finite and infinite input; NaN stays NaN.
//
// Threading: parallel over rows (OpenMP) when there are many; call from one thread. Rows must name
// distinct slots.
#pragma once

#include <cstdint>

#include "cpu_attention/attention/decode_attention.h"

namespace moebatch {

// One token to store: its sequence's block table (covering `position`) and absolute position.
struct KvAppendRow {
  const int32_t* block_table = nullptr;
  int64_t position = 0;
};

// k, v: [num_rows, kv.num_kv_heads, kv.head_dim] f32, row i for rows[i]. Writes through kv.base.
// With kv.value_dim > 0 (the value is part of the key row) v is not read and may be null.
void AppendKv(CpuIsa isa, const KvLayerView& kv, const KvAppendRow* rows, int64_t num_rows,
              const float* k, const float* v);
inline void AppendKv(const KvLayerView& kv, const KvAppendRow* rows, int64_t num_rows,
                     const float* k, const float* v) {
  AppendKv(SelectedCpuIsa(), kv, rows, num_rows, k, v);
}

}  // namespace moebatch
