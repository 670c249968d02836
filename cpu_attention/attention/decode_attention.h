// Paged attention on the CPU with hand-vectorised kernels (MoE-Lens §6.6): the decode attention
// the CPU runs for every decode token while the GPU does the matrix work, and the prefill
// attention of the cpu backend. Same contract as PagedAttentionReference (paged_attention.h):
// q/out [tokens, num_heads, head_dim] f32, K/V in the paged cache as f32, bf16 or f16, GQA (the
// query heads of one KV head are processed together so each KV byte is read once), causal, optional
// sliding window, fp32 accumulation with an online softmax; contexts longer than 512 keys are split
// into chunks across threads and merged (flash-decoding). Work items are (query row, KV heads,
// chunk), with as many of the row's KV heads per item as still leave 4 items per thread; the
// AVX-512 and AVX2 kernels walk an item's heads inner (each KV block read as two sequential
// streams) with paced software prefetch (decode_attention_tiled.h). Batch-invariant: the chunk
// split depends on the row's own key range only and each head's arithmetic not on the item's
// size, so a row's bits do not depend on the other rows or the thread count.
//
// One binary runs everywhere: each ISA's kernel is compiled in its own file with its own flags
// (decode_attention_avx2.cc: AVX2+FMA+F16C; decode_attention_avx512.cc: AVX-512 F/BW/VL/DQ) and
// the level runtime/cpu_isa.h selects runs. At the AVX-512 level, MLA's bf16 latent cache (one KV
// head for 16 or more query heads, 30 FLOP per byte) runs on AMX tiles where CpuAmxUsable()
// (mla_attention_amx.cc); the GQA shapes stay on the FMA kernels (decode_attention_avx512.cc says
// why AMX and the AVX512-BF16 dot product do not pay there).
//
// Threading: parallel inside, on the calling thread's OpenMP pool (sized and pinned by
// runtime/cpu_threads.h); call from one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "cpu_attention/attention/paged_attention.h"
#include "cpu_attention/runtime/cpu_isa.h"

namespace moebatch {

// Attention with the kernel of `isa` (which must be supported: see SupportedCpuIsas). sinks:
// [num_heads] f32 attention-sink logits (gpt-oss) or null; the per-ISA kernels return a head's
// unnormalised (acc, max, sum) and the sink joins the denominator where they are normalised or
// merged here, the same for every ISA (SoftmaxNormalizer).
void PagedAttention(CpuIsa isa, const KvLayerView& kv, const AttentionSequence* seqs,
                    int64_t num_seqs, const float* q, int64_t num_heads, float scale,
                    std::optional<int64_t> sliding_window, float* out,
                    const float* sinks = nullptr);

// Attention with SelectedCpuIsa().
inline void PagedAttention(const KvLayerView& kv, const AttentionSequence* seqs, int64_t num_seqs,
                           const float* q, int64_t num_heads, float scale,
                           std::optional<int64_t> sliding_window, float* out,
                           const float* sinks = nullptr) {
  PagedAttention(SelectedCpuIsa(), kv, seqs, num_seqs, q, num_heads, scale, sliding_window, out,
                 sinks);
}

}  // namespace moebatch
