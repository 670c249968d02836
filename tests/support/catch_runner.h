// Catch2's implementation is compiled once (tests/support/catch_runner.cc) for every test program;
// a program's main calls RunCatch. Catch2 v2 declares Catch::Session only where its implementation
// is compiled, hence this function instead.
#pragma once

namespace moebatch::testing {

// Catch::Session().run(argc, argv): runs the program's test cases as the command line says;
// returns the process exit status (the number of failed test cases, capped at 255).
int RunCatch(int argc, char** argv);

}  // namespace moebatch::testing
