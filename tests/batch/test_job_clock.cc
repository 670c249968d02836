// JobClock (engine/batch/job_clock.h): progress, rates from the job's start and the ETA, on an
// injected clock (no timing assertions), and that the real clock reads sub-second time.
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "engine/batch/job_clock.h"

namespace moebatch {
namespace {

using std::chrono::milliseconds;

// A steady_clock time point the test moves by hand.
struct FakeTime {
  JobClock::Clock::time_point now = JobClock::Clock::time_point(std::chrono::hours(1));
  JobClock::NowFn fn() {
    return [this] { return now; };
  }
};

TEST_CASE("job clock: rates are measured from the start, with sub-second resolution") {
  FakeTime t;
  JobClock clock(/*requests_total=*/10, /*tokens_total=*/1000, t.fn());
  JobClock::Reading r = clock.Read();
  CHECK(r.elapsed_seconds == 0);
  CHECK(r.tokens_per_second == 0);
  CHECK(r.requests_per_second == 0);
  CHECK_FALSE(r.eta_seconds.has_value());  // nothing done yet

  t.now += milliseconds(250);
  clock.AddTokens(50);
  r = clock.Read();
  CHECK(r.elapsed_seconds == Approx(0.25));
  CHECK(r.tokens_done == 50);
  CHECK(r.tokens_total == 1000);
  CHECK(r.tokens_per_second == Approx(200.0));
  CHECK(r.requests_per_second == 0);
  // 5% of the tokens in 0.25 s: 95% left takes 4.75 s.
  REQUIRE(r.eta_seconds.has_value());
  CHECK(*r.eta_seconds == Approx(4.75));

  t.now += milliseconds(1750);  // 2 s since the start
  clock.AddTokens(150);
  clock.AddRequests(5);
  r = clock.Read();
  CHECK(r.elapsed_seconds == Approx(2.0));
  CHECK(r.tokens_per_second == Approx(100.0));  // 200 tokens over the whole 2 s
  CHECK(r.requests_per_second == Approx(2.5));
  CHECK(r.requests_done == 5);
  CHECK(r.requests_total == 10);
  // The request fraction (50%) is ahead of the token fraction (20%): it sets the ETA.
  CHECK(*r.eta_seconds == Approx(2.0));

  clock.AddRequests(5);
  CHECK(*clock.Read().eta_seconds == 0);
}

TEST_CASE("job clock: unknown totals play no part in the ETA") {
  FakeTime t;
  JobClock clock(/*requests_total=*/4, /*tokens_total=*/0, t.fn());
  t.now += milliseconds(100);
  clock.AddTokens(1000);
  CHECK_FALSE(clock.Read().eta_seconds.has_value());
  clock.AddRequests(1);
  CHECK(*clock.Read().eta_seconds == Approx(0.3));
  clock.SetTotals(4, 4000);  // 25% either way
  CHECK(*clock.Read().eta_seconds == Approx(0.3));

  JobClock empty(0, 0, t.fn());
  CHECK_FALSE(empty.Read().eta_seconds.has_value());
}

TEST_CASE("job clock: the real clock is monotonic and reads fractions of a second") {
  JobClock clock;
  const double first = clock.ElapsedSeconds();
  std::this_thread::sleep_for(milliseconds(20));
  const double second = clock.ElapsedSeconds();
  CHECK(first >= 0);
  CHECK(second > first);
  CHECK(second != static_cast<double>(static_cast<int64_t>(second)));  // not whole seconds
}

}  // namespace
}  // namespace moebatch
