#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cpu_attention/runtime/cpu_threads.h"
#include "cuda/cuda_backend.h"
#include "cuda/device_probe.h"
#include "cpu_attention/backend/cpu_device.h"
#include "engine/offload/gpu_memory_plan.h"
#include "engine/offload/pipeline_profiler.h"
#include "spdlog/spdlog.h"

namespace moebatch {

std::optional<EngineOptions::WeightSource> WeightSourceFromString(std::string_view name) {
  if (name == "mapped") return EngineOptions::WeightSource::kMapped;
  if (name == "host") return EngineOptions::WeightSource::kHostCopy;
  if (name == "synthetic") return EngineOptions::WeightSource::kSynthetic;
  return std::nullopt;
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kNone:
      break;
  }
  return "";
}

struct Engine::Sequence {
  Sequence(int64_t id, GenerationRequest request, const Tokenizer& tokenizer)
      : params(std::move(request.sampling)), sampler(params), detokenizer(tokenizer) {
    slots.id = id;
    prompt_tokens = static_cast<int64_t>(request.prompt_token_ids.size());
    slots.tokens = std::move(request.prompt_token_ids);
    for (const std::string& s : params.stop) max_stop_len = std::max(max_stop_len, s.size());
  }
  SequenceSlots slots;
  SamplingParams params;
  Sampler sampler;
  StreamingDetokenizer detokenizer;
  int64_t prompt_tokens = 0;
  std::string text;    // released by the detokenizer (cut at a stop string when one hits)
  size_t emitted = 0;  // bytes of `text` already returned
  size_t max_stop_len = 0;
  int64_t completion_tokens() const {
    return static_cast<int64_t>(slots.tokens.size()) - prompt_tokens;
  }
};

namespace {

// MoE-Lens §6.3 on the cuda backend: n_real from a one-layer device (weights resident), the
// layer's transfer time from the data mover's first fill. Cached under options.profile_dir.
// nullopt (with a warning) when the timings give no usable line (e.g. a model so small that the
// time does not grow with tokens): the budget stays at the ceiling. Device errors are errors.
absl::StatusOr<std::optional<int64_t>> ProfileTokenBudget(const WeightStore& store,
                                                          const EngineOptions& options,
                                                          const CudaBackendOptions& cuda_options) {
  std::string gpu = "gpu" + std::to_string(options.gpu_device);
  if (auto gpus = ProbeGpus(); gpus.ok()) {
    for (const GpuInfo& g : *gpus) {
      if (g.index == options.gpu_device) gpu = g.name;
    }
  }
  const std::string key = ProfileKey(store.config(), gpu, options.gpu_memory_bytes);
  if (!options.profile_dir.empty()) {
    auto cached = LoadProfile(options.profile_dir, key);
    if (cached.ok()) {
      spdlog::info("pipeline profile {}: n_real {} tokens per pass (cached)", key, cached->n_real);
      return std::optional<int64_t>(cached->n_real);
    }
    if (cached.status().code() != absl::StatusCode::kNotFound) {
      spdlog::warn("{}; profiling again", cached.status().ToString());
    }
  }
  auto one_layer = WeightStore::View(store, 1);
  if (!one_layer.ok()) return one_layer.status();
  auto device = CreateCudaDevice(**one_layer, cuda_options);
  if (!device.ok()) return device.status();
  const int64_t most = cuda_options.max_tokens_per_pass;
  std::vector<int64_t> tokens;
  for (int64_t n = 128; n <= most; n *= 2) tokens.push_back(n);
  if (tokens.size() < 2) tokens = {1, std::max<int64_t>(2, most)};
  PipelineProfile profile;
  auto points = MeasureLayerTimes(**device, tokens, 3);
  if (!points.ok()) return points.status();
  profile.points = *std::move(points);
  auto unusable = [&](const absl::Status& st) {
    spdlog::warn("pipeline profile {}: {}; the token budget stays at the ceiling of {} tokens", key,
                 std::string(st.message()), most);
    return std::optional<int64_t>();
  };
  auto fit = FitLine(profile.points);
  if (!fit.ok()) return unusable(fit.status());
  profile.fit = *fit;
  const DeviceCounters moved = (*device)->counters();
  if (moved.weight_bytes <= 0 || moved.weight_busy_seconds <= 0) {
    return absl::InternalError("pipeline profile: the layer's weights were never copied");
  }
  profile.layer_transfer_seconds = static_cast<double>(store.max_layer_bytes()) /
                                   (moved.weight_bytes / moved.weight_busy_seconds);
  auto n_real = TokensToSaturate(profile.fit, profile.layer_transfer_seconds);
  if (!n_real.ok()) return unusable(n_real.status());
  profile.n_real = *n_real;
  spdlog::info(
      "pipeline profile {}: layer time {:.3f} ms + {:.4f} ms/token (r2 {:.3f}), transfer {:.2f} "
      "ms -> n_real {} tokens per pass",
      key, profile.fit.intercept * 1e3, profile.fit.slope * 1e3, profile.fit.r2,
      profile.layer_transfer_seconds * 1e3, profile.n_real);
  if (!options.profile_dir.empty()) {
    if (auto st = SaveProfile(options.profile_dir, key, profile); !st.ok()) {
      spdlog::warn("{}", st.ToString());
    }
  }
  return std::optional<int64_t>(profile.n_real);
}

}  // namespace

Engine::~Engine() {
  if (trace_ != nullptr) {
    if (absl::Status st = WriteTrace(); !st.ok()) spdlog::warn("{}", st.ToString());
  }
}

absl::Status Engine::WriteTrace() const {
  if (trace_ == nullptr) return absl::FailedPreconditionError("no trace_file was set");
  absl::Status st = trace_->WriteChromeTrace(options_.trace_file);
  if (st.ok()) {
    spdlog::info("trace: {} events written to {}", trace_->size(), options_.trace_file);
  }
  return st;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  // Before anything large is loaded.
  if (options.max_num_seqs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_seqs: must be >= 0 (0: automatic), got ", options.max_num_seqs));
  }
  if (options.gpu_resident_layers < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_resident_layers: must be >= -1 (-1: automatic), got ", options.gpu_resident_layers));
  }
  if (options.max_tokens_per_pass < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_tokens_per_pass: must be >= 0 (0: automatic), got ", options.max_tokens_per_pass));
  }
  std::unique_ptr<Engine> engine(new Engine());
  engine->options_ = options;
  // Bad thread options fail here, at start-up, rather than at the first Step.
  absl::Status threads = CheckCpuThreads(options.cpu_threads, options.pin_cpu_threads);
  if (!threads.ok()) return threads;
  using WeightSource = EngineOptions::WeightSource;
  const bool cuda = options.backend == EngineOptions::Backend::kCuda;
  WeightStoreOptions store_options;
  store_options.dtype = options.weight_dtype;
  EngineOptions::WeightSource weight_source = options.weights;
  if (cuda) {
    store_options.allocator = PinnedHostAllocator();
    if (store_options.allocator == nullptr) return CudaComputeDType(options.gpu_device).status();
    if (!store_options.dtype) {
      auto dtype = CudaComputeDType(options.gpu_device);
      if (!dtype.ok()) return dtype.status();
      store_options.dtype = *dtype;
    }
    if (weight_source == WeightSource::kMapped) weight_source = WeightSource::kHostCopy;
  }
  store_options.host_budget_bytes = options.host_memory_bytes;
  store_options.reserved_bytes = options.kv_cache_bytes;
  const ModelWeights* weights = nullptr;
  if (weight_source == WeightSource::kSynthetic) {
    auto config = LoadModelConfig(options.model_dir);
    if (!config.ok()) return config.status();
    auto store = WeightStore::Synthetic(*config, options.synthetic_layers, options.synthetic_seed,
                                        store_options);
    if (!store.ok()) return store.status();
    engine->weight_store_ = *std::move(store);
  } else {
    auto checkpoint = Checkpoint::Load(options.model_dir);
    if (!checkpoint.ok()) return checkpoint.status();
    engine->checkpoint_ = *std::move(checkpoint);
    if (weight_source == WeightSource::kHostCopy) {
      auto store = WeightStore::Load(*engine->checkpoint_, store_options);
      if (!store.ok()) return store.status();
      engine->weight_store_ = *std::move(store);
    }
  }
  if (engine->weight_store_ != nullptr) {
    weights = &engine->weight_store_->weights();
  } else {
    weights = &engine->checkpoint_->weights();
  }
  const ModelConfig& c = engine->weight_store_ != nullptr ? engine->weight_store_->config()
                                                          : engine->checkpoint_->config();

  auto tokenizer =
      Tokenizer::Load(options.model_dir + "/tokenizer.model", c.bos_token_id, c.eos_token_id);
  if (!tokenizer.ok()) return tokenizer.status();
  engine->tokenizer_ = *std::move(tokenizer);
  if (engine->tokenizer_->vocab_size() > c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.model has ", engine->tokenizer_->vocab_size(),
                     " pieces but config.json vocab_size is ", c.vocab_size));
  }
  spdlog::info("tokenizer: {} pieces, chat layout {}", engine->tokenizer_->vocab_size(),
               ChatFormatName(engine->tokenizer_->chat_format()));

  // Tokens per pass and sequences (MoE-Lens §6.2-6.3; 0: automatic). The cuda backend's ceiling is
  // what its GPU budget holds activations for, lowered to the profiler's n_real; the device is then
  // sized for that budget (no pass exceeds it: engine/scheduler.h), no more.
  int64_t max_tokens = options.max_tokens_per_pass;
  std::optional<int64_t> n_real;
  CudaBackendOptions cuda_options;
  if (cuda) {
    cuda_options.device = options.gpu_device;
    cuda_options.gpu_memory_bytes = options.gpu_memory_bytes;
    cuda_options.packet_bytes = static_cast<size_t>(options.weight_packet_bytes);
    cuda_options.resident_layers = options.gpu_resident_layers;
    // Resolved once, so the profiling device and the engine's plan against the same bytes.
    auto budget = CudaMemoryBudget(cuda_options);
    if (!budget.ok()) return budget.status();
    cuda_options.gpu_memory_bytes = *budget;
    if (max_tokens == 0) {
      // Beside resident layers the user asked for; automatic ones take what the pass leaves.
      const WeightStore& store = *engine->weight_store_;
      const int64_t layer_bytes = static_cast<int64_t>(store.max_layer_bytes());
      max_tokens = AutomaticTokensPerPass(c, store.dtype(), layer_bytes, *budget,
                                          store.num_layers(), options.gpu_resident_layers);
      if (max_tokens < 1) {  // PlanGpuMemory says what does not fit
        const int64_t resident = std::clamp<int64_t>(options.gpu_resident_layers, 0,
                                                     std::max<int64_t>(0, store.num_layers() - 2));
        return PlanGpuMemory(c, store.dtype(), layer_bytes, 1, *budget, resident).status();
      }
    }
    cuda_options.max_tokens_per_pass = max_tokens;
    if (options.profile_token_budget) {
      auto profiled = ProfileTokenBudget(*engine->weight_store_, options, cuda_options);
      if (!profiled.ok()) return profiled.status();
      n_real = *profiled;  // nullopt: no usable profile
    }
  } else if (max_tokens == 0) {
    max_tokens = kCpuTokensPerPass;
  }
  const SchedulerConfig schedule =
      SchedulerConfigFor(max_tokens, options.max_num_seqs, n_real, options.kv_block_size);
  if (cuda) {
    cuda_options.max_tokens_per_pass = schedule.max_tokens_per_pass;
    auto device = CreateCudaDevice(*engine->weight_store_, cuda_options);
    if (!device.ok()) return device.status();
    engine->model_ = std::make_unique<ModelRunner>(
        *std::move(device), ModelRunnerOptions{options.vslpipe.value_or(cuda)});
  } else {
    auto device = CpuDevice::Create(
        c, *weights,
        CpuDeviceOptions{options.compute_dtype, options.widened_weight_budget_bytes,
                         options.batch_invariant});
    if (!device.ok()) return device.status();
    engine->model_ = std::make_unique<ModelRunner>(
        *std::move(device), ModelRunnerOptions{options.vslpipe.value_or(cuda)});
  }

  if (options.kv_block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_block_size: must be positive, got ", options.kv_block_size));
  }
  KvCacheConfig kv;
  kv.num_layers = c.num_hidden_layers;
  kv.num_kv_heads = c.num_key_value_heads;
  kv.head_dim = c.head_dim;
  kv.block_size = options.kv_block_size;
  kv.dtype = options.kv_dtype.value_or(options.compute_dtype);
  int64_t kv_bytes = options.kv_cache_bytes;
  if (kv_bytes == 0) {
    // MoE-Lens §5.1: fill what host memory is left with KV cache. 90% of what is available now
    // (the weights are already placed), less 1 GiB for everything else and the pass's buffers, or
    // the rest of an explicit host budget once those and the weights are counted.
    const int64_t weights_bytes =
        engine->weight_store_ != nullptr
            ? static_cast<int64_t>(engine->weight_store_->total_bytes())
            : static_cast<int64_t>(engine->checkpoint_->store().total_bytes());
    const int64_t available = AvailableHostMemoryBytes();
    // The pass's host buffers at their largest, which grow after the cache is placed: q, k, v and
    // attention output f32 for each micro-batch (either may hold the whole budget) and, for
    // sampled sequences, a logits row per token (the engine's and a micro-batch's copy).
    const int64_t pass_bytes =
        schedule.max_tokens_per_pass *
        (2 * (2 * c.q_size() + 2 * c.kv_size()) * int64_t{4} + 2 * c.vocab_size * int64_t{4});
    const int64_t reserve = (int64_t{1} << 30) + pass_bytes;
    kv_bytes = options.host_memory_bytes > 0 ? options.host_memory_bytes - weights_bytes - reserve
                                             : available / 10 * 9 - reserve;
    spdlog::info(
        "KV cache: {} MiB from the host memory {} ({} MiB available, weights {} MiB, pass buffers "
        "up to {} MiB)",
        std::max<int64_t>(kv_bytes, 0) >> 20,
        options.host_memory_bytes > 0 ? "budget" : "available", available >> 20,
        weights_bytes >> 20, pass_bytes >> 20);
  }
  kv.num_blocks = std::max<int64_t>(kv_bytes, 0) / kv.bytes_per_block();
  if (kv.num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv_cache_bytes: ", options.kv_cache_bytes,
                                                   " bytes hold no KV block (one block takes ",
                                                   kv.bytes_per_block(), " bytes)"));
  }
  auto cache = PagedKvCache::Create(kv);
  if (!cache.ok()) return cache.status();
  engine->cache_ = *std::move(cache);
  engine->allocator_ = std::make_unique<BlockAllocator>(kv.num_blocks);
  engine->scheduler_ = std::make_unique<Scheduler>(schedule, engine->allocator_.get());
  engine->max_context_ = std::min(c.max_position_embeddings, kv.num_blocks * kv.block_size);
  if (!options.trace_file.empty()) {
    engine->trace_ = std::make_unique<PipelineTrace>();
    engine->model_->SetTrace(engine->trace_.get());
  }
  spdlog::info(
      "engine: {} backend, {} layers, {} experts (top-{}), compute {}{}, KV cache {} blocks x {} "
      "tokens ({} MiB, {}), max context {} tokens; {} tokens per pass{}, up to {} sequences",
      engine->model_->device().name(), c.num_hidden_layers, c.num_local_experts,
      c.num_experts_per_tok,
      cuda ? DTypeName(engine->weight_store_->dtype()) : DTypeName(options.compute_dtype),
      cuda ? "" : (options.batch_invariant ? " (batch-invariant)" : " (oneDNN)"), kv.num_blocks,
      kv.block_size, engine->cache_->total_bytes() >> 20, DTypeName(kv.dtype), engine->max_context_,
      schedule.max_tokens_per_pass,
      n_real ? absl::StrCat(" (n_real ", *n_real, ", ceiling ", max_tokens, ")") : std::string(),
      schedule.max_num_seqs);
  return engine;
}

absl::StatusOr<int64_t> Engine::AddRequest(GenerationRequest request) {
  const auto& ids = request.prompt_token_ids;
  if (ids.empty()) return absl::InvalidArgumentError("prompt: must contain at least one token");
  const int64_t vocab = config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt_token_ids[", i, "]: ", ids[i], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (static_cast<int64_t>(ids.size()) >= max_context_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt: ", ids.size(), " tokens leave no room to generate; the context holds at most ",
        max_context_, " tokens"));
  }
  if (auto st = request.sampling.Validate(); !st.ok()) return st;
  const int64_t id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, std::move(request), *tokenizer_);
  scheduler_->Add(&seq->slots);
  sequences_.emplace(id, std::move(seq));
  return id;
}

void Engine::Abort(int64_t request_id) {
  if (sequences_.count(request_id) != 0) aborted_.push_back(request_id);
}

void Engine::Finish(Sequence* seq, FinishReason reason, GenerationOutput* out) {
  out->finished = true;
  out->finish_reason = reason;
  out->completion_tokens = seq->completion_tokens();
  scheduler_->Remove(&seq->slots);  // frees its KV blocks now
  ++stats_.requests_finished;
  sequences_.erase(seq->slots.id);
}

void Engine::AcceptToken(Sequence* seq, int32_t token, GenerationOutput* out) {
  seq->slots.tokens.push_back(token);
  out->new_token_ids.push_back(token);
  ++stats_.generated_tokens;
  FinishReason reason = FinishReason::kNone;
  const bool eos = token == tokenizer_->eos_id() && !seq->params.ignore_eos;
  if (!eos) seq->text += seq->detokenizer.Add(token);
  if (eos) {
    reason = FinishReason::kStop;
  } else if (seq->completion_tokens() >= seq->params.max_tokens ||
             static_cast<int64_t>(seq->slots.tokens.size()) >= max_context_) {
    reason = FinishReason::kLength;
  }
  if (reason != FinishReason::kNone) seq->text += seq->detokenizer.Finish();
  // Stop strings: search the text that could contain a new match (it may straddle old text).
  if (seq->max_stop_len > 0) {
    const size_t from = seq->emitted;  // nothing before `emitted` can start a match (held back)
    size_t cut = std::string::npos;
    for (const std::string& stop : seq->params.stop) {
      cut = std::min(cut, seq->text.find(stop, from));
    }
    if (cut != std::string::npos) {
      seq->text.resize(cut);
      reason = FinishReason::kStop;
    }
  }
  // Release text, holding back a tail that might still become a stop string.
  size_t release = seq->text.size();
  if (reason == FinishReason::kNone && seq->max_stop_len > 1) {
    release =
        seq->text.size() > seq->max_stop_len - 1 ? seq->text.size() - (seq->max_stop_len - 1) : 0;
    release = std::max(release, seq->emitted);
    while (release > seq->emitted && (static_cast<uint8_t>(seq->text[release]) & 0xC0) == 0x80) {
      --release;  // never split a UTF-8 character
    }
  }
  out->new_text.append(seq->text, seq->emitted, release - seq->emitted);
  seq->emitted = release;
  out->completion_tokens = seq->completion_tokens();
  if (reason != FinishReason::kNone) Finish(seq, reason, out);
}

absl::Status Engine::Step(std::vector<GenerationOutput>* outputs) {
  if (cpu_pool_owner_ != std::this_thread::get_id()) {
    absl::Status pool = ConfigureCpuThreads(options_.cpu_threads, options_.pin_cpu_threads);
    if (!pool.ok()) return pool;
    cpu_pool_owner_ = std::this_thread::get_id();
  }
  for (int64_t id : aborted_) {
    auto it = sequences_.find(id);
    if (it == sequences_.end()) continue;
    GenerationOutput out;
    out.request_id = id;
    out.prompt_tokens = it->second->prompt_tokens;
    Finish(it->second.get(), FinishReason::kAborted, &out);
    outputs->push_back(std::move(out));
  }
  aborted_.clear();
  if (!scheduler_->has_work()) return absl::OkStatus();

  SchedulerOutput plan = scheduler_->Schedule();
  stats_.preemptions += static_cast<int64_t>(plan.preempted.size());
  if (plan.empty()) {
    if (!plan.preempted.empty()) return absl::OkStatus();  // freed blocks; the next pass runs
    return absl::InternalError(
        "scheduler made no progress (KV cache too small for the queue head)");
  }

  ForwardBatch batch;
  std::vector<SequenceSlots*> need_logits;
  for (const ScheduledChunk& chunk : plan.chunks) {
    SequenceSlots* s = chunk.seq;
    ForwardSequence fs;
    fs.block_table = &s->block_table;
    fs.token_start = static_cast<int64_t>(batch.token_ids.size());
    fs.num_tokens = chunk.num_tokens;
    fs.context_len = s->num_computed + chunk.num_tokens;
    fs.need_logits = fs.context_len == static_cast<int64_t>(s->tokens.size());
    fs.greedy = fs.need_logits && sequences_.at(s->id)->sampler.greedy();
    batch.token_ids.insert(batch.token_ids.end(), s->tokens.begin() + s->num_computed,
                           s->tokens.begin() + fs.context_len);
    batch.seqs.push_back(fs);
    if (fs.need_logits) need_logits.push_back(s);
  }
  const auto start = std::chrono::steady_clock::now();
  ForwardStats pass;
  if (auto st = model_->Forward(batch, *cache_, &logits_, &pass, &greedy_tokens_); !st.ok()) {
    return st;
  }
  stats_.forward_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats_.device_seconds += pass.device_seconds;
  stats_.cpu_attention_seconds += pass.cpu_attention_seconds;
  stats_.weight_transfer_seconds += pass.weight_transfer_seconds;
  stats_.weight_bytes += pass.weight_bytes;
  stats_.expert_token_pairs += pass.expert_token_pairs;
  stats_.experts_touched += pass.experts_touched;
  stats_.last_pass = pass;
  const double weight_elem = static_cast<double>(DTypeSize(
      weight_store_ != nullptr ? weight_store_->dtype() : checkpoint_->config().torch_dtype));
  stats_.last_utilization = ComputeSparseUtilization(
      config(), weight_elem, static_cast<double>(DTypeSize(cache_->config().dtype)), pass,
      options_.peak_memory_bytes_per_second, options_.peak_flops);
  stats_.activated_bytes +=
      stats_.last_utilization.activated_weight_bytes + stats_.last_utilization.kv_bytes;
  stats_.sparse_flops += stats_.last_utilization.flops;
  ++stats_.passes;
  stats_.prefill_tokens += plan.num_prefill_tokens;
  stats_.decode_tokens += plan.num_decode_tokens;
  scheduler_->Commit(plan);

  // Next tokens: greedy ones came from the device; the others are sampled here, in parallel (each
  // sequence has its own generator and scratch, so the result does not depend on the threads).
  const int64_t vocab = config().vocab_size;
  const int64_t n = static_cast<int64_t>(need_logits.size());
  std::vector<Sequence*> seqs(n);
  std::vector<int64_t> logits_row(n, -1);
  std::vector<int32_t> tokens(n);
  int64_t sampled = 0, greedy = 0;
  for (int64_t i = 0; i < n; ++i) {
    seqs[i] = sequences_.at(need_logits[i]->id).get();
    if (seqs[i]->sampler.greedy()) {
      tokens[i] = greedy_tokens_[greedy++];
    } else {
      logits_row[i] = sampled++;
    }
  }
#pragma omp parallel for schedule(dynamic, 4) if (sampled > 8)
  for (int64_t i = 0; i < n; ++i) {
    if (logits_row[i] < 0) continue;
    tokens[i] = seqs[i]->sampler.Sample(logits_.data() + logits_row[i] * vocab,
                                        static_cast<int32_t>(vocab));
  }
  for (int64_t i = 0; i < n; ++i) {
    GenerationOutput out;
    out.request_id = seqs[i]->slots.id;
    out.prompt_tokens = seqs[i]->prompt_tokens;
    AcceptToken(seqs[i], tokens[i], &out);
    outputs->push_back(std::move(out));
  }
  return absl::OkStatus();
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  s.backend = model_->device().name();
  s.waiting = scheduler_->num_waiting();
  s.running = scheduler_->num_running();
  s.kv_blocks_total = allocator_->num_blocks();
  s.kv_blocks_free = allocator_->num_free();
  return s;
}

}  // namespace moebatch
