// bench_attention_tile_cycles' two halves: the timing, compiled with the AVX2 kernel's flags
// (attention_tile_cycles_avx2.cc), and the program (attention_tile_cycles.cc), compiled without
// them so that it can refuse a CPU without AVX2+FMA before any AVX2 instruction runs.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace moebatch {

struct TileTiming {
  double ns_per_key_row = 0;  // best of the repeats: seconds per call / kTile keys, in ns
  uint64_t acc_hash = 0;      // FNV-1a over the accumulators' bits after the last call
};

// Times `repeats` x `calls` calls of the AVX2 tile kernel for `group` query heads of one KV head
// (1..8) on one tile of 16 bf16 keys of `head_dim` (a multiple of 16, <= 256) that stays in L1,
// with the online softmax carried from call to call as in the engine. INVALID_ARGUMENT for a group
// or head dim the tiled kernel does not take. Call only where the CPU has AVX2, FMA and F16C.
absl::StatusOr<TileTiming> TimeAvx2BF16Tile(int group, int64_t head_dim, int64_t calls,
                                            int repeats);

}  // namespace moebatch
