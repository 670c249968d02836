#include "cpu_attention/gemm/matmul.h"

#include <dnnl.hpp>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "cpu_attention/gemm/invariant_linear.h"

namespace moebatch {

using dnnl::memory;
using Tag = memory::data_type;

struct Matmul::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  // (n, k, src type, weight type) -> primitive with a run-time M.
  std::map<std::tuple<int64_t, int64_t, int, int>, dnnl::matmul> primitives;
  std::vector<float> weight_f32;  // converted weights (f32 mode with bf16/f16 weights)
  // Widened copies kept across calls, keyed by the source address, within widened_budget bytes.
  std::map<const void*, std::vector<float>> widened;
  int64_t widened_bytes = 0;
  int64_t widened_budget = 0;

  // The f32 copy of w [n, k]: from the cache, or converted now (and cached when it fits).
  const float* Widen(const void* w, DType w_dtype, int64_t n, int64_t k) {
    if (auto it = widened.find(w); it != widened.end()) return it->second.data();
    const int64_t bytes = n * k * static_cast<int64_t>(sizeof(float));
    std::vector<float>* dst = &weight_f32;
    if (widened_bytes + bytes <= widened_budget) {
      dst = &widened[w];
      widened_bytes += bytes;
    }
    dst->resize(static_cast<size_t>(n * k));
    ConvertToF32(w_dtype, w, dst->data(), dst->size());
    return dst->data();
  }
  std::vector<uint16_t> src_bf16;  // rounded activations (bf16 mode)
  std::vector<float> src_rounded;  // rounded to f16 and widened back to f32 (f16 mode)

  // x[count] rounded to f16 (nearest even) and widened back to f32: f16 compute's activations.
  const float* RoundToF16(const float* x, int64_t count) {
    src_rounded.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) src_rounded[i] = F16ToF32(F32ToF16(x[i]));
    return src_rounded.data();
  }

  dnnl::matmul& Get(int64_t n, int64_t k, Tag src, Tag wei) {
    auto key = std::make_tuple(n, k, static_cast<int>(src), static_cast<int>(wei));
    auto it = primitives.find(key);
    if (it != primitives.end()) return it->second;
    const memory::dim rt = DNNL_RUNTIME_DIM_VAL;
    memory::desc src_md({rt, k}, src, {k, 1});
    memory::desc wei_md({k, n}, wei, {1, k});  // W [N, K] row-major seen as Wᵀ [K, N]
    memory::desc dst_md({rt, n}, Tag::f32, {n, 1});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), engine);
    return primitives.emplace(key, dnnl::matmul(pd)).first->second;
  }
};

Matmul::Matmul(DType compute_dtype) : compute_dtype_(compute_dtype), impl_(new Impl) {}
Matmul::~Matmul() = default;

absl::StatusOr<std::unique_ptr<Matmul>> Matmul::Create(DType compute_dtype,
                                                       int64_t widened_weight_budget_bytes,
                                                       bool batch_invariant) {
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16 &&
      compute_dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("compute dtype must be f32, bf16 or f16, got ",
                                                   std::string(DTypeName(compute_dtype))));
  }
  std::unique_ptr<Matmul> mm(new Matmul(compute_dtype));
  mm->impl_->widened_budget = widened_weight_budget_bytes;
  mm->batch_invariant_ = batch_invariant;
  if (batch_invariant || compute_dtype != DType::kBF16) return mm;
  try {  // oneDNN refuses a bf16 matmul where the CPU has no AVX-512 (its 2.x releases)
    mm->impl_->Get(64, 64, Tag::bf16, Tag::bf16);
    mm->onednn_bf16_ = true;
  } catch (const dnnl::error&) {
    mm->onednn_bf16_ = false;
  }
  return mm;
}

Matmul::Path Matmul::PathFor(int64_t m, DType w_dtype) const {
  if (batch_invariant_) return Path::kInvariant;
  if (compute_dtype_ == DType::kBF16 && w_dtype == DType::kBF16) {
    return onednn_bf16_ && m >= kOneDnnBf16MinRows ? Path::kOneDnnBf16 : Path::kInvariant;
  }
  return m >= kOneDnnF32MinRows ? Path::kOneDnnF32 : Path::kInvariant;
}

std::string Matmul::Describe() const {
  if (batch_invariant_) {
    if (compute_dtype_ != DType::kBF16) return "batch-invariant kernels";
    return absl::StrCat("batch-invariant kernels (bf16 weights in the pair order, on ",
                        Bf16OnVdpbf16ps(SelectedCpuIsa()) ? "vdpbf16ps)" : "f32 FMAs)");
  }
  const std::string f32 = absl::StrCat("batch-invariant kernels below ", kOneDnnF32MinRows,
                                       " rows, oneDNN f32 from ", kOneDnnF32MinRows);
  if (compute_dtype_ != DType::kBF16) return f32;
  if (!onednn_bf16_) {
    return absl::StrCat(
        "bf16 weights: batch-invariant kernels (oneDNN has no bf16 matmul on this "
        "CPU); other weights: ",
        f32);
  }
  return absl::StrCat("bf16 weights: batch-invariant kernels below ", kOneDnnBf16MinRows,
                      " rows, oneDNN bf16 (AVX512-BF16 / AMX) from ", kOneDnnBf16MinRows,
                      "; other weights: ", f32);
}

absl::Status Matmul::Linear(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype,
                            int64_t n, float* y) {
  if (m == 0) return absl::OkStatus();
  Impl& im = *impl_;
  if (PathFor(m, w_dtype) == Path::kInvariant) {
    const float* src = x;
    if (compute_dtype_ == DType::kBF16 && w_dtype == DType::kBF16) {  // as the bf16 GEMM rounds
      im.src_bf16.resize(static_cast<size_t>(m * k));
      ConvertFromF32(DType::kBF16, x, im.src_bf16.data(), im.src_bf16.size());
      InvariantLinearBf16(SelectedCpuIsa(), im.src_bf16.data(), m, k,
                          static_cast<const uint16_t*>(w), n, y);
      return absl::OkStatus();
    }
    if (compute_dtype_ == DType::kF16 && w_dtype == DType::kF16) {
      src = im.RoundToF16(x, m * k);
    }
    InvariantLinear(src, m, k, w, w_dtype, n, y);
    return absl::OkStatus();
  }
  try {
    const void* src = x;
    const void* wei = w;
    Tag src_t = Tag::f32, wei_t = Tag::f32;
    if (compute_dtype_ == DType::kBF16 && w_dtype == DType::kBF16) {
      im.src_bf16.resize(static_cast<size_t>(m * k));
      ConvertFromF32(DType::kBF16, x, im.src_bf16.data(), im.src_bf16.size());
      src = im.src_bf16.data();
      src_t = wei_t = Tag::bf16;
    } else {
      if (compute_dtype_ == DType::kF16 && w_dtype == DType::kF16) src = im.RoundToF16(x, m * k);
      if (w_dtype != DType::kF32) wei = im.Widen(w, w_dtype, n, k);
    }
    dnnl::matmul& prim = im.Get(n, k, src_t, wei_t);
    memory src_m({{m, k}, src_t, {k, 1}}, im.engine, const_cast<void*>(src));
    memory wei_m({{k, n}, wei_t, {1, k}}, im.engine, const_cast<void*>(wei));
    memory dst_m({{m, n}, Tag::f32, {n, 1}}, im.engine, y);
    prim.execute(im.stream,
                 {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DST, dst_m}});
    im.stream.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("oneDNN matmul [", m, "x", k, "] x [", k, "x", n, "] failed: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace moebatch
