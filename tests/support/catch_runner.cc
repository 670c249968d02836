// Catch2's implementation (CATCH_CONFIG_RUNNER: everything but main), compiled once for every test
// program: tests/support/catch_main.cc and tests/cuda/gpu_catch_main.cc add only their main.
#define CATCH_CONFIG_RUNNER
#include "tests/support/catch_runner.h"

#include <catch2/catch.hpp>

namespace moebatch::testing {

int RunCatch(int argc, char** argv) { return Catch::Session().run(argc, argv); }

}  // namespace moebatch::testing
