// The cuda backend's Device (cuda/cuda_backend.h): tasks A and B with cuda/kernels.h and cuBLAS,
// weights from resident layers or the two weight slots (engine/offload/weight_slots.h) the data
// mover fills through cuda/cuda_memory.h's copy engine (MoE-Lens §6.4-6.5).
//
// Quantized weights (a store with ggml-block tensors: a GGUF file, --weight_dtype int8|int4) are
// streamed as they are (the slots hold the store's region bytes) and each such matrix is
// dequantized on the GPU (gpu::DequantizeRows) into one scratch buffer in the compute dtype right
// before its GEMM, on the compute stream, so the scratch is free again when the next GEMM's
// dequantization starts; lm_head is dequantized once, at set-up, into its resident buffer; the
// embedding's gathered rows are decoded to f32 on the device.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cuda/cublas_loader.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_memory.h"
#include "cuda/kernels.h"
#include "engine/model/ggml_type.h"
#include "engine/offload/data_mover.h"
#include "engine/offload/gpu_memory_plan.h"
#include "engine/offload/weight_slots.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

using gpu::GpuDType;

absl::Status CublasError(cublasStatus_t err, const char* what) {
  if (err == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": cuBLAS status ", static_cast<int>(err)));
}

GpuDType ToGpu(DType t) {
  switch (t) {
    case DType::kF16:
      return GpuDType::kF16;
    case DType::kBF16:
      return GpuDType::kBF16;
    case DType::kF32:
      break;
  }
  return GpuDType::kF32;
}

// out [rows, hidden] (dtype) = the config's norm of the hidden states in [rows, hidden] f32 with
// weight [hidden] (dtype): RMSNorm, or DBRX's LayerNorm without bias.
absl::Status HiddenNorm(const ModelConfig& c, const float* in, const void* weight, GpuDType dtype,
                        int64_t rows, void* out, cudaStream_t stream) {
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (c.norm == NormType::kLayerNorm) {
    return gpu::LayerNorm(in, weight, dtype, rows, c.hidden_size, eps, out, dtype, stream);
  }
  return gpu::RmsNorm(in, weight, dtype, rows, c.hidden_size, eps, out, dtype, stream);
}

cudaDataType_t CudaType(GpuDType t) {
  switch (t) {
    case GpuDType::kF16:
      return CUDA_R_16F;
    case GpuDType::kBF16:
      return CUDA_R_16BF;
    case GpuDType::kF32:
      break;
  }
  return CUDA_R_32F;
}

// --- The device ---------------------------------------------------------------------------------

class CudaDevice final : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Create(const WeightStore& store,
                                                        const CudaBackendOptions& options);
  ~CudaDevice() override;

  const char* name() const override { return "cuda"; }
  const ModelConfig& config() const override { return store_.config(); }
  // Every call makes the device current on the calling thread first (the engine may be created on
  // one thread and stepped on another), and a failed call leaves the weight slots to be reset at
  // the next BeginPass.
  absl::Status Embed(int micro_batch, const int32_t* token_ids, const int64_t* positions,
                     int64_t tokens) override {
    return OnDevice([&] { return RunEmbed(micro_batch, token_ids, positions, tokens); });
  }
  // Prefill attention in task A (MoE-Lens §6.4): gpu::PrefillAttention over the segments' own
  // q/k/v, f32, before q/k/v go to the host.
  bool AttendsPrefill() const override { return true; }
  absl::Status SetPrefillSegments(int micro_batch, const int32_t* cu_rows,
                                  int64_t num_segments) override {
    return OnDevice([&] { return RunSetPrefillSegments(micro_batch, cu_rows, num_segments); });
  }
  absl::Status TaskA(int micro_batch, int64_t layer, float* q, float* k, float* v,
                     float* attn) override {
    return OnDevice([&] { return RunTaskA(micro_batch, layer, q, k, v, attn); });
  }
  absl::Status TaskB(int micro_batch, int64_t layer, const float* attn,
                     ForwardStats* stats) override {
    return OnDevice([&] { return RunTaskB(micro_batch, layer, attn, stats); });
  }
  absl::Status Logits(int micro_batch, const int64_t* rows, int64_t n, float* logits) override {
    return OnDevice([&] { return RunLogits(micro_batch, rows, n, logits); });
  }
  // The argmax on the GPU (gpu::ArgmaxRows): n token ids cross PCIe instead of n x vocab logits.
  absl::Status GreedyTokens(int micro_batch, const int64_t* rows, int64_t n,
                            int32_t* token_ids) override {
    return OnDevice([&] { return RunGreedyTokens(micro_batch, rows, n, token_ids); });
  }
  void BeginPass(int micro_batches) override {
    if (failed_) ResetAfterFailure();
    weight_slots_->BeginPass(micro_batches);
  }
  HostAllocator* host_buffer_allocator() const override { return buffer_allocator_.get(); }
  DeviceCounters counters() const override {
    const DataMoverStats s = mover_->stats();
    return DeviceCounters{s.fills, s.bytes, s.busy_seconds};
  }

 private:
  explicit CudaDevice(const WeightStore& store) : store_(store) {}

  template <typename Call>
  absl::Status OnDevice(Call&& call) {
    absl::Status st = CudaError(cudaSetDevice(device_), "cudaSetDevice");
    if (st.ok()) st = call();
    if (!st.ok()) failed_ = true;
    return st;
  }
  absl::Status RunEmbed(int micro_batch, const int32_t* token_ids, const int64_t* positions,
                        int64_t tokens);
  absl::Status RunSetPrefillSegments(int micro_batch, const int32_t* cu_rows, int64_t num_segments);
  absl::Status RunTaskA(int micro_batch, int64_t layer, float* q, float* k, float* v, float* attn);
  absl::Status RunTaskB(int micro_batch, int64_t layer, const float* attn, ForwardStats* stats);
  absl::Status RunLogits(int micro_batch, const int64_t* rows, int64_t n, float* logits);
  absl::Status RunGreedyTokens(int micro_batch, const int64_t* rows, int64_t n, int32_t* token_ids);
  // h[from, to) += O projection of attn_f_'s rows [from, to) (converted to the compute dtype), on
  // the compute stream: task B's first step, which task A does for the prefill segments' rows.
  absl::Status OutputProjection(int micro_batch, const std::byte* slot, int64_t layer, int64_t from,
                                int64_t to);
  // logits_ [n, vocab] f32 = RMSNorm(h[rows]) lm_headᵀ on the compute stream; 1 <= n <= tokens.
  absl::Status LmHead(int micro_batch, const int64_t* rows, int64_t n);
  // After a failed call, which may have left a pass half done (two layers live, a fill waited
  // for by no one): WeightSlots::Reset, and the streams drained.
  void ResetAfterFailure();

  // Bump allocation inside the one budgeted cudaMalloc, 256-byte aligned. With guards on
  // (MOEBATCH_CUDA_GUARD_BYTES), `guard_bytes_` of kGuardByte follow the buffer's last byte.
  template <typename T>
  T* Carve(int64_t count, const char* name) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    std::byte* p = arena_ + arena_used_;
    if (guard_bytes_ > 0) guards_.push_back(Guard{name, p + bytes});
    arena_used_ += (bytes + guard_bytes_ + 255) / 256 * 256;
    return reinterpret_cast<T*>(p);
  }
  // The guards' bytes all still kGuardByte, after the device finished all its work; Internal
  // naming the buffer whose guard was written otherwise. Called at the end of every pass.
  absl::Status CheckGuards();
  absl::Status CheckCall(int micro_batch, int64_t layer, int64_t tokens) const;
  // The weights of `layer`: a resident layer's region, or the weight slot WeightSlots says holds
  // it (its fill complete; the next streamed layer is then queued).
  absl::StatusOr<const std::byte*> AwaitLayer(int64_t layer);
  // y[m, n] (f32) = x[m, k] (dtype_) wᵀ with w [n, k] (dtype_) on the compute stream.
  absl::Status Gemm(const void* x, const void* w, int64_t m, int64_t n, int64_t k, float* y);
  // The same with the weight matrix `t` of `layer` in `slot` [n, k]: when it is in ggml blocks,
  // dequantized into dequant_ (compute dtype) first, on the compute stream. Nothing for m = 0.
  absl::Status Gemm(const void* x, const std::byte* slot, int64_t layer, const TensorInfo* t,
                    int64_t m, int64_t n, int64_t k, float* y);
  // Where a tensor of `layer` (a LayerWeights field, pointing into the layer's host region) is
  // in the device copy of that region at `slot`: the same offset. null for an absent tensor.
  const void* Tensor(const std::byte* slot, int64_t layer, const TensorInfo* t) const {
    return t == nullptr ? nullptr : slot + (t->data - store_.layer(layer).data);
  }
  // One FFN of `width` over `n` rows of `in` (compute dtype): out [n, hidden] f32 =
  // w2(silu(w1 x) * w3 x), through gate_, up_ and act_.
  absl::Status Ffn(const std::byte* slot, int64_t layer, const ExpertWeights& ew, const void* in,
                   int64_t n, float* out);
  // A MoE layer's FFN over x_ (the normed hidden state of `tokens` rows): the router's top-k, the
  // experts over their rows, the shared expert when the model has one; h += their weighted sum.
  absl::Status RoutedExperts(const std::byte* slot, int64_t layer, const LayerWeights& lw,
                             int64_t tokens, float* h, ForwardStats* stats);

  const WeightStore& store_;
  GpuDType dtype_ = GpuDType::kBF16;
  size_t elem_ = 2;
  int device_ = 0;
  GpuMemoryPlan plan_;
  std::byte* arena_ = nullptr;
  size_t arena_used_ = 0;
  struct Guard {
    const char* buffer;  // the buffer the guard follows
    std::byte* at;
  };
  static constexpr unsigned char kGuardByte = 0xA5;
  size_t guard_bytes_ = 0;
  std::vector<Guard> guards_;
  cudaStream_t compute_ = nullptr, transfer_ = nullptr;
  cudaEvent_t computed_ = nullptr, transferred_ = nullptr;
  const gpu::CublasApi* blas_ = nullptr;  // gpu::Cublas(): set before cublas_
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<CudaCopyEngine> copy_engine_;
  std::unique_ptr<DataMover> mover_;
  std::byte* slots_[2] = {nullptr, nullptr};
  std::vector<std::byte*> resident_layers_;  // layers 0..r-1, on the device for good
  // The dequantization scratch: [the largest quantized matrix of a layer] in dtype_
  // (plan_.dequant_bytes); null without quantized weights.
  void* dequant_ = nullptr;
  std::unique_ptr<WeightSlots> weight_slots_;
  std::unique_ptr<DevicePinnedAllocator> buffer_allocator_;
  bool failed_ = false;  // a call failed since the last BeginPass

  // Resident.
  void* lm_head_ = nullptr;
  void* final_norm_ = nullptr;
  float* inv_freq_ = nullptr;
  float rope_scaling_ = 1.0f;  // RopeTable::attention_scaling
  // Per micro-batch.
  float* h_[kMaxMicroBatches] = {};
  int64_t* positions_[kMaxMicroBatches] = {};
  int64_t tokens_[kMaxMicroBatches] = {};
  int32_t* prefill_cu_[kMaxMicroBatches] = {};  // [T + 1] segment row offsets (device)
  int64_t prefill_segments_[kMaxMicroBatches] = {};
  int64_t prefill_first_[kMaxMicroBatches] = {};  // rows [first, last) are in the segments
  int64_t prefill_last_[kMaxMicroBatches] = {};
  // Scratch (one task at a time).
  void* x_ = nullptr;  // [T, hidden] dtype
  float *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_f_ = nullptr, *proj_ = nullptr;
  void* attn_c_ = nullptr;
  float* router_ = nullptr;
  int32_t *ids_ = nullptr, *slot_of_ = nullptr, *sorted_token_ = nullptr, *offsets_ = nullptr;
  float* route_w_ = nullptr;
  void* expert_in_ = nullptr;                                      // [T k, hidden] dtype
  float *gate_ = nullptr, *up_ = nullptr, *expert_out_ = nullptr;  // [T, ffn columns] f32
  void* act_ = nullptr;  // [T, ffn columns] dtype (GpuFfnColumnsPerToken)
  float *shared_out_ = nullptr, *shared_gate_ = nullptr;  // [T, hidden], [T] f32
  float* logits_ = nullptr;
  int32_t* rows_ = nullptr;
  std::byte* workspace_ = nullptr;
  std::vector<std::byte> embed_rows_;  // host staging of the embedding gather
  std::vector<int32_t> host_offsets_;
};

absl::StatusOr<std::unique_ptr<Device>> CudaDevice::Create(const WeightStore& store,
                                                           const CudaBackendOptions& options) {
  const ModelConfig& c = store.config();
  if (c.mla || c.topk_method != TopkMethod::kSoftmax) {
    return absl::UnimplementedError(
        absl::StrCat("the cuda backend does not compute ", c.model_type,
                     "'s multi-head latent attention and routing yet (run it with --backend=cpu)"));
  }
  if (c.attention_sinks || c.swiglu_limit || c.expert_bias || c.router_linear_bias ||
      !c.sliding_layers.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "the cuda backend does not compute ", c.model_type,
        "'s attention sinks, per-layer sliding windows, router and expert biases and clamped "
        "SwiGLU yet (run it with --backend=cpu)"));
  }
  if (c.num_local_experts > gpu::kMaxRouterExperts ||
      c.num_experts_per_tok > gpu::kMaxCombineTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cuda backend routes at most ", gpu::kMaxRouterExperts, " experts, top-",
                     gpu::kMaxCombineTopK, "; the model has ", c.num_local_experts, ", top-",
                     c.num_experts_per_tok, " (run it with --backend=cpu)"));
  }
  // Quantized tensors: every type must be one the GPU decodes; the scratch holds the largest
  // quantized matrix of a layer in the compute dtype (lm_head is decoded into its own buffer).
  const size_t compute_elem = gpu::GpuDTypeSize(ToGpu(store.dtype()));
  int64_t dequant_bytes = 0;
  for (int64_t r = -1; r < store.num_layers(); ++r) {
    for (const WeightTensor& t : (r < 0 ? store.globals() : store.layer(r)).tensors) {
      if (!t.quant) continue;
      if (!gpu::GpuDequantizes(*t.quant) || t.shape.size() != 2) {
        return absl::UnimplementedError(
            absl::StrCat("the cuda backend does not dequantize ", GgmlTypeInfoOf(*t.quant).name,
                         " weights (tensor \"", t.name,
                         "\"; it decodes Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, "
                         "Q5_K, Q6_K and MXFP4 matrices); run the model with --backend=cpu"));
      }
      if (r >= 0) {
        dequant_bytes = std::max<int64_t>(
            dequant_bytes, t.shape[0] * t.shape[1] * static_cast<int64_t>(compute_elem));
      }
    }
  }
  std::unique_ptr<CudaDevice> d(new CudaDevice(store));
  d->device_ = options.device;
  d->buffer_allocator_ = std::make_unique<DevicePinnedAllocator>(options.device);
  d->dtype_ = ToGpu(store.dtype());
  d->elem_ = gpu::GpuDTypeSize(d->dtype_);
  MB_RETURN_IF_ERROR(CudaError(cudaSetDevice(options.device), "cudaSetDevice"));
  // A host thread waiting for the GPU sleeps instead of spinning (CUDA spins by default with one
  // context): the engine thread waits on the device while the CPU task's OpenMP team, one thread
  // per core, attends; a spinning waiter would take a core from it and make a straggler of one
  // thread.
  MB_RETURN_IF_ERROR(CudaError(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync),
                               "cudaSetDeviceFlags (blocking sync)"));
  auto budget = CudaMemoryBudget(options);
  if (!budget.ok()) return budget.status();
  auto plan = PlanGpuDevice(c, store.dtype(), static_cast<int64_t>(store.max_layer_bytes()),
                            store.num_layers(), options.max_tokens_per_pass, *budget,
                            options.resident_layers, dequant_bytes);
  if (!plan.ok()) return plan.status();
  d->plan_ = *plan;
  // The plan's workspace holds the cuBLAS workspace, the small buffers and the 256-byte alignment
  // of every carved buffer (checked after carving).
  // Guards (a debugging aid, MOEBATCH_CUDA_GUARD_BYTES) come on top of the budget: at most
  // kMaxCarves buffers, each with its guard and up to 255 bytes more of alignment.
  if (const char* env = std::getenv("MOEBATCH_CUDA_GUARD_BYTES"); env != nullptr && *env != '\0') {
    int64_t guard = 0;
    if (!absl::SimpleAtoi(env, &guard) || guard < 0 || guard > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("MOEBATCH_CUDA_GUARD_BYTES=", env, ": expected 0 to 1048576 bytes"));
    }
    d->guard_bytes_ = static_cast<size_t>(guard);
  }
  constexpr size_t kMaxCarves = 40;
  const size_t arena_bytes =
      static_cast<size_t>(d->plan_.total_bytes) +
      (d->guard_bytes_ > 0
           ? (kMaxCarves + static_cast<size_t>(d->plan_.resident_layers)) * (d->guard_bytes_ + 256)
           : 0);
  void* arena = nullptr;
  MB_RETURN_IF_ERROR(CudaError(cudaMalloc(&arena, arena_bytes), "cudaMalloc (the GPU budget)"));
  d->arena_ = static_cast<std::byte*>(arena);

  const int64_t T = options.max_tokens_per_pass, hidden = c.hidden_size;
  const int64_t k = c.num_experts_per_tok, E = c.num_local_experts;
  const int64_t ffn_columns = GpuFfnColumnsPerToken(c);
  d->slots_[0] = d->Carve<std::byte>(d->plan_.weight_slot_bytes, "weight slot 0");
  d->slots_[1] = d->Carve<std::byte>(d->plan_.weight_slot_bytes, "weight slot 1");
  for (int64_t l = 0; l < d->plan_.resident_layers; ++l) {
    d->resident_layers_.push_back(
        d->Carve<std::byte>(d->plan_.weight_slot_bytes, "resident layer"));
  }
  d->lm_head_ = d->Carve<std::byte>(c.vocab_size * hidden * d->elem_, "lm_head");
  d->final_norm_ = d->Carve<std::byte>(hidden * d->elem_, "final_norm");
  d->inv_freq_ = d->Carve<float>(c.head_dim / 2, "inv_freq");
  for (int mb = 0; mb < kMaxMicroBatches; ++mb) {
    d->h_[mb] = d->Carve<float>(T * hidden, "h");
    d->positions_[mb] = d->Carve<int64_t>(T, "positions");
    d->prefill_cu_[mb] = d->Carve<int32_t>(T + 1, "prefill_cu");
  }
  d->x_ = d->Carve<std::byte>(T * hidden * d->elem_, "x");
  d->q_ = d->Carve<float>(T * c.q_size(), "q");
  d->k_ = d->Carve<float>(T * c.kv_size(), "k");
  d->v_ = d->Carve<float>(T * c.kv_size(), "v");
  d->attn_f_ = d->Carve<float>(T * c.q_size(), "attn_f");
  d->attn_c_ = d->Carve<std::byte>(T * c.q_size() * d->elem_, "attn_c");
  d->proj_ = d->Carve<float>(T * hidden, "proj");
  d->router_ = d->Carve<float>(T * E, "router");
  d->ids_ = d->Carve<int32_t>(T * k, "ids");
  d->route_w_ = d->Carve<float>(T * k, "route_w");
  d->slot_of_ = d->Carve<int32_t>(T * k, "slot_of");
  d->sorted_token_ = d->Carve<int32_t>(T * k, "sorted_token");
  d->offsets_ = d->Carve<int32_t>(E + 1, "offsets");
  d->expert_in_ = d->Carve<std::byte>(T * k * hidden * d->elem_, "expert_in");
  d->gate_ = d->Carve<float>(T * ffn_columns, "gate");
  d->up_ = d->Carve<float>(T * ffn_columns, "up");
  d->act_ = d->Carve<std::byte>(T * ffn_columns * d->elem_, "act");
  d->expert_out_ = d->Carve<float>(T * k * hidden, "expert_out");
  if (c.shared_expert_intermediate_size > 0) {
    d->shared_out_ = d->Carve<float>(T * hidden, "shared_out");
    d->shared_gate_ = d->Carve<float>(T, "shared_gate");
  }
  d->logits_ = d->Carve<float>(T * c.vocab_size, "logits");
  d->rows_ = d->Carve<int32_t>(T, "rows");
  if (d->plan_.dequant_bytes > 0) {
    d->dequant_ = d->Carve<std::byte>(d->plan_.dequant_bytes, "dequantization scratch");
  }
  const size_t workspace_bytes = GpuMemoryPlan::kCublasWorkspaceBytes;
  d->workspace_ = d->Carve<std::byte>(static_cast<int64_t>(workspace_bytes), "workspace");
  if (d->guards_.size() > kMaxCarves + static_cast<size_t>(d->plan_.resident_layers) ||
      d->arena_used_ > arena_bytes) {
    return absl::InternalError(absl::StrCat("GPU memory: carved ", d->arena_used_,
                                            " bytes out of an arena of ", arena_bytes));
  }

  MB_RETURN_IF_ERROR(
      CudaError(cudaStreamCreateWithFlags(&d->compute_, cudaStreamNonBlocking), "compute stream"));
  MB_RETURN_IF_ERROR(CudaError(cudaStreamCreateWithFlags(&d->transfer_, cudaStreamNonBlocking),
                               "transfer stream"));
  MB_RETURN_IF_ERROR(
      CudaError(cudaEventCreateWithFlags(&d->computed_, cudaEventDisableTiming), "event"));
  MB_RETURN_IF_ERROR(
      CudaError(cudaEventCreateWithFlags(&d->transferred_, cudaEventDisableTiming), "event"));
  absl::StatusOr<const gpu::CublasApi*> blas = gpu::Cublas();
  if (!blas.ok()) return blas.status();
  d->blas_ = *blas;
  MB_RETURN_IF_ERROR(CublasError(d->blas_->create(&d->cublas_), "cublasCreate"));
  MB_RETURN_IF_ERROR(CublasError(d->blas_->set_stream(d->cublas_, d->compute_), "cublasSetStream"));
  MB_RETURN_IF_ERROR(CublasError(
      d->blas_->set_workspace(d->cublas_, d->workspace_, workspace_bytes), "cublasSetWorkspace"));
  // f32 means f32: no TF32 tensor-core rounding in the exactness mode.
  MB_RETURN_IF_ERROR(
      CublasError(d->blas_->set_math_mode(d->cublas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));

  // Resident weights: lm_head and the final norm; the RoPE inverse frequencies as the CPU has them.
  const ModelWeights& w = store.weights();
  if (w.lm_head->quant) {
    // A quantized lm_head (int8 at load, a GGUF file's Q6_K / Q8_0 ...): its blocks through weight
    // slot 0 (unused until the data mover starts) in chunks of rows, each decoded into lm_head_.
    const GgmlType type = *w.lm_head->quant;
    const int64_t row_bytes = GgmlRowBytes(GgmlTypeInfoOf(type), hidden);
    const int64_t chunk = d->plan_.weight_slot_bytes / row_bytes;
    if (chunk < 1) {
      return absl::InternalError(absl::StrCat("lm_head: a row of ", row_bytes,
                                              " bytes does not fit a weight slot of ",
                                              d->plan_.weight_slot_bytes));
    }
    for (int64_t r0 = 0; r0 < c.vocab_size; r0 += chunk) {
      const int64_t rows = std::min(chunk, c.vocab_size - r0);
      MB_RETURN_IF_ERROR(CudaError(cudaMemcpyAsync(d->slots_[0], w.lm_head->data + r0 * row_bytes,
                                                   static_cast<size_t>(rows * row_bytes),
                                                   cudaMemcpyHostToDevice, d->compute_),
                                   "lm_head H2D"));
      MB_RETURN_IF_ERROR(gpu::DequantizeRows(
          d->slots_[0], type, rows, hidden,
          static_cast<std::byte*>(d->lm_head_) + r0 * hidden * static_cast<int64_t>(d->elem_),
          d->dtype_, d->compute_));
      MB_RETURN_IF_ERROR(CudaError(cudaStreamSynchronize(d->compute_), "lm_head dequantization"));
    }
  } else {
    MB_RETURN_IF_ERROR(CudaError(
        cudaMemcpy(d->lm_head_, w.lm_head->data, w.lm_head->nbytes, cudaMemcpyHostToDevice),
        "lm_head H2D"));
  }
  MB_RETURN_IF_ERROR(
      CudaError(cudaMemcpy(d->final_norm_, w.norm->data, w.norm->nbytes, cudaMemcpyHostToDevice),
                "final norm H2D"));
  for (size_t l = 0; l < d->resident_layers_.size(); ++l) {
    const WeightRegion& region = store.layer(static_cast<int64_t>(l));
    MB_RETURN_IF_ERROR(CudaError(
        cudaMemcpy(d->resident_layers_[l], region.data, region.bytes, cudaMemcpyHostToDevice),
        "resident layer H2D"));
  }
  const RopeTable rope = ComputeRope(c);
  d->rope_scaling_ = rope.attention_scaling;
  MB_RETURN_IF_ERROR(
      CudaError(cudaMemcpy(d->inv_freq_, rope.inv_freq.data(), rope.inv_freq.size() * sizeof(float),
                           cudaMemcpyHostToDevice),
                "inv_freq H2D"));
  const std::vector<unsigned char> pattern(d->guard_bytes_, kGuardByte);
  for (const Guard& g : d->guards_) {
    MB_RETURN_IF_ERROR(CudaError(
        cudaMemcpy(g.at, pattern.data(), pattern.size(), cudaMemcpyHostToDevice), "guard H2D"));
  }
  if (!d->guards_.empty()) {
    spdlog::info("cuda backend: {} guards of {} bytes after the arena's buffers", d->guards_.size(),
                 d->guard_bytes_);
  }
  // A cudaMemcpy from pageable memory (inv_freq) may return before the device is written, and
  // the non-blocking compute stream does not wait for the default stream: finish it now.
  MB_RETURN_IF_ERROR(CudaError(cudaDeviceSynchronize(), "set-up copies"));

  auto engine =
      CudaCopyEngine::Create(options.device, {d->slots_[0], d->slots_[1]},
                             static_cast<size_t>(d->plan_.weight_slot_bytes), d->compute_);
  if (!engine.ok()) return engine.status();
  d->copy_engine_ = *std::move(engine);
  d->mover_ = std::make_unique<DataMover>(d->copy_engine_.get(), options.packet_bytes);
  d->weight_slots_ = std::make_unique<WeightSlots>(
      store, static_cast<int64_t>(d->resident_layers_.size()), d->mover_.get());
  d->host_offsets_.resize(E + 1);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, options.device);
  spdlog::info("cuda backend: {} (sm_{}{}), {} compute, budget {:.2f} GiB: {}", prop.name,
               prop.major, prop.minor, DTypeName(store.dtype()), *budget / double(1 << 30),
               d->plan_.ToString());
  return std::unique_ptr<Device>(std::move(d));
}

CudaDevice::~CudaDevice() {
  weight_slots_.reset();
  mover_.reset();  // stops after the packet in flight
  copy_engine_.reset();
  if (compute_ != nullptr) cudaStreamSynchronize(compute_);
  if (transfer_ != nullptr) cudaStreamSynchronize(transfer_);
  if (cublas_ != nullptr) blas_->destroy(cublas_);
  if (computed_ != nullptr) cudaEventDestroy(computed_);
  if (transferred_ != nullptr) cudaEventDestroy(transferred_);
  if (compute_ != nullptr) cudaStreamDestroy(compute_);
  if (transfer_ != nullptr) cudaStreamDestroy(transfer_);
  if (arena_ != nullptr) cudaFree(arena_);
}

absl::Status CudaDevice::CheckCall(int micro_batch, int64_t layer, int64_t tokens) const {
  if (micro_batch < 0 || micro_batch >= kMaxMicroBatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch ", micro_batch, " outside [0, ", kMaxMicroBatches, ")"));
  }
  if (layer < 0 || layer >= store_.num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " outside [0, ", store_.num_layers(), ")"));
  }
  if (tokens < 0 || tokens > plan_.tokens_per_pass) {
    return absl::InvalidArgumentError(
        absl::StrCat(tokens, " tokens in a micro-batch; the GPU budget was planned for ",
                     plan_.tokens_per_pass));
  }
  return absl::OkStatus();
}

void CudaDevice::ResetAfterFailure() {
  if (cudaSetDevice(device_) != cudaSuccess) return;
  weight_slots_->Reset();
  for (cudaStream_t stream : {compute_, transfer_}) {
    if (cudaError_t err = cudaStreamSynchronize(stream); err != cudaSuccess) {
      spdlog::warn("cuda backend: resetting after a failed call: {}", cudaGetErrorString(err));
    }
  }
  failed_ = false;
}

absl::StatusOr<const std::byte*> CudaDevice::AwaitLayer(int64_t layer) {
  if (layer < static_cast<int64_t>(resident_layers_.size())) return resident_layers_[layer];
  auto slot = weight_slots_->Acquire(layer);
  if (!slot.ok()) return slot.status();
  return slots_[*slot];
}

absl::Status CudaDevice::Gemm(const void* x, const void* w, int64_t m, int64_t n, int64_t k,
                              float* y) {
  if (m == 0) return absl::OkStatus();
  // Row-major y[m, n] = x[m, k] w[n, k]ᵀ is column-major yᵀ[n, m] = w (k x n, transposed) x ...:
  // cuBLAS C = op(A) op(B) with A = w (lda k, op T) and B = x (ldb k, op N).
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t t = CudaType(dtype_);
  return CublasError(
      blas_->gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, w, t, static_cast<int>(k), x, t,
                     static_cast<int>(k), &beta, y, CUDA_R_32F, static_cast<int>(n),
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

absl::Status CudaDevice::Gemm(const void* x, const std::byte* slot, int64_t layer,
                              const TensorInfo* t, int64_t m, int64_t n, int64_t k, float* y) {
  if (m == 0) return absl::OkStatus();
  const void* w = Tensor(slot, layer, t);
  if (t->quant) {
    MB_RETURN_IF_ERROR(gpu::DequantizeRows(w, *t->quant, n, k, dequant_, dtype_, compute_));
    w = dequant_;
  }
  return Gemm(x, w, m, n, k, y);
}

absl::Status CudaDevice::OutputProjection(int micro_batch, const std::byte* slot, int64_t layer,
                                          int64_t from, int64_t to) {
  if (to <= from) return absl::OkStatus();
  const ModelConfig& c = config();
  const int64_t q_row = c.q_size(), hidden = c.hidden_size, rows = to - from;
  std::byte* attn_c = static_cast<std::byte*>(attn_c_) + from * q_row * elem_;
  MB_RETURN_IF_ERROR(
      gpu::ConvertF32To(attn_f_ + from * q_row, rows * q_row, attn_c, dtype_, compute_));
  const LayerWeights& lw = store_.weights().layers[layer];
  MB_RETURN_IF_ERROR(
      Gemm(attn_c, slot, layer, lw.o_proj, rows, hidden, q_row, proj_ + from * hidden));
  if (lw.o_bias != nullptr) {
    MB_RETURN_IF_ERROR(gpu::AddBias(proj_ + from * hidden, rows, hidden,
                                    Tensor(slot, layer, lw.o_bias), dtype_, compute_));
  }
  return gpu::AddResidual(h_[micro_batch] + from * hidden, proj_ + from * hidden, rows * hidden,
                          compute_);
}

absl::Status CudaDevice::RunEmbed(int micro_batch, const int32_t* token_ids,
                                  const int64_t* positions, int64_t tokens) {
  MB_RETURN_IF_ERROR(CheckCall(micro_batch, 0, tokens));
  prefill_segments_[micro_batch] = 0;
  const ModelConfig& c = config();
  const TensorInfo& table = *store_.weights().embed_tokens;
  // A quantized table's rows are gathered in their blocks and decoded on the device.
  const size_t row_bytes =
      table.quant ? static_cast<size_t>(GgmlRowBytes(GgmlTypeInfoOf(*table.quant), c.hidden_size))
                  : static_cast<size_t>(c.hidden_size) * DTypeSize(*table.dtype);
  for (int64_t t = 0; t < tokens; ++t) {
    if (token_ids[t] < 0 || token_ids[t] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", token_ids[t], " outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  // The embedding table stays in host memory: gather the rows here, widen on the GPU.
  embed_rows_.resize(static_cast<size_t>(tokens) * row_bytes);
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(embed_rows_.data() + t * row_bytes, table.data + token_ids[t] * row_bytes,
                row_bytes);
  }
  tokens_[micro_batch] = tokens;
  if (tokens == 0) return absl::OkStatus();
  // Stage the rows in the (not yet used) expert-input buffer, which is large enough:
  // [T k, hidden] >= [T, hidden] in the compute dtype (2 or 4 bytes an element; ggml blocks take
  // at most 34 bytes per 32).
  MB_RETURN_IF_ERROR(CudaError(cudaMemcpyAsync(expert_in_, embed_rows_.data(), embed_rows_.size(),
                                               cudaMemcpyHostToDevice, compute_),
                               "embedding rows H2D"));
  MB_RETURN_IF_ERROR(CudaError(cudaMemcpyAsync(positions_[micro_batch], positions,
                                               static_cast<size_t>(tokens) * sizeof(int64_t),
                                               cudaMemcpyHostToDevice, compute_),
                               "positions H2D"));
  if (table.quant) {
    MB_RETURN_IF_ERROR(gpu::DequantizeRows(expert_in_, *table.quant, tokens, c.hidden_size,
                                           h_[micro_batch], GpuDType::kF32, compute_));
  } else {
    MB_RETURN_IF_ERROR(gpu::ConvertToF32(expert_in_, ToGpu(*table.dtype), tokens * c.hidden_size,
                                         h_[micro_batch], compute_));
  }
  MB_RETURN_IF_ERROR(weight_slots_->StartPass());
  return CudaError(cudaStreamSynchronize(compute_), "embedding");
}

absl::Status CudaDevice::RunSetPrefillSegments(int micro_batch, const int32_t* cu_rows,
                                               int64_t num_segments) {
  const int64_t tokens =
      tokens_[micro_batch < 0 || micro_batch >= kMaxMicroBatches ? 0 : micro_batch];
  MB_RETURN_IF_ERROR(CheckCall(micro_batch, 0, tokens));
  if (num_segments < 0 || num_segments > tokens || (num_segments > 0 && cu_rows == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefill segments: ", num_segments, " segments in a micro-batch of ", tokens, " tokens"));
  }
  for (int64_t s = 0; s < num_segments + (num_segments > 0 ? 1 : 0); ++s) {
    if (cu_rows[s] < 0 || cu_rows[s] > tokens || (s > 0 && cu_rows[s] < cu_rows[s - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefill segments: cu_rows[", s, "] = ", cu_rows[s],
                       " is out of order or outside [0, ", tokens, "]"));
    }
  }
  prefill_segments_[micro_batch] = num_segments;
  if (num_segments == 0) return absl::OkStatus();
  prefill_first_[micro_batch] = cu_rows[0];
  prefill_last_[micro_batch] = cu_rows[num_segments];
  MB_RETURN_IF_ERROR(
      CudaError(cudaMemcpyAsync(prefill_cu_[micro_batch], cu_rows,
                                static_cast<size_t>(num_segments + 1) * sizeof(int32_t),
                                cudaMemcpyHostToDevice, compute_),
                "prefill segments H2D"));
  return CudaError(cudaStreamSynchronize(compute_), "prefill segments");
}

absl::Status CudaDevice::RunTaskA(int micro_batch, int64_t layer, float* q, float* k, float* v,
                                  float* attn) {
  const int64_t tokens =
      tokens_[micro_batch < 0 || micro_batch >= kMaxMicroBatches ? 0 : micro_batch];
  MB_RETURN_IF_ERROR(CheckCall(micro_batch, layer, tokens));
  const ModelConfig& c = config();
  auto slot = AwaitLayer(layer);
  if (!slot.ok()) return slot.status();
  if (tokens == 0) return absl::OkStatus();
  const std::byte* s = *slot;
  const int64_t hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const LayerWeights& lw = store_.weights().layers[layer];
  MB_RETURN_IF_ERROR(HiddenNorm(c, h_[micro_batch], Tensor(s, layer, lw.input_layernorm), dtype_,
                                tokens, x_, compute_));
  MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.q_proj, tokens, c.q_size(), hidden, q_));
  MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.k_proj, tokens, c.kv_size(), hidden, k_));
  MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.v_proj, tokens, c.kv_size(), hidden, v_));
  // The families' attention inputs, in CpuDevice::TaskA's order: q/k/v biases, the q/k norms
  // (per head: Qwen3; over the projection: OLMoE), clip_qkv (OLMoE), then RoPE.
  if (lw.q_bias != nullptr) {
    for (auto [x, bias, n] :
         {std::tuple{q_, lw.q_bias, c.q_size()}, std::tuple{k_, lw.k_bias, c.kv_size()},
          std::tuple{v_, lw.v_bias, c.kv_size()}}) {
      MB_RETURN_IF_ERROR(gpu::AddBias(x, tokens, n, Tensor(s, layer, bias), dtype_, compute_));
    }
  }
  if (c.qk_norm != QkNorm::kNone) {
    const bool per_head = c.qk_norm == QkNorm::kPerHead;
    const int64_t d = c.head_dim;
    MB_RETURN_IF_ERROR(gpu::RmsNorm(q_, Tensor(s, layer, lw.q_norm), dtype_,
                                    per_head ? tokens * c.num_attention_heads : tokens,
                                    per_head ? d : c.q_size(), eps, q_, GpuDType::kF32, compute_));
    MB_RETURN_IF_ERROR(gpu::RmsNorm(k_, Tensor(s, layer, lw.k_norm), dtype_,
                                    per_head ? tokens * c.num_key_value_heads : tokens,
                                    per_head ? d : c.kv_size(), eps, k_, GpuDType::kF32, compute_));
  }
  if (c.clip_qkv) {
    const float limit = static_cast<float>(*c.clip_qkv);
    MB_RETURN_IF_ERROR(gpu::ClampAbs(q_, tokens * c.q_size(), limit, compute_));
    MB_RETURN_IF_ERROR(gpu::ClampAbs(k_, tokens * c.kv_size(), limit, compute_));
    MB_RETURN_IF_ERROR(gpu::ClampAbs(v_, tokens * c.kv_size(), limit, compute_));
  }
  MB_RETURN_IF_ERROR(gpu::ApplyRope(q_, tokens, c.num_attention_heads, c.head_dim,
                                    positions_[micro_batch], inv_freq_, rope_scaling_, compute_));
  MB_RETURN_IF_ERROR(gpu::ApplyRope(k_, tokens, c.num_key_value_heads, c.head_dim,
                                    positions_[micro_batch], inv_freq_, rope_scaling_, compute_));
  // Prefill attention of the segments, and what task B would do with it: the O projection and
  // the residual, with this layer's weights (device.h: a device that attends prefill may apply it
  // itself). The segments' attention never leaves the GPU, and task B moves only the rows the CPU
  // attended: per prefill token and layer, q_size f32 less each way over PCIe (16 KiB for
  // Mixtral), the H2D half of which would compete with the weight stream.
  const int64_t segments = prefill_segments_[micro_batch];
  const int64_t first = segments > 0 ? prefill_first_[micro_batch] : tokens;
  const int64_t last = segments > 0 ? prefill_last_[micro_batch] : tokens;
  if (segments > 0) {
    MB_RETURN_IF_ERROR(gpu::PrefillAttention(
        q_, k_, v_, prefill_cu_[micro_batch], segments, tokens, c.num_attention_heads,
        c.num_key_value_heads, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
        c.sliding_window.value_or(0), attn_f_, compute_));
    MB_RETURN_IF_ERROR(OutputProjection(micro_batch, s, layer, first, last));
  }
  // q (rows outside the segments: the CPU attends them), k and v to the host on the transfer
  // stream, after the compute stream's work.
  MB_RETURN_IF_ERROR(CudaError(cudaEventRecord(computed_, compute_), "event"));
  MB_RETURN_IF_ERROR(CudaError(cudaStreamWaitEvent(transfer_, computed_, 0), "event wait"));
  const int64_t q_row = c.q_size();
  const size_t kvb = static_cast<size_t>(tokens * c.kv_size()) * sizeof(float);
  auto rows_d2h = [&](float* host, const float* device, int64_t from, int64_t to,
                      const char* what) {
    if (to <= from) return absl::OkStatus();
    return CudaError(cudaMemcpyAsync(host + from * q_row, device + from * q_row,
                                     static_cast<size_t>((to - from) * q_row) * sizeof(float),
                                     cudaMemcpyDeviceToHost, transfer_),
                     what);
  };
  MB_RETURN_IF_ERROR(rows_d2h(q, q_, 0, first, "q D2H"));
  MB_RETURN_IF_ERROR(rows_d2h(q, q_, last, tokens, "q D2H"));
  MB_RETURN_IF_ERROR(
      CudaError(cudaMemcpyAsync(k, k_, kvb, cudaMemcpyDeviceToHost, transfer_), "k D2H"));
  MB_RETURN_IF_ERROR(
      CudaError(cudaMemcpyAsync(v, v_, kvb, cudaMemcpyDeviceToHost, transfer_), "v D2H"));
  return CudaError(cudaStreamSynchronize(transfer_), "task A");
}

absl::Status CudaDevice::RunTaskB(int micro_batch, int64_t layer, const float* attn,
                                  ForwardStats* stats) {
  const int64_t tokens =
      tokens_[micro_batch < 0 || micro_batch >= kMaxMicroBatches ? 0 : micro_batch];
  MB_RETURN_IF_ERROR(CheckCall(micro_batch, layer, tokens));
  const ModelConfig& c = config();
  auto slot = AwaitLayer(layer);
  if (!slot.ok()) return slot.status();
  const std::byte* s = *slot;
  const int64_t hidden = c.hidden_size;
  float* h = h_[micro_batch];
  if (tokens > 0) {
    // The attention output of the rows the CPU attended (all but the prefill segments', which
    // task A applied) to the device on the transfer stream; the compute stream waits for it.
    const int64_t segments = prefill_segments_[micro_batch];
    const int64_t first = segments > 0 ? prefill_first_[micro_batch] : tokens;
    const int64_t last = segments > 0 ? prefill_last_[micro_batch] : tokens;
    const int64_t q_row = c.q_size();
    for (auto [from, to] : {std::pair{int64_t{0}, first}, std::pair{last, tokens}}) {
      if (to <= from) continue;
      MB_RETURN_IF_ERROR(
          CudaError(cudaMemcpyAsync(attn_f_ + from * q_row, attn + from * q_row,
                                    static_cast<size_t>((to - from) * q_row) * sizeof(float),
                                    cudaMemcpyHostToDevice, transfer_),
                    "attention H2D"));
    }
    MB_RETURN_IF_ERROR(CudaError(cudaEventRecord(transferred_, transfer_), "event"));
    MB_RETURN_IF_ERROR(CudaError(cudaStreamWaitEvent(compute_, transferred_, 0), "event wait"));
    MB_RETURN_IF_ERROR(OutputProjection(micro_batch, s, layer, 0, first));
    MB_RETURN_IF_ERROR(OutputProjection(micro_batch, s, layer, last, tokens));
    const LayerWeights& lw = store_.weights().layers[layer];
    MB_RETURN_IF_ERROR(HiddenNorm(c, h, Tensor(s, layer, lw.post_attention_layernorm), dtype_,
                                  tokens, x_, compute_));
    if (lw.router == nullptr) {
      // A dense layer: its FFN over every token, added to the residual (CpuDevice's one expert
      // with weight 1 gives the same f32 sums: 0 + out * 1, then h + that).
      MB_RETURN_IF_ERROR(Ffn(s, layer, lw.experts[0], x_, tokens, expert_out_));
      MB_RETURN_IF_ERROR(gpu::AddResidual(h, expert_out_, tokens * hidden, compute_));
      if (stats != nullptr) {
        stats->expert_token_pairs += tokens;
        stats->experts_touched += 1;
      }
    } else {
      MB_RETURN_IF_ERROR(RoutedExperts(s, layer, lw, tokens, h, stats));
    }
  }
  // The layer's weights are done with once every micro-batch ran its task B.
  MB_RETURN_IF_ERROR(weight_slots_->TaskBDone(layer));
  return CudaError(cudaStreamSynchronize(compute_), "task B");
}

absl::Status CudaDevice::Ffn(const std::byte* slot, int64_t layer, const ExpertWeights& ew,
                             const void* in, int64_t n, float* out) {
  const int64_t hidden = config().hidden_size, width = ew.w1->shape[0];
  MB_RETURN_IF_ERROR(Gemm(in, slot, layer, ew.w1, n, width, hidden, gate_));
  MB_RETURN_IF_ERROR(Gemm(in, slot, layer, ew.w3, n, width, hidden, up_));
  MB_RETURN_IF_ERROR(gpu::SiluMul(gate_, up_, GpuDType::kF32, n, width, act_, dtype_, compute_));
  return Gemm(act_, slot, layer, ew.w2, n, hidden, width, out);
}

absl::Status CudaDevice::RoutedExperts(const std::byte* s, int64_t layer, const LayerWeights& lw,
                                       int64_t tokens, float* h, ForwardStats* stats) {
  const ModelConfig& c = config();
  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size;
  const int64_t E = c.num_local_experts, top_k = c.num_experts_per_tok;
  MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.router, tokens, E, hidden, router_));
  // DBRX's p-norm (p != 1) divides the top-k weights after the selection, as CpuDevice::TaskB.
  const bool p_norm = c.norm_topk_prob && c.topk_norm_p != 1.0;
  MB_RETURN_IF_ERROR(gpu::RouterTopK(router_, tokens, E, top_k, ids_, route_w_,
                                     c.norm_topk_prob && !p_norm, compute_));
  if (p_norm) {
    MB_RETURN_IF_ERROR(gpu::NormalizeTopKWeights(route_w_, tokens, top_k,
                                                 static_cast<float>(c.topk_norm_p), compute_));
  }
  MB_RETURN_IF_ERROR(gpu::BuildExpertPermutation(ids_, tokens, top_k, E, offsets_, sorted_token_,
                                                 slot_of_, compute_));
  MB_RETURN_IF_ERROR(
      CudaError(cudaMemcpyAsync(host_offsets_.data(), offsets_, (E + 1) * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, compute_),
                "expert offsets D2H"));
  MB_RETURN_IF_ERROR(CudaError(cudaStreamSynchronize(compute_), "router"));
  const int64_t rows = host_offsets_[E];
  MB_RETURN_IF_ERROR(
      gpu::GatherRows(x_, dtype_, tokens, hidden, sorted_token_, rows, expert_in_, compute_));
  const auto* in = static_cast<const std::byte*>(expert_in_);
  auto* act = static_cast<std::byte*>(act_);
  int64_t touched = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = host_offsets_[e], n = host_offsets_[e + 1] - r0;
    if (n == 0) continue;
    ++touched;
    const void* x = in + r0 * hidden * elem_;
    const ExpertWeights& ew = lw.experts[e];
    MB_RETURN_IF_ERROR(Gemm(x, s, layer, ew.w1, n, ffn, hidden, gate_ + r0 * ffn));
    MB_RETURN_IF_ERROR(Gemm(x, s, layer, ew.w3, n, ffn, hidden, up_ + r0 * ffn));
  }
  MB_RETURN_IF_ERROR(gpu::SiluMul(gate_, up_, GpuDType::kF32, rows, ffn, act_, dtype_, compute_));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = host_offsets_[e], n = host_offsets_[e + 1] - r0;
    if (n == 0) continue;
    MB_RETURN_IF_ERROR(Gemm(act + r0 * ffn * elem_, s, layer, lw.experts[e].w2, n, hidden, ffn,
                            expert_out_ + r0 * hidden));
  }
  // Qwen2-MoE's shared expert over every token, scaled by sigmoid(x · shared_expert_gate), after
  // the routed experts (it reuses their gate/up/act buffers).
  const float* shared = nullptr;
  if (lw.shared_expert_gate != nullptr) {
    MB_RETURN_IF_ERROR(Ffn(s, layer, lw.shared_expert, x_, tokens, shared_out_));
    MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.shared_expert_gate, tokens, 1, hidden, shared_gate_));
    MB_RETURN_IF_ERROR(gpu::ScaleBySigmoid(shared_out_, tokens, hidden, shared_gate_, compute_));
    shared = shared_out_;
  }
  MB_RETURN_IF_ERROR(gpu::CombineExperts(expert_out_, slot_of_, ids_, route_w_, tokens, top_k,
                                         hidden, h, shared, compute_));
  if (stats != nullptr) {
    stats->expert_token_pairs += rows;
    stats->experts_touched += touched;
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::LmHead(int micro_batch, const int64_t* rows, int64_t n) {
  const int64_t tokens =
      tokens_[micro_batch < 0 || micro_batch >= kMaxMicroBatches ? 0 : micro_batch];
  MB_RETURN_IF_ERROR(CheckCall(micro_batch, 0, tokens));
  const ModelConfig& c = config();
  if (n < 1 || n > tokens) {  // the row buffers hold the micro-batch's tokens
    return absl::InvalidArgumentError(
        absl::StrCat("logits: ", n, " rows of a micro-batch of ", tokens, " tokens"));
  }
  std::vector<int32_t> host_rows(n);
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("logits row ", rows[i], " outside the micro-batch's ", tokens, " tokens"));
    }
    host_rows[i] = static_cast<int32_t>(rows[i]);
  }
  MB_RETURN_IF_ERROR(CudaError(cudaMemcpyAsync(rows_, host_rows.data(), n * sizeof(int32_t),
                                               cudaMemcpyHostToDevice, compute_),
                               "rows H2D"));
  // The rows' hidden states (f32) into proj_, normed into x_ (compute dtype), then lm_head.
  MB_RETURN_IF_ERROR(gpu::GatherRows(h_[micro_batch], GpuDType::kF32, tokens, c.hidden_size, rows_,
                                     n, proj_, compute_));
  MB_RETURN_IF_ERROR(HiddenNorm(c, proj_, final_norm_, dtype_, n, x_, compute_));
  return Gemm(x_, lm_head_, n, c.vocab_size, c.hidden_size, logits_);
}

absl::Status CudaDevice::RunLogits(int micro_batch, const int64_t* rows, int64_t n, float* logits) {
  if (n == 0) return CheckCall(micro_batch, 0, 0);
  MB_RETURN_IF_ERROR(LmHead(micro_batch, rows, n));
  MB_RETURN_IF_ERROR(CudaError(
      cudaMemcpyAsync(logits, logits_, static_cast<size_t>(n * config().vocab_size) * sizeof(float),
                      cudaMemcpyDeviceToHost, compute_),
      "logits D2H"));
  MB_RETURN_IF_ERROR(CudaError(cudaStreamSynchronize(compute_), "logits"));
  return CheckGuards();
}

absl::Status CudaDevice::RunGreedyTokens(int micro_batch, const int64_t* rows, int64_t n,
                                         int32_t* token_ids) {
  if (n == 0) return CheckCall(micro_batch, 0, 0);
  MB_RETURN_IF_ERROR(LmHead(micro_batch, rows, n));
  // The argmax into the top-k ids buffer ([T k] int32, free between passes' task B).
  MB_RETURN_IF_ERROR(gpu::ArgmaxRows(logits_, n, config().vocab_size, ids_, compute_));
  MB_RETURN_IF_ERROR(CudaError(
      cudaMemcpyAsync(token_ids, ids_, n * sizeof(int32_t), cudaMemcpyDeviceToHost, compute_),
      "greedy tokens D2H"));
  MB_RETURN_IF_ERROR(CudaError(cudaStreamSynchronize(compute_), "greedy tokens"));
  return CheckGuards();
}

absl::Status CudaDevice::CheckGuards() {
  if (guards_.empty()) return absl::OkStatus();
  // Every stream's work, the data mover's fills included, done.
  MB_RETURN_IF_ERROR(CudaError(cudaDeviceSynchronize(), "guard check"));
  std::vector<unsigned char> read(guard_bytes_);
  for (const Guard& g : guards_) {
    MB_RETURN_IF_ERROR(
        CudaError(cudaMemcpy(read.data(), g.at, read.size(), cudaMemcpyDeviceToHost), "guard D2H"));
    for (size_t i = 0; i < read.size(); ++i) {
      if (read[i] != kGuardByte) {
        return absl::InternalError(absl::StrCat(
            "GPU memory guard: byte ", i, " past the end of the buffer '", g.buffer,
            "' was overwritten (", static_cast<int>(read[i]), ", not ",
            static_cast<int>(kGuardByte), "): a kernel or copy wrote past that buffer"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DType> CudaComputeDType(int device) {
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", device, ": ", cudaGetErrorString(err)));
  }
  return prop.major >= 8 ? DType::kBF16 : DType::kF16;
}

absl::StatusOr<int64_t> CudaMemoryBudget(const CudaBackendOptions& options) {
  if (options.gpu_memory_bytes > 0) return options.gpu_memory_bytes;
  size_t free_bytes = 0, total_bytes = 0;
  cudaError_t err = cudaSetDevice(options.device);
  if (err == cudaSuccess) err = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (err != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", options.device, ": ", cudaGetErrorString(err)));
  }
  // Room for what CUDA allocates after the arena: cuBLAS/cuBLASLt state and the kernel modules it
  // loads lazily on first use.
  constexpr int64_t kReserve = int64_t{1} << 30;
  if (static_cast<int64_t>(free_bytes) <= kReserve) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CUDA device ", options.device, " has ", free_bytes >> 20,
                     " MiB free; the engine leaves 1 GiB of it to CUDA and needs more (or set "
                     "--gpu_memory_gb)"));
  }
  return static_cast<int64_t>(free_bytes) - kReserve;
}

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const WeightStore& store,
                                                         const CudaBackendOptions& options) {
  return CudaDevice::Create(store, options);
}

}  // namespace moebatch
