#include "engine/plan/cpu_roofline.h"

#include <cmath>
#include <vector>

#include "engine/model/family.h"

namespace moebatch {

Roofline RooflineOf(const PassWork& work, const HostCeilings& host) {
  Roofline r;
  if (host.bytes_per_s > 0) r.memory_seconds = work.bytes() / host.bytes_per_s;
  if (host.flops_per_s > 0) r.compute_seconds = work.flops / host.flops_per_s;
  return r;
}

namespace {

// The tensor of `real` that `target` (a pointer into `scratch`, as ModelTensors returns it) stands
// for: the field at the same offset of the same layer, expert or ModelWeights; null when `target`
// is none of them. *expert: it is a routed expert's.
const TensorInfo* Resolve(const ModelWeights& scratch, const ModelWeights& real,
                          const TensorInfo* const* target, bool* expert) {
  const auto* at = reinterpret_cast<const char*>(target);
  auto field = [at](const auto& from, const auto& to) -> const TensorInfo* {
    const auto* base = reinterpret_cast<const char*>(&from);
    if (at < base || at >= base + sizeof(from)) return nullptr;
    return *reinterpret_cast<const TensorInfo* const*>(reinterpret_cast<const char*>(&to) +
                                                       (at - base));
  };
  *expert = false;
  if (const TensorInfo* t = field(scratch, real)) return t;
  for (size_t l = 0; l < scratch.layers.size() && l < real.layers.size(); ++l) {
    if (const TensorInfo* t = field(scratch.layers[l], real.layers[l])) return t;
    const auto& se = scratch.layers[l].experts;
    const auto& re = real.layers[l].experts;
    for (size_t e = 0; e < se.size() && e < re.size(); ++e) {
      if (const TensorInfo* t = field(se[e], re[e])) {
        *expert = true;
        return t;
      }
    }
  }
  return nullptr;
}

}  // namespace

PassWork PassWorkOf(const ModelConfig& config, const ModelWeights& weights, const PassCounts& stats,
                    double kv_bytes_per_token_layer, int64_t logits_rows) {
  // Every tensor of the family, as ModelTensors lists them (its targets point into `scratch`,
  // laid out as `weights` is), mapped back to `weights`.
  ModelWeights scratch;
  const int64_t layers = static_cast<int64_t>(weights.layers.size());
  const std::vector<std::vector<TensorSpec>> regions = ModelTensors(config, layers, &scratch);
  const double tokens = static_cast<double>(stats.tokens);
  PassWork work;
  double expert_bytes = 0, expert_elements = 0, experts = 0;
  for (int64_t l = 0; l < layers && l + 1 < static_cast<int64_t>(regions.size()); ++l) {
    experts += static_cast<double>(weights.layers[l].experts.size());
    for (const TensorSpec& spec : regions[l + 1]) {
      bool expert = false;
      const TensorInfo* t = Resolve(scratch, weights, spec.target, &expert);
      if (t == nullptr) continue;
      const double elements = static_cast<double>(t->numel());
      if (expert) {
        expert_bytes += static_cast<double>(t->nbytes);
        expert_elements += elements;
        continue;
      }
      work.weight_bytes += static_cast<double>(t->nbytes);
      if (t->shape.size() == 2) work.flops += 2 * tokens * elements;  // a matrix, not a vector
    }
  }
  if (experts > 0) {
    work.weight_bytes += static_cast<double>(stats.experts_touched) * expert_bytes / experts;
    work.flops += 2 * static_cast<double>(stats.expert_token_pairs) * expert_elements / experts;
  }
  if (const TensorInfo* e = weights.embed_tokens; e != nullptr && config.vocab_size > 0) {
    work.weight_bytes += tokens * static_cast<double>(e->nbytes) / config.vocab_size;
  }
  if (const TensorInfo* head = weights.lm_head; head != nullptr && logits_rows > 0) {
    work.weight_bytes += static_cast<double>(head->nbytes);
    work.flops += 2 * static_cast<double>(logits_rows) * static_cast<double>(head->numel());
  }
  const double kv_rows = static_cast<double>(stats.kv_tokens_read) * static_cast<double>(layers);
  work.kv_bytes = kv_rows * kv_bytes_per_token_layer;
  work.flops += 4 * static_cast<double>(config.q_size()) * kv_rows;
  return work;
}

double ExpectedExpertsTouched(const ModelShape& model, double tokens) {
  if (model.num_experts <= 0 || tokens <= 0) return 0;
  const double e = static_cast<double>(model.num_experts);
  const double k = static_cast<double>(model.top_k);
  return e * (1 - std::pow(1 - k / e, tokens));
}

namespace {

// One pass of `rows` token rows, `attended` K/V rows summed over the rows (per layer), logits for
// `logit_rows` rows, and `distinct` sequences' worth of K/V read (kv_rows: rows of K/V read per
// layer).
PassWork PlannedPass(const ModelShape& m, double rows, double attended, double kv_rows,
                     double logit_rows) {
  const double h = static_cast<double>(m.hidden_size);
  const double q = static_cast<double>(m.num_heads * m.head_dim);
  const double kv = static_cast<double>(m.num_kv_heads * m.head_dim);
  const double layers = static_cast<double>(m.num_layers);
  const double bpe = m.weight_bytes_per_element;
  const double attention = 2 * h * q + 2 * h * kv;  // q, o; k, v
  const double expert = 3 * h * static_cast<double>(m.ffn_size);
  const double shared = 3 * h * static_cast<double>(m.shared_ffn_size);
  const double dense = 3 * h * static_cast<double>(m.dense_ffn_size);
  const double moe_layers = layers * (1 - m.dense_layer_fraction);
  const double dense_layers = layers * m.dense_layer_fraction;
  const double router = h * static_cast<double>(m.num_experts);
  PassWork w;
  // Elements read once per pass, and their FLOPs for every row.
  const double fixed = layers * attention + moe_layers * (router + shared) + dense_layers * dense;
  w.weight_bytes = bpe * (fixed + moe_layers * ExpectedExpertsTouched(m, rows) * expert);
  w.flops = 2 * rows * (fixed + moe_layers * static_cast<double>(m.top_k) * expert);
  const double vocab = static_cast<double>(m.vocab_size);
  w.weight_bytes += bpe * rows * h;  // the embedding rows
  if (logit_rows > 0) {
    w.weight_bytes += bpe * vocab * h;
    w.flops += 2 * logit_rows * vocab * h;
  }
  w.flops += 4 * q * attended * layers;
  w.kv_bytes = kv_rows * KvBytesPerToken(m);  // KvBytesPerToken counts every layer
  return w;
}

}  // namespace

PassWork DecodePassWork(const ModelShape& model, int64_t sequences, int64_t context) {
  const double s = static_cast<double>(sequences);
  // Keys read per layer, averaged over the layers: a window layer reads at most its window.
  const double all = KvBytesPerToken(model);
  const double ctx =
      static_cast<double>(context) *
      (all > 0 ? KvBytesPerSequenceToken(model, static_cast<double>(context)) / all : 1.0);
  return PlannedPass(model, s, s * ctx, s * ctx, s);
}

PassWork PrefillPassWork(const ModelShape& model, int64_t sequences, int64_t prompt_tokens) {
  const double s = static_cast<double>(sequences), p = static_cast<double>(prompt_tokens);
  // Row i of a prompt attends i + 1 keys: p (p + 1) / 2 per prompt; the K/V rows are the prompt's
  // own, written and read once.
  return PlannedPass(model, s * p, s * p * (p + 1) / 2, s * p, s);
}

}  // namespace moebatch
