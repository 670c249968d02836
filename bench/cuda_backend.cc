// The cuda backend's transfer and GEMM figures (MoE-Lens §5 and §6.5), on a GPU host:
//
//   bench_cuda_backend [--config_dir bench/models/mixtral-8x7b --gpu_memory_gb 16 --dtype bf16
//       --mover_layers 4 --decode_seqs 256 --context 512 --tokens 64,128,...,8192 --repeats 5
//       --packet_mb 64]
//
//  1. Raw pinned H2D bandwidth: cudaMemcpyAsync of 1 GiB from page-locked memory, best of
//     --repeats (D2H too, for reference).
//  2. The data mover's achieved bandwidth while the GPU tasks and the small transfers run: the
//     Mixtral shape with --mover_layers synthetic layers (weights in pinned memory), whole forward
//     passes of a decode batch (--decode_seqs sequences at --context tokens, CPU attention between
//     the GPU tasks) through ModelRunner; bytes moved / time the copies were in flight, against the
//     raw figure (bound: >= 90%).
//  3. GPU time of task B per layer against tokens per pass (one resident synthetic layer, so no
//     transfer is in the timing; attention outputs H2D included), next to the layer's transfer time
//     at the raw bandwidth; the crossover n where they are equal (MoE-Lens §5: below n the pass is
//     PCIe-bound).
// --gpu_memory_gb caps the engine's GPU memory (16 emulates a T4, 24 an L4).
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/model/weight_store.h"
#include "engine/model_runner.h"
#include "engine/tools/program_flags.h"

ABSL_FLAG(std::string, config_dir, "bench/models/mixtral-8x7b", "directory of a config.json");
ABSL_FLAG(double, gpu_memory_gb, 16.0, "GPU memory budget, GiB (16: T4, 24: L4)");
ABSL_FLAG(std::string, dtype, "", "weights/compute dtype bf16|f16 (default: the GPU's)");
ABSL_FLAG(int64_t, mover_layers, 4, "synthetic layers for the data mover figure");
ABSL_FLAG(int64_t, decode_seqs, 256, "sequences of the decode batch (figure 2)");
ABSL_FLAG(int64_t, context, 512, "their context length");
ABSL_FLAG(std::string, tokens, "64,128,256,512,1024,2048,4096,8192", "tokens per pass, figure 3");
ABSL_FLAG(int64_t, repeats, 5, "timed repetitions (best kept)");
ABSL_FLAG(int64_t, packet_mb, 64, "data mover packet, MiB");

namespace moebatch {
namespace {

#define CHECK_CUDA(expr)                                               \
  do {                                                                 \
    cudaError_t e_ = (expr);                                           \
    if (e_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}

void OrDie(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best GB/s of cudaMemcpyAsync of `bytes` in direction `kind`.
double CopyBandwidth(size_t bytes, cudaMemcpyKind kind, int repeats) {
  HostAllocator* pinned = PinnedHostAllocator();
  std::byte* host = OrDie(pinned->Allocate(bytes), "pinned allocation");
  std::memset(host, 1, bytes);
  void* dev = nullptr;
  CHECK_CUDA(cudaMalloc(&dev, bytes));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  double best = 0;
  for (int r = 0; r <= repeats; ++r) {
    CHECK_CUDA(cudaEventRecord(a, s));
    if (kind == cudaMemcpyHostToDevice) {
      CHECK_CUDA(cudaMemcpyAsync(dev, host, bytes, kind, s));
    } else {
      CHECK_CUDA(cudaMemcpyAsync(host, dev, bytes, kind, s));
    }
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) best = std::max(best, bytes / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  cudaFree(dev);
  pinned->Free(host, bytes);
  return best;
}

int Run() {
  const int repeats = static_cast<int>(std::max<int64_t>(1, absl::GetFlag(FLAGS_repeats)));
  const int64_t budget = static_cast<int64_t>(absl::GetFlag(FLAGS_gpu_memory_gb) * (1 << 30));
  ModelConfig config = OrDie(LoadModelConfig(absl::GetFlag(FLAGS_config_dir)), "config");
  DType dtype = OrDie(CudaComputeDType(0), "GPU");
  if (!absl::GetFlag(FLAGS_dtype).empty()) {
    auto d = DTypeFromString(absl::GetFlag(FLAGS_dtype));
    if (!d) {
      std::fprintf(stderr, "bad --dtype\n");
      return 2;
    }
    dtype = *d;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("GPU: %s (sm_%d%d, %.1f GiB); budget %.1f GiB; %s; model %s\n", prop.name, prop.major,
              prop.minor, prop.totalGlobalMem / double(1 << 30), budget / double(1 << 30),
              std::string(DTypeName(dtype)).c_str(), absl::GetFlag(FLAGS_config_dir).c_str());

  // 1. Raw pinned bandwidth.
  const double h2d = CopyBandwidth(size_t{1} << 30, cudaMemcpyHostToDevice, repeats);
  const double d2h = CopyBandwidth(size_t{1} << 30, cudaMemcpyDeviceToHost, repeats);
  std::printf("\n1. pinned cudaMemcpyAsync of 1 GiB: H2D %.2f GB/s, D2H %.2f GB/s (best of %d)\n",
              h2d, d2h, repeats);

  WeightStoreOptions store_options;
  store_options.allocator = PinnedHostAllocator();
  store_options.dtype = dtype;
  const int64_t context = absl::GetFlag(FLAGS_context);
  const int64_t seqs = absl::GetFlag(FLAGS_decode_seqs);

  // 2. The data mover during real forward passes.
  {
    auto store =
        OrDie(WeightStore::Synthetic(config, absl::GetFlag(FLAGS_mover_layers), 1, store_options),
              "synthetic weights");
    CudaBackendOptions options;
    options.gpu_memory_bytes = budget;
    options.max_tokens_per_pass = std::max<int64_t>(seqs, 1);
    options.packet_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_packet_mb)) << 20;
    ModelRunner runner(OrDie(CreateCudaDevice(*store, options), "cuda device"));
    const ModelConfig& c = store->config();
    const int64_t bs = 16, blocks = BlocksForTokens(context + repeats + 2, bs);
    KvCacheConfig kc{c.num_hidden_layers, c.num_key_value_heads, c.head_dim, bs,
                     seqs * blocks,       DType::kBF16};
    auto cache = OrDie(PagedKvCache::Create(kc), "KV cache");
    std::vector<std::vector<int32_t>> tables(seqs);
    for (int64_t s = 0; s < seqs; ++s) {
      for (int64_t b = 0; b < blocks; ++b)
        tables[s].push_back(static_cast<int32_t>(s * blocks + b));
    }
    // The KV cache holds whatever it holds (zero pages): attention cost does not depend on it.
    const DeviceCounters before = runner.device().counters();
    const double t0 = Now();
    for (int pass = 0; pass < repeats; ++pass) {
      ForwardBatch batch;
      for (int64_t s = 0; s < seqs; ++s) {
        batch.token_ids.push_back(static_cast<int32_t>((s * 7 + pass) % c.vocab_size));
        batch.seqs.push_back(ForwardSequence{&tables[s], s, 1, context + pass + 1, true});
      }
      std::vector<float> logits;
      OrDie(runner.Forward(batch, *cache, &logits), "forward");
    }
    const double seconds = Now() - t0;
    const DeviceCounters after = runner.device().counters();
    const double bytes = static_cast<double>(after.weight_bytes - before.weight_bytes);
    const double busy = after.weight_busy_seconds - before.weight_busy_seconds;
    const double mover = bytes / busy / 1e9;
    std::printf(
        "\n2. data mover during %d decode passes (%lld seqs x %lld context, %lld layers, %lld MiB "
        "packets): %.2f GB/s while copying = %.1f%% of raw H2D (bound >= 90%%: %s); %.2f GB over "
        "%.3f s of passes (%.1f%% of the wall time copying)\n",
        repeats, static_cast<long long>(seqs), static_cast<long long>(context),
        static_cast<long long>(c.num_hidden_layers),
        static_cast<long long>(absl::GetFlag(FLAGS_packet_mb)), mover, 100.0 * mover / h2d,
        mover >= 0.9 * h2d ? "holds" : "FAILS", bytes / 1e9, seconds, 100.0 * busy / seconds);
  }

  // 3. Task B per layer against tokens per pass.
  {
    std::vector<int64_t> token_counts;
    for (absl::string_view t :
         absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',', absl::SkipEmpty())) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(t, &n) || n <= 0) {
        std::fprintf(stderr, "bad --tokens\n");
        return 2;
      }
      token_counts.push_back(n);
    }
    const int64_t most = *std::max_element(token_counts.begin(), token_counts.end());
    auto store = OrDie(WeightStore::Synthetic(config, 1, 2, store_options), "synthetic layer");
    const double layer_bytes = static_cast<double>(store->layer(0).bytes);
    const double transfer_ms = layer_bytes / (h2d * 1e9) * 1e3;
    CudaBackendOptions options;
    options.gpu_memory_bytes = budget;
    options.max_tokens_per_pass = most;
    auto device = OrDie(CreateCudaDevice(*store, options), "cuda device (one layer)");
    const ModelConfig& c = store->config();
    std::vector<float> q(most * c.q_size()), k(most * c.kv_size()), v(most * c.kv_size());
    std::vector<float> attn(most * c.q_size());
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& x : attn) x = u(rng);
    std::printf("\n3. task B of one layer (%.2f GiB of weights, transfer %.2f ms at %.2f GB/s):\n",
                layer_bytes / double(1 << 30), transfer_ms, h2d);
    std::printf("| tokens/pass | task B ms (best of %d) | tokens/s | vs transfer |\n", repeats);
    std::printf("| --- | --- | --- | --- |\n");
    double prev_n = 0, prev_ms = 0, crossover = 0;
    for (int64_t n : token_counts) {
      std::vector<int32_t> ids(n);
      std::vector<int64_t> pos(n);
      for (int64_t i = 0; i < n; ++i) {
        ids[i] = static_cast<int32_t>((i * 131) % c.vocab_size);
        pos[i] = i % 4096;
      }
      OrDie(device->Embed(0, ids.data(), pos.data(), n), "embed");
      OrDie(device->TaskA(0, 0, q.data(), k.data(), v.data(), nullptr), "task A");
      double best = 1e30;
      for (int r = 0; r <= repeats; ++r) {
        const double t0 = Now();
        OrDie(device->TaskB(0, 0, attn.data(), nullptr), "task B");
        if (r > 0) best = std::min(best, Now() - t0);
        OrDie(device->Embed(0, ids.data(), pos.data(), n), "embed");  // fresh hidden state
      }
      const double ms = best * 1e3;
      std::printf("| %lld | %.3f | %.0f | %.2fx |\n", static_cast<long long>(n), ms, n / best,
                  ms / transfer_ms);
      if (crossover == 0 && ms >= transfer_ms && prev_n > 0) {
        crossover = prev_n + (transfer_ms - prev_ms) / (ms - prev_ms) * (n - prev_n);
      }
      prev_n = static_cast<double>(n);
      prev_ms = ms;
    }
    if (crossover > 0) {
      std::printf(
          "crossover: task B time equals the layer's transfer time at n = %.0f tokens per "
          "pass\n",
          crossover);
    } else {
      std::printf("crossover: not within the token counts measured\n");
    }
  }
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  moebatch::ParseProgramFlags(
      argc, argv,
      "bench_cuda_backend [--config_dir bench/models/mixtral-8x7b --gpu_memory_gb 16 ...]\n"
      "The cuda backend's transfer and GEMM figures.");
  return moebatch::Run();
}
