// The engine's command-line flags (Abseil flags), shared by moebatch-run and moebatchd so both take
// the same options with the same names, defaults and checks (the daemon's --config JSON file sets
// them too):
//   --backend --compute_dtype --kv_dtype --kv_cache_gb --kv_block_size --max_num_seqs
//   --max_tokens_per_pass --cpu_threads --pin_cpu_threads --weights --weight_dtype
//   --synthetic_layers --synthetic_seed --host_memory_gb --gpu_device --gpu_memory_gb
//   --weight_packet_mb --vslpipe --trace_file --profile_token_budget --profile_dir
//   --peak_memory_gbs --peak_tflops --verify_weights --dry_run
// `<program> --help` lists them with their help text.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/engine.h"

namespace moebatch {

// EngineOptions for `model_dir` from the flags' values. InvalidArgument naming the flag and the
// reason for a bad value (e.g. "--weights: must be mapped, host or synthetic, got 'disk'").
absl::StatusOr<EngineOptions> EngineOptionsFromFlags(const std::string& model_dir);

// --dry_run: the program prints the engine's plan (PrintDryRun) and exits instead of loading.
bool DryRunRequested();
// Prints Engine::Plan(options) to stdout; its errors otherwise.
absl::Status PrintDryRun(const EngineOptions& options);

// Makes --help list the program's own flags (files ending in _main.cc) and these; call before
// absl::ParseCommandLine.
void ShowEngineFlagsInHelp();

}  // namespace moebatch
