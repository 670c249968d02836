// Catch2 main for tests that need a CUDA GPU. Without one (no driver, or no device) it prints
// "no CUDA GPU: skipping" and exits 77, which tests/CMakeLists.txt declares as ctest's
// SKIP_RETURN_CODE. Any other CUDA error (a driver older than this build's CUDA runtime, a device
// that fails to start) fails the run with its name: a GPU host must not pass by skipping.
// Listing (--list-*, -l, -t) and --help work without a GPU, so that catch_discover_tests can
// enumerate the tests at build time on any machine.
// The cuda backend runs with guards after its arena's buffers (MOEBATCH_CUDA_GUARD_BYTES=256 unless
// the environment says otherwise; cuda/cuda_backend.h): a kernel or copy that writes past a buffer
// fails the pass that did it, on a GPU and on the CUDA emulator alike.
// Catch2's implementation comes from tests/support/catch_runner.cc.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "tests/support/catch_runner.h"

namespace {

// Whether a CUDA driver is installed (libcuda, which the runtime loads): without one the runtime
// reports cudaErrorInsufficientDriver too, and that is the no-GPU case.
bool DriverPresent() {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return false;
  dlclose(driver);
  return true;
}

bool ListsOrHelps(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.substr(0, 7) == "--list-" || arg == "-l" || arg == "-t" || arg == "-h" || arg == "-?" ||
        arg == "--help") {
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("MOEBATCH_CUDA_GUARD_BYTES", "256", /*overwrite=*/0);
  if (!ListsOrHelps(argc, argv)) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorNoDevice || (err == cudaErrorInsufficientDriver && !DriverPresent()) ||
        (err == cudaSuccess && count == 0)) {
      std::printf("no CUDA GPU: skipping\n");
      return 77;
    }
    if (err != cudaSuccess) {
      std::printf("CUDA is present but unusable: %s (%s)\n", cudaGetErrorName(err),
                  cudaGetErrorString(err));
      return 1;
    }
  }
  return moebatch::testing::RunCatch(argc, argv);
}
