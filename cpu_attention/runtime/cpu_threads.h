// The CPU task's thread pool (MoE-Lens §6.6 runs decode attention on every core while the
// GPU works). It is OpenMP's pool of the thread that runs the engine: decode attention, the KV
// append path, the CPU matmuls (oneDNN, built on the same libgomp runtime) and the rest of the cpu
// backend all run their parallel regions on it, so the CPU work never oversubscribes the cores.
//
// Threading: OpenMP keeps one pool per calling thread; call ConfigureCpuThreads from the thread
// that will run the parallel work (the engine thread), before its first parallel region or
// between passes, never inside one.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace moebatch {

// CPUs this process may run on, in ascending order, read at the first call: the calling thread's
// sched_getaffinity mask and, when OpenMP binds threads (OMP_PROC_BIND; libgomp binds the initial
// thread to one place as it loads), every CPU of OpenMP's places (omp_get_place_proc_ids).
const std::vector<int>& AllowedCpus();

// The CPUs the process's cgroup CPU quota gives it, rounded up: the smallest over its cgroup and
// the cgroups above it of cgroup v2's cpu.max ("QUOTA PERIOD"; "max": none) or cgroup v1's
// cpu.cfs_quota_us / cpu.cfs_period_us (-1: none), as container runtimes set them (docker run
// --cpus, a Kubernetes CPU limit). nullopt without a quota. `cgroup_root`: where the cgroup
// filesystems are mounted ("/sys/fs/cgroup"; v1's cpu controller in "cpu,cpuacct" or "cpu");
// `proc_self_cgroup`: the text of /proc/self/cgroup. Unreadable or malformed files count as no
// quota.
std::optional<int> CgroupCpuQuota(const std::string& cgroup_root,
                                  const std::string& proc_self_cgroup);

// The threads cpu_threads 0 means: one per allowed CPU, but no more than the cgroup CPU quota of
// this process (read once): with more threads than the quota, OpenMP's threads would wait for
// each other while the kernel throttles them.
int DefaultCpuThreads();

// Checks a (num_threads, pin) request without applying it: InvalidArgument for num_threads < 0,
// or for pin with more threads than allowed CPUs (the message names `cpu_threads`).
absl::Status CheckCpuThreads(int num_threads, bool pin);

// Sizes the calling thread's OpenMP pool to `num_threads` (0: DefaultCpuThreads()) and, with
// `pin`, binds pool thread i to the i-th allowed CPU (the calling thread is thread 0); without it,
// keeps OpenMP's own binding when OMP_PROC_BIND asks for one (omp_get_proc_bind() is not
// omp_proc_bind_false), else lets every pool thread run on all allowed CPUs again.
// Errors: CheckCpuThreads's; Internal when the OS refuses an affinity change.
absl::Status ConfigureCpuThreads(int num_threads, bool pin);

}  // namespace moebatch
