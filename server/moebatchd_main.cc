// moebatchd: the batch-job daemon.
//
//   moebatchd --model DIR --listen HOST:PORT --data-dir DIR [--config FILE] [flags]
//
// Loads the model, opens the job store (SQLite under --data-dir), queues again whatever an earlier
// run left unfinished, and serves moebatch.v1.BatchService, grpc.health.v1 and server reflection.
// SIGINT/SIGTERM stop it: in-flight calls end, the engine thread stops; unfinished requests stay
// pending in the store for the next start. Flags may be spelt with dashes or underscores. --config
// names a JSON object of flag values ({"kv_cache_gb": 8, "listen": "0.0.0.0:50051"}; keys starting
// with # are comments, as in deploy/moebatchd.json); flags given on the command line win over it.
// Under systemd (Type=notify) it reports READY, STOPPING and watchdog pings (systemd_notify.h).
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/engine_flags.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "nlohmann/json.hpp"
#include "server/batch_service.h"
#include "server/engine_worker.h"
#include "server/job_store.h"
#include "server/systemd_notify.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "",
          "Hugging Face model directory (config.json, safetensors, "
          "tokenizer.model)");
ABSL_FLAG(std::string, model_name, "", "the model's name in the API (default: the directory name)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address HOST:PORT");
ABSL_FLAG(std::string, data_dir, "", "directory of the job store (moebatch.db)");
ABSL_FLAG(std::string, config, "", "JSON file of flag values; the command line overrides it");
ABSL_FLAG(int64_t, max_in_flight, 512, "requests handed to the engine at once");
ABSL_FLAG(int32_t, default_max_tokens, 256, "max_tokens for requests that give none");
ABSL_FLAG(int64_t, max_requests_per_job, 100000, "requests per job at most");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error|off");

namespace moebatch {
namespace {

// "--data-dir=x" -> "--data_dir=x": absl flags are spelt with underscores.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv, std::set<std::string>* given) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && a.rfind("--", 0) == 0 && a.size() > 2) {
      const size_t end = a.find('=') == std::string::npos ? a.size() : a.find('=');
      for (size_t c = 2; c < end; ++c) {
        if (a[c] == '-') a[c] = '_';
      }
      std::string name = a.substr(2, end - 2);
      if (name.rfind("no", 0) == 0 && absl::FindCommandLineFlag(name) == nullptr) {
        name = name.substr(2);  // --nofoo
      }
      given->insert(name);
    }
    args.push_back(std::move(a));
  }
  return args;
}

absl::Status ApplyConfigFile(const std::string& path, const std::set<std::string>& given) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--config: cannot read ", path));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("--config ", path, ": not a JSON object"));
  }
  for (const auto& [key, value] : j.items()) {
    std::string name = key;
    for (char& c : name) c = c == '-' ? '_' : c;
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

// SIGINT and SIGTERM, blocked in every thread (main blocks them before any thread starts); the
// stopper thread waits for them with sigwait.
sigset_t StopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

int Run(const std::set<std::string>& given) {
  const sigset_t signals = StopSignals();
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
  if (model_dir.empty() || data_dir.empty()) {
    std::cerr << "moebatchd: --model and --data-dir are required (see --help)\n";
    return 2;
  }
  auto options = EngineOptionsFromFlags(model_dir);
  if (!options.ok()) {
    std::cerr << "moebatchd: " << options.status().message() << "\n";
    return 2;
  }

  auto store = JobStore::Open(data_dir);
  if (!store.ok()) {
    std::cerr << "moebatchd: job store: " << store.status() << "\n";
    return 1;
  }
  if (options->profile_dir.empty()) options->profile_dir = data_dir;
  auto engine = Engine::Create(*options);
  if (!engine.ok()) {
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
    limits.model_name = std::filesystem::path(model_dir).lexically_normal().filename().string();
    if (limits.model_name.empty()) {
      limits.model_name =
          std::filesystem::path(model_dir).lexically_normal().parent_path().filename().string();
    }
  }
  limits.default_max_tokens = absl::GetFlag(FLAGS_default_max_tokens);
  limits.max_requests_per_job = absl::GetFlag(FLAGS_max_requests_per_job);
  limits.max_context_tokens = (*engine)->max_context_tokens();

  EngineWorker worker(engine->get(), store->get(),
                      WorkerOptions{absl::GetFlag(FLAGS_max_in_flight)});
  BatchServiceImpl service(store->get(), &worker, &(*engine)->tokenizer(), limits);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(256 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "moebatchd: cannot listen on " << absl::GetFlag(FLAGS_listen) << "\n";
    return 1;
  }
  worker.Start();
  spdlog::info("moebatchd: serving model '{}' on {} (port {}), data in {}", limits.model_name,
               absl::GetFlag(FLAGS_listen), port, data_dir);
  NotifyReady(absl::StrCat("serving ", limits.model_name, " on ", absl::GetFlag(FLAGS_listen)));
  // systemd's watchdog (WatchdogSec): pinged while the engine thread keeps looping and is healthy.
  WatchdogPinger watchdog([&worker](std::chrono::microseconds interval) {
    return worker.health().ok() && std::chrono::steady_clock::now() - worker.last_loop() < interval;
  });

  std::thread stopper([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("moebatchd: signal {}, stopping", sig);
    NotifyStopping(absl::StrCat("stopping on signal ", sig));
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  });
  server->Wait();
  worker.Stop();
  stopper.join();
  spdlog::info("moebatchd: stopped");
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  const sigset_t signals = moebatch::StopSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before OpenMP, gRPC or the engine start threads
  absl::SetProgramUsageMessage(
      "moebatchd --model DIR --listen HOST:PORT --data-dir DIR [--config FILE] [flags]");
  moebatch::ShowEngineFlagsInHelp();
  std::set<std::string> given;
  std::vector<std::string> args = moebatch::NormalizeFlagNames(argc, argv, &given);
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(ptrs.size()), ptrs.data());
  return moebatch::Run(given);
}
