// Checkpoint: config.json + the tensor store, with every tensor MixtralForCausalLM expects checked
// for presence, shape and dtype (names as transformers 4.x modeling_mixtral.py and the hub's
// per-expert w1/w2/w3 layout).
#include "engine/model/checkpoint.h"

#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/family.h"
#include "engine/model/weight_check.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Looks up the tensors the model needs and checks each one's shape and dtype.
class TensorChecker {
 public:
  TensorChecker(const std::string& dir, const TensorStore& store, DType dtype)
      : dir_(dir), store_(store), dtype_(dtype) {}

  // Sets `*out` to tensor `name`, which must have `shape` and the config's dtype.
  absl::Status Get(const std::string& name, std::vector<int64_t> shape, const TensorInfo** out) {
    const TensorInfo* info = store_.Find(name);
    if (info == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("tensor \"", name, "\" is missing from the checkpoint in ", dir_));
    }
    if (info->shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(info->file, ": tensor \"", name, "\": wrong shape: expected ",
                       ShapeString(shape), ", found ", ShapeString(info->shape)));
    }
    if (info->dtype != dtype_) {
      return absl::InvalidArgumentError(absl::StrCat(
          info->file, ": tensor \"", name, "\": wrong dtype: expected ",
          std::string(DTypeName(dtype_)), " (config torch_dtype), found ", info->dtype_name));
    }
    used_.insert(name);
    *out = info;
    return absl::OkStatus();
  }

  // Logs (debug) the tensors no Get asked for, e.g. rotary inv_freq buffers of old checkpoints.
  void LogUnused() const {
    for (const auto& [name, info] : store_.tensors()) {
      if (used_.count(name) == 0) {
        spdlog::debug("{}: ignoring unexpected tensor {}", info->file, name);
      }
    }
  }

 private:
  const std::string& dir_;
  const TensorStore& store_;
  const DType dtype_;
  std::set<std::string> used_;
};

absl::Status LoadWeights(const ModelConfig& c, TensorChecker& check, ModelWeights* w) {
  for (const std::vector<TensorSpec>& region : ModelTensors(c, c.num_hidden_layers, w)) {
    for (const TensorSpec& t : region) {
      if (absl::Status s = check.Get(t.name, t.shape, t.target); !s.ok()) return s;
    }
  }
  if (c.tie_word_embeddings) w->lm_head = w->embed_tokens;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Load(const std::string& model_dir) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = model_dir;

  absl::StatusOr<ModelConfig> config = LoadModelConfig(model_dir);
  if (!config.ok()) return config.status();
  ckpt->config_ = *std::move(config);

  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(model_dir);
  if (!store.ok()) return store.status();
  ckpt->store_ = *std::move(store);

  TensorChecker check(model_dir, *ckpt->store_, ckpt->config_.torch_dtype);
  if (absl::Status s = LoadWeights(ckpt->config_, check, &ckpt->weights_); !s.ok()) return s;
  // What is cheap to read whole (norms, routers, the first rows of the embedding and lm_head) must
  // be finite: a NaN there makes every answer garbage (engine/model/weight_check.h).
  if (absl::Status s = CheckSmallTensorsFinite(ckpt->weights_); !s.ok()) return s;
  check.LogUnused();

  const ModelConfig& c = ckpt->config_;
  spdlog::info(
      "loaded {} from {}: {} layers x {} experts (top-{}), hidden {}, {} tensors, {:.1f} MiB {} in "
      "{} file(s)",
      c.architecture, model_dir, c.num_hidden_layers, c.num_local_experts, c.num_experts_per_tok,
      c.hidden_size, ckpt->store_->tensors().size(), ckpt->store_->total_bytes() / double(1 << 20),
      DTypeName(c.torch_dtype), ckpt->store_->num_files());
  return ckpt;
}

}  // namespace moebatch
