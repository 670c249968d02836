// The cuda backend's Device (cuda/cuda_backend.h), shared by its two files: cuda_device.cc sets
// it up (the GPU memory plan carved out of one cudaMalloc, streams, cuBLAS, resident weights, the
// data mover) and checks it between passes; cuda_device_passes.cc runs the passes (embedding,
// tasks A and B, the experts, lm_head) with cuda/kernels.h and cuBLAS. Weights come from resident
// layers or the two weight slots (engine/offload/weight_slots.h) the data mover fills through
// cuda/cuda_memory.h's copy engine (MoE-Lens §6.4-6.5).
//
// Quantized weights (a store with ggml-block tensors: a GGUF file, --weight_dtype int8|int4) are
// streamed as they are (the slots hold the store's region bytes) and each such matrix is
// dequantized on the GPU (gpu::DequantizeRows) into one scratch buffer in the compute dtype right
// before its GEMM, on the compute stream, so the scratch is free again when the next GEMM's
// dequantization starts; lm_head is dequantized once, at set-up, into its resident buffer; the
// embedding's gathered rows are decoded to f32 on the device.
//
// Threading: one thread at a time calls a device (the engine's); each call makes the device current
// on the calling thread first. Errors cross as absl::Status (cuda/cuda_memory.h's CudaError,
// CublasError here).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cuda/cublas_loader.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_memory.h"
#include "cuda/kernels.h"
#include "engine/offload/data_mover.h"
#include "engine/offload/gpu_memory_plan.h"
#include "engine/offload/weight_slots.h"

namespace moebatch {
namespace cuda_device_internal {

using gpu::GpuDType;

inline absl::Status CublasError(cublasStatus_t err, const char* what) {
  if (err == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": cuBLAS status ", static_cast<int>(err)));
}

inline GpuDType ToGpu(DType t) {
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

inline cudaDataType_t CudaType(GpuDType t) {
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
  // gpt-oss's sinks [heads] f32 of `layer` for the CPU's decode attention; null without sinks.
  const float* AttentionSinks(int64_t layer) const override {
    return layer >= 0 && layer < static_cast<int64_t>(host_sinks_.size()) &&
                   !host_sinks_[layer].empty()
               ? host_sinks_[layer].data()
               : nullptr;
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
  // The tokens of `micro_batch`'s pass (Embed's count), 0 for a micro-batch out of range (which
  // CheckCall then refuses).
  int64_t TokensOf(int micro_batch) const {
    return micro_batch < 0 || micro_batch >= kMaxMicroBatches ? 0 : tokens_[micro_batch];
  }
  // The weights of `layer`: a resident layer's region, or the weight slot WeightSlots says holds
  // it (its fill complete; the next streamed layer is then queued).
  absl::StatusOr<const std::byte*> AwaitLayer(int64_t layer);
  // y[m, n] (f32) = x[m, k] (dtype_) wᵀ with w [n, k] (dtype_) on the compute stream.
  absl::Status Gemm(const void* x, const void* w, int64_t m, int64_t n, int64_t k, float* y);
  // The same over strided rows: y (rows ldy apart) = x (rows ldx apart) times wᵀ for w [n, k]
  // (w_rows_out true) or times w for w [k, n] (false), w's rows ldw apart; MLA's per-head
  // products with slices of kv_b_proj.
  absl::Status GemmStrided(const void* x, int64_t ldx, const void* w, int64_t ldw, bool w_rows_out,
                           int64_t m, int64_t n, int64_t k, float* y, int64_t ldy);
  // The same with the weight matrix `t` of `layer` in `slot` [n, k]: when it is in ggml blocks,
  // dequantized into dequant_ (compute dtype) first, on the compute stream. Nothing for m = 0.
  absl::Status Gemm(const void* x, const std::byte* slot, int64_t layer, const TensorInfo* t,
                    int64_t m, int64_t n, int64_t k, float* y);
  // Where a tensor of `layer` (a LayerWeights field, pointing into the layer's host region) is
  // in the device copy of that region at `slot`: the same offset. null for an absent tensor.
  const void* Tensor(const std::byte* slot, int64_t layer, const TensorInfo* t) const {
    return t == nullptr ? nullptr : slot + (t->data - store_.layer(layer).data);
  }
  // Task A's q_, k_, v_ [T, heads or kv_heads, head_dim] f32 of a layer of standard attention
  // from x_: q/k/v projections, then the families' biases, q/k norms, clip_qkv and RoPE.
  absl::Status StandardQkv(int micro_batch, const std::byte* slot, int64_t layer, int64_t tokens);
  // Task A of a multi-head latent attention layer (CpuDevice::TaskAMla's math): q_ = the
  // absorbed queries [T, heads, latent], k_ = the latent rows [T, latent].
  absl::Status MlaQueryAndLatent(int micro_batch, const std::byte* slot, int64_t layer,
                                 int64_t tokens);
  // MLA's W_UV: mla_v_c_ [rows, heads * v_head_dim] (dtype_) = per head attn_c_'s first
  // kv_lora_rank values of rows [from, to) times W_UV[h]ᵀ, the o_proj input.
  absl::Status MlaValueUp(const std::byte* slot, int64_t layer, int64_t from, int64_t to);
  // One FFN of `width` over `n` rows of `in` (compute dtype): out [n, hidden] f32 =
  // w2(silu(w1 x) * w3 x) (gpt-oss: the clamped SwiGLU), through gate_, up_ and act_.
  absl::Status Ffn(const std::byte* slot, int64_t layer, const ExpertWeights& ew, const void* in,
                   int64_t n, float* out);
  // act [rows, width] (dtype_) = silu(gate) * up, or gpt-oss's clamped SwiGLU, of gate and up
  // [rows, width] f32.
  absl::Status Activation(const float* gate, const float* up, int64_t rows, int64_t width,
                          void* act);
  // The element type of a float tensor of the store (its biases, norms and sinks).
  static GpuDType TensorDType(const TensorInfo* t) { return ToGpu(*t->dtype); }
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
  // gpt-oss's attention sinks [layers, heads] f32 on the device (null without sinks), and every
  // layer's on the host.
  float* sinks_ = nullptr;
  std::vector<std::vector<float>> host_sinks_;
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
  // Multi-head latent attention: q projected [T, heads * qk_head_dim], the low-rank q [T,
  // q_lora_rank] and the heads' values after W_UV [T, heads * v_head_dim], each in f32 and in
  // dtype_ (a GEMM input).
  float *mla_q_ = nullptr, *mla_a_ = nullptr, *mla_v_ = nullptr;
  void *mla_q_c_ = nullptr, *mla_a_c_ = nullptr, *mla_v_c_ = nullptr;
  float* router_bias_ = nullptr;  // DeepSeek-V3's e_score_correction_bias [layers, E] f32
  float* logits_ = nullptr;
  int32_t* rows_ = nullptr;
  std::byte* workspace_ = nullptr;
  std::vector<std::byte> embed_rows_;  // host staging of the embedding gather
  std::vector<int32_t> host_offsets_;
};

}  // namespace cuda_device_internal
}  // namespace moebatch
