#include "engine/engine_plan.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model/family.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_tensors.h"
#include "engine/model/weight_store.h"

namespace moebatch {
namespace {

std::string MiB(int64_t bytes) { return absl::StrFormat("%.0f MiB", bytes / 1048576.0); }
std::string GiB(int64_t bytes) {
  return bytes >= (int64_t{1} << 30) ? absl::StrFormat("%.2f GiB", bytes / 1073741824.0)
                                     : absl::StrFormat("%.1f MiB", bytes / 1048576.0);
}

}  // namespace

HostFacts ReadHostFacts() { return HostFacts{AvailableHostMemoryBytes()}; }

absl::StatusOr<EnginePlan> MakeEnginePlan(const EngineOptions& options, const ModelConfig& config,
                                          const Backend& backend, const HostFacts& host,
                                          std::optional<int64_t> n_real) {
  if (options.schedule.max_num_seqs < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_num_seqs: must be >= 0 (0: automatic), got ", options.schedule.max_num_seqs));
  }
  if (options.gpu.resident_layers < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_resident_layers: must be >= -1 (-1: automatic), got ", options.gpu.resident_layers));
  }
  if (options.schedule.max_tokens_per_pass < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens_per_pass: must be >= 0 (0: automatic), got ",
                     options.schedule.max_tokens_per_pass));
  }
  if (options.kv.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_block_size: must be positive, got ", options.kv.block_size));
  }
  if (options.weights.synthetic_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic_layers: must be >= 0 (0: all), got ",
                                                   options.weights.synthetic_layers));
  }

  EnginePlan plan;
  plan.backend = std::string(backend.name());
  plan.config = config;
  if (options.weights.source == WeightSource::kSynthetic && options.weights.synthetic_layers > 0) {
    plan.config.num_hidden_layers =
        std::min(options.weights.synthetic_layers, config.num_hidden_layers);
  }
  const ModelConfig& c = plan.config;
  auto device = backend.Plan(options, c);
  if (!device.ok()) {
    return absl::Status(device.status().code(),
                        absl::StrCat("backend ", backend.name(), ": ", device.status().message()));
  }
  plan.device = *std::move(device);

  // The weights' bytes as WeightStore lays them out (engine/model/weight_store.h); mapped weights
  // take the checkpoint's dtype and no alignment (the tensors' bytes). A GGUF file's tensors keep
  // their own types: its bytes are the file's.
  plan.weight_dtype = plan.device.weight_source == WeightSource::kMapped
                          ? c.torch_dtype
                          : plan.device.weight_dtype.value_or(c.torch_dtype);
  const bool mapped = plan.device.weight_source == WeightSource::kMapped;
  const std::optional<WeightQuantization> quantize =
      plan.device.weight_source == WeightSource::kMapped ? std::nullopt : options.weights.quantize;
  int64_t params = 0;
  {
    ModelWeights scratch;
    for (const auto& region : ModelTensors(c, c.num_hidden_layers, &scratch)) {
      for (const TensorSpec& t : region) {
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        params += n;
      }
    }
  }
  if (options.weights.source != WeightSource::kSynthetic && IsGgufFile(options.model_dir)) {
    if (quantize) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight_dtype ", WeightQuantizationName(*quantize), ": ", options.model_dir,
                       " is a GGUF file, whose tensors keep their own types"));
    }
    auto file = GgufFile::Open(options.model_dir);
    if (!file.ok()) return file.status();
    auto bytes = GgufTensorBytes(**file, c);
    if (!bytes.ok()) return bytes.status();
    plan.weight_bytes = bytes->total;
    plan.layer_bytes = bytes->max_layer;
    plan.weight_format = absl::StrCat("GGUF ", bytes->main_type);
  } else {
    plan.weight_bytes = WeightStore::RequiredBytes(c, c.num_hidden_layers, plan.weight_dtype,
                                                   /*alignment=*/mapped ? 1 : 256, quantize);
    plan.layer_bytes = WeightStore::LayerRegionBytes(c, plan.weight_dtype, 256, quantize);
    plan.weight_format = quantize ? absl::StrCat(WeightQuantizationName(*quantize), " (",
                                                 GgmlTypeInfoOf(quantize->type).name,
                                                 ", groups of ", quantize->group_size, ")")
                                  : std::string(DTypeName(plan.weight_dtype));
  }
  plan.weight_bytes_per_param =
      params > 0 ? static_cast<double>(plan.weight_bytes) / static_cast<double>(params) : 2;

  // Tokens per pass and sequences (MoE-Lens §6.2-6.3): the backend's ceiling, lowered to n_real.
  plan.n_real = n_real;
  plan.schedule = SchedulerConfigFor(plan.device.max_tokens_per_pass, options.schedule.max_num_seqs,
                                     n_real, options.kv.block_size);
  plan.vslpipe = options.schedule.vslpipe.value_or(plan.device.vslpipe);

  KvCacheConfig& kv = plan.kv;
  kv.num_layers = c.num_hidden_layers;
  kv.num_kv_heads = c.num_key_value_heads;
  kv.head_dim = c.head_dim;
  kv.value_dim = c.mla ? c.attention_value_dim() : 0;  // MLA: latent rows stored once
  kv.block_size = options.kv.block_size;
  kv.dtype = options.kv.dtype.value_or(options.cpu.compute_dtype);
  SetWindowLayers(c, c.num_hidden_layers, &kv);  // sliding layers keep only their window
  plan.schedule.main_window = kv.group_window(KvGroup::kMain);
  plan.schedule.window = kv.num_groups() == 2 ? kv.group_window(KvGroup::kWindow) : 0;
  // The pass's host buffers at their largest, which grow after the cache is placed: q, k, v and
  // attention output f32 for each micro-batch (either may hold the whole budget) and, for sampled
  // sequences, a logits row per token (the engine's and a micro-batch's copy).
  plan.pass_buffer_bytes =
      plan.schedule.max_tokens_per_pass *
      (2 * (2 * c.q_size() + 2 * c.kv_size()) * int64_t{4} + 2 * c.vocab_size * int64_t{4});
  plan.kv_bytes = options.kv.bytes;
  plan.kv_automatic = options.kv.bytes == 0;
  if (plan.kv_automatic) {
    // MoE-Lens §5.1: fill what host memory is left with KV cache. 90% of what is available with
    // the weights placed, less 1 GiB for everything else and the pass's buffers, or the rest of an
    // explicit host budget once those and the weights are counted.
    const int64_t reserve = (int64_t{1} << 30) + plan.pass_buffer_bytes;
    if (options.host_memory_bytes > 0) {
      plan.host_budget_bytes = options.host_memory_bytes;
      plan.kv_bytes = options.host_memory_bytes - plan.weight_bytes - reserve;
    } else {
      // MemAvailable was read before the weights were placed: copied weights come out of it,
      // mapped ones do not (their pages are the file's, which the kernel may drop).
      const int64_t copied = mapped ? 0 : plan.weight_bytes;
      plan.host_budget_bytes = host.available_memory_bytes;
      plan.kv_bytes = (host.available_memory_bytes - copied) / 10 * 9 - reserve;
    }
  }
  kv.num_blocks = std::max<int64_t>(plan.kv_bytes, 0) / kv.bytes_per_block();
  if (kv.num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache_bytes: ", plan.kv_bytes, " bytes hold no KV block (one block takes ",
        kv.bytes_per_block(), " bytes)",
        plan.kv_automatic ? "; the host memory left after the weights is too small" : ""));
  }
  // A sequence's blocks: its context's in the main table (or, kept to a window, the window's and
  // the one being written: ceil((window - 1) / block_size) + 1), and a window table's beside. One
  // block more keeps a lone sequence's prefill chunks from stalling at a block boundary.
  const int64_t window_blocks =
      kv.window > 0 ? BlocksForTokens(kv.window - 1, kv.block_size) + 1 : 0;
  if (kv.group_window(KvGroup::kMain) > 0) {
    if (kv.num_blocks < window_blocks + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_cache_bytes: ", plan.kv_bytes, " bytes hold ", kv.num_blocks,
          " KV blocks, fewer than one sequence's window of ", kv.window, " tokens takes (",
          window_blocks + 1, " blocks of ", kv.bytes_per_block(), " bytes)"));
    }
    plan.max_context_tokens = c.max_position_embeddings;
  } else {
    const int64_t reserved = kv.num_groups() == 2 ? window_blocks + 1 : 0;
    plan.max_context_tokens = std::min(
        c.max_position_embeddings, std::max<int64_t>(0, kv.num_blocks - reserved) * kv.block_size);
  }
  if (kv.num_groups() == 2 && plan.max_context_tokens < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_bytes: ", plan.kv_bytes, " bytes hold ", kv.num_blocks,
                     " KV blocks: no room for a sequence beside its window table (",
                     window_blocks + 1, " blocks)"));
  }
  return plan;
}

std::string EnginePlan::ToString() const {
  const ModelConfig& c = config;
  std::string out = absl::StrCat("backend       ", backend, ": ", device.device, "\n");
  absl::StrAppend(&out, "model         ", c.architecture, ": ", c.num_hidden_layers,
                  " layers, hidden ", c.hidden_size, ", ", c.num_attention_heads, " heads / ",
                  c.num_key_value_heads, " KV heads x ", c.head_dim, ", ", c.num_local_experts,
                  " experts (top-", c.num_experts_per_tok, "), vocab ", c.vocab_size, "\n");
  absl::StrAppend(&out, "weights       ", WeightSourceName(device.weight_source), ", ",
                  weight_format, device.pinned_weights ? ", page-locked" : "", ": ",
                  GiB(weight_bytes), " (", GiB(layer_bytes), " per layer)\n");
  absl::StrAppend(&out, "compute       ", std::string(DTypeName(device.compute_dtype)), "\n");
  if (device.device_memory_bytes > 0) {
    absl::StrAppend(&out, "device memory ", GiB(device.device_memory_bytes), ", ",
                    device.resident_layers, " resident layers: ", device.device_memory_plan, "\n");
  }
  absl::StrAppend(
      &out, "tokens        ", schedule.max_tokens_per_pass, " per pass",
      n_real ? absl::StrCat(" (n_real ", *n_real, ", ceiling ", device.max_tokens_per_pass, ")")
             : std::string(),
      ", up to ", schedule.max_num_seqs, " sequences, VSLPipe ", vslpipe ? "on" : "off", "\n");
  absl::StrAppend(&out, "KV cache      ", MiB(kv.num_blocks * kv.bytes_per_block()), " ",
                  std::string(DTypeName(kv.dtype)), ": ", kv.num_blocks, " blocks x ",
                  kv.block_size, " tokens (", kv.bytes_per_block(),
                  " bytes per block), max context ", max_context_tokens, " tokens\n");
  if (!kv.window_layers.empty()) {
    absl::StrAppend(
        &out, "KV window     ", kv.num_window_layers(), " of ", kv.num_layers,
        " layers attend the last ", kv.window, " tokens: their blocks behind it are freed",
        kv.num_groups() == 2 ? absl::StrCat(" (a second block table per sequence; ",
                                            kv.num_layer_slots(), " layer slots per block)")
                             : std::string(),
        "\n");
  }
  absl::StrAppend(
      &out, "host memory   ",
      kv_automatic ? absl::StrCat("KV cache from ", GiB(host_budget_bytes), ", ") : std::string(),
      "pass buffers up to ", MiB(pass_buffer_bytes));
  return out;
}

}  // namespace moebatch
