// Catch2 main for tests that need a CUDA GPU. Without one (no driver, or no device) it prints
// "no CUDA GPU: skipping" and exits 77, which tests/CMakeLists.txt declares as ctest's
// SKIP_RETURN_CODE. Listing (--list-*, -l, -t) and --help work without a GPU, so that
// catch_discover_tests can enumerate the tests at build time on any machine.
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string_view>

namespace {

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
  if (!ListsOrHelps(argc, argv)) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();  // clear the error of a missing driver
      std::printf("no CUDA GPU: skipping\n");
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
