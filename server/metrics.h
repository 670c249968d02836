// The daemon's Prometheus endpoint: a text exposition at http://<listen>/metrics, the
// registry of prometheus-cpp's core serialized by its TextSerializer and served by cpp-httplib on
// threads of default stack size (std::thread). Not civetweb (prometheus-cpp's Exposer): it creates
// its threads with a fixed ~100 KB stack, and glibc refuses a stack smaller than the process's
// static TLS, which cuBLAS alone makes ~100 KB, so in moebatchd it could not start at all. No gRPC
// and no engine code here: the engine's cumulative EngineStats are turned into counters and gauges
// by ObservePass.
//
//   auto metrics = DaemonMetrics::Create("127.0.0.1:9464");   // port 0: any free port (port())
//   metrics->ObservePass(engine->stats());                    // engine thread, after every pass
//   metrics->ObserveResult(/*failed=*/false, prompt, completion);   // each result committed
//   metrics->SetJobCounts(counts);  metrics->SetReady(true);
//
// Metrics (all prefixed moebatch_; units in the names; "last pass" = the newest ObservePass):
//   Daemon
//     moebatch_ready                        gauge    1 when the daemon serves requests, else 0
//     moebatch_jobs{state}                  gauge    jobs in each state (validating, in_progress,
//                                                    finalizing, completed, failed, cancelling,
//                                                    cancelled, expired); as last given to SetJobCounts
//     moebatch_requests_total{outcome}      counter  results committed, by outcome="completed"
//                                                    or "failed"
//     moebatch_prompt_tokens_total          counter  prompt tokens of those results
//     moebatch_completion_tokens_total      counter  generated tokens of those results (usage)
//   Engine (from EngineStats; counters count since this process started, across engine resets)
//     moebatch_engine_info{backend}         gauge    1, labelled with the backend ("cpu", "cuda")
//     moebatch_engine_passes_total          counter  forward passes
//     moebatch_prefill_tokens_total         counter  tokens prefilled (re-prefill after preemption
//                                                    included)
//     moebatch_decode_tokens_total          counter  tokens decoded
//     moebatch_generated_tokens_total       counter  tokens sampled, as they are generated (those
//                                                    of requests later cancelled included)
//     moebatch_preemptions_total            counter  sequences preempted (KV blocks reclaimed)
//     moebatch_forward_seconds_total        counter  wall time inside the model forward
//     moebatch_busy_seconds_total{unit}     counter  forward time inside device calls
//                                                    (unit="device"), the CPU attention task
//                                                    ("cpu_attention"), with weight copies in
//                                                    flight ("weight_transfer"); divide rates by
//                                                    rate(moebatch_forward_seconds_total) for
//                                                    busy fractions over any window
//     moebatch_weight_transfer_bytes_total  counter  weight bytes copied to the device
//     moebatch_pass_duration_seconds        histogram  one observation per pass (forward time)
//     moebatch_tokens_per_second            gauge    generated tokens per second over the last
//                                                    MetricsOptions::rate_window_seconds (computed
//                                                    at scrape time: 0 when the engine is idle)
//     moebatch_busy_fraction{unit}          gauge    last pass: busy seconds / pass seconds, units
//                                                    as above (EngineActivity's fractions, but of
//                                                    the last pass; under VSLPipe device and CPU
//                                                    overlap, so they may sum past 1)
//     moebatch_kv_blocks{state}             gauge    KV cache blocks, state="used"|"free"
//     moebatch_engine_sequences{state}      gauge    sequences in the engine, "waiting"|"running"
//     moebatch_last_pass_tokens             gauge    tokens in the last pass
//     moebatch_last_pass_micro_batches      gauge    its micro-batches (2 when VSLPipe split it)
//     moebatch_sparse_mbu_ratio, moebatch_sparse_mfu_ratio
//                                           gauge    MoE-CAP sparse memory-bandwidth / FLOP
//                                                    utilisation of the last pass, 0..1 (0 when the
//                                                    peak is unknown: --peak_memory_gbs,
//                                                    --peak_tflops)
//     moebatch_achieved_memory_bytes_per_second  gauge  last pass: activated weights + KV read
//     moebatch_achieved_flops_per_second         gauge  last pass
//
// Counters are monotone: ObservePass adds the difference from the previous observation. When any
// cumulative field went down (a new Engine), the new values are taken as counted from zero. When
// several passes happened between two observations, the last pass is observed with its own
// duration and the others with their mean, so the histogram's count and sum still match
// moebatch_engine_passes_total and moebatch_forward_seconds_total.
//
// Threading: every method may be called from any thread (the engine thread, gRPC handlers);
// scrapes run on the HTTP worker threads. The scrape hook runs on those too, before each
// collection.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/job_state.h"

namespace moebatch {

struct EngineStats;

struct MetricsOptions {
  // moebatch_tokens_per_second: generated tokens over this many seconds (fewer while the process
  // is younger), divided by them.
  double rate_window_seconds = 10.0;
  int http_threads = 2;  // HTTP worker threads (each serves one connection at a time)
  // The time source of the rate window; unset: std::chrono::steady_clock::now (tests set it).
  std::function<std::chrono::steady_clock::time_point()> clock;
};

class DaemonMetrics {
 public:
  // Starts the HTTP endpoint on `listen_address`: "HOST:PORT" (an IPv4 address, or a host name,
  // bound to its first IPv4 address), "[IPV6]:PORT" ("[::]:PORT": every IPv6 and IPv4 address) or
  // "PORT" (every IPv4 address); port 0 picks a free port (see port()). Returns once the socket is
  // bound and listening, so a scrape right after works. InvalidArgument for a malformed address
  // (an IPv6 address without brackets included); Unavailable, with the system's reason, when it
  // cannot be bound (address in use, not local, host name not found, ...) or its threads cannot
  // be started.
  static absl::StatusOr<std::unique_ptr<DaemonMetrics>> Create(const std::string& listen_address,
                                                               const MetricsOptions& options = {});
  // Stops the HTTP server first and joins its threads: at once when no scrape is in flight; an
  // idle kept-alive connection holds a worker up to 1 s, a request being read up to 2 s more.
  ~DaemonMetrics();

  DaemonMetrics(const DaemonMetrics&) = delete;
  DaemonMetrics& operator=(const DaemonMetrics&) = delete;

  // The port the endpoint listens on (the bound one when 0 was asked for).
  int port() const;

  void SetReady(bool ready);
  // Jobs per state; states missing from `counts` read 0.
  void SetJobCounts(const std::map<JobState, int64_t>& counts);
  // Called at the start of every scrape (on an HTTP thread), e.g. to SetJobCounts from the store;
  // exceptions it throws are logged and ignored. Pass nullptr to remove (this waits for a running
  // hook, so the hook itself must not call SetScrapeHook). Whatever it uses must outlive this
  // object, or the hook must be removed first.
  void SetScrapeHook(std::function<void()> hook);

  // The engine's cumulative statistics (Engine::stats()), after a pass.
  void ObservePass(const EngineStats& stats);
  // One result committed to the store: its outcome and token usage (negative counts ignored).
  void ObserveResult(bool failed, int64_t prompt_tokens, int64_t completion_tokens);

  // The text exposition /metrics serves (runs the scrape hook too).
  std::string Render() const;

 private:
  struct Impl;
  explicit DaemonMetrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moebatch
