// The CPU thread pool (cpu_attention/runtime/cpu_threads.h): sizing, pinning, unpinning, bad values. Run
// on the test's own thread, which owns its OpenMP pool; the pool is restored at the end.
#include <omp.h>
#include <sched.h>

#include <catch2/catch.hpp>
#include <set>
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
