#include "cuda/cublas_loader.h"

#include <dlfcn.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moebatch {
namespace gpu {
namespace {

#if !defined(MOEBATCH_CUBLAS_LINKED)
// dlsym of `name` into *fn; false when the library lacks it.
template <typename F>
bool Resolve(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}
#endif

absl::StatusOr<CublasApi> Load() {
#if defined(MOEBATCH_CUBLAS_LINKED)
  return CublasApi{&cublasCreate_v2,    &cublasDestroy_v2,
                   &cublasSetStream_v2, &cublasSetWorkspace_v2,
                   &cublasSetMathMode,  static_cast<CublasApi::GemmEx>(&cublasGemmEx)};
#else
  const std::string soname = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string why = lib == nullptr ? dlerror() : "";
#if defined(MOEBATCH_CUDA_LIBRARY_DIR)
  if (lib == nullptr) {
    const std::string path = absl::StrCat(MOEBATCH_CUDA_LIBRARY_DIR, "/", soname);
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) absl::StrAppend(&why, "; ", dlerror());
  }
#endif
  if (lib == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("the cuda backend cannot load cuBLAS (", soname, "): ", why));
  }
  CublasApi api{};
  const char* missing = nullptr;
  if (!Resolve(lib, "cublasCreate_v2", &api.create)) missing = "cublasCreate_v2";
  if (!Resolve(lib, "cublasDestroy_v2", &api.destroy)) missing = "cublasDestroy_v2";
  if (!Resolve(lib, "cublasSetStream_v2", &api.set_stream)) missing = "cublasSetStream_v2";
  if (!Resolve(lib, "cublasSetWorkspace_v2", &api.set_workspace)) {
    missing = "cublasSetWorkspace_v2";
  }
  if (!Resolve(lib, "cublasSetMathMode", &api.set_math_mode)) missing = "cublasSetMathMode";
  if (!Resolve(lib, "cublasGemmEx", &api.gemm_ex)) missing = "cublasGemmEx";
  if (missing != nullptr) {
    return absl::UnavailableError(
        absl::StrCat("the cuda backend's cuBLAS (", soname, ") has no ", missing));
  }
  return api;  // the library stays loaded for the process's life
#endif
}

}  // namespace

absl::StatusOr<const CublasApi*> Cublas() {
  static const absl::StatusOr<CublasApi> api = Load();
  if (!api.ok()) return api.status();
  return &*api;
}

}  // namespace gpu
}  // namespace moebatch
