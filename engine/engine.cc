#include "engine/engine.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cpu_attention/runtime/cpu_threads.h"
#include "cpu_attention/runtime/host_roof.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/checkpoint.h"
#include "engine/model/gguf.h"
#include "engine/model/weight_check.h"
#include "engine/model/weight_store.h"
#include "engine/model_runner.h"
#include "engine/pipeline_trace.h"
#include "engine/scheduler.h"
#include "engine/text/json_output.h"
#include "engine/text/output_text.h"
#include "spdlog/spdlog.h"

namespace moebatch {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

// One choice of one request.
struct Engine::Sequence {
  Sequence(int64_t request_id, int32_t choice, std::vector<int32_t> prompt_token_ids,
           SamplingParams sampling, const Tokenizer& tokenizer)
      : request_id(request_id),
        choice(choice),
        params(std::move(sampling)),
        sampler(params, choice),
        text(tokenizer, params.stop) {
    slots.id = SequenceId(request_id, choice);
    if (params.json_object) json.emplace();
    prompt_tokens = static_cast<int64_t>(prompt_token_ids.size());
    slots.tokens = std::move(prompt_token_ids);
  }
  int64_t request_id = 0;
  int32_t choice = 0;
  int32_t pending_forks = 0;  // choice 0 before its prompt is prefilled: the choices to fork
  SequenceSlots slots;
  SamplingParams params;
  Sampler sampler;
  OutputText text;                 // the text it releases (stop strings applied)
  std::optional<JsonPrefix> json;  // JSON mode (params.json_object): what was generated so far
  int64_t prompt_tokens = 0;
  int64_t completion_tokens() const {
    return static_cast<int64_t>(slots.tokens.size()) - prompt_tokens;
  }
};

namespace {

// The model's config and the backend the options name, the two inputs of a plan.
absl::StatusOr<std::pair<ModelConfig, const Backend*>> PlanInputs(const EngineOptions& options) {
  auto backend = FindBackend(options.backend, options);
  if (!backend.ok()) return backend.status();
  auto config = LoadModelConfig(options.model_dir);
  if (!config.ok()) return config.status();
  return std::make_pair(*std::move(config), *backend);
}

}  // namespace

Engine::Engine() = default;

Engine::~Engine() {
  if (trace_ != nullptr) {
    if (absl::Status st = WriteTrace(); !st.ok()) spdlog::warn("{}", st.ToString());
  }
}

absl::Status Engine::WriteTrace() const {
  if (trace_ == nullptr) return absl::FailedPreconditionError("no trace_file was set");
  absl::Status st = trace_->WriteChromeTrace(options_.metrics.trace_file);
  if (st.ok()) {
    spdlog::info("trace: {} events written to {}", trace_->size(), options_.metrics.trace_file);
  }
  return st;
}

absl::StatusOr<EnginePlan> Engine::Plan(const EngineOptions& options) {
  auto inputs = PlanInputs(options);
  if (!inputs.ok()) return inputs.status();
  return MakeEnginePlan(options, inputs->first, *inputs->second, ReadHostFacts());
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  // Before anything large is loaded: the options, the backend and its plan.
  if (absl::Status st = CheckCpuThreads(options.cpu.threads, options.cpu.pin_threads); !st.ok()) {
    return st;
  }
  auto inputs = PlanInputs(options);
  if (!inputs.ok()) return inputs.status();
  const Backend& backend = *inputs->second;
  const HostFacts host = ReadHostFacts();
  auto first_plan = MakeEnginePlan(options, inputs->first, backend, host);
  if (!first_plan.ok()) return first_plan.status();
  const BackendPlan& device_plan = first_plan->device;
  spdlog::info("backend {}: {}", backend.name(), device_plan.device);
  if (options.backend == "auto") {
    for (const Backend* other : RegisteredBackends()) {
      if (other == &backend || other->automatic()) continue;
      if (auto found = other->Probe(options); found.ok()) {
        spdlog::info(
            "backend {} has a device ({}) but --backend=auto does not choose it yet; "
            "--backend={} runs it",
            other->name(), *found, other->name());
      }
    }
  }

  std::unique_ptr<Engine> engine(new Engine());
  engine->options_ = options;
  WeightStoreOptions store_options;
  store_options.dtype = device_plan.weight_dtype;
  store_options.quantize = options.weights.quantize;
  store_options.allocator = device_plan.pinned_weights ? backend.pinned_allocator() : nullptr;
  store_options.host_budget_bytes = options.host_memory_bytes;
  store_options.reserved_bytes = options.kv.bytes;
  switch (device_plan.weight_source) {
    case WeightSource::kSynthetic: {
      auto store = WeightStore::Synthetic(inputs->first, options.weights.synthetic_layers,
                                          options.weights.synthetic_seed, store_options);
      if (!store.ok()) return store.status();
      engine->weight_store_ = *std::move(store);
      break;
    }
    case WeightSource::kMapped:
    case WeightSource::kHostCopy: {
      auto checkpoint = Checkpoint::Load(options.model_dir);
      if (!checkpoint.ok()) return checkpoint.status();
      engine->checkpoint_ = *std::move(checkpoint);
      if (device_plan.weight_source == WeightSource::kHostCopy) {
        auto store = WeightStore::Load(*engine->checkpoint_, store_options);
        if (!store.ok()) return store.status();
        engine->weight_store_ = *std::move(store);
        // The copy holds every weight: the checkpoint's mapping goes (its pages leave the
        // process's memory, so a model quantized at load holds what its format says).
        engine->checkpoint_.reset();
      }
      break;
    }
  }
  LoadedWeights loaded;
  if (engine->weight_store_ != nullptr) {
    loaded = {&engine->weight_store_->config(), &engine->weight_store_->weights(),
              engine->weight_store_.get()};
  } else {
    loaded = {&engine->checkpoint_->config(), &engine->checkpoint_->weights(), nullptr};
  }
  const ModelConfig& c = *loaded.config;
  if (options.weights.verify) {
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status st = CheckAllTensorsFinite(*loaded.weights); !st.ok()) return st;
    spdlog::info("verify_weights: every weight is finite ({:.1f} s)",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  // The tokenizer: a GGUF file's metadata, else the model directory's files.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer;
  std::string tokenizer_source;
  if (IsGgufFile(options.model_dir)) {
    std::unique_ptr<GgufFile> opened;
    const GgufFile* gguf = engine->checkpoint_ != nullptr ? engine->checkpoint_->gguf() : nullptr;
    if (gguf == nullptr) {  // synthetic weights of a GGUF model
      auto file = GgufFile::Open(options.model_dir);
      if (!file.ok()) return file.status();
      opened = *std::move(file);
      gguf = opened.get();
    }
    tokenizer =
        Tokenizer::LoadFromGguf(*gguf, c.bos_token_id, c.eos_token_id, options.text.chat_template);
    tokenizer_source = options.model_dir + " (tokenizer.ggml.tokens)";
  } else {
    tokenizer = Tokenizer::LoadFromModelDir(options.model_dir, c.bos_token_id, c.eos_token_id,
                                            options.text.chat_template);
  }
  if (!tokenizer.ok()) return tokenizer.status();
  engine->tokenizer_ = *std::move(tokenizer);
  const bool bpe = engine->tokenizer_->kind() == TokenizerKind::kBpe;
  if (tokenizer_source.empty()) {
    tokenizer_source =
        absl::StrCat(options.model_dir, "/", bpe ? "tokenizer.json" : "tokenizer.model");
  }
  if (engine->tokenizer_->vocab_size() > c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(tokenizer_source, " has ", engine->tokenizer_->vocab_size(), " tokens but ",
                     IsGgufFile(options.model_dir) ? options.model_dir + "'s"
                                                   : options.model_dir + "/config.json",
                     " vocab_size is ", c.vocab_size));
  }
  engine->eos_token_ids_ = c.eos_token_ids;
  spdlog::info("tokenizer: {} {} tokens, chat layout {}, end of sequence {}",
               IsGgufFile(options.model_dir) ? "GGUF metadata"
               : bpe                         ? "tokenizer.json"
                                             : "tokenizer.model",
               engine->tokenizer_->vocab_size(), engine->tokenizer_->chat_layout_name(),
               absl::StrJoin(engine->eos_token_ids_, ", "));

  // What loading parsed and dropped (GGUF metadata, a tokenizer's JSON) goes back to the system.
  malloc_trim(0);

  // MoE-Lens §6.3: the backend may lower the tokens per pass to its profiled n_real; the plan is
  // then made again with it (the device and the pass buffers are sized for that budget, no more).
  std::optional<int64_t> n_real;
  if (device_plan.profile_token_budget) {
    auto profiled = backend.ProfileTokenBudget(loaded, options, device_plan);
    if (!profiled.ok()) return profiled.status();
    n_real = *profiled;
  }
  auto plan = n_real ? MakeEnginePlan(options, inputs->first, backend, host, n_real)
                     : std::move(first_plan);
  if (!plan.ok()) return plan.status();
  engine->plan_ = *std::move(plan);
  const EnginePlan& p = engine->plan_;

  auto device = backend.CreateDevice(loaded, options, p.device, p.schedule.max_tokens_per_pass);
  if (!device.ok()) return device.status();
  engine->model_ = std::make_unique<ModelRunner>(*std::move(device), ModelRunnerOptions{p.vslpipe});

  if (p.kv_automatic) {
    spdlog::info(
        "KV cache: {} MiB from the host memory {} ({} MiB, weights {} MiB, pass buffers up to "
        "{} MiB)",
        std::max<int64_t>(p.kv_bytes, 0) >> 20,
        options.host_memory_bytes > 0 ? "budget" : "available", p.host_budget_bytes >> 20,
        p.weight_bytes >> 20, p.pass_buffer_bytes >> 20);
  }
  auto cache = PagedKvCache::Create(p.kv);
  if (!cache.ok()) return cache.status();
  engine->cache_ = *std::move(cache);
  engine->allocator_ = std::make_unique<BlockAllocator>(p.kv.num_blocks);
  engine->scheduler_ = std::make_unique<Scheduler>(p.schedule, engine->allocator_.get());
  if (!options.metrics.trace_file.empty()) {
    engine->trace_ = std::make_unique<PipelineTrace>();
    engine->model_->SetTrace(engine->trace_.get());
    // The ceilings of each pass's roofline in the trace: the given peaks, else measured here on
    // the engine's own thread pool.
    HostCeilings& roof = engine->roof_;
    roof.bytes_per_s = options.metrics.peak_memory_bytes_per_second;
    roof.flops_per_s = options.metrics.peak_flops;
    if (roof.bytes_per_s <= 0 || roof.flops_per_s <= 0) {
      const MeasuredHost host = MeasureHost();
      if (roof.bytes_per_s <= 0) roof.bytes_per_s = host.triad_bytes_per_s;
      if (roof.flops_per_s <= 0) roof.flops_per_s = host.fma_flops_per_s;
      spdlog::info(
          "trace: each pass's roofline against {:.1f} GB/s and {:.1f} GFLOP/s (measured on {} "
          "threads: triad {:.1f} GB/s, {} FMA peak {:.1f} GFLOP/s; --peak_memory_gbs and "
          "--peak_tflops set them)",
          roof.bytes_per_s / 1e9, roof.flops_per_s / 1e9, host.threads,
          host.triad_bytes_per_s / 1e9, host.fma_isa, host.fma_flops_per_s / 1e9);
    }
  }
  spdlog::info(
      "engine: {} backend, {} layers, {} experts (top-{}), compute {}{}, KV cache {} blocks x {} "
      "tokens{} ({} MiB, {}), max context {} tokens; {} tokens per pass{}, up to {} sequences",
      engine->model_->device().name(), c.num_hidden_layers, c.num_local_experts,
      c.num_experts_per_tok, DTypeName(p.device.compute_dtype),
      p.backend == "cpu"
          ? (options.cpu.batch_invariant ? " (batch-invariant)" : " (not batch-invariant)")
          : "",
      p.kv.num_blocks, p.kv.block_size,
      p.kv.window_layers.empty()
          ? std::string()
          : absl::StrCat(", ", p.kv.num_groups() == 2 ? "window layers" : "every layer",
                         " kept to the last ", p.kv.window),
      engine->cache_->total_bytes() >> 20, DTypeName(p.kv.dtype), p.max_context_tokens,
      p.schedule.max_tokens_per_pass,
      p.n_real
          ? absl::StrCat(" (n_real ", *p.n_real, ", ceiling ", p.device.max_tokens_per_pass, ")")
          : std::string(),
      p.schedule.max_num_seqs);
  return engine;
}

absl::StatusOr<std::vector<std::vector<double>>> Engine::ScoreTokens(
    const std::vector<std::vector<int32_t>>& sequences, int64_t first) {
  if (!sequences_.empty()) {
    return absl::FailedPreconditionError("ScoreTokens: requests are in flight");
  }
  ForwardBatch batch;
  std::vector<std::vector<int32_t>> tables(sequences.size()), window_tables(sequences.size());
  const auto release = [&] {
    for (auto& table : tables) allocator_->FreeAll(&table);
    for (auto& table : window_tables) allocator_->FreeAll(&table);
  };
  const int64_t block_size = cache_->config().block_size;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const auto& ids = sequences[s];
    const int64_t n = static_cast<int64_t>(ids.size());
    if (first < 1 || first >= n) {
      release();
      return absl::InvalidArgumentError(absl::StrCat("ScoreTokens: sequence ", s, " has ", n,
                                                     " tokens; first must be in [1, ", n, ")"));
    }
    // A block per block_size tokens in each table (the window table too: one pass attends the
    // whole sequence).
    const int num_tables = cache_->config().num_groups();
    for (int64_t b = 0; b < num_tables * BlocksForTokens(n, block_size); ++b) {
      const std::optional<int32_t> block = allocator_->Allocate();
      if (!block) {
        release();
        return absl::InvalidArgumentError(
            absl::StrCat("ScoreTokens: the KV cache's ", allocator_->num_blocks(), " blocks of ",
                         block_size, " tokens do not hold the sequences"));
      }
      (b % num_tables == 0 ? tables : window_tables)[s].push_back(*block);
    }
    ForwardSequence fs;
    fs.block_table = &tables[s];
    if (cache_->config().num_groups() == 2) fs.window_block_table = &window_tables[s];
    fs.token_start = static_cast<int64_t>(batch.token_ids.size());
    fs.num_tokens = n;
    fs.context_len = n;
    fs.need_logits = true;
    // Logits of rows first - 1 .. n - 1 (the last rows, as ForwardSequence gives them): rows
    // first - 1 .. n - 2 predict ids[first .. n - 1]; the last row's are not used.
    fs.num_logits = n - first + 1;
    batch.token_ids.insert(batch.token_ids.end(), ids.begin(), ids.end());
    batch.seqs.push_back(fs);
  }
  if (static_cast<int64_t>(batch.token_ids.size()) > plan_.schedule.max_tokens_per_pass) {
    release();
    return absl::InvalidArgumentError(absl::StrCat(
        "ScoreTokens: ", batch.token_ids.size(), " tokens exceed the ",
        plan_.schedule.max_tokens_per_pass, " tokens per pass (--max_tokens_per_pass)"));
  }
  std::vector<float> logits;
  absl::Status st = model_->Forward(batch, *cache_, &logits);
  release();
  if (!st.ok()) return st;
  const int64_t vocab = config().vocab_size;
  std::vector<std::vector<double>> out(sequences.size());
  size_t row = 0;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const auto& ids = sequences[s];
    const int64_t n = static_cast<int64_t>(ids.size());
    for (int64_t i = first; i < n; ++i, ++row) {
      const float* z = logits.data() + row * vocab;
      double max = z[0];
      for (int64_t v = 1; v < vocab; ++v) max = std::max<double>(max, z[v]);
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(z[v]) - max);
      out[s].push_back(static_cast<double>(z[ids[i]]) - max - std::log(sum));
    }
    ++row;  // the last row's logits
  }
  return out;
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
  if (static_cast<int64_t>(ids.size()) >= plan_.max_context_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt: ", ids.size(), " tokens leave no room to generate; the context holds at most ",
        plan_.max_context_tokens, " tokens"));
  }
  if (auto st = request.sampling.Validate(); !st.ok()) return st;
  const int32_t n = request.sampling.n;
  if (n > max_choices()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n: ", n, " choices, more than the ", max_choices(),
        " sequences this engine decodes in one pass (--max_num_seqs, --max_tokens_per_pass)"));
  }
  if (request.sampling.json_object && json_mask_ == nullptr) {
    json_mask_ = std::make_unique<JsonTokenMask>(*tokenizer_, eos_token_ids_);
  }
  const int64_t id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, 0, std::move(request.prompt_token_ids),
                                        std::move(request.sampling), *tokenizer_);
  seq->pending_forks = n - 1;
  seq->slots.width = n;
  scheduler_->Add(&seq->slots);
  sequences_.emplace(seq->slots.id, std::move(seq));
  return id;
}

int32_t Engine::max_choices() const {
  return static_cast<int32_t>(std::min<int64_t>(kMaxChoices, max_sequences_per_pass()));
}

int64_t Engine::max_sequences_per_pass() const {
  return std::min(plan_.schedule.max_num_seqs, plan_.schedule.max_tokens_per_pass);
}

void Engine::Abort(int64_t request_id) {
  for (int32_t c = 0; c < kMaxChoices; ++c) {
    if (sequences_.count(SequenceId(request_id, c)) != 0) {
      aborted_.push_back(request_id);
      return;
    }
  }
}

std::vector<Engine::Sequence*> Engine::Fork(Sequence* parent) {
  std::vector<Sequence*> children;
  const int32_t n = parent->pending_forks + 1;
  // The prompt is prefilled and nothing is generated yet: tokens == prompt == num_computed.
  for (int32_t c = 1; c < n; ++c) {
    auto child = std::make_unique<Sequence>(parent->request_id, c, parent->slots.tokens,
                                            parent->params, *tokenizer_);
    child->slots.num_computed = parent->slots.num_computed;
    child->slots.block_table = parent->slots.block_table;
    for (int32_t block : child->slots.block_table) allocator_->Share(block);
    child->slots.window_block_table = parent->slots.window_block_table;
    for (int32_t block : child->slots.window_block_table) {
      if (block != kNoBlock) allocator_->Share(block);
    }
    scheduler_->AddRunning(&child->slots);
    children.push_back(child.get());
    sequences_.emplace(child->slots.id, std::move(child));
  }
  parent->pending_forks = 0;
  parent->slots.width = 1;
  return children;
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
  const bool eos =
      std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end() &&
      !seq->params.ignore_eos;
  if (eos) {
    reason = FinishReason::kStop;
  } else if (seq->completion_tokens() >= seq->params.max_tokens ||
             static_cast<int64_t>(seq->slots.tokens.size()) >= plan_.max_context_tokens) {
    reason = FinishReason::kLength;
  }
  if (seq->text.Add(eos ? std::nullopt : std::optional<int32_t>(token),
                    reason != FinishReason::kNone)) {
    reason = FinishReason::kStop;  // a stop string
  }
  seq->text.Release(reason != FinishReason::kNone, &out->new_text);
  out->completion_tokens = seq->completion_tokens();
  if (reason != FinishReason::kNone) Finish(seq, reason, out);
}

void Engine::AnnotatePass(const ForwardStats& pass, int64_t logits_rows) {
  const ModelWeights& weights =
      weight_store_ != nullptr ? weight_store_->weights() : checkpoint_->weights();
  const KvCacheConfig& kv = cache_->config();
  const double kv_per_token_layer =
      static_cast<double>(kv.layer_block_bytes()) / static_cast<double>(kv.block_size);
  const PassCounts counts{pass.tokens, pass.experts_touched, pass.expert_token_pairs,
                          pass.kv_tokens_read};
  const PassWork work = PassWorkOf(config(), weights, counts, kv_per_token_layer, logits_rows);
  const Roofline roof = RooflineOf(work, roof_);
  std::vector<PipelineTrace::Arg> args = {
      {"weight_MB", work.weight_bytes / 1e6, ""},
      {"kv_MB", work.kv_bytes / 1e6, ""},
      {"GFLOP", work.flops / 1e9, ""},
      {"bound", 0, roof.bound_name()},
      {"bound_ms", roof.seconds() * 1e3, ""},
      {"memory_bound_ms", roof.memory_seconds * 1e3, ""},
      {"compute_bound_ms", roof.compute_seconds * 1e3, ""},
  };
  if (pass.pass_seconds > 0) args.push_back({"of_bound", roof.seconds() / pass.pass_seconds, ""});
  trace_->AnnotateLast(PipelineTrace::kPassRow, std::move(args));
}

absl::Status Engine::Step(std::vector<GenerationOutput>* outputs) {
  if (cpu_pool_owner_ != std::this_thread::get_id()) {
    absl::Status pool = ConfigureCpuThreads(options_.cpu.threads, options_.cpu.pin_threads);
    if (!pool.ok()) return pool;
    cpu_pool_owner_ = std::this_thread::get_id();
  }
  for (int64_t id : aborted_) {
    for (int32_t c = 0; c < kMaxChoices; ++c) {
      auto it = sequences_.find(SequenceId(id, c));
      if (it == sequences_.end()) continue;
      const int32_t pending = it->second->pending_forks;
      GenerationOutput out;
      out.request_id = id;
      out.index = c;
      out.prompt_tokens = it->second->prompt_tokens;
      Finish(it->second.get(), FinishReason::kAborted, &out);
      // Choices not forked yet end too, so that every choice has a final output.
      for (int32_t k = 1; k <= pending; ++k) {
        GenerationOutput unforked = out;
        unforked.index = k;
        outputs->push_back(std::move(unforked));
      }
      outputs->push_back(std::move(out));
    }
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

  // Copy-on-write of shared KV blocks, before the pass writes into the copies.
  for (const BlockCopy& copy : plan.copies) cache_->CopyBlock(copy.src, copy.dst);

  ForwardBatch batch;
  std::vector<SequenceSlots*> need_logits;
  for (const ScheduledChunk& chunk : plan.chunks) {
    SequenceSlots* s = chunk.seq;
    ForwardSequence fs;
    fs.block_table = &s->block_table;
    if (scheduler_->config().window > 0) fs.window_block_table = &s->window_block_table;
    fs.token_start = static_cast<int64_t>(batch.token_ids.size());
    fs.num_tokens = chunk.num_tokens;
    fs.context_len = s->num_computed + chunk.num_tokens;
    fs.need_logits = fs.context_len == static_cast<int64_t>(s->tokens.size());
    fs.greedy = fs.need_logits && sequences_.at(s->id)->sampler.device_greedy();
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
  if (trace_ != nullptr) AnnotatePass(pass, static_cast<int64_t>(need_logits.size()));
  const double weight_elem = plan_.weight_bytes_per_param;
  stats_.last_utilization = ComputeSparseUtilization(
      config(), weight_elem, static_cast<double>(DTypeSize(cache_->config().dtype)), pass,
      options_.metrics.peak_memory_bytes_per_second, options_.metrics.peak_flops);
  stats_.activated_bytes +=
      stats_.last_utilization.activated_weight_bytes + stats_.last_utilization.kv_bytes;
  stats_.sparse_flops += stats_.last_utilization.flops;
  ++stats_.passes;
  stats_.prefill_tokens += plan.num_prefill_tokens;
  stats_.decode_tokens += plan.num_decode_tokens;
  scheduler_->Commit(plan);

  // Next tokens: greedy ones came from the device; the others are sampled here, in parallel (each
  // sequence has its own generator and scratch, so the result does not depend on the threads).
  // A request whose prompt was just prefilled forks its other choices here: they sample from the
  // same row of logits (or take the same greedy token).
  const int64_t vocab = config().vocab_size;
  std::vector<Sequence*> seqs;
  std::vector<int64_t> logits_row;  // -1: the device's greedy token
  std::vector<int32_t> tokens;
  int64_t sampled = 0, greedy = 0;
  for (SequenceSlots* slots : need_logits) {
    Sequence* seq = sequences_.at(slots->id).get();
    int64_t row = -1;
    int32_t token = 0;
    if (seq->sampler.device_greedy()) {
      token = greedy_tokens_[greedy++];
    } else {
      row = sampled++;
    }
    seqs.push_back(seq);
    logits_row.push_back(row);
    tokens.push_back(token);
    if (seq->pending_forks > 0) {
      for (Sequence* child : Fork(seq)) {
        seqs.push_back(child);
        logits_row.push_back(row);
        tokens.push_back(token);
      }
    }
  }
  const int64_t n = static_cast<int64_t>(seqs.size());
  const int64_t to_sample = n - std::count(logits_row.begin(), logits_row.end(), int64_t{-1});
  std::vector<TokenLogprob> logprobs(n);
#pragma omp parallel for schedule(dynamic, 4) if (to_sample > 8)
  for (int64_t i = 0; i < n; ++i) {
    if (logits_row[i] < 0) continue;
    const float* row = logits_.data() + logits_row[i] * vocab;
    // -1, as the device's greedy argmax says it, for a row that is not finite.
    if (!std::all_of(row, row + vocab, [](float v) { return std::isfinite(v); })) {
      tokens[i] = -1;
      continue;
    }
    if (seqs[i]->json) {
      // JSON mode: the tokens that would not continue a JSON object are masked out (a copy of
      // the row: the choices of a request share it); with none left, EOS ends the reply.
      thread_local std::vector<float> masked;
      masked.assign(row, row + vocab);
      if (json_mask_->Apply(*seqs[i]->json, masked.data(), vocab) == 0) {
        tokens[i] = eos_token_ids_.empty() ? -1 : eos_token_ids_[0];
      } else {
        tokens[i] = seqs[i]->sampler.Sample(masked.data(), static_cast<int32_t>(vocab));
      }
      if (tokens[i] >= 0) json_mask_->Advance(&*seqs[i]->json, tokens[i]);
    } else {
      tokens[i] = seqs[i]->sampler.Sample(row, static_cast<int32_t>(vocab));
    }
    if (seqs[i]->params.logprobs) {
      logprobs[i] =
          TokenLogprobs(row, static_cast<int32_t>(vocab), tokens[i], seqs[i]->params.top_logprobs);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    GenerationOutput out;
    out.request_id = seqs[i]->request_id;
    out.index = seqs[i]->choice;
    out.prompt_tokens = seqs[i]->prompt_tokens;
    if (tokens[i] < 0) {
      ++stats_.requests_failed;
      out.error = absl::InternalError(
          absl::StrCat("the model's logits for this request are not finite (NaN or inf) after ",
                       seqs[i]->completion_tokens(),
                       " generated tokens: its weights or their computation "
                       "are broken (moebatch-run/moebatchd --verify_weights checks every weight)"));
      out.completion_tokens = seqs[i]->completion_tokens();
      Finish(seqs[i], FinishReason::kError, &out);
    } else {
      if (seqs[i]->params.logprobs) out.new_logprobs.push_back(std::move(logprobs[i]));
      AcceptToken(seqs[i], tokens[i], &out);  // may finish (and free) the sequence
    }
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
