// moebatchd: the batch-job daemon.
//
//   moebatchd --model DIR|FILE.gguf --listen HOST:PORT --data-dir DIR [--config FILE] [flags]
//
// Opens the job store (SQLite under --data-dir), starts serving (grpc.health.v1 NOT_SERVING while
// the model loads), loads the model, queues again whatever an earlier run left unfinished, and
// serves moebatch.v1.BatchService, grpc.health.v1 (SERVING once loaded) and server reflection.
//
// Authentication (server/auth.h): with --tokens_file every call needs a bearer token of a tenant;
// without one, authentication is off and it listens on loopback only. TLS with --tls_cert and
// --tls_key (and --tls_client_ca to require client certificates). Limits: --max_request_bytes
// (RESOURCE_EXHAUSTED from gRPC), --max_requests_per_job and --max_tokens_per_request
// (INVALID_ARGUMENT), --max_pending_jobs_per_tenant and --max_queued_tokens_per_tenant
// (RESOURCE_EXHAUSTED).
//
// Signals: SIGTERM/SIGINT drain: no new jobs (UNAVAILABLE), in-flight sequences finish and commit
// for up to --drain_timeout_s, then the server stops and it exits 0; whatever did not finish stays
// pending in the store and runs on the next start. SIGHUP reloads the tokens file (a bad file is
// logged and the old tokens stay). Flags may be spelt with dashes or underscores. --config
// names a JSON object of flag values ({"kv_cache_gb": 8, "listen": "0.0.0.0:50051"}; keys starting
// with # are comments, as in deploy/moebatchd.json); flags given on the command line win over it.
// Under systemd (Type=notify) it reports READY, STOPPING and watchdog pings (systemd_notify.h).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "engine/engine.h"
#include "engine/tools/engine_flags.h"
#include "engine/tools/program_flags.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "nlohmann/json.hpp"
#include "server/auth.h"
#include "server/batch_service.h"
#include "server/engine_worker.h"
#include "server/file_store.h"
#include "server/http_api.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/startup_checks.h"
#include "server/systemd_notify.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "",
          "the model: a Hugging Face directory (config.json, *.safetensors, tokenizer.json or "
          "tokenizer.model) or a GGUF file (llama.cpp's format: Q4_K, Q8_0, ... kept quantized)");
ABSL_FLAG(
    std::string, model_name, "",
    "the model's name in the API (default: the directory name, or the GGUF file's without .gguf)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address HOST:PORT");
ABSL_FLAG(std::string, data_dir, "", "directory of the job store (moebatch.db)");
ABSL_FLAG(std::string, config, "", "JSON file of flag values; the command line overrides it");
ABSL_FLAG(int64_t, max_in_flight, 0,
          "requests handed to the engine at once (0: twice the sequences the engine decodes per "
          "pass, so that its scheduler always has requests to admit)");
ABSL_FLAG(int32_t, default_max_tokens, 256, "max_tokens for requests that give none");
ABSL_FLAG(int64_t, max_requests_per_job, 100000, "requests per job at most");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error|off");
ABSL_FLAG(std::string, tokens_file, "",
          "JSON file of SHA-256 token digests -> tenant, role (server/auth.h; make entries with "
          "moebatch-token). Empty: no authentication, loopback only");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate chain (TLS when set with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: clients must present a certificate it signed (mutual TLS)");
ABSL_FLAG(int32_t, tls_reload_s, 60,
          "seconds between checks of the TLS files for renewed certificates (read again without a "
          "restart)");
ABSL_FLAG(int64_t, max_request_bytes, 64 << 20,
          "largest gRPC message accepted (a CreateJob payload), bytes; RESOURCE_EXHAUSTED above");
ABSL_FLAG(int32_t, max_tokens_per_request, 0,
          "max_tokens of one request at most (0: only the context length limits it)");
ABSL_FLAG(int64_t, max_pending_jobs_per_tenant, 0, "unfinished jobs per tenant at most (0: none)");
ABSL_FLAG(int64_t, max_queued_tokens_per_tenant, 0,
          "prompt + max_tokens of a tenant's requests without a result, at most (0: none)");
ABSL_FLAG(std::string, http_listen, "",
          "OpenAI Files and Batches API over HTTP on HOST:PORT (HTTPS with --tls_cert/--tls_key; "
          "docs/api.md); empty: off");
ABSL_FLAG(int32_t, http_threads, 8, "HTTP API worker threads (each serves one connection)");
ABSL_FLAG(int64_t, max_upload_bytes, int64_t{512} << 20,
          "an uploaded file (POST /v1/files) at most, bytes (413 beyond)");
ABSL_FLAG(double, retention_days, 30,
          "finished jobs (with their results) and uploaded files older than this many days are "
          "deleted; 0: kept until deleted");
ABSL_FLAG(bool, check_model, false,
          "refuse request lines whose body.model is not the daemon's model name (default: any "
          "body.model is accepted, as OpenAI batch files name OpenAI's models)");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT of the Prometheus endpoint (GET /metrics; server/metrics.h); empty: off");
ABSL_FLAG(int64_t, max_streams, 256,
          "WatchJob and GetResults streams open at once, at most; each holds a server thread "
          "while it waits; one more gets RESOURCE_EXHAUSTED. The server's threads are capped at "
          "this plus 64 for the other calls");
ABSL_FLAG(double, drain_timeout_s, 60,
          "on SIGTERM, seconds to let in-flight sequences finish before stopping");

namespace moebatch {
namespace {

absl::Status ApplyConfigFile(const std::string& path, const std::set<std::string>& given) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--config: cannot read ", path));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("--config ", path, ": not a JSON object"));
  }
  for (const auto& [key, value] : j.items()) {
    const std::string name = FlagNameWithUnderscores(key);  // "kv-cache-gb" or "kv_cache_gb"
    if (given.count(name) != 0 || name == "config" || name.rfind('#', 0) == 0) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--config ", path, ": unknown flag '", key, "'"));
    }
    const std::string text = value.is_string() ? value.get<std::string>() : value.dump();
    std::string error;
    if (!flag->ParseFrom(text, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--config ", path, ": ", key, ": ", error));
    }
  }
  return absl::OkStatus();
}

// SIGINT, SIGTERM and SIGHUP, blocked in every thread (main blocks them before any thread
// starts); the signal thread waits for them with sigwait.
sigset_t HandledSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  return signals;
}

// Whether `listen` (HOST:PORT, [V6]:PORT or unix:PATH) reaches this host only.
bool IsLoopbackAddress(const std::string& listen) {
  if (listen.rfind("unix:", 0) == 0) return true;
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, ": cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Insecure, or TLS from --tls_cert / --tls_key (client certificates required and verified when
// --tls_client_ca is given). gRPC's file-watcher provider reads the files again every
// --tls_reload_s seconds, so renewed certificates take effect without a restart (replace the files
// by rename, so that it never sees a certificate beside the old key). The files are read once here
// too, so that a missing one stops the start with the flag named.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials() {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert), key = absl::GetFlag(FLAGS_tls_key),
                    ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (cert.empty() && key.empty()) {
    if (!ca.empty())
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    return grpc::InsecureServerCredentials();
  }
  if (cert.empty() || key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  const int reload_s = absl::GetFlag(FLAGS_tls_reload_s);
  if (reload_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_reload_s: must be at least 1 second, got ", reload_s));
  }
  std::map<std::string, std::string> pems;
  for (const auto& [flag, path] :
       {std::pair{"tls_cert", cert}, std::pair{"tls_key", key}, std::pair{"tls_client_ca", ca}}) {
    if (path.empty()) continue;
    auto pem = ReadFile(flag, path);
    if (!pem.ok()) return pem.status();
    if (pem->find("-----BEGIN") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", path, " is not PEM"));
    }
    pems[flag] = *std::move(pem);
  }
  // The pair and its dates now: gRPC would otherwise start, log the key error and fail every
  // handshake while reporting SERVING.
  if (absl::Status st = CheckServerCertificate(pems["tls_cert"], pems["tls_key"]); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(st.message(), " (", cert, ", ", key, ")"));
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      key, cert, ca, static_cast<unsigned int>(reload_s));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

int Run(const std::set<std::string>& given) {
  const sigset_t signals = HandledSignals();
  if (const std::string config = absl::GetFlag(FLAGS_config); !config.empty()) {
    if (auto st = ApplyConfigFile(config, given); !st.ok()) {
      std::cerr << "moebatchd: " << st.message() << "\n";
      return 2;
    }
  }
  spdlog::set_default_logger(spdlog::stderr_color_mt("moebatchd"));
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  const std::string listen = absl::GetFlag(FLAGS_listen);
  if (DryRunRequested() && !model_dir.empty()) {  // the plan from config.json; nothing is loaded
    auto options = EngineOptionsFromFlags(model_dir);
    absl::Status st = options.ok() ? PrintDryRun(*options) : options.status();
    if (!st.ok()) std::cerr << "moebatchd: " << st.message() << "\n";
    return st.ok() ? 0 : 1;
  }
  if (model_dir.empty() || data_dir.empty()) {
    std::cerr << "moebatchd: --model and --data-dir are required (see --help)\n";
    return 2;
  }
  auto options = EngineOptionsFromFlags(model_dir);
  if (!options.ok()) {
    std::cerr << "moebatchd: " << options.status().message() << "\n";
    return 2;
  }
  for (const auto& [name, value] :
       {std::pair<const char*, int64_t>{"max_request_bytes",
                                        absl::GetFlag(FLAGS_max_request_bytes)},
        {"max_requests_per_job", absl::GetFlag(FLAGS_max_requests_per_job)}}) {
    if (value < 1 || (std::string(name) == "max_request_bytes" && value > INT32_MAX)) {
      std::cerr << "moebatchd: --" << name << " must be in [1, " << INT32_MAX << "], got " << value
                << "\n";
      return 2;
    }
  }
  if (absl::GetFlag(FLAGS_max_in_flight) < 0) {
    std::cerr << "moebatchd: --max_in_flight must be >= 0 (0: automatic), got "
              << absl::GetFlag(FLAGS_max_in_flight) << "\n";
    return 2;
  }
  const std::string http_listen = absl::GetFlag(FLAGS_http_listen);
  const double retention_days = absl::GetFlag(FLAGS_retention_days);
  if (absl::GetFlag(FLAGS_http_threads) < 1 || absl::GetFlag(FLAGS_http_threads) > 1024 ||
      absl::GetFlag(FLAGS_max_upload_bytes) < 1 || !(retention_days >= 0)) {
    std::cerr << "moebatchd: --http_threads must be in [1, 1024], --max_upload_bytes at least 1, "
                 "--retention_days at least 0\n";
    return 2;
  }
  const int64_t max_streams = absl::GetFlag(FLAGS_max_streams);
  if (max_streams < 1 || max_streams > 100000) {
    std::cerr << "moebatchd: --max_streams must be in [1, 100000], got " << max_streams << "\n";
    return 2;
  }
  const int32_t max_tokens_per_request = absl::GetFlag(FLAGS_max_tokens_per_request);
  if (max_tokens_per_request < 0 || absl::GetFlag(FLAGS_max_pending_jobs_per_tenant) < 0 ||
      absl::GetFlag(FLAGS_max_queued_tokens_per_tenant) < 0 ||
      !(absl::GetFlag(FLAGS_drain_timeout_s) >= 0)) {
    std::cerr << "moebatchd: --max_tokens_per_request, --max_pending_jobs_per_tenant, "
                 "--max_queued_tokens_per_tenant and --drain_timeout_s must be >= 0\n";
    return 2;
  }
  if (max_tokens_per_request > 0 &&
      absl::GetFlag(FLAGS_default_max_tokens) > max_tokens_per_request) {
    std::cerr << "moebatchd: --default_max_tokens " << absl::GetFlag(FLAGS_default_max_tokens)
              << " is over --max_tokens_per_request " << max_tokens_per_request << "\n";
    return 2;
  }

  // Authentication: a tokens file, or loopback only.
  std::unique_ptr<TokenAuthenticator> auth;
  if (const std::string tokens = absl::GetFlag(FLAGS_tokens_file); !tokens.empty()) {
    auto loaded = TokenAuthenticator::Load(tokens);
    if (!loaded.ok()) {
      std::cerr << "moebatchd: " << loaded.status().message() << "\n";
      return 2;
    }
    auth = *std::move(loaded);
    spdlog::info("moebatchd: authentication on: {} tokens from {}", auth->size(), tokens);
  } else if (!http_listen.empty() && !IsLoopbackAddress(http_listen)) {
    std::cerr << "moebatchd: no --tokens_file, so authentication is off and moebatchd listens on "
                 "loopback only; --http_listen "
              << http_listen << " is not a loopback address\n";
    return 2;
  } else if (!IsLoopbackAddress(listen)) {
    std::cerr << "moebatchd: no --tokens_file, so authentication is off and moebatchd listens on "
                 "loopback only; --listen "
              << listen << " is not a loopback address (give --tokens_file, or listen on "
              << "127.0.0.1, [::1] or localhost)\n";
    return 2;
  } else {
    spdlog::warn(
        "moebatchd: no --tokens_file: authentication is off, every caller is the admin "
        "tenant 'local'; listening on loopback only ({})",
        listen);
  }
  auto credentials = ServerCredentials();
  if (!credentials.ok()) {
    std::cerr << "moebatchd: " << credentials.status().message() << "\n";
    return 2;
  }

  // One daemon per data dir: a second one would run the first one's pending requests too.
  auto data_dir_lock = DataDirLock::Acquire(data_dir);
  if (!data_dir_lock.ok()) {
    std::cerr << "moebatchd: " << data_dir_lock.status().message() << "\n";
    return 1;
  }
  auto store = JobStore::Open(data_dir);
  if (!store.ok()) {
    std::cerr << "moebatchd: job store: " << store.status() << "\n";
    return 1;
  }
  auto files = FileStore::Open(data_dir);
  if (!files.ok()) {
    std::cerr << "moebatchd: file store: " << files.status() << "\n";
    return 1;
  }

  // Metrics from now on (moebatch_ready 0 while loading). Declared after the store, which its
  // scrape hook reads, and before the worker, which feeds it: destroyed in between.
  std::unique_ptr<DaemonMetrics> metrics;
  if (const std::string address = absl::GetFlag(FLAGS_metrics_listen); !address.empty()) {
    auto created = DaemonMetrics::Create(address);
    if (!created.ok()) {
      std::cerr << "moebatchd: --metrics_listen: " << created.status().message() << "\n";
      return 2;
    }
    metrics = *std::move(created);
    JobStore* job_store = store->get();
    DaemonMetrics* m = metrics.get();
    metrics->SetScrapeHook([job_store, m] {
      if (auto counts = job_store->CountJobsByState(); counts.ok()) m->SetJobCounts(*counts);
    });
    spdlog::info("moebatchd: metrics on http://{}/metrics", address);
  }

  // Serve first (health NOT_SERVING, the BatchService UNAVAILABLE) while the model loads.
  BatchServiceImpl service(store->get(), auth.get());
  service.set_max_streams(max_streams);
  if (metrics != nullptr) {
    // Requests that failed validation against the context are results at once.
    service.set_on_job_created([m = metrics.get()](const JobRecord& job) {
      for (int64_t i = 0; i < job.failed; ++i) m->ObserveResult(true, 0, 0);
    });
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  // Without SO_REUSEPORT (gRPC's default sets it): a second daemon on a port in use must fail
  // here, not share the port and split the clients between two job stores.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen, *credentials, &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(absl::GetFlag(FLAGS_max_request_bytes)));
  // The sync server's threads, capped: streams beyond --max_streams are refused before they
  // wait, so the other 64 stay for unary calls.
  grpc::ResourceQuota thread_quota("moebatchd");
  thread_quota.SetMaxThreads(static_cast<int>(max_streams + 64));
  builder.SetResourceQuota(thread_quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "moebatchd: --listen " << listen
              << ": cannot listen there (the port is in use, or the address is not this host's)\n";
    return 1;
  }
  // The OpenAI HTTP API on the same service (its batches are jobs), same TLS files.
  HttpApiOptions http_options;
  http_options.max_upload_bytes = absl::GetFlag(FLAGS_max_upload_bytes);
  http_options.started_at = static_cast<int64_t>(std::time(nullptr));
  OpenAiHttpApi http_api(&service, store->get(), files->get(), auth.get(), http_options);
  if (!http_listen.empty()) {
    HttpEndpointOptions endpoint;
    endpoint.label = "http";
    endpoint.threads = absl::GetFlag(FLAGS_http_threads);
    endpoint.tls_cert = absl::GetFlag(FLAGS_tls_cert);
    endpoint.tls_key = absl::GetFlag(FLAGS_tls_key);
    endpoint.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
    if (absl::Status st = http_api.Start(http_listen, endpoint); !st.ok()) {
      server->Shutdown(std::chrono::system_clock::now());
      server->Wait();
      std::cerr << "moebatchd: --http_listen: " << st.message() << "\n";
      return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    spdlog::info("moebatchd: OpenAI API on {}://{} (port {})",
                 endpoint.tls_cert.empty() ? "http" : "https", http_listen, http_api.port());
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  const std::string kServiceName = v1::BatchService::service_full_name();
  auto set_serving = [&](bool serving) {
    health->SetServingStatus(serving);
    health->SetServingStatus(kServiceName, serving);
    if (metrics != nullptr) metrics->SetReady(serving);
  };
  set_serving(false);
  spdlog::info("moebatchd: listening on {} (port {}, {}), loading {}", listen, port,
               absl::GetFlag(FLAGS_tls_cert).empty() ? "plaintext" : "TLS", model_dir);
  NotifyStatus(absl::StrCat("loading ", model_dir));

  // The signal thread: SIGHUP reloads the tokens file; the first SIGTERM/SIGINT starts the stop.
  std::atomic<bool> stopping{false};
  std::atomic<bool> self_stop{false};  // the daemon stops itself (a failed load), no signal came
  absl::Notification stop_requested;
  std::thread signal_thread([&] {
    for (;;) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0) continue;
      if (sig == SIGHUP) {
        if (auth == nullptr) {
          spdlog::info("moebatchd: SIGHUP: no --tokens_file to reload");
        } else if (absl::Status st = auth->Reload(); st.ok()) {
          spdlog::info("moebatchd: SIGHUP: reloaded {} tokens from {}", auth->size(), auth->path());
        } else {
          spdlog::error("moebatchd: SIGHUP: {}; keeping the {} tokens loaded before",
                        std::string(st.message()), auth->size());
        }
        continue;
      }
      if (!self_stop) spdlog::info("moebatchd: signal {}, stopping", sig);
      stopping = true;
      stop_requested.Notify();
      return;
    }
  });
  // A watchdog ping while loading too: a checkpoint of tens of GB takes minutes.
  std::atomic<EngineWorker*> live_worker{nullptr};
  WatchdogPinger watchdog([&live_worker](std::chrono::microseconds interval) {
    EngineWorker* w = live_worker.load();
    if (w == nullptr) return true;  // loading
    return w->health().ok() && std::chrono::steady_clock::now() - w->last_loop() < interval;
  });

  if (options->schedule.profile_dir.empty()) options->schedule.profile_dir = data_dir;
  auto engine = Engine::Create(*options);
  if (!engine.ok()) {
    server->Shutdown(std::chrono::system_clock::now());
    server->Wait();
    self_stop = true;
    ::kill(::getpid(), SIGTERM);  // pending until the signal thread takes it and returns
    signal_thread.join();
    // The reason, last.
    spdlog::error("moebatchd: cannot load model: {}", engine.status().ToString());
    std::cerr << "moebatchd: cannot load model: " << engine.status() << "\n";
    return 1;
  }
  // A cancellation an earlier run did not finish.
  if (auto cancelling = (*store)->JobsInState(JobState::kCancelling); cancelling.ok()) {
    for (const std::string& job : *cancelling)
      (void)(*store)->SetJobState(job, JobState::kCancelled);
  }

  JobLimits limits;
  limits.model_name = absl::GetFlag(FLAGS_model_name);
  if (limits.model_name.empty()) {
    const std::filesystem::path path = std::filesystem::path(model_dir).lexically_normal();
    // A GGUF file: its name without ".gguf".
    limits.model_name = (path.extension() == ".gguf" ? path.stem() : path.filename()).string();
    if (limits.model_name.empty()) {
      limits.model_name =
          std::filesystem::path(model_dir).lexically_normal().parent_path().filename().string();
    }
  }
  limits.default_max_tokens = absl::GetFlag(FLAGS_default_max_tokens);
  limits.max_requests_per_job = absl::GetFlag(FLAGS_max_requests_per_job);
  limits.max_tokens_per_request = max_tokens_per_request;
  limits.max_context_tokens = (*engine)->max_context_tokens();
  limits.vocab_size = (*engine)->config().vocab_size;
  limits.check_model = absl::GetFlag(FLAGS_check_model);
  limits.max_choices = (*engine)->max_choices();
  TenantQuota quota;
  quota.max_pending_jobs = absl::GetFlag(FLAGS_max_pending_jobs_per_tenant);
  quota.max_queued_tokens = absl::GetFlag(FLAGS_max_queued_tokens_per_tenant);

  int64_t max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  if (max_in_flight == 0) max_in_flight = 2 * (*engine)->max_sequences_per_pass();
  spdlog::info("moebatchd: at most {} requests in the engine at once{}", max_in_flight,
               absl::GetFlag(FLAGS_max_in_flight) == 0 ? " (--max_in_flight 0: automatic)" : "");
  EngineWorker worker(engine->get(), store->get(), WorkerOptions{max_in_flight, metrics.get()});
  worker.Start();
  live_worker = &worker;
  service.Attach(&worker, &(*engine)->tokenizer(), limits, quota);
  if (!stopping) set_serving(true);
  spdlog::info("moebatchd: serving model '{}' on {} (port {}), data in {}", limits.model_name,
               listen, port, data_dir);
  NotifyReady(absl::StrCat("serving ", limits.model_name, " on ", listen));

  // Health follows the job store and the engine: NOT_SERVING while the store refuses writes (the
  // disk full, a damaged file; the worker holds its results meanwhile) or the engine has failed,
  // SERVING again once they recover. Checked every second until the stop.
  // Retention runs there too, at start and every 10 minutes, and jobs past their completion window
  // expire (checked every second).
  std::thread health_monitor([&] {
    bool serving = !stopping;
    std::chrono::steady_clock::time_point next_retention{};
    std::set<std::string> expiring;  // handed to the worker
    while (!stop_requested.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      if (auto due = (*store)->JobsToExpire(static_cast<int64_t>(std::time(nullptr))); due.ok()) {
        for (const std::string& job : *due) {
          if (!expiring.insert(job).second) continue;
          spdlog::info("job {}: its completion window passed; expiring it", job);
          worker.Cancel(job, JobState::kExpired);
        }
      }
      if (retention_days > 0 && std::chrono::steady_clock::now() >= next_retention) {
        next_retention = std::chrono::steady_clock::now() + std::chrono::minutes(10);
        const int64_t cutoff =
            static_cast<int64_t>(std::time(nullptr)) - static_cast<int64_t>(retention_days * 86400);
        auto jobs = (*store)->DeleteJobsFinishedBefore(cutoff);
        auto old_files = (*files)->DeleteCreatedBefore(cutoff);
        if (!jobs.ok() || !old_files.ok()) {
          spdlog::warn("moebatchd: retention: {} {}", jobs.status().ToString(),
                       old_files.status().ToString());
        } else if (*jobs > 0 || *old_files > 0) {
          spdlog::info("moebatchd: retention: deleted {} jobs and {} files older than {} days",
                       *jobs, *old_files, retention_days);
        }
      }
      absl::Status st = (*store)->health();
      if (!st.ok()) st = (*store)->ProbeWrite();  // space again? (a write sets health)
      if (st.ok()) st = worker.health();
      if (st.ok() != serving) {
        serving = st.ok();
        set_serving(serving);
        if (serving) {
          spdlog::info("moebatchd: SERVING again");
        } else {
          spdlog::error("moebatchd: NOT_SERVING: {}", st.ToString());
        }
      }
    }
  });

  // Graceful stop: no new jobs, in-flight sequences finish (up to the timeout) and commit.
  stop_requested.WaitForNotification();
  health_monitor.join();
  NotifyStopping("draining");
  service.StopAccepting();
  set_serving(false);
  const double drain_s = absl::GetFlag(FLAGS_drain_timeout_s);
  spdlog::info("moebatchd: draining: in-flight requests finish within {} s; no new jobs", drain_s);
  const int64_t left = worker.Drain(absl::Seconds(drain_s));
  if (left == 0) {
    spdlog::info("moebatchd: drained: every in-flight request committed");
  } else {
    spdlog::warn(
        "moebatchd: {} requests still in flight after {} s; they run again on the next "
        "start",
        left, drain_s);
  }
  // Open streams (WatchJob, GetResults with wait) end now; unary calls get a moment to finish.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  http_api.Stop();
  worker.Stop();
  live_worker = nullptr;
  signal_thread.join();
  if (metrics != nullptr) metrics->SetScrapeHook(nullptr);
  spdlog::info("moebatchd: stopped");
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  const sigset_t signals = moebatch::HandledSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before OpenMP, gRPC or the engine start threads
  moebatch::ShowEngineFlagsInHelp();
  std::set<std::string> given;
  moebatch::ParseProgramFlags(
      argc, argv,
      "moebatchd --model DIR|FILE.gguf --listen HOST:PORT --data-dir DIR [--config FILE] [flags]",
      &given);
  return moebatch::Run(given);
}
