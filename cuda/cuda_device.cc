// The cuda backend's Device, set-up and between passes (cuda/cuda_device_internal.h): the GPU
// memory plan carved out of one cudaMalloc, streams, cuBLAS, the resident weights, the data mover
// and weight slots; a failed call's reset and the memory guards' check; the backend's entry points
// (cuda/cuda_backend.h). The passes themselves: cuda_device_passes.cc.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cuda/cuda_device_internal.h"
#include "engine/model/ggml_type.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace cuda_device_internal {

absl::StatusOr<std::unique_ptr<Device>> CudaDevice::Create(const WeightStore& store,
                                                           const CudaBackendOptions& options) {
  const ModelConfig& c = store.config();
  if (c.mla) {
    for (const LayerWeights& lw : store.weights().layers) {
      if (lw.kv_b_proj->quant) {  // as CpuDevice::PrepareMla
        return absl::UnimplementedError(absl::StrCat(
            lw.kv_b_proj->name,
            ": MLA's kv_b_proj must be f32, f16 or bf16 (its W_UK and W_UV are multiplied per "
            "head, not dequantized)"));
      }
    }
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
  constexpr size_t kMaxCarves = 48;
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
  const int64_t layers = store.num_layers();
  if (c.attention_sinks) d->sinks_ = d->Carve<float>(layers * c.num_attention_heads, "sinks");
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
  if (c.mla) {
    const MlaConfig& m = *c.mla;
    const int64_t q_cols = c.num_attention_heads * m.qk_head_dim();
    const int64_t v_cols = c.num_attention_heads * m.v_head_dim;
    d->mla_q_ = d->Carve<float>(T * q_cols, "mla_q");
    d->mla_q_c_ = d->Carve<std::byte>(T * q_cols * d->elem_, "mla_q_c");
    if (m.q_lora_rank > 0) {
      d->mla_a_ = d->Carve<float>(T * m.q_lora_rank, "mla_a");
      d->mla_a_c_ = d->Carve<std::byte>(T * m.q_lora_rank * d->elem_, "mla_a_c");
    }
    d->mla_v_ = d->Carve<float>(T * v_cols, "mla_v");
    d->mla_v_c_ = d->Carve<std::byte>(T * v_cols * d->elem_, "mla_v_c");
  }
  if (c.topk_method == TopkMethod::kNoauxTc) {
    d->router_bias_ = d->Carve<float>(layers * E, "router_bias");
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
  // Small per-layer vectors in f32, once: gpt-oss's sinks (on the host too, for the CPU's decode
  // attention: AttentionSinks) and DeepSeek-V3's router correction bias.
  auto f32_rows = [&](const TensorInfo* t, float* device_row,
                      std::vector<float>* host) -> absl::Status {
    host->resize(static_cast<size_t>(t->numel()));
    ConvertToF32(*t->dtype, t->data, host->data(), host->size());
    return CudaError(
        cudaMemcpy(device_row, host->data(), host->size() * sizeof(float), cudaMemcpyHostToDevice),
        "per-layer vector H2D");
  };
  std::vector<float> router_bias;
  for (int64_t l = 0; l < layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    std::vector<float>& sinks = d->host_sinks_.emplace_back();
    if (lw.sinks != nullptr) {
      MB_RETURN_IF_ERROR(f32_rows(lw.sinks, d->sinks_ + l * c.num_attention_heads, &sinks));
    }
    if (d->router_bias_ != nullptr && lw.router_bias != nullptr) {
      MB_RETURN_IF_ERROR(f32_rows(lw.router_bias, d->router_bias_ + l * E, &router_bias));
    }
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

}  // namespace cuda_device_internal

using cuda_device_internal::CudaDevice;

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
