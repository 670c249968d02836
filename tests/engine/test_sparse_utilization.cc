// engine/sparse_utilization.h against MoE-CAP's own example (seed 004, §4.4: Mixtral-8x22B, bf16,
// batch 1, TPOT 100 ms needs 0.780 TB/s by S-MBU) and hand-worked Mixtral-8x7B figures.
#include <catch2/catch.hpp>

#include "engine/sparse_utilization.h"

namespace moebatch {
namespace {

TEST_CASE("S-MBU: MoE-CAP's Mixtral-8x22B example", "[sparse_utilization]") {
  const ModelConfig c = *KnownModelConfig("mixtral-8x22b");
  ForwardStats pass;
  pass.tokens = 1;
  pass.experts_touched = 56 * 2;  // one token: its top-2 in every layer
  pass.pass_seconds = 0.1;        // TPOT 100 ms
  const SparseUtilization u = ComputeSparseUtilization(c, 2.0, 2.0, pass, 2.0e12, 0);
  // Per layer: attention 6144 x (2 x 6144 + 2 x 1024) + norms = 88.1 M, router 49 K, two experts
  // of 3 x 6144 x 16384 = 302 M: 692.3 M; x 56 layers = 38.8 G parameters, x 2 bytes / 0.1 s.
  REQUIRE(u.bytes_per_second == Approx(0.780e12).epsilon(0.01));
  REQUIRE(u.kv_bytes == 0);
  REQUIRE(u.s_mbu == Approx(u.bytes_per_second / 2.0e12));
  REQUIRE(u.s_mfu == 0);  // no compute peak given
}

TEST_CASE("S-MFU and KV bytes: Mixtral-8x7B by hand", "[sparse_utilization]") {
  const ModelConfig c = *KnownModelConfig("mixtral-8x7b");
  ForwardStats pass;
  pass.tokens = 256;
  pass.experts_touched = 32 * 8;  // a batch: every expert of every layer used
  pass.kv_tokens_read = 256 * 512;
  pass.pass_seconds = 2.0;
  const SparseUtilization u = ComputeSparseUtilization(c, 2.0, 2.0, pass, 0, 100e12);
  // Per token and layer: 2 x (attention 41.95 M + router 32.8 K + 2 experts x 176.2 M).
  const double attn = 4096.0 * (2 * 4096 + 2 * 1024) + 2 * 4096;
  const double per_token = 32 * (2 * attn + 2 * 4096.0 * 8 + 2 * 2 * 3 * 4096.0 * 14336);
  REQUIRE(u.flops == Approx(256 * per_token));
  REQUIRE(per_token == Approx(25.2e9).epsilon(0.01));
  REQUIRE(u.s_mfu == Approx(256 * per_token / 2.0 / 100e12));
  // KV: 131,072 context tokens x 32 layers x K and V x 1024 x 2 bytes = 16 GiB.
  REQUIRE(u.kv_bytes == Approx(131072.0 * 32 * 2 * 1024 * 2));
  // All 8 experts of every layer counted once, not once per token.
  REQUIRE(u.activated_weight_bytes ==
          Approx(2.0 * (32 * (attn + 4096.0 * 8) + 32 * 8 * 3 * 4096.0 * 14336)));
  REQUIRE(u.s_mbu == 0);
}

}  // namespace
}  // namespace moebatch
