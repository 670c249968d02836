#include "cpu_attention/runtime/cpu_threads.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace moebatch {

const std::vector<int>& AllowedCpus() {
  static const std::vector<int> cpus = [] {
    std::vector<int> out;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) out.push_back(c);
      }
    }
    if (out.empty()) out.push_back(0);
    return out;
  }();
  return cpus;
}

absl::Status CheckCpuThreads(int num_threads, bool pin) {
  const int allowed = static_cast<int>(AllowedCpus().size());
  if (num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_threads: must be >= 0 (0: one per CPU), got ", num_threads));
  }
  if (pin && num_threads > allowed) {
    return absl::InvalidArgumentError(absl::StrCat("cpu_threads: cannot pin ", num_threads,
                                                   " threads to the ", allowed,
                                                   " CPUs this process may use"));
  }
  return absl::OkStatus();
}

absl::Status ConfigureCpuThreads(int num_threads, bool pin) {
  absl::Status valid = CheckCpuThreads(num_threads, pin);
  if (!valid.ok()) return valid;
  const std::vector<int>& cpus = AllowedCpus();
  const int threads = num_threads == 0 ? static_cast<int>(cpus.size()) : num_threads;
  omp_set_num_threads(threads);
  std::atomic<int> error{0};
#pragma omp parallel num_threads(threads)
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (pin) {
      CPU_SET(cpus[omp_get_thread_num()], &set);
    } else {
      for (int c : cpus) CPU_SET(c, &set);
    }
    const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    if (rc != 0) error.store(rc);
  }
  if (error.load() != 0) {
    return absl::InternalError(
        absl::StrCat("setting CPU thread affinity failed: ", std::strerror(error.load())));
  }
  return absl::OkStatus();
}

}  // namespace moebatch
