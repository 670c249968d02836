// engine/offload/data_mover.h with host slots: packets, FIFO order, slots never overwritten while held,
// errors named by layer, stopping with fills queued.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "engine/offload/data_mover.h"

namespace moebatch {
namespace {

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xff);
  return v;
}

// Host slots that also log what the mover does, and can fail one layer's packets.
class LoggingEngine final : public CopyEngine {
 public:
  LoggingEngine(int slots, size_t bytes) : host_(slots, bytes) {}
  int num_slots() const override { return host_.num_slots(); }
  size_t slot_bytes() const override { return host_.slot_bytes(); }
  std::byte* slot(int i) const { return host_.slot(i); }
  absl::Status BeforeFill(int slot) override {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back("before " + std::to_string(slot));
    return absl::OkStatus();
  }
  absl::Status CopyPacket(int slot, size_t offset, const std::byte* src, size_t bytes) override {
    if (fail_src != nullptr && src >= fail_src && src < fail_src + fail_bytes) {
      return absl::DataLossError("injected copy failure");
    }
    max_packet = std::max(max_packet.load(), bytes);
    return host_.CopyPacket(slot, offset, src, bytes);
  }
  absl::Status AfterFill(int slot) override {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back("after " + std::to_string(slot));
    return absl::OkStatus();
  }
  void OnRelease(int slot) override {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back("release " + std::to_string(slot));
  }

  std::mutex mu;
  std::vector<std::string> events;
  std::atomic<size_t> max_packet{0};
  const std::byte* fail_src = nullptr;
  size_t fail_bytes = 0;

 private:
  HostCopyEngine host_;
};

TEST_CASE("data mover: layers through two slots, in packets, never overwriting a held slot",
          "[data_mover]") {
  const size_t slot_bytes = 100000;
  LoggingEngine engine(2, slot_bytes);
  std::vector<std::vector<std::byte>> layers;
  const size_t sizes[] = {100000, 77777, 1, 99999, 4096, 65537, 100000, 12345};
  for (size_t i = 0; i < std::size(sizes); ++i) layers.push_back(RandomBytes(sizes[i], i + 1));
  const size_t packet = 4000;
  std::vector<uint64_t> tickets;
  {
    DataMover mover(&engine, packet);
    REQUIRE(mover.packet_bytes() == packet);
    // The pipeline's pattern: everything queued ahead; layer L goes to slot L % 2.
    for (size_t l = 0; l < layers.size(); ++l) {
      auto t = mover.Enqueue(static_cast<int>(l % 2), layers[l].data(), layers[l].size(),
                             static_cast<int64_t>(l));
      REQUIRE(t.ok());
      tickets.push_back(*t);
    }
    int64_t packets = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
      INFO("layer " << l);
      REQUIRE(mover.Wait(tickets[l]).ok());
      const int slot = static_cast<int>(l % 2);
      REQUIRE(std::memcmp(engine.slot(slot), layers[l].data(), layers[l].size()) == 0);
      // While held, the next fill of this slot (layer l + 2) must not start.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      REQUIRE(std::memcmp(engine.slot(slot), layers[l].data(), layers[l].size()) == 0);
      mover.Release(slot);
      packets += static_cast<int64_t>((layers[l].size() + packet - 1) / packet);
    }
    const DataMoverStats s = mover.stats();
    REQUIRE(s.fills == static_cast<int64_t>(layers.size()));
    REQUIRE(s.packets == packets);
    int64_t bytes = 0;
    for (const auto& l : layers) bytes += static_cast<int64_t>(l.size());
    REQUIRE(s.bytes == bytes);
    REQUIRE(s.busy_seconds > 0);
  }
  REQUIRE(engine.max_packet == packet);
  // Each fill of a slot after its first comes after the release of its previous content.
  std::vector<int> fills_seen(2, 0), releases_seen(2, 0);
  for (const std::string& e : engine.events) {
    const int slot = e.back() - '0';
    if (e.rfind("before", 0) == 0) {
      if (fills_seen[slot] > 0) REQUIRE(releases_seen[slot] == fills_seen[slot]);
      ++fills_seen[slot];
    } else if (e.rfind("release", 0) == 0) {
      ++releases_seen[slot];
    }
  }
  REQUIRE(fills_seen[0] == 4);
  REQUIRE(fills_seen[1] == 4);
}

TEST_CASE("data mover: bad requests and copy errors are named", "[data_mover]") {
  LoggingEngine engine(2, 1000);
  auto layer = RandomBytes(1000, 7);
  auto bad = RandomBytes(500, 8);
  DataMover mover(&engine, 256);
  REQUIRE(mover.Enqueue(2, layer.data(), 10, 0).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(mover.Enqueue(-1, layer.data(), 10, 0).status().code() ==
          absl::StatusCode::kInvalidArgument);
  auto too_big = mover.Enqueue(0, layer.data(), 1001, 5);
  REQUIRE(too_big.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(too_big.status().message().find("layer 5") != std::string::npos);
  REQUIRE(mover.Wait(12345).code() == absl::StatusCode::kInvalidArgument);

  engine.fail_src = bad.data();
  engine.fail_bytes = bad.size();
  auto t0 = mover.Enqueue(0, bad.data(), bad.size(), 3);
  auto t1 = mover.Enqueue(0, layer.data(), layer.size(), 4);  // same slot: a failed fill holds none
  REQUIRE(t0.ok());
  REQUIRE(t1.ok());
  const absl::Status failed = mover.Wait(*t0);
  REQUIRE(failed.code() == absl::StatusCode::kDataLoss);
  REQUIRE(failed.message().find("layer 3") != std::string::npos);
  REQUIRE(mover.Wait(*t1).ok());
  REQUIRE(std::memcmp(engine.slot(0), layer.data(), layer.size()) == 0);
  REQUIRE(mover.Wait(*t0).code() == absl::StatusCode::kDataLoss);  // asked again: same answer
}

TEST_CASE("data mover: stopping drops the fills still queued", "[data_mover]") {
  LoggingEngine engine(1, 64);
  auto a = RandomBytes(64, 1), b = RandomBytes(64, 2);
  {
    DataMover mover(&engine, 16);
    auto t0 = mover.Enqueue(0, a.data(), a.size(), 0);
    auto t1 = mover.Enqueue(0, b.data(), b.size(), 1);  // waits for a Release that never comes
    REQUIRE(mover.Wait(*t0).ok());
    REQUIRE(t1.ok());
  }  // must not hang
  REQUIRE(std::memcmp(engine.slot(0), a.data(), a.size()) == 0);
}

TEST_CASE("data mover: a producer and a consumer thread, many layers", "[data_mover]") {
  const int layers = 200;
  const size_t bytes = 3000;
  HostCopyEngine engine(2, bytes);
  std::vector<std::vector<std::byte>> data;
  for (int l = 0; l < layers; ++l) data.push_back(RandomBytes(bytes - l, 100 + l));
  DataMover mover(&engine, 1024);
  std::vector<uint64_t> tickets(layers);
  std::atomic<int> queued{0};
  std::thread producer([&] {
    for (int l = 0; l < layers; ++l) {
      tickets[l] = *mover.Enqueue(l % 2, data[l].data(), data[l].size(), l);
      queued.store(l + 1);
    }
  });
  int mismatches = 0;
  for (int l = 0; l < layers; ++l) {
    while (queued.load() <= l) std::this_thread::yield();
    if (!mover.Wait(tickets[l]).ok()) ++mismatches;
    if (std::memcmp(engine.slot(l % 2), data[l].data(), data[l].size()) != 0) ++mismatches;
    mover.Release(l % 2);
  }
  producer.join();
  REQUIRE(mismatches == 0);
  REQUIRE(mover.stats().fills == layers);
}

}  // namespace
}  // namespace moebatch
