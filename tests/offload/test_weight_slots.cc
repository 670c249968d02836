// engine/offload/weight_slots.h, the cuda backend's weight streaming protocol, on the host: the real
// DataMover over HostCopyEngine slots, driven in the order the model runner calls the device
// (plain passes and VSLPipe's Fig. 9 order), with every layer's bytes checked in the slot it is
// computed from, the fills counted, and recovery after a failed pass.
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/offload/data_mover.h"
#include "engine/model/model_config.h"
#include "engine/offload/weight_slots.h"
#include "engine/model/weight_store.h"

namespace moebatch {
namespace {

std::string Fixture(const std::string& name) {
  return std::string(MOEBATCH_FIXTURES_DIR) + "/" + name;
}

// Synthetic tiny-mixtral weights, `layers` of them (distinct bytes per layer).
std::unique_ptr<WeightStore> Store(int64_t layers) {
  auto config = LoadModelConfig(Fixture("tiny-mixtral"));
  REQUIRE(config.ok());
  config->num_hidden_layers = static_cast<int>(layers);
  auto store = WeightStore::Synthetic(*config, layers, 3, WeightStoreOptions{});
  REQUIRE(store.ok());
  return *std::move(store);
}

struct Rig {
  Rig(int64_t layers, int64_t resident, size_t packet_bytes = 4096)
      : store(Store(layers)),
        engine(2, store->max_layer_bytes()),
        mover(&engine, packet_bytes),
        slots(*store, resident, &mover) {}
  std::unique_ptr<WeightStore> store;
  HostCopyEngine engine;
  DataMover mover;
  WeightSlots slots;

  // What the device does for task A or B of `layer`: the layer's weights, checked byte for byte.
  void Use(int64_t layer) {
    if (layer < slots.num_resident()) return;
    auto slot = slots.Acquire(layer);
    INFO(slot.status().ToString());
    REQUIRE(slot.ok());
    const WeightRegion& region = store->layer(layer);
    INFO("layer " << layer << " in slot " << *slot);
    REQUIRE(std::memcmp(engine.slot(*slot), region.data, region.bytes) == 0);
  }
  void TaskA(int64_t layer) { Use(layer); }
  void TaskB(int64_t layer) {
    Use(layer);
    const absl::Status st = slots.TaskBDone(layer);
    INFO(st.ToString());
    REQUIRE(st.ok());
  }
  // One pass as ModelRunner drives the device: plain (A_l, B_l for each layer) or VSLPipe's
  // Fig. 9 order with two micro-batches (A0a A0b | B0a A1a | B0b A1b | ... | B(N-1)a B(N-1)b).
  void Pass(bool vslpipe) {
    const int64_t n = store->num_layers();
    slots.BeginPass(vslpipe ? 2 : 1);
    REQUIRE(slots.StartPass().ok());
    if (!vslpipe) {
      for (int64_t l = 0; l < n; ++l) {
        TaskA(l);
        TaskB(l);
      }
      return;
    }
    TaskA(0);
    TaskA(0);
    for (int64_t l = 0; l + 1 < n; ++l) {
      TaskB(l);
      TaskA(l + 1);
      TaskB(l);
      TaskA(l + 1);
    }
    TaskB(n - 1);
    TaskB(n - 1);
  }
};

TEST_CASE("weight slots: every layer's bytes, plain and VSLPipe passes, resident or streamed",
          "[weight_slots]") {
  for (int64_t layers = 1; layers <= 5; ++layers) {
    for (int64_t resident = 0; resident <= std::max<int64_t>(0, layers - 2); ++resident) {
      for (int mix = 0; mix < 16; ++mix) {  // the four passes' kinds, bit p: VSLPipe
        CAPTURE(layers, resident, mix);
        Rig rig(layers, resident);
        const int passes = 4;
        for (int p = 0; p < passes; ++p) rig.Pass(((mix >> p) & 1) != 0);
        // Fills: one per streamed layer and pass, but two streamed layers stay in the slots after
        // the first pass, and a single one after its first fill. Nothing is copied twice per pass.
        const int64_t streamed = layers - resident;
        const int64_t fills = rig.mover.stats().fills;
        if (streamed <= 2) {
          REQUIRE(fills == streamed);
        } else {
          // The last pass queued the next pass's first two streamed layers.
          REQUIRE(fills >= streamed * passes);
          REQUIRE(fills <= streamed * passes + 2);
        }
      }
    }
  }
}

TEST_CASE("weight slots: layers out of order are refused; Reset recovers the next pass",
          "[weight_slots]") {
  Rig rig(5, 1);
  rig.Pass(false);
  rig.slots.BeginPass(1);
  REQUIRE(rig.slots.StartPass().ok());
  rig.TaskA(0);  // resident
  rig.TaskA(1);  // streamed: 1 computing, 2 prefetched
  // Layer 3 while 1 and 2 hold the slots; task B of 2 before 1's.
  REQUIRE(rig.slots.Acquire(3).status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(rig.slots.TaskBDone(2).code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(rig.slots.Acquire(0).status().code() == absl::StatusCode::kInvalidArgument);
  rig.slots.Reset();
  REQUIRE(rig.slots.content(0) == -1);
  REQUIRE(rig.slots.content(1) == -1);
  for (bool vslpipe : {true, false, true}) rig.Pass(vslpipe);  // checks every layer's bytes
  // A reset in the middle of a VSLPipe pass, both layers live and one fill not waited for.
  rig.slots.BeginPass(2);
  REQUIRE(rig.slots.StartPass().ok());
  rig.TaskA(0);
  rig.TaskA(0);
  rig.TaskB(0);
  rig.TaskA(1);
  rig.slots.Reset();
  rig.Pass(true);
  rig.Pass(false);
}

}  // namespace
}  // namespace moebatch
