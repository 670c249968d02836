#include "server/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include "spdlog/spdlog.h"

namespace moebatch {
namespace {
void Send(const std::string& message) {
  const int r = sd_notify(0, message.c_str());
  if (r < 0) spdlog::warn("sd_notify: error {}", -r);
}
}  // namespace

void NotifyReady(const std::string& status) { Send("READY=1\nSTATUS=" + status); }
void NotifyStopping(const std::string& status) { Send("STOPPING=1\nSTATUS=" + status); }
void NotifyStatus(const std::string& status) { Send("STATUS=" + status); }

WatchdogPinger::WatchdogPinger(std::function<bool(std::chrono::microseconds)> alive)
    : alive_(std::move(alive)) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return;
  interval_ = std::chrono::microseconds(usec);
  spdlog::info("systemd watchdog: {} ms, pinging every {} ms", usec / 1000, usec / 2000);
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (alive_(interval_)) {
        Send("WATCHDOG=1");
      } else {
        spdlog::error("systemd watchdog: the engine thread is not looping; not pinging");
      }
      cv_.wait_for(lock, interval_ / 2, [this] { return stop_; });
    }
  });
}

WatchdogPinger::~WatchdogPinger() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace moebatch
