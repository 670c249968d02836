// cuda/kernels.h: what is particular to the kernels of task B and greedy decoding, with the answers
// written out by hand rather than computed: the router's tie-breaking (the lower expert id, in
// descending order), the permutation's zeroed offsets for zero tokens, and argmax's ties inside a
// thread's stride, across warps and across the block (each thread keeps its first maximum, the
// tree keeps the lower index). What each kernel computes on random inputs is checked against the
// cpu backend's op of the same name in test_backend_ops.cc. Same GPU rule as
// test_cuda_kernels_task_a.cc.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "cuda/kernels.h"
#include "tests/cuda/cuda_test_util.h"

using namespace moebatch::gpu;
using namespace moebatch::gpu::testing;

TEST_CASE("RouterTopK breaks ties to the lower expert id, descending order", "[cuda]") {
  Stream stream;
  const int64_t experts = 8, top_k = 3;
  const std::vector<float> logits = {
      0,    0,    0,    0,    0,  0, 0,  0,   // all tied: 0, 1, 2
      1,    3,    3,    0,    3,  0, 0,  0,   // three tied at the top: 1, 2, 4
      0.1f, 0.5f, 0.3f, 0.7f, 0,  0, 0,  -1,  // distinct: 3, 1, 2
      -5,   -5,   2,    -5,   -5, 1, -5, 1,   // one top, then a tie: 2, 5, 7
  };
  const int64_t tokens = static_cast<int64_t>(logits.size()) / experts;
  DeviceBuffer<float> logits_d(logits);
  DeviceBuffer<int32_t> ids_d(tokens * top_k);
  DeviceBuffer<float> weights_d(tokens * top_k);
  STATUS_REQUIRE(RouterTopK(logits_d.get(), tokens, experts, top_k, ids_d.get(), weights_d.get(),
                            true, stream.get()));
  stream.Sync();
  CHECK(ids_d.Download() == std::vector<int32_t>{0, 1, 2, 1, 2, 4, 3, 1, 2, 2, 5, 7});
  const std::vector<float> weights = weights_d.Download();
  CHECK(weights[0] == weights[1]);  // tied experts get the same weight
  CHECK(weights[1] == weights[2]);
  CHECK(weights[3] == weights[4]);
  CHECK(weights[4] == weights[5]);
  CHECK(weights[10] == weights[11]);
  for (int64_t t = 0; t < tokens; ++t) {
    CHECK(std::abs(weights[t * top_k] + weights[t * top_k + 1] + weights[t * top_k + 2] - 1.0f) <=
          1e-6f);
  }
}

TEST_CASE("BuildExpertPermutation zeroes the offsets for zero tokens", "[cuda]") {
  Stream stream;
  const int64_t experts = 8;
  DeviceBuffer<int32_t> offsets_d(experts + 1);  // fresh memory: 0xff bytes on the emulator
  STATUS_REQUIRE(BuildExpertPermutation(nullptr, 0, 2, experts, offsets_d.get(), nullptr, nullptr,
                                        stream.get()));
  stream.Sync();
  CHECK(offsets_d.Download() == std::vector<int32_t>(experts + 1, 0));
}

TEST_CASE("ArgmaxRows: the first maximum wins, whichever thread holds it", "[cuda]") {
  Stream stream;
  const int64_t n = 32000, rows = 7;  // 256 threads: index j belongs to thread j % 256
  std::vector<float> x(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) x[i] = static_cast<float>(i % 997) * 0.001f;
  std::vector<int32_t> want(rows);
  // Row 0: twice in one thread's stride (300 and 300 + 256).
  x[0 * n + 300] = x[0 * n + 556] = 9.0f;
  want[0] = 300;
  // Row 1: in two warps of the same block, the later index in the lower warp's lanes
  // (thread 40 holds index 40 + 256 * 10 = 2600; thread 200 holds 200).
  x[1 * n + 2600] = x[1 * n + 200] = 9.0f;
  want[1] = 200;
  // Row 2: in lane 31 of warp 0 and lane 0 of warp 1 (indices 31 and 32), and far later.
  x[2 * n + 31] = x[2 * n + 32] = x[2 * n + n - 1] = 9.0f;
  want[2] = 31;
  // Row 3: one NaN, held by thread 160 of warp 5 (index 4000): not finite, -1 (the OR of every
  // thread's flag, across warps).
  x[3 * n + 4000] = NAN;
  want[3] = -1;
  // Row 4: all equal: index 0.
  std::fill(x.begin() + 4 * n, x.begin() + 5 * n, 0.5f);
  want[4] = 0;
  // Row 5: the maximum at the last index.
  x[5 * n + n - 1] = 9.0f;
  want[5] = static_cast<int32_t>(n - 1);
  // Row 6: -0.0 and +0.0 compare equal: the first of them wins.
  std::fill(x.begin() + 6 * n, x.begin() + 7 * n, -1.0f);
  x[6 * n + 700] = -0.0f;
  x[6 * n + 5] = 0.0f;
  want[6] = 5;
  DeviceBuffer<float> x_d(x);
  DeviceBuffer<int32_t> ids_d(rows);
  STATUS_REQUIRE(ArgmaxRows(x_d.get(), rows, n, ids_d.get(), stream.get()));
  stream.Sync();
  CHECK(ids_d.Download() == want);
}
