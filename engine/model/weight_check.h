// Checks that weights hold finite numbers. A checkpoint whose lm_head is all NaN, or whose first
// norm is all +inf, loads and runs, and every request then "succeeds" with token 0 repeated: these
// checks find such a file at load, naming the tensor, before a request is served.
//
//   CheckSmallTensorsFinite: what the loader reads anyway, cheap (norms, routers, the first rows
//     of the embedding and lm_head): always, at load.
//   CheckAllTensorsFinite:   every element of every tensor (--verify_weights): one pass over
//     the weights' bytes, parallel (OpenMP); tens of seconds for a 90 GB checkpoint.
// The engine also refuses non-finite logits at run time, per request (engine/engine.h).
//
// Threading: reentrant; the tensors are only read.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/checkpoint.h"
#include "engine/model/safetensors.h"

namespace moebatch {

// InvalidArgument "tensor <name> (<file>): element <i> is nan|inf|-inf" for the first non-finite
// value among the first `max_elements` of `t` (0: all); OK for a tensor of another dtype than
// bf16/f16/f32 (nothing to check).
absl::Status CheckTensorFinite(const TensorInfo& t, int64_t max_elements = 0);

// Norms and routers whole, and the first kSampleRows rows of embed_tokens and lm_head.
inline constexpr int64_t kSampleRows = 64;
absl::Status CheckSmallTensorsFinite(const ModelWeights& w);

// Every tensor whole.
absl::Status CheckAllTensorsFinite(const ModelWeights& w);

}  // namespace moebatch
