// server/metrics.h: the Prometheus endpoint, scraped over real HTTP on a free local port.
#include <arpa/inet.h>
#include <elf.h>
#include <link.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"

#ifdef MOEBATCH_TEST_METRICS_WITH_CUBLAS
#include <cublasLt.h>
#include <cublas_v2.h>
#endif

namespace moebatch {
namespace {

using Clock = std::chrono::steady_clock;

// A TCP connection to the loopback address of `family` (127.0.0.1 or ::1), port `port`; -1 when it
// fails. No Catch assertions (any thread may call it).
int TryConnectLoopback(int port, int family = AF_INET) {
  const int fd = socket(family, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  int rc;
  if (family == AF_INET6) {
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    addr.sin6_addr = in6addr_loopback;
    rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (rc != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int ConnectLoopback(int port, int family = AF_INET) {
  const int fd = TryConnectLoopback(port, family);
  REQUIRE(fd >= 0);
  return fd;
}

// GET http://127.0.0.1:<port><path> (or [::1]); the whole response (status line, headers, body),
// empty when it cannot connect or send. No Catch assertions (any thread may call it).
std::string TryHttpGet(int port, const std::string& path, int family = AF_INET) {
  const int fd = TryConnectLoopback(port, family);
  if (fd < 0) return "";
  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  if (send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return response;
}

std::string HttpGet(int port, const std::string& path, int family = AF_INET) {
  const std::string response = TryHttpGet(port, path, family);
  REQUIRE_FALSE(response.empty());
  return response;
}

// The status code of an HTTP response ("HTTP/1.x 200 OK" -> 200).
int StatusCode(const std::string& response) {
  const size_t space = response.find(' ');
  if (response.rfind("HTTP/1.", 0) != 0 || space == std::string::npos) return 0;
  return std::atoi(response.c_str() + space + 1);
}

struct Scrape {
  std::string text;                       // the body
  std::map<std::string, double> samples;  // "name{labels}" -> value

  double at(const std::string& key) const {
    auto it = samples.find(key);
    INFO("sample " << key << " in\n" << text);
    REQUIRE(it != samples.end());
    return it->second;
  }
  bool has(const std::string& key) const { return samples.count(key) != 0; }
};

Scrape Parse(const std::string& body) {
  Scrape s;
  s.text = body;
  std::istringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    REQUIRE(space != std::string::npos);
    s.samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return s;
}

Scrape ScrapeHttp(const DaemonMetrics& m) {
  const std::string response = HttpGet(m.port(), "/metrics");
  INFO(response);
  REQUIRE(StatusCode(response) == 200);
  const size_t body = response.find("\r\n\r\n");
  REQUIRE(body != std::string::npos);
  return Parse(response.substr(body + 4));
}

// A clock the test moves.
struct FakeClock {
  Clock::time_point now = Clock::time_point(std::chrono::hours(1000));
  void Advance(double seconds) {
    now += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
};

EngineStats FirstStats() {
  EngineStats s;
  s.backend = "cuda";
  s.passes = 1;
  s.prefill_tokens = 100;
  s.decode_tokens = 0;
  s.generated_tokens = 4;
  s.preemptions = 0;
  s.forward_seconds = 0.5;
  s.device_seconds = 0.3;
  s.cpu_attention_seconds = 0.2;
  s.weight_transfer_seconds = 0.1;
  s.weight_bytes = 1000;
  s.kv_blocks_total = 64;
  s.kv_blocks_free = 60;
  s.waiting = 2;
  s.running = 4;
  s.last_pass.tokens = 100;
  s.last_pass.micro_batches = 2;
  s.last_pass.pass_seconds = 0.5;
  s.last_pass.device_seconds = 0.3;
  s.last_pass.cpu_attention_seconds = 0.2;
  s.last_pass.weight_transfer_seconds = 0.1;
  s.last_utilization.s_mbu = 0.25;
  s.last_utilization.s_mfu = 0.125;
  s.last_utilization.bytes_per_second = 2e9;
  s.last_utilization.flops_per_second = 3e12;
  return s;
}

// Three more passes of 0.08 s each.
EngineStats SecondStats() {
  EngineStats s = FirstStats();
  s.passes = 4;
  s.prefill_tokens = 120;
  s.decode_tokens = 30;
  s.generated_tokens = 40;
  s.preemptions = 2;
  s.forward_seconds = 0.74;
  s.device_seconds = 0.5;
  s.cpu_attention_seconds = 0.35;
  s.weight_transfer_seconds = 0.15;
  s.weight_bytes = 1600;
  s.kv_blocks_free = 50;
  s.waiting = 0;
  s.running = 6;
  s.last_pass.tokens = 10;
  s.last_pass.micro_batches = 1;
  s.last_pass.pass_seconds = 0.08;
  s.last_pass.device_seconds = 0.064;
  s.last_pass.cpu_attention_seconds = 0.032;
  s.last_pass.weight_transfer_seconds = 0.016;
  s.last_utilization.s_mbu = 0.5;
  s.last_utilization.s_mfu = 0.0625;
  return s;
}

std::unique_ptr<DaemonMetrics> Make(FakeClock* clock) {
  MetricsOptions options;
  options.rate_window_seconds = 10;
  options.clock = [clock] { return clock->now; };
  auto m = DaemonMetrics::Create("127.0.0.1:0", options);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  REQUIRE((*m)->port() > 0);
  return std::move(*m);
}

TEST_CASE("metrics: a fresh endpoint serves every family at zero") {
  FakeClock clock;
  auto m = Make(&clock);
  const Scrape s = ScrapeHttp(*m);
  CHECK(s.at("moebatch_ready") == 0);
  CHECK(s.at("moebatch_engine_passes_total") == 0);
  CHECK(s.at("moebatch_generated_tokens_total") == 0);
  CHECK(s.at("moebatch_requests_total{outcome=\"completed\"}") == 0);
  CHECK(s.at("moebatch_requests_total{outcome=\"failed\"}") == 0);
  CHECK(s.at("moebatch_jobs{state=\"in_progress\"}") == 0);
  CHECK(s.at("moebatch_jobs{state=\"cancelled\"}") == 0);
  CHECK(s.at("moebatch_pass_duration_seconds_count") == 0);
  CHECK(s.at("moebatch_tokens_per_second") == 0);
  CHECK(s.at("moebatch_kv_blocks{state=\"used\"}") == 0);
  CHECK(s.text.find("# HELP moebatch_generated_tokens_total ") != std::string::npos);
  CHECK(s.text.find("# TYPE moebatch_generated_tokens_total counter") != std::string::npos);
  CHECK(s.text.find("# TYPE moebatch_pass_duration_seconds histogram") != std::string::npos);
  CHECK(s.text.find("# TYPE moebatch_tokens_per_second gauge") != std::string::npos);
  CHECK_FALSE(s.text.find("moebatch_engine_info{") != std::string::npos);  // no backend yet
  // The exposition format's content type.
  const std::string response = HttpGet(m->port(), "/metrics");
  CHECK(response.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n") !=
        std::string::npos);
  // Other paths are not served.
  CHECK(StatusCode(HttpGet(m->port(), "/nothing")) == 404);
}

TEST_CASE("metrics: counters are the engine's deltas, gauges its last pass") {
  FakeClock clock;
  auto m = Make(&clock);
  clock.Advance(1);
  m->ObservePass(FirstStats());
  Scrape s = ScrapeHttp(*m);
  CHECK(s.at("moebatch_engine_passes_total") == 1);
  CHECK(s.at("moebatch_generated_tokens_total") == 4);
  CHECK(s.at("moebatch_pass_duration_seconds_count") == 1);
  CHECK(s.at("moebatch_pass_duration_seconds_sum") == Approx(0.5));
  CHECK(s.at("moebatch_engine_info{backend=\"cuda\"}") == 1);
  CHECK(s.at("moebatch_tokens_per_second") == Approx(4.0));  // 4 tokens in the first 1 s

  clock.Advance(1);
  m->ObservePass(SecondStats());
  m->SetReady(true);
  m->SetJobCounts({{JobState::kInProgress, 2}, {JobState::kCompleted, 3}});
  m->ObserveResult(false, 10, 5);
  m->ObserveResult(false, 10, 5);
  m->ObserveResult(true, 7, 0);
  m->ObserveResult(false, -1, -1);  // negative usage: counted as a request, no tokens

  s = ScrapeHttp(*m);
  CHECK(s.at("moebatch_ready") == 1);
  CHECK(s.at("moebatch_jobs{state=\"in_progress\"}") == 2);
  CHECK(s.at("moebatch_jobs{state=\"completed\"}") == 3);
  CHECK(s.at("moebatch_jobs{state=\"failed\"}") == 0);
  CHECK(s.at("moebatch_jobs{state=\"validating\"}") == 0);
  CHECK(s.at("moebatch_requests_total{outcome=\"completed\"}") == 3);
  CHECK(s.at("moebatch_requests_total{outcome=\"failed\"}") == 1);
  CHECK(s.at("moebatch_prompt_tokens_total") == 27);
  CHECK(s.at("moebatch_completion_tokens_total") == 10);

  CHECK(s.at("moebatch_engine_passes_total") == 4);
  CHECK(s.at("moebatch_prefill_tokens_total") == 120);
  CHECK(s.at("moebatch_decode_tokens_total") == 30);
  CHECK(s.at("moebatch_generated_tokens_total") == 40);
  CHECK(s.at("moebatch_preemptions_total") == 2);
  CHECK(s.at("moebatch_weight_transfer_bytes_total") == 1600);
  CHECK(s.at("moebatch_forward_seconds_total") == Approx(0.74));
  CHECK(s.at("moebatch_busy_seconds_total{unit=\"device\"}") == Approx(0.5));
  CHECK(s.at("moebatch_busy_seconds_total{unit=\"cpu_attention\"}") == Approx(0.35));
  CHECK(s.at("moebatch_busy_seconds_total{unit=\"weight_transfer\"}") == Approx(0.15));

  // One observation per pass: 0.5 s, then three of 0.08 s (the last one's own, two by their mean).
  CHECK(s.at("moebatch_pass_duration_seconds_count") == 4);
  CHECK(s.at("moebatch_pass_duration_seconds_sum") == Approx(0.74));
  CHECK(s.at("moebatch_pass_duration_seconds_bucket{le=\"0.05\"}") == 0);
  CHECK(s.at("moebatch_pass_duration_seconds_bucket{le=\"0.1\"}") == 3);
  CHECK(s.at("moebatch_pass_duration_seconds_bucket{le=\"0.25\"}") == 3);
  CHECK(s.at("moebatch_pass_duration_seconds_bucket{le=\"0.5\"}") == 4);
  CHECK(s.at("moebatch_pass_duration_seconds_bucket{le=\"+Inf\"}") == 4);

  CHECK(s.at("moebatch_kv_blocks{state=\"used\"}") == 14);
  CHECK(s.at("moebatch_kv_blocks{state=\"free\"}") == 50);
  CHECK(s.at("moebatch_engine_sequences{state=\"waiting\"}") == 0);
  CHECK(s.at("moebatch_engine_sequences{state=\"running\"}") == 6);
  CHECK(s.at("moebatch_last_pass_tokens") == 10);
  CHECK(s.at("moebatch_last_pass_micro_batches") == 1);
  CHECK(s.at("moebatch_busy_fraction{unit=\"device\"}") == Approx(0.8));
  CHECK(s.at("moebatch_busy_fraction{unit=\"cpu_attention\"}") == Approx(0.4));
  CHECK(s.at("moebatch_busy_fraction{unit=\"weight_transfer\"}") == Approx(0.2));
  CHECK(s.at("moebatch_sparse_mbu_ratio") == Approx(0.5));
  CHECK(s.at("moebatch_sparse_mfu_ratio") == Approx(0.0625));
  CHECK(s.at("moebatch_achieved_memory_bytes_per_second") == Approx(2e9));
  CHECK(s.at("moebatch_achieved_flops_per_second") == Approx(3e12));

  // tokens/s: 40 tokens in the process's first 2 s; then over the 10 s window; then idle.
  CHECK(s.at("moebatch_tokens_per_second") == Approx(20.0));
  clock.Advance(3);
  CHECK(ScrapeHttp(*m).at("moebatch_tokens_per_second") == Approx(8.0));  // 40 in 5 s
  clock.Advance(9);  // now 14 s: the window (4 s, 14 s] saw no tokens
  CHECK(ScrapeHttp(*m).at("moebatch_tokens_per_second") == 0);
  EngineStats third = SecondStats();
  third.passes = 5;
  third.generated_tokens = 60;
  third.forward_seconds = 0.84;
  m->ObservePass(third);
  CHECK(ScrapeHttp(*m).at("moebatch_tokens_per_second") == Approx(2.0));  // 20 in 10 s

  // The same statistics again (a Step without a pass): nothing moves.
  m->ObservePass(third);
  const Scrape again = ScrapeHttp(*m);
  CHECK(again.at("moebatch_engine_passes_total") == 5);
  CHECK(again.at("moebatch_pass_duration_seconds_count") == 5);
  CHECK(again.at("moebatch_generated_tokens_total") == 60);

  // Render gives the same exposition without HTTP.
  const Scrape rendered = Parse(m->Render());
  CHECK(rendered.at("moebatch_engine_passes_total") == 5);
  CHECK(rendered.at("moebatch_jobs{state=\"completed\"}") == 3);
}

TEST_CASE("metrics: counters never go down when the engine's statistics start over") {
  FakeClock clock;
  auto m = Make(&clock);
  m->ObservePass(SecondStats());
  const Scrape before = ScrapeHttp(*m);

  // A new engine: fewer passes than before. Its figures count from zero on top.
  EngineStats fresh;
  fresh.backend = "cpu";
  fresh.passes = 2;
  fresh.prefill_tokens = 16;
  fresh.generated_tokens = 5;
  fresh.forward_seconds = 0.02;
  fresh.device_seconds = 0.01;
  fresh.last_pass.pass_seconds = 0.01;
  m->ObservePass(fresh);
  const Scrape after = ScrapeHttp(*m);
  CHECK(after.at("moebatch_engine_passes_total") == 6);
  CHECK(after.at("moebatch_prefill_tokens_total") == 136);
  CHECK(after.at("moebatch_generated_tokens_total") == 45);
  CHECK(after.at("moebatch_pass_duration_seconds_count") == 6);
  CHECK(after.at("moebatch_forward_seconds_total") == Approx(0.76));
  CHECK(after.at("moebatch_engine_info{backend=\"cpu\"}") == 1);
  CHECK_FALSE(after.has("moebatch_engine_info{backend=\"cuda\"}"));
  for (const auto& [key, value] : before.samples) {
    if (key.find("_total") == std::string::npos && key.find("_count") == std::string::npos &&
        key.find("_bucket") == std::string::npos && key.find("_sum") == std::string::npos) {
      continue;  // gauges may go down
    }
    INFO(key);
    CHECK(after.at(key) >= value);
  }

  // It goes on from there.
  fresh.passes = 3;
  fresh.generated_tokens = 9;
  fresh.forward_seconds = 0.03;
  m->ObservePass(fresh);
  const Scrape later = ScrapeHttp(*m);
  CHECK(later.at("moebatch_engine_passes_total") == 7);
  CHECK(later.at("moebatch_generated_tokens_total") == 49);
  CHECK(later.at("moebatch_pass_duration_seconds_count") == 7);
}

TEST_CASE("metrics: observations from two threads while scraping") {
  auto m = DaemonMetrics::Create("127.0.0.1:0");
  REQUIRE(m.ok());
  DaemonMetrics& metrics = **m;
  constexpr int kPasses = 2000;
  std::thread engine([&] {
    EngineStats s;
    s.backend = "cpu";
    for (int i = 1; i <= kPasses; ++i) {
      s.passes = i;
      s.generated_tokens = 3 * i;
      s.forward_seconds = 0.001 * i;
      s.last_pass.pass_seconds = 0.001;
      metrics.ObservePass(s);
    }
  });
  std::thread results([&] {
    for (int i = 0; i < kPasses; ++i) metrics.ObserveResult(i % 2 == 1, 2, 1);
  });
  double last_passes = 0, last_requests = 0;
  for (int i = 0; i < 20; ++i) {
    const Scrape s = ScrapeHttp(metrics);
    const double passes = s.at("moebatch_engine_passes_total");
    const double requests = s.at("moebatch_requests_total{outcome=\"completed\"}");
    CHECK(passes >= last_passes);
    CHECK(requests >= last_requests);
    last_passes = passes;
    last_requests = requests;
  }
  engine.join();
  results.join();
  const Scrape s = ScrapeHttp(metrics);
  CHECK(s.at("moebatch_engine_passes_total") == kPasses);
  CHECK(s.at("moebatch_pass_duration_seconds_count") == kPasses);
  CHECK(s.at("moebatch_generated_tokens_total") == 3 * kPasses);
  CHECK(s.at("moebatch_requests_total{outcome=\"completed\"}") == kPasses / 2);
  CHECK(s.at("moebatch_requests_total{outcome=\"failed\"}") == kPasses / 2);
  CHECK(s.at("moebatch_prompt_tokens_total") == 2 * kPasses);
  CHECK(s.at("moebatch_completion_tokens_total") == kPasses);
}

TEST_CASE("metrics: the scrape hook runs before each collection") {
  FakeClock clock;
  auto m = Make(&clock);
  int calls = 0;
  m->SetScrapeHook([&] {
    ++calls;
    m->SetJobCounts({{JobState::kValidating, calls}});
  });
  CHECK(ScrapeHttp(*m).at("moebatch_jobs{state=\"validating\"}") == 1);
  CHECK(ScrapeHttp(*m).at("moebatch_jobs{state=\"validating\"}") == 2);
  m->SetScrapeHook([] { throw std::runtime_error("store gone"); });
  CHECK(ScrapeHttp(*m).at("moebatch_jobs{state=\"validating\"}") == 2);  // still served
  m->SetScrapeHook(nullptr);
  CHECK(ScrapeHttp(*m).at("moebatch_jobs{state=\"validating\"}") == 2);
  CHECK(calls == 2);
}

TEST_CASE("metrics: an address that cannot be bound or parsed is a clear error") {
  FakeClock clock;
  auto first = Make(&clock);
  const std::string taken = "127.0.0.1:" + std::to_string(first->port());
  auto second = DaemonMetrics::Create(taken);
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == absl::StatusCode::kUnavailable);
  INFO(second.status().message());
  CHECK(second.status().message().find(taken) != absl::string_view::npos);
  CHECK(second.status().message().find("Address already in use") != absl::string_view::npos);
  // The first endpoint is unharmed.
  CHECK(ScrapeHttp(*first).at("moebatch_ready") == 0);

  for (const char* bad : {"",
                          "::1",
                          "::1:9464",
                          "127.0.0.1:70000",
                          "127.0.0.1:",
                          ":9464",
                          "999.1.1.1:80",
                          "127.0.0.1:9464s",
                          "127.0.0.1:1,127.0.0.1:2",
                          "local host:1",
                          "[::1]",
                          "[::1",
                          "[::1]9464",
                          "[::1]:",
                          "[]:9464",
                          "[127.0.0.1]:9464",
                          "[zz::1]:9464",
                          "[fe80::1%lo]:9464",
                          "[::1]:9464x",
                          "-1",
                          "1.2:80"}) {
    INFO("address \"" << bad << "\"");
    auto m = DaemonMetrics::Create(bad);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
  }
  // Not an address of this host.
  auto foreign = DaemonMetrics::Create("192.0.2.1:0");  // TEST-NET-1
  REQUIRE_FALSE(foreign.ok());
  CHECK(foreign.status().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("metrics: IPv6 in brackets, host names and the bare port") {
  // [::1]: served over IPv6 where the host has an IPv6 loopback, else Unavailable with a reason.
  auto v6 = DaemonMetrics::Create("[::1]:0");
  if (v6.ok()) {
    REQUIRE((*v6)->port() > 0);
    const std::string response = HttpGet((*v6)->port(), "/metrics", AF_INET6);
    CHECK(StatusCode(response) == 200);
    CHECK(response.find("moebatch_ready 0") != std::string::npos);
  } else {
    WARN("no IPv6 loopback here: " << v6.status().ToString());
    CHECK(v6.status().code() == absl::StatusCode::kUnavailable);
  }
  // A host name binds its IPv4 address.
  auto named = DaemonMetrics::Create("localhost:0");
  INFO(named.status().ToString());
  REQUIRE(named.ok());
  CHECK(ScrapeHttp(**named).at("moebatch_ready") == 0);
  // A bare port: every IPv4 address, the loopback included.
  auto any = DaemonMetrics::Create("0");
  INFO(any.status().ToString());
  REQUIRE(any.ok());
  CHECK(ScrapeHttp(**any).at("moebatch_ready") == 0);
}

TEST_CASE("metrics: more concurrent scrapes than HTTP threads") {
  MetricsOptions options;
  options.http_threads = 2;
  auto m = DaemonMetrics::Create("127.0.0.1:0", options);
  REQUIRE(m.ok());
  DaemonMetrics& metrics = **m;
  metrics.ObservePass(SecondStats());
  std::vector<std::thread> scrapers;
  std::vector<int> served(8, 0);
  for (size_t t = 0; t < served.size(); ++t) {
    scrapers.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        const std::string response = TryHttpGet(metrics.port(), "/metrics");
        if (StatusCode(response) == 200 &&
            response.find("moebatch_engine_passes_total 4") != std::string::npos) {
          ++served[t];
        }
      }
    });
  }
  for (std::thread& t : scrapers) t.join();
  for (int n : served) CHECK(n == 10);
}

TEST_CASE("metrics: a scrape answers while hundreds of connections send half a request") {
  auto m = DaemonMetrics::Create("127.0.0.1:0", MetricsOptions{});
  REQUIRE(m.ok());
  // 300 connections that each send the start of a request and then wait, holding what they get.
  std::vector<int> stalled;
  for (int i = 0; i < 300; ++i) {
    const int fd = TryConnectLoopback((*m)->port(), AF_INET);
    REQUIRE(fd >= 0);
    const std::string partial = "GET /metr";
    REQUIRE(send(fd, partial.data(), partial.size(), 0) == static_cast<ssize_t>(partial.size()));
    stalled.push_back(fd);
  }
  // A normal scrape, which gives up after 8 s without an answer (Prometheus' default scrape
  // timeout is 10 s).
  const int fd = TryConnectLoopback((*m)->port(), AF_INET);
  REQUIRE(fd >= 0);
  timeval timeout{8, 0};
  REQUIRE(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)) == 0);
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  REQUIRE(send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) response.append(buf, n);
  close(fd);
  CHECK(StatusCode(response) == 200);
  CHECK(response.find("moebatch_ready") != std::string::npos);
  for (int s : stalled) close(s);
}

TEST_CASE("metrics: the destructor stops the server promptly") {
  // Right after Create, and after scrapes.
  for (int scrapes : {0, 3}) {
    auto m = DaemonMetrics::Create("127.0.0.1:0");
    REQUIRE(m.ok());
    for (int i = 0; i < scrapes; ++i) CHECK(StatusCode(HttpGet((*m)->port(), "/metrics")) == 200);
    const int port = (*m)->port();
    const auto start = Clock::now();
    m->reset();
    CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 0.5);
    // The port is closed: nothing accepts there any more.
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0);
    close(fd);
  }
  // A client holding an idle connection (a worker waits for its request) delays it by at most
  // the keep-alive timeout (1 s).
  auto m = DaemonMetrics::Create("127.0.0.1:0");
  REQUIRE(m.ok());
  const int idle = ConnectLoopback((*m)->port());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // accepted, handed to a worker
  const auto start = Clock::now();
  m->reset();
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 2.0);
  close(idle);
}

// The static TLS of every object loaded at startup: glibc puts it in each thread's stack, and a
// thread whose requested stack is smaller cannot be created (pthread_create: EINVAL).
size_t StaticTlsBytes() {
  size_t total = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_TLS) {
            *static_cast<size_t*>(data) += info->dlpi_phdr[i].p_memsz;
          }
        }
        return 0;
      },
      &total);
  return total;
}

// moebatchd linked cuBLAS once, whose static TLS (~100 KB, libcublasLt's alone 0x17020 bytes)
// exceeded the fixed stack size civetweb gave its threads: the endpoint could not start inside the
// daemon. The cuda backend now loads cuBLAS with dlopen (its TLS then dynamic); with CUDA this test
// still links cuBLAS (tests/CMakeLists.txt), so the endpoint is kept working under that TLS.
TEST_CASE("metrics: serves with cuBLAS's static TLS in every thread") {
#ifdef MOEBATCH_TEST_METRICS_WITH_CUBLAS
  CHECK(cublasLtGetVersion() > 0);  // referenced, so the libraries stay linked
  int major = 0;
  CHECK(cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS);
  INFO("static TLS " << StaticTlsBytes() << " bytes");
  REQUIRE(StaticTlsBytes() > 96 * 1024);
#else
  WARN("built without CUDA: the static TLS here is " << StaticTlsBytes() << " bytes, not cuBLAS's");
#endif
  FakeClock clock;
  auto m = Make(&clock);
  CHECK(ScrapeHttp(*m).at("moebatch_ready") == 0);
}

}  // namespace
}  // namespace moebatch
