#include "engine/model_runner.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "cpu_attention/attention/decode_attention.h"

namespace moebatch {

ModelRunner::PhaseWorker::PhaseWorker(int omp_threads) {
  thread_ = std::thread([this, omp_threads] {
    omp_set_num_threads(omp_threads);  // this thread's OpenMP team: the caller's size
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || (busy_ && task_); });
      if (stop_) return;
      std::function<void()> task = std::move(task_);
      task_ = nullptr;
      lock.unlock();
      task();
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  });
}

ModelRunner::PhaseWorker::~PhaseWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ModelRunner::PhaseWorker::Start(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = std::move(task);
    busy_ = true;
  }
  cv_.notify_all();
}

void ModelRunner::PhaseWorker::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
}

ModelRunner::ModelRunner(std::unique_ptr<Device> device, ModelRunnerOptions options)
    : device_(std::move(device)), options_(options), window_layers_(config().NumSlidingLayers()) {
  HostAllocator* allocator = device_->host_buffer_allocator();
  for (MicroBatch& mb : micro_batches_) {
    for (HostBuffer<float>* buffer : {&mb.q, &mb.k, &mb.v, &mb.attn, &mb.logits}) {
      buffer->set_allocator(allocator);
    }
  }
}

ModelRunner::~ModelRunner() = default;

absl::Status ModelRunner::Plan(const ForwardBatch& batch, const PagedKvCache& cache,
                               int micro_batches) {
  const ModelConfig& c = config();
  const int64_t tokens = static_cast<int64_t>(batch.token_ids.size());
  const int64_t num_seqs = static_cast<int64_t>(batch.seqs.size());

  // Validate the batch.
  std::vector<bool> covered(tokens, false);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const ForwardSequence& seq = batch.seqs[s];
    if (seq.num_tokens <= 0 || seq.token_start < 0 || seq.token_start + seq.num_tokens > tokens ||
        seq.context_len < seq.num_tokens ||
        (seq.need_logits && !seq.greedy &&
         (seq.num_logits < 1 || seq.num_logits > seq.num_tokens))) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward batch: sequence ", s, " is malformed"));
    }
    for (KvGroup g : {KvGroup::kMain, KvGroup::kWindow}) {
      const KvCacheConfig& kc = cache.config();
      if (g == KvGroup::kWindow && kc.num_groups() == 1) break;
      const std::vector<int32_t>* table =
          g == KvGroup::kMain ? seq.block_table : seq.window_block_table;
      // A table kept to a window: the entries from the block of the first key the chunk's first
      // query reads must be blocks (those before may be kNoBlock).
      const int64_t window = kc.group_window(g);
      const int64_t first_key =
          window > 0 ? std::max<int64_t>(0, seq.context_len - seq.num_tokens - window + 1) : 0;
      const int64_t end = BlocksForTokens(seq.context_len, kc.block_size);
      bool ok = table != nullptr && static_cast<int64_t>(table->size()) >= end;
      for (int64_t b = first_key / kc.block_size; ok && window > 0 && b < end; ++b) {
        ok = (*table)[b] >= 0 && (*table)[b] < kc.num_blocks;
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "forward batch: sequence ", s, "'s ", g == KvGroup::kMain ? "" : "window ",
            "block table does not cover positions ", first_key, "..", seq.context_len - 1));
      }
    }
    if (seq.context_len > c.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward batch: sequence ", s, " reaches position ", seq.context_len - 1,
                       " beyond max_position_embeddings ", c.max_position_embeddings));
    }
    for (int64_t i = 0; i < seq.num_tokens; ++i) covered[seq.token_start + i] = true;
  }
  for (int64_t t = 0; t < tokens; ++t) {
    if (!covered[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward batch: token ", t, " has no sequence"));
    }
    if (batch.token_ids[t] < 0 || batch.token_ids[t] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", batch.token_ids[t], " outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }

  // Assign sequences to micro-batches (VSLPipe: balanced in tokens; largest first to the lighter
  // one), keeping batch order inside each.
  std::vector<int> owner(num_seqs, 0);
  if (micro_batches == 2) {
    std::vector<int64_t> order(num_seqs);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return batch.seqs[a].num_tokens > batch.seqs[b].num_tokens;
    });
    int64_t load[2] = {0, 0}, count[2] = {0, 0};
    for (int64_t s : order) {
      const int m = load[1] < load[0] || (load[1] == load[0] && count[1] < count[0]) ? 1 : 0;
      owner[s] = m;
      load[m] += batch.seqs[s].num_tokens;
      ++count[m];
    }
  }
  num_micro_batches_ = micro_batches;
  const int64_t q_row = c.q_size(), kv_row = c.kv_size();
  for (int m = 0; m < micro_batches; ++m) {
    MicroBatch& mb = micro_batches_[m];
    mb.token_ids.clear();
    mb.positions.clear();
    mb.append_rows.clear();
    mb.attn_seqs.clear();
    mb.window_append_rows.clear();
    mb.window_attn_seqs.clear();
    mb.prefill_cu_rows.clear();
    mb.logit_rows.clear();
    mb.logit_outputs.clear();
    mb.greedy_rows.clear();
    mb.greedy_outputs.clear();
  }
  // Sequences the device attends (whole context in this pass) go after the others of their
  // micro-batch, so that their rows form one run of segments; logits stay in batch order.
  const bool device_prefill =
      device_->AttendsPrefill() && tokens < std::numeric_limits<int32_t>::max();
  auto on_device = [&](const ForwardSequence& seq) {
    return device_prefill && seq.context_len == seq.num_tokens;
  };
  // Each sequence's row in the pass's logits or greedy tokens (batch order within each kind).
  std::vector<size_t> output_index(num_seqs, 0);
  size_t logits_out = 0, greedy_out = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const ForwardSequence& seq = batch.seqs[s];
    if (!seq.need_logits) continue;
    if (seq.greedy) {
      output_index[s] = greedy_out++;
    } else {
      output_index[s] = logits_out;
      logits_out += static_cast<size_t>(seq.num_logits);
    }
  }
  for (int round = 0; round < 2; ++round) {
    for (int64_t s = 0; s < num_seqs; ++s) {
      const ForwardSequence& seq = batch.seqs[s];
      if (on_device(seq) != (round == 1)) continue;
      MicroBatch& mb = micro_batches_[owner[s]];
      const int64_t start = mb.tokens();
      for (int64_t i = 0; i < seq.num_tokens; ++i) {
        const int64_t position = seq.context_len - seq.num_tokens + i;
        mb.token_ids.push_back(batch.token_ids[seq.token_start + i]);
        mb.positions.push_back(position);
        mb.append_rows.push_back(KvAppendRow{seq.block_table->data(), position});
        if (seq.window_block_table != nullptr) {
          mb.window_append_rows.push_back(KvAppendRow{seq.window_block_table->data(), position});
        }
      }
      if (round == 0) {
        mb.attn_seqs.push_back(
            AttentionSequence{seq.block_table->data(), start, seq.num_tokens, seq.context_len});
        if (seq.window_block_table != nullptr) {
          mb.window_attn_seqs.push_back(AttentionSequence{seq.window_block_table->data(), start,
                                                          seq.num_tokens, seq.context_len});
        }
      } else {
        if (mb.prefill_cu_rows.empty()) mb.prefill_cu_rows.push_back(static_cast<int32_t>(start));
        mb.prefill_cu_rows.push_back(static_cast<int32_t>(start + seq.num_tokens));
      }
      if (seq.need_logits && seq.greedy) {
        mb.greedy_rows.push_back(start + seq.num_tokens - 1);
        mb.greedy_outputs.push_back(output_index[s]);
      } else if (seq.need_logits) {
        for (int64_t j = 0; j < seq.num_logits; ++j) {
          mb.logit_rows.push_back(start + seq.num_tokens - seq.num_logits + j);
          mb.logit_outputs.push_back(output_index[s] + static_cast<size_t>(j));
        }
      }
    }
  }
  for (int m = 0; m < micro_batches; ++m) {
    MicroBatch& mb = micro_batches_[m];
    const size_t n = static_cast<size_t>(mb.tokens());
    for (auto [buffer, size] : {std::pair{&mb.q, n * q_row}, std::pair{&mb.k, n * kv_row},
                                std::pair{&mb.v, n * kv_row}, std::pair{&mb.attn, n * q_row}}) {
      if (absl::Status st = buffer->Resize(size); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

void ModelRunner::CpuTask(int64_t layer, MicroBatch& mb, PagedKvCache& cache) {
  const auto start = PipelineTrace::Clock::now();
  const ModelConfig& c = config();
  KvLayerView view;
  view.base = cache.LayerBase(layer);
  view.dtype = cache.config().dtype;
  view.num_kv_heads = c.num_key_value_heads;
  view.head_dim = c.head_dim;
  view.block_size = cache.config().block_size;
  view.block_stride_bytes = cache.block_stride_bytes();
  view.value_offset_bytes = cache.value_offset_bytes();
  view.value_dim = cache.config().value_dim;
  // A window layer's rows are found through the window block tables.
  const bool window_group = cache.config().group(layer) == KvGroup::kWindow;
  const std::vector<KvAppendRow>& rows = window_group ? mb.window_append_rows : mb.append_rows;
  const std::vector<AttentionSequence>& seqs = window_group ? mb.window_attn_seqs : mb.attn_seqs;
  AppendKv(view, rows.data(), mb.tokens(), mb.k.data(), mb.v.data());
  // The layer's own window (gpt-oss alternates sliding and full layers) and sinks.
  PagedAttention(view, seqs.data(), static_cast<int64_t>(seqs.size()), mb.q.data(),
                 c.num_attention_heads, c.attention_scale(), c.LayerSlidingWindow(layer),
                 mb.attn.data(), device_->AttentionSinks(layer));
  const auto end = PipelineTrace::Clock::now();
  cpu_seconds_ += std::chrono::duration<double>(end - start).count();
  if (trace_ != nullptr) {
    trace_->Add(PipelineTrace::kCpuRow, "C" + std::to_string(layer), start, end, layer,
                static_cast<int>(&mb - micro_batches_), mb.tokens());
  }
}

template <typename F>
absl::Status ModelRunner::DeviceCall(const char* name, int64_t layer, int micro_batch,
                                     ForwardStats* stats, F&& call) {
  const auto start = PipelineTrace::Clock::now();
  absl::Status st = call();
  const auto end = PipelineTrace::Clock::now();
  stats->device_seconds += std::chrono::duration<double>(end - start).count();
  if (trace_ != nullptr) {
    trace_->Add(PipelineTrace::kDeviceRow,
                layer >= 0 ? absl::StrCat(name, layer) : std::string(name), start, end, layer,
                micro_batch, micro_batches_[micro_batch].tokens());
  }
  return st;
}

absl::Status ModelRunner::RunPlain(PagedKvCache& cache, ForwardStats* stats) {
  Device& device = *device_;
  MicroBatch& mb = micro_batches_[0];
  for (int64_t layer = 0; layer < config().num_hidden_layers; ++layer) {
    if (auto st = DeviceCall("A", layer, 0, stats,
                             [&] {
                               return device.TaskA(0, layer, mb.q.data(), mb.k.data(), mb.v.data(),
                                                   mb.attn.data());
                             });
        !st.ok()) {
      return st;
    }
    CpuTask(layer, mb, cache);  // MoE-Lens §6.6
    if (auto st = DeviceCall("B", layer, 0, stats,
                             [&] { return device.TaskB(0, layer, mb.attn.data(), stats); });
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::RunPipelined(PagedKvCache& cache, ForwardStats* stats) {
  Device& device = *device_;
  MicroBatch& alpha = micro_batches_[0];
  MicroBatch& beta = micro_batches_[1];
  const int64_t n = config().num_hidden_layers;
  if (worker_ == nullptr) worker_ = std::make_unique<PhaseWorker>(omp_get_max_threads());
  auto task_a = [&](int m, int64_t layer) {
    MicroBatch& mb = micro_batches_[m];
    return DeviceCall("A", layer, m, stats, [&] {
      return device.TaskA(m, layer, mb.q.data(), mb.k.data(), mb.v.data(), mb.attn.data());
    });
  };
  auto task_b = [&](int m, int64_t layer) {
    return DeviceCall("B", layer, m, stats,
                      [&] { return device.TaskB(m, layer, micro_batches_[m].attn.data(), stats); });
  };
  // One phase: the CPU task of (layer, mb) on the worker, the device work here; both end before
  // the next phase (the exchange of Fig. 9).
  auto phase = [&](int64_t cpu_layer, MicroBatch& cpu_mb,
                   const std::function<absl::Status()>& device_work) {
    worker_->Start([&, cpu_layer] { CpuTask(cpu_layer, cpu_mb, cache); });
    absl::Status st = device_work();
    worker_->Wait();
    return st;
  };

  // Prologue.
  if (auto st = task_a(0, 0); !st.ok()) return st;
  if (auto st = phase(0, alpha, [&] { return task_a(1, 0); }); !st.ok()) return st;
  // Stages 0 .. n-2.
  for (int64_t i = 0; i + 1 < n; ++i) {
    auto st = phase(i, beta, [&] {
      absl::Status s = task_b(0, i);
      return s.ok() ? task_a(0, i + 1) : s;
    });
    if (!st.ok()) return st;
    st = phase(i + 1, alpha, [&] {
      absl::Status s = task_b(1, i);
      return s.ok() ? task_a(1, i + 1) : s;
    });
    if (!st.ok()) return st;
  }
  // Epilogue.
  if (auto st = phase(n - 1, beta, [&] { return task_b(0, n - 1); }); !st.ok()) return st;
  return task_b(1, n - 1);
}

absl::Status ModelRunner::Forward(const ForwardBatch& batch, PagedKvCache& cache,
                                  std::vector<float>* logits, ForwardStats* stats,
                                  std::vector<int32_t>* greedy_tokens) {
  const ModelConfig& c = config();
  const auto pass_start = PipelineTrace::Clock::now();
  const DeviceCounters counters_before = device_->counters();
  cpu_seconds_ = 0;
  const int micro_batches = options_.vslpipe && batch.seqs.size() >= 2 ? 2 : 1;
  for (size_t s = 0; greedy_tokens == nullptr && s < batch.seqs.size(); ++s) {
    if (batch.seqs[s].need_logits && batch.seqs[s].greedy) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forward batch: sequence ", s, " asks for its greedy token but there is no output"));
    }
  }
  if (auto st = Plan(batch, cache, micro_batches); !st.ok()) return st;
  last_micro_batches_ = micro_batches;

  Device& device = *device_;
  device.BeginPass(micro_batches);
  ForwardStats local_stats;
  local_stats.tokens = static_cast<int64_t>(batch.token_ids.size());
  local_stats.micro_batches = micro_batches;
  // Keys the sequences' last queries read, averaged over the layers: a window layer reads at most
  // its window.
  const int64_t layers = config().num_hidden_layers;
  for (const ForwardSequence& seq : batch.seqs) {
    const int64_t full = seq.context_len * (layers - window_layers_);
    const int64_t windowed =
        window_layers_ > 0 ? std::min(seq.context_len, *config().sliding_window) * window_layers_
                           : 0;
    local_stats.kv_tokens_read += (full + windowed) / layers;
  }
  for (int m = 0; m < micro_batches; ++m) {
    MicroBatch& mb = micro_batches_[m];
    if (auto st = DeviceCall(
            "embed", -1, m, &local_stats,
            [&] { return device.Embed(m, mb.token_ids.data(), mb.positions.data(), mb.tokens()); });
        !st.ok()) {
      return st;
    }
    const int64_t segments =
        mb.prefill_cu_rows.empty() ? 0 : static_cast<int64_t>(mb.prefill_cu_rows.size()) - 1;
    if (device.AttendsPrefill()) {
      if (auto st = device.SetPrefillSegments(m, mb.prefill_cu_rows.data(), segments); !st.ok()) {
        return st;
      }
    }
    if (segments > 0) {
      local_stats.device_attention_tokens += mb.prefill_cu_rows.back() - mb.prefill_cu_rows.front();
    }
  }
  absl::Status run =
      micro_batches == 2 ? RunPipelined(cache, &local_stats) : RunPlain(cache, &local_stats);
  if (!run.ok()) return run;

  // Final norm and lm_head on the rows that need logits or greedy tokens only, back in batch
  // order.
  size_t rows = 0, greedy = 0;
  for (int m = 0; m < micro_batches; ++m) {
    rows += micro_batches_[m].logit_rows.size();
    greedy += micro_batches_[m].greedy_rows.size();
  }
  logits->resize(rows * static_cast<size_t>(c.vocab_size));
  if (greedy_tokens != nullptr) greedy_tokens->resize(greedy);
  for (int m = 0; m < micro_batches; ++m) {
    MicroBatch& mb = micro_batches_[m];
    const int64_t k = static_cast<int64_t>(mb.logit_rows.size());
    if (k > 0) {
      // Rows already in batch order (one micro-batch, no device-attended prefill moved last) go
      // to the pass's logits in place; otherwise they are put in batch order after.
      bool in_place = micro_batches == 1;
      for (int64_t i = 0; in_place && i < k; ++i) in_place = mb.logit_outputs[i] == size_t(i);
      if (!in_place) {
        if (absl::Status st = mb.logits.Resize(static_cast<size_t>(k * c.vocab_size)); !st.ok()) {
          return st;
        }
      }
      float* out = in_place ? logits->data() : mb.logits.data();
      if (auto st = DeviceCall("lm_head", -1, m, &local_stats,
                               [&] { return device.Logits(m, mb.logit_rows.data(), k, out); });
          !st.ok()) {
        return st;
      }
      if (!in_place) {  // up to ~2.5 GB at 20,000 sampled sequences: all threads copy
#pragma omp parallel for schedule(static) if (k > 64)
        for (int64_t i = 0; i < k; ++i) {
          std::copy_n(mb.logits.data() + i * c.vocab_size, c.vocab_size,
                      logits->data() + mb.logit_outputs[i] * c.vocab_size);
        }
      }
    }
    const int64_t g = static_cast<int64_t>(mb.greedy_rows.size());
    if (g > 0) {
      mb.greedy_tokens.resize(static_cast<size_t>(g));
      if (auto st = DeviceCall("lm_head", -1, m, &local_stats,
                               [&] {
                                 return device.GreedyTokens(m, mb.greedy_rows.data(), g,
                                                            mb.greedy_tokens.data());
                               });
          !st.ok()) {
        return st;
      }
      for (int64_t i = 0; i < g; ++i) (*greedy_tokens)[mb.greedy_outputs[i]] = mb.greedy_tokens[i];
    }
  }
  const auto pass_end = PipelineTrace::Clock::now();
  const DeviceCounters counters_after = device_->counters();
  local_stats.pass_seconds = std::chrono::duration<double>(pass_end - pass_start).count();
  local_stats.cpu_attention_seconds = cpu_seconds_;
  local_stats.weight_transfer_seconds =
      counters_after.weight_busy_seconds - counters_before.weight_busy_seconds;
  local_stats.weight_bytes = counters_after.weight_bytes - counters_before.weight_bytes;
  if (trace_ != nullptr) {
    trace_->Add(PipelineTrace::kPassRow,
                absl::StrCat("pass: ", local_stats.tokens, " tokens, ", micro_batches,
                             micro_batches == 2 ? " micro-batches (VSLPipe)" : " micro-batch"),
                pass_start, pass_end, -1, -1, local_stats.tokens);
  }
  if (stats != nullptr) *stats = local_stats;
  return absl::OkStatus();
}

}  // namespace moebatch
