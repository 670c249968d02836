// cuda/cublas_loader.h: cuBLAS is not in a program until the cuda backend asks for it, and then it
// loads from the toolkit the build found. Needs the CUDA libraries, not a GPU (label unit).
#include <link.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "cuda/cublas_loader.h"

namespace moebatch {
namespace {

// Whether a shared object whose path contains `name` is mapped into this process.
bool Loaded(const char* name) {
  struct Query {
    const char* name;
    bool found;
  } q{name, false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* q = static_cast<Query*>(data);
        if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, q->name) != nullptr) {
          q->found = true;
        }
        return 0;
      },
      &q);
  return q.found;
}

TEST_CASE("cuBLAS is loaded on the cuda backend's first call, not linked") {
  // This program links the cuda backend like moebatch-run and moebatchd do.
  REQUIRE_FALSE(Loaded("libcublas"));
  auto api = gpu::Cublas();
  INFO(api.status().ToString());
  REQUIRE(api.ok());
  const gpu::CublasApi& a = **api;
  CHECK(a.create != nullptr);
  CHECK(a.destroy != nullptr);
  CHECK(a.set_stream != nullptr);
  CHECK(a.set_workspace != nullptr);
  CHECK(a.set_math_mode != nullptr);
  CHECK(a.gemm_ex != nullptr);
  CHECK(Loaded("libcublasLt"));
  auto again = gpu::Cublas();  // resolved once
  REQUIRE(again.ok());
  CHECK(*again == *api);
}

}  // namespace
}  // namespace moebatch
