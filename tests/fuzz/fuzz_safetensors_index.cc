// libFuzzer target: model.safetensors.index.json text through ParseSafetensorsIndex
// (engine/model/safetensors.h), what TensorStore::Open reads before opening the shards.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto index = moebatch::ParseSafetensorsIndex(text, "model.safetensors.index.json");
  if (!index.ok()) {
    FUZZ_CHECK(index.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               index.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(!index->shards.empty(), "no shard");
  std::set<std::string> shards;
  for (const auto& [shard, example_tensor] : index->shards) {
    FUZZ_CHECK(!shard.empty(), "empty shard name");
    FUZZ_CHECK(shards.insert(shard).second, "shard %s listed twice", shard.c_str());
    const auto it = index->weight_map.find(example_tensor);
    FUZZ_CHECK(it != index->weight_map.end() && it->second == shard, "example tensor");
  }
  for (const auto& [tensor, shard] : index->weight_map) {
    FUZZ_CHECK(shards.count(shard) == 1, "shard %s of %s not listed", shard.c_str(),
               tensor.c_str());
  }
  return 0;
}
