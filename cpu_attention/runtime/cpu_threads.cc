#include "cpu_attention/runtime/cpu_threads.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace moebatch {

const std::vector<int>& AllowedCpus() {
  static const std::vector<int> cpus = [] {
    std::vector<int> out;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) CPU_ZERO(&set);
    // Under OMP_PROC_BIND, libgomp binds the initial thread to its first place when it loads,
    // before any code of ours runs; its places, built from the process's mask, hold the rest.
    for (int p = 0; p < omp_get_num_places(); ++p) {
      std::vector<int> ids(omp_get_place_num_procs(p));
      omp_get_place_proc_ids(p, ids.data());
      for (int c : ids) {
        if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
      }
    }
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) out.push_back(c);
    }
    if (out.empty()) out.push_back(0);
    return out;
  }();
  return cpus;
}

namespace {

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The CPUs one cgroup directory's quota allows (rounded up), or nullopt.
std::optional<int> QuotaIn(const std::string& dir, bool v2) {
  double quota = 0, period = 0;
  if (v2) {
    const auto text = ReadSmallFile(dir + "/cpu.max");
    if (!text) return std::nullopt;
    std::vector<std::string> parts =
        absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
    if (parts.size() != 2 || parts[0] == "max") return std::nullopt;
    if (!absl::SimpleAtod(parts[0], &quota) || !absl::SimpleAtod(parts[1], &period)) {
      return std::nullopt;
    }
  } else {
    const auto q = ReadSmallFile(dir + "/cpu.cfs_quota_us");
    const auto p = ReadSmallFile(dir + "/cpu.cfs_period_us");
    if (!q || !p || !absl::SimpleAtod(absl::StripAsciiWhitespace(*q), &quota) ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(*p), &period)) {
      return std::nullopt;
    }
  }
  if (!(quota > 0) || !(period > 0)) return std::nullopt;  // -1 (v1): no quota
  return std::max(1, static_cast<int>(std::ceil(quota / period)));
}

// The smallest quota of `path` and its ancestors under `mount`.
std::optional<int> QuotaUp(const std::string& mount, std::string path, bool v2) {
  std::optional<int> best;
  while (true) {
    if (const auto q = QuotaIn(mount + (path == "/" ? "" : path), v2)) {
      best = best ? std::min(*best, *q) : *q;
    }
    if (path.empty() || path == "/") break;
    const size_t slash = path.find_last_of('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return best;
}

}  // namespace

std::optional<int> CgroupCpuQuota(const std::string& cgroup_root,
                                  const std::string& proc_self_cgroup) {
  std::optional<int> best;
  auto keep = [&best](std::optional<int> q) {
    if (q) best = best ? std::min(*best, *q) : *q;
  };
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n', absl::SkipEmpty())) {
    // "hierarchy-ID:controllers:path"; v2's unified hierarchy is "0::path".
    const std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3 || f[2].empty() || f[2][0] != '/') continue;
    if (f[0] == "0" && f[1].empty()) {
      keep(QuotaUp(cgroup_root, f[2], /*v2=*/true));
      keep(QuotaUp(cgroup_root + "/unified", f[2], /*v2=*/true));  // hybrid hosts
      continue;
    }
    const std::vector<std::string> controllers = absl::StrSplit(f[1], ',');
    if (std::find(controllers.begin(), controllers.end(), "cpu") == controllers.end()) continue;
    for (const std::string& mount :
         {cgroup_root + "/" + f[1], cgroup_root + "/cpu", cgroup_root + "/cpu,cpuacct"}) {
      keep(QuotaUp(mount, f[2], /*v2=*/false));
    }
  }
  return best;
}

int DefaultCpuThreads() {
  static const int threads = [] {
    const int allowed = static_cast<int>(AllowedCpus().size());
    const auto self = ReadSmallFile("/proc/self/cgroup");
    const auto quota = self ? CgroupCpuQuota("/sys/fs/cgroup", *self) : std::nullopt;
    return quota ? std::min(allowed, *quota) : allowed;
  }();
  return threads;
}

absl::Status CheckCpuThreads(int num_threads, bool pin) {
  const int allowed = static_cast<int>(AllowedCpus().size());
  if (num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_threads: must be >= 0 (0: one per CPU, within the cgroup's CPU quota), "
                     "got ",
                     num_threads));
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
  const int threads = num_threads == 0 ? DefaultCpuThreads() : num_threads;
  omp_set_num_threads(threads);
  // OMP_PROC_BIND asked OpenMP to bind the pool's threads (one per place): keep its binding.
  if (!pin && omp_get_proc_bind() != omp_proc_bind_false) return absl::OkStatus();
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
