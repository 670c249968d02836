#include "server/metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "httplib.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/http_endpoint.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

using Clock = std::chrono::steady_clock;
using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;

constexpr std::array<JobState, 8> kJobStates = {
    JobState::kValidating, JobState::kInProgress, JobState::kFinalizing, JobState::kCompleted,
    JobState::kFailed,     JobState::kCancelling, JobState::kCancelled,  JobState::kExpired};

// Forward passes run from milliseconds (a small model on the CPU) to tens of seconds (a large MoE
// streaming its weights over PCIe at a full token budget).
const std::vector<double> kPassBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                          0.5,   1,      2.5,   5,    10,    25,   60};

constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

// The EngineStats fields that become counters.
struct Cumulative {
  int64_t passes = 0, prefill = 0, decode = 0, generated = 0, preemptions = 0, weight_bytes = 0;
  double forward = 0, device = 0, cpu_attention = 0, weight_transfer = 0;

  static Cumulative Of(const EngineStats& s) {
    Cumulative c;
    c.passes = s.passes;
    c.prefill = s.prefill_tokens;
    c.decode = s.decode_tokens;
    c.generated = s.generated_tokens;
    c.preemptions = s.preemptions;
    c.weight_bytes = s.weight_bytes;
    c.forward = s.forward_seconds;
    c.device = s.device_seconds;
    c.cpu_attention = s.cpu_attention_seconds;
    c.weight_transfer = s.weight_transfer_seconds;
    return c;
  }
  // Some field went down since `before`: a different (new) engine's statistics.
  bool WentBelow(const Cumulative& before) const {
    return passes < before.passes || prefill < before.prefill || decode < before.decode ||
           generated < before.generated || preemptions < before.preemptions ||
           weight_bytes < before.weight_bytes || forward < before.forward ||
           device < before.device || cpu_attention < before.cpu_attention ||
           weight_transfer < before.weight_transfer;
  }
};

template <typename T>
prometheus::Family<T>& Build(prometheus::detail::Builder<T> builder, const char* name,
                             const char* help, prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

}  // namespace

struct DaemonMetrics::Impl {
  explicit Impl(const MetricsOptions& o) : options(o) {
    if (!options.clock) options.clock = [] { return Clock::now(); };
    if (!(options.rate_window_seconds > 0)) options.rate_window_seconds = 10.0;
    start = options.clock();
    rate_samples.emplace_back(start, 0.0);
    prometheus::Registry& r = *registry;

    ready = &Build(prometheus::BuildGauge(), "moebatch_ready",
                   "1 when the daemon serves requests, else 0", r)
                 .Add({});
    auto& jobs_family =
        Build(prometheus::BuildGauge(), "moebatch_jobs", "Batch jobs in each state", r);
    for (JobState s : kJobStates) {
      jobs[s] = &jobs_family.Add({{"state", std::string(JobStateName(s))}});
    }
    auto& requests = Build(prometheus::BuildCounter(), "moebatch_requests_total",
                           "Batch requests whose result was committed, by outcome", r);
    requests_completed = &requests.Add({{"outcome", "completed"}});
    requests_failed = &requests.Add({{"outcome", "failed"}});
    prompt_tokens = &Build(prometheus::BuildCounter(), "moebatch_prompt_tokens_total",
                           "Prompt tokens of the requests whose result was committed", r)
                         .Add({});
    completion_tokens = &Build(prometheus::BuildCounter(), "moebatch_completion_tokens_total",
                               "Generated tokens of the requests whose result was committed", r)
                             .Add({});

    engine_info = &Build(prometheus::BuildGauge(), "moebatch_engine_info",
                         "The engine's backend (value 1)", r);
    passes = &Build(prometheus::BuildCounter(), "moebatch_engine_passes_total",
                    "Forward passes of the engine", r)
                  .Add({});
    prefill_tokens = &Build(prometheus::BuildCounter(), "moebatch_prefill_tokens_total",
                            "Tokens prefilled (re-prefill after preemption included)", r)
                          .Add({});
    decode_tokens =
        &Build(prometheus::BuildCounter(), "moebatch_decode_tokens_total", "Tokens decoded", r)
             .Add({});
    generated_tokens = &Build(prometheus::BuildCounter(), "moebatch_generated_tokens_total",
                              "Tokens sampled by the engine, as they are generated", r)
                            .Add({});
    preemptions = &Build(prometheus::BuildCounter(), "moebatch_preemptions_total",
                         "Sequences preempted to free KV cache blocks", r)
                       .Add({});
    forward_seconds = &Build(prometheus::BuildCounter(), "moebatch_forward_seconds_total",
                             "Wall time inside the model forward", r)
                           .Add({});
    auto& busy_seconds = Build(prometheus::BuildCounter(), "moebatch_busy_seconds_total",
                               "Forward time inside device calls, the CPU attention task, or "
                               "with weight copies in flight (overlapping under VSLPipe)",
                               r);
    busy_device_seconds = &busy_seconds.Add({{"unit", "device"}});
    busy_cpu_seconds = &busy_seconds.Add({{"unit", "cpu_attention"}});
    busy_transfer_seconds = &busy_seconds.Add({{"unit", "weight_transfer"}});
    weight_transfer_bytes =
        &Build(prometheus::BuildCounter(), "moebatch_weight_transfer_bytes_total",
               "Weight bytes copied to the device", r)
             .Add({});
    pass_duration = &Build(prometheus::BuildHistogram(), "moebatch_pass_duration_seconds",
                           "Forward time of each engine pass", r)
                         .Add({}, kPassBuckets);
    tokens_per_second = &Build(prometheus::BuildGauge(), "moebatch_tokens_per_second",
                               absl::StrCat("Generated tokens per second over the last ",
                                            options.rate_window_seconds, " s")
                                   .c_str(),
                               r)
                             .Add({});
    auto& busy_fraction =
        Build(prometheus::BuildGauge(), "moebatch_busy_fraction",
              "Fraction of the last pass's forward time inside device calls, the CPU attention "
              "task, or with weight copies in flight (may sum past 1 under VSLPipe)",
              r);
    busy_device = &busy_fraction.Add({{"unit", "device"}});
    busy_cpu = &busy_fraction.Add({{"unit", "cpu_attention"}});
    busy_transfer = &busy_fraction.Add({{"unit", "weight_transfer"}});
    auto& kv = Build(prometheus::BuildGauge(), "moebatch_kv_blocks", "KV cache blocks", r);
    kv_used = &kv.Add({{"state", "used"}});
    kv_free = &kv.Add({{"state", "free"}});
    auto& sequences = Build(prometheus::BuildGauge(), "moebatch_engine_sequences",
                            "Sequences inside the engine, waiting or running", r);
    seq_waiting = &sequences.Add({{"state", "waiting"}});
    seq_running = &sequences.Add({{"state", "running"}});
    last_pass_tokens =
        &Build(prometheus::BuildGauge(), "moebatch_last_pass_tokens", "Tokens in the last pass", r)
             .Add({});
    last_pass_micro_batches = &Build(prometheus::BuildGauge(), "moebatch_last_pass_micro_batches",
                                     "Micro-batches of the last pass (2 when VSLPipe split it)", r)
                                   .Add({});
    s_mbu = &Build(prometheus::BuildGauge(), "moebatch_sparse_mbu_ratio",
                   "Sparse memory-bandwidth utilisation (MoE-CAP S-MBU) of the last pass; 0 when "
                   "the memory peak is unknown",
                   r)
                 .Add({});
    s_mfu = &Build(prometheus::BuildGauge(), "moebatch_sparse_mfu_ratio",
                   "Sparse FLOP utilisation (MoE-CAP S-MFU) of the last pass; 0 when the compute "
                   "peak is unknown",
                   r)
                 .Add({});
    achieved_bytes = &Build(prometheus::BuildGauge(), "moebatch_achieved_memory_bytes_per_second",
                            "Activated weight and KV bytes read per second in the last pass", r)
                          .Add({});
    achieved_flops = &Build(prometheus::BuildGauge(), "moebatch_achieved_flops_per_second",
                            "FLOPs per second in the last pass", r)
                          .Add({});
  }

  // Stops the HTTP server first (no scrape may run once the members below go).
  ~Impl() { endpoint.reset(); }

  void Serve(const httplib::Request&, httplib::Response& res) {
    try {
      res.set_content(prometheus::TextSerializer().Serialize(Collect()), kContentType);
    } catch (const std::exception& e) {
      spdlog::warn("metrics: a scrape failed: {}", e.what());
      res.status = 500;
      res.set_content(absl::StrCat("metrics: ", e.what(), "\n"), "text/plain; charset=utf-8");
    } catch (...) {
      spdlog::warn("metrics: a scrape failed");
      res.status = 500;
      res.set_content("metrics: unknown error\n", "text/plain; charset=utf-8");
    }
  }

  // Under mu_.
  void ObservePasses(int64_t n, double forward, double last_pass_seconds) {
    if (n == 1) {
      pass_duration->Observe(forward);
      return;
    }
    // Only the last of them is known on its own: the others get their mean.
    const double last = std::min(std::max(last_pass_seconds, 0.0), std::max(forward, 0.0));
    pass_duration->Observe(last);
    const double others = static_cast<double>(n - 1);
    const double mean = std::max(forward - last, 0.0) / others;
    std::vector<double> increments(kPassBuckets.size() + 1, 0.0);
    const size_t bucket = static_cast<size_t>(
        std::lower_bound(kPassBuckets.begin(), kPassBuckets.end(), mean) - kPassBuckets.begin());
    increments[bucket] = others;
    pass_duration->ObserveMultiple(increments, mean * others);
  }

  // Under mu_: drops the samples older than the newest one at or before now - window.
  void PruneRate(Clock::time_point now) {
    const auto window = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(options.rate_window_seconds));
    while (rate_samples.size() >= 2 && rate_samples[1].first <= now - window) {
      rate_samples.pop_front();
    }
  }

  void UpdateRate() {
    std::lock_guard<std::mutex> lock(mu);
    const Clock::time_point now = options.clock();
    PruneRate(now);
    const auto& [base_time, base_value] = rate_samples.front();
    const double age = std::chrono::duration<double>(now - base_time).count();
    const double span = std::min(age, options.rate_window_seconds);
    const double generated = rate_samples.back().second - base_value;
    tokens_per_second->Set(span > 0 ? generated / span : 0.0);
  }

  std::vector<prometheus::MetricFamily> Collect() {
    {
      std::lock_guard<std::mutex> lock(hook_mu);
      if (hook) {
        try {
          hook();
        } catch (const std::exception& e) {
          spdlog::warn("metrics: the scrape hook failed: {}", e.what());
        } catch (...) {
          spdlog::warn("metrics: the scrape hook failed");
        }
      }
    }
    UpdateRate();
    return registry->Collect();
  }

  MetricsOptions options;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  int port = 0;

  Gauge* ready;
  std::map<JobState, Gauge*> jobs;
  Counter *requests_completed, *requests_failed, *prompt_tokens, *completion_tokens;
  prometheus::Family<Gauge>* engine_info;
  Counter *passes, *prefill_tokens, *decode_tokens, *generated_tokens, *preemptions;
  Counter *forward_seconds, *busy_device_seconds, *busy_cpu_seconds, *busy_transfer_seconds;
  Counter* weight_transfer_bytes;
  Histogram* pass_duration;
  Gauge* tokens_per_second;
  Gauge *busy_device, *busy_cpu, *busy_transfer;
  Gauge *kv_used, *kv_free, *seq_waiting, *seq_running;
  Gauge *last_pass_tokens, *last_pass_micro_batches;
  Gauge *s_mbu, *s_mfu, *achieved_bytes, *achieved_flops;

  std::mutex mu;  // the fields below; makes ObservePass's read-compare-add atomic
  bool have_previous = false;
  Cumulative previous;
  std::string backend;
  Gauge* backend_gauge = nullptr;
  Clock::time_point start;
  std::deque<std::pair<Clock::time_point, double>> rate_samples;  // (time, generated so far)

  std::mutex hook_mu;  // held while the hook runs, so SetScrapeHook waits for a running one
  std::function<void()> hook;

  // Last: its threads use the above. The worker pool is made by Create (so that failing to start
  // its threads is Create's error) and handed to listen_after_bind through new_task_queue, which
  // owns and joins it from then on.
  std::unique_ptr<HttpEndpoint> endpoint;
};

absl::StatusOr<std::unique_ptr<DaemonMetrics>> DaemonMetrics::Create(
    const std::string& listen_address, const MetricsOptions& options) {
  std::unique_ptr<Impl> impl;
  try {
    impl = std::make_unique<Impl>(options);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("metrics: building the registry: ", e.what()));
  }
  Impl* raw = impl.get();
  HttpEndpointOptions http;
  http.label = "metrics";
  http.threads = options.http_threads;
  auto endpoint = HttpEndpoint::Start(listen_address, http, [raw](httplib::Server& server) {
    server.Get("/metrics", [raw](const httplib::Request& req, httplib::Response& res) {
      raw->Serve(req, res);
    });
  });
  if (!endpoint.ok()) return endpoint.status();
  impl->endpoint = *std::move(endpoint);
  impl->port = impl->endpoint->port();
  try {
    return std::unique_ptr<DaemonMetrics>(new DaemonMetrics(std::move(impl)));
  } catch (const std::exception& e) {  // impl, not moved from, stops the server
    return absl::InternalError(absl::StrCat("metrics endpoint: ", e.what()));
  }
}

DaemonMetrics::DaemonMetrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DaemonMetrics::~DaemonMetrics() = default;

int DaemonMetrics::port() const { return impl_->port; }

void DaemonMetrics::SetReady(bool ready) { impl_->ready->Set(ready ? 1.0 : 0.0); }

void DaemonMetrics::SetJobCounts(const std::map<JobState, int64_t>& counts) {
  for (const auto& [state, gauge] : impl_->jobs) {
    auto it = counts.find(state);
    gauge->Set(it == counts.end() ? 0.0 : static_cast<double>(it->second));
  }
}

void DaemonMetrics::SetScrapeHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(impl_->hook_mu);
  impl_->hook = std::move(hook);
}

void DaemonMetrics::ObservePass(const EngineStats& stats) {
  Impl& m = *impl_;
  const Cumulative now = Cumulative::Of(stats);
  std::lock_guard<std::mutex> lock(m.mu);
  Cumulative base;  // zeros: the first observation, or a new engine
  if (m.have_previous) {
    if (now.WentBelow(m.previous)) {
      spdlog::info(
          "metrics: the engine's statistics went back (a new engine); its figures are "
          "added to the counters from zero");
    } else {
      base = m.previous;
    }
  }
  m.previous = now;
  m.have_previous = true;

  const int64_t new_passes = now.passes - base.passes;
  m.passes->Increment(static_cast<double>(new_passes));
  m.prefill_tokens->Increment(static_cast<double>(now.prefill - base.prefill));
  m.decode_tokens->Increment(static_cast<double>(now.decode - base.decode));
  m.generated_tokens->Increment(static_cast<double>(now.generated - base.generated));
  m.preemptions->Increment(static_cast<double>(now.preemptions - base.preemptions));
  m.weight_transfer_bytes->Increment(static_cast<double>(now.weight_bytes - base.weight_bytes));
  m.forward_seconds->Increment(now.forward - base.forward);
  m.busy_device_seconds->Increment(now.device - base.device);
  m.busy_cpu_seconds->Increment(now.cpu_attention - base.cpu_attention);
  m.busy_transfer_seconds->Increment(now.weight_transfer - base.weight_transfer);
  if (new_passes > 0) {
    m.ObservePasses(new_passes, now.forward - base.forward, stats.last_pass.pass_seconds);
  }

  const ForwardStats& last = stats.last_pass;
  const double pass_seconds = last.pass_seconds;
  m.busy_device->Set(pass_seconds > 0 ? last.device_seconds / pass_seconds : 0.0);
  m.busy_cpu->Set(pass_seconds > 0 ? last.cpu_attention_seconds / pass_seconds : 0.0);
  m.busy_transfer->Set(pass_seconds > 0 ? last.weight_transfer_seconds / pass_seconds : 0.0);
  m.last_pass_tokens->Set(static_cast<double>(last.tokens));
  m.last_pass_micro_batches->Set(static_cast<double>(last.micro_batches));
  m.kv_used->Set(static_cast<double>(stats.kv_blocks_total - stats.kv_blocks_free));
  m.kv_free->Set(static_cast<double>(stats.kv_blocks_free));
  m.seq_waiting->Set(static_cast<double>(stats.waiting));
  m.seq_running->Set(static_cast<double>(stats.running));
  m.s_mbu->Set(stats.last_utilization.s_mbu);
  m.s_mfu->Set(stats.last_utilization.s_mfu);
  m.achieved_bytes->Set(stats.last_utilization.bytes_per_second);
  m.achieved_flops->Set(stats.last_utilization.flops_per_second);

  if (stats.backend != m.backend) {
    if (m.backend_gauge != nullptr) m.engine_info->Remove(m.backend_gauge);
    m.backend_gauge = nullptr;
    m.backend = stats.backend;
    if (!m.backend.empty()) {
      m.backend_gauge = &m.engine_info->Add({{"backend", m.backend}});
      m.backend_gauge->Set(1);
    }
  }

  const Clock::time_point t = m.options.clock();
  m.rate_samples.emplace_back(t, m.generated_tokens->Value());
  m.PruneRate(t);
}

void DaemonMetrics::ObserveResult(bool failed, int64_t prompt_tokens, int64_t completion_tokens) {
  (failed ? impl_->requests_failed : impl_->requests_completed)->Increment();
  if (prompt_tokens > 0) impl_->prompt_tokens->Increment(static_cast<double>(prompt_tokens));
  if (completion_tokens > 0) {
    impl_->completion_tokens->Increment(static_cast<double>(completion_tokens));
  }
}

std::string DaemonMetrics::Render() const {
  return prometheus::TextSerializer().Serialize(impl_->Collect());
}

}  // namespace moebatch
