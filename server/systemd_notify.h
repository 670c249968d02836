// The systemd service protocol (sd_notify(3), libsystemd) for moebatchd under Type=notify:
// READY=1 once it serves, STOPPING=1 when a stop begins, STATUS= lines, and WATCHDOG=1 pings while
// the engine thread is alive, when the unit sets WatchdogSec (WATCHDOG_USEC in the environment).
// Without NOTIFY_SOCKET (not started by systemd) every call does nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace moebatch {

void NotifyReady(const std::string& status);
void NotifyStopping(const std::string& status);
void NotifyStatus(const std::string& status);

// Pings WATCHDOG=1 every half watchdog interval while `alive()` says the daemon is healthy (the
// engine thread looped recently); stops pinging otherwise, so systemd restarts a hung daemon.
// Starts no thread when the watchdog is off. Destruction stops the thread.
class WatchdogPinger {
 public:
  explicit WatchdogPinger(std::function<bool(std::chrono::microseconds interval)> alive);
  ~WatchdogPinger();
  bool enabled() const { return interval_.count() > 0; }

 private:
  std::chrono::microseconds interval_{0};
  std::function<bool(std::chrono::microseconds)> alive_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace moebatch
