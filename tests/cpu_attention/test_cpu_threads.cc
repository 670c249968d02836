// The CPU thread pool (cpu_attention/runtime/cpu_threads.h): sizing, pinning, unpinning, bad
// values. Run on the test's own thread, which owns its OpenMP pool; the pool is restored at the
// end.
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cpu_attention/runtime/cpu_threads.h"

using namespace moebatch;

TEST_CASE("CPU threads: sized to the CPUs, pinned when asked", "[cpu_threads]") {
  const std::vector<int>& cpus = AllowedCpus();
  REQUIRE(!cpus.empty());
  const int n = static_cast<int>(cpus.size());

  REQUIRE(ConfigureCpuThreads(0, false).ok());
  REQUIRE(omp_get_max_threads() == n);

  REQUIRE(ConfigureCpuThreads(n, true).ok());
  std::vector<int> seen(n, -1), allowed_count(n, 0);
#pragma omp parallel
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    // No Catch assertions inside the parallel region (Catch is not thread-safe): -1 on failure.
    const bool ok = sched_getaffinity(0, sizeof(set), &set) == 0;
    seen[omp_get_thread_num()] = sched_getcpu();
    allowed_count[omp_get_thread_num()] = ok ? CPU_COUNT(&set) : -1;
  }
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(allowed_count[i] == 1);
    CHECK(seen[i] == cpus[i]);
  }

  // Unpinned again: every pool thread may use every CPU.
  REQUIRE(ConfigureCpuThreads(0, false).ok());
#pragma omp parallel
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    const bool ok = sched_getaffinity(0, sizeof(set), &set) == 0;
    allowed_count[omp_get_thread_num()] = ok ? CPU_COUNT(&set) : -1;
  }
  for (int i = 0; i < n; ++i) CHECK(allowed_count[i] == n);

  // Fewer threads than CPUs.
  REQUIRE(ConfigureCpuThreads(1, true).ok());
  REQUIRE(omp_get_max_threads() == 1);
  REQUIRE(ConfigureCpuThreads(0, false).ok());
}

TEST_CASE("CPU threads: bad values are refused with the reason", "[cpu_threads]") {
  const int n = static_cast<int>(AllowedCpus().size());
  absl::Status negative = ConfigureCpuThreads(-1, false);
  CHECK(negative.code() == absl::StatusCode::kInvalidArgument);
  CHECK(negative.message().find("cpu_threads") != std::string::npos);
  absl::Status too_many = ConfigureCpuThreads(n + 1, true);
  CHECK(too_many.code() == absl::StatusCode::kInvalidArgument);
  CHECK(too_many.message().find("cannot pin") != std::string::npos);
  // More threads than CPUs is allowed unpinned (oversubscription is the user's call).
  CHECK(ConfigureCpuThreads(n + 1, false).ok());
  CHECK(omp_get_max_threads() == n + 1);
  REQUIRE(ConfigureCpuThreads(0, false).ok());
}

// Under OMP_PROC_BIND libgomp binds the initial thread to one CPU as it loads, before any of our
// code runs. tests/CMakeLists.txt runs this case again with OMP_PROC_BIND=true OMP_PLACES=cores
// and MOEBATCH_TEST_ALLOWED_CPUS set to what `nproc` counted outside the bound process.
TEST_CASE("CPU threads: under OMP_PROC_BIND every allowed CPU counts and OpenMP's binding stays",
          "[cpu_threads]") {
  const std::vector<int>& cpus = AllowedCpus();
  cpu_set_t own;
  CPU_ZERO(&own);
  REQUIRE(sched_getaffinity(0, sizeof(own), &own) == 0);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &own)) CHECK(std::find(cpus.begin(), cpus.end(), c) != cpus.end());
  }
  const char* expected_env = std::getenv("MOEBATCH_TEST_ALLOWED_CPUS");
  if (expected_env == nullptr) return;  // the run without binding: the check above only
  REQUIRE(omp_get_proc_bind() != omp_proc_bind_false);
  const int expected = std::atoi(expected_env);
  REQUIRE(static_cast<int>(cpus.size()) == expected);
  REQUIRE(omp_get_num_places() >= 1);

  // Unpinned: OpenMP's binding is kept, one place per pool thread.
  const int n = std::min(expected, omp_get_num_places());
  REQUIRE(ConfigureCpuThreads(n, false).ok());
  REQUIRE(omp_get_max_threads() == n);
  std::vector<int> place(n, -2), allowed_count(n, 0), place_procs(n, 0);
#pragma omp parallel
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    const bool ok = sched_getaffinity(0, sizeof(set), &set) == 0;
    const int t = omp_get_thread_num();
    place[t] = omp_get_place_num();
    allowed_count[t] = ok ? CPU_COUNT(&set) : -1;
    place_procs[t] = place[t] >= 0 ? omp_get_place_num_procs(place[t]) : -1;
  }
  std::set<int> places;
  for (int i = 0; i < n; ++i) {
    CAPTURE(i, place[i]);
    CHECK(place[i] >= 0);
    CHECK(allowed_count[i] == place_procs[i]);
    places.insert(place[i]);
  }
  CHECK(static_cast<int>(places.size()) == n);
}

namespace {

// Writes `text` to `path`, creating its directories.
void Put(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

}  // namespace

// CgroupCpuQuota on cgroup trees written here as container runtimes lay them out.
TEST_CASE("CPU threads: the cgroup CPU quota, v1 and v2, nested, absent", "[cpu_threads]") {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("moebatch_cgroup_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);

  // cgroup v2: docker run --cpus 2.5 gives "250000 100000" in the container's own cgroup.
  Put(root / "v2/system.slice/docker-1.scope/cpu.max", "250000 100000\n");
  CHECK(CgroupCpuQuota((root / "v2").string(), "0::/system.slice/docker-1.scope\n") == 3);
  // A parent's smaller quota wins; "max" is none.
  Put(root / "v2/kubepods/cpu.max", "200000 100000\n");
  Put(root / "v2/kubepods/pod1/c1/cpu.max", "max 100000\n");
  CHECK(CgroupCpuQuota((root / "v2").string(), "0::/kubepods/pod1/c1\n") == 2);
  Put(root / "v2/free/cpu.max", "max 100000\n");
  CHECK(!CgroupCpuQuota((root / "v2").string(), "0::/free\n").has_value());
  // A container with its own cgroup namespace sees "/" and the files at the mount's top.
  Put(root / "ns/cpu.max", "50000 100000\n");
  CHECK(CgroupCpuQuota((root / "ns").string(), "0::/\n") == 1);

  // cgroup v1: the cpu controller mounted as "cpu,cpuacct"; -1 is no quota.
  Put(root / "v1/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "400000\n");
  Put(root / "v1/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  const std::string v1 = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n";
  CHECK(CgroupCpuQuota((root / "v1").string(), v1) == 4);
  Put(root / "v1/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
  CHECK(!CgroupCpuQuota((root / "v1").string(), v1).has_value());
  // Nothing mounted, or a malformed file: no quota.
  CHECK(!CgroupCpuQuota((root / "none").string(), v1).has_value());
  Put(root / "bad/cpu.max", "lots\n");
  CHECK(!CgroupCpuQuota((root / "bad").string(), "0::/\n").has_value());
  std::filesystem::remove_all(root);

  // This process: the default is within both the CPUs and any quota.
  const int threads = DefaultCpuThreads();
  CHECK(threads >= 1);
  CHECK(threads <= static_cast<int>(AllowedCpus().size()));
}
