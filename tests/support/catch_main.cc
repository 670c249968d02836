// The test programs' main: Catch2's default one (what CATCH_CONFIG_MAIN defines), over the
// implementation in tests/support/catch_runner.cc.
#include "tests/support/catch_runner.h"

int main(int argc, char** argv) { return moebatch::testing::RunCatch(argc, argv); }
