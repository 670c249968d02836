// The command line of every moebatch program (moebatchd, moebatch-run, moebatch-plan,
// moebatch-token, the bench/ programs): Abseil flags, spelt with dashes or underscores, and a
// --version that names the project's version and build.
//
//   int main(int argc, char** argv) {
//     moebatch::ShowEngineFlagsInHelp();  // optional: any absl::SetFlagsUsageConfig comes first
//     std::vector<char*> args =
//         moebatch::ParseProgramFlags(argc, argv, "prog --model DIR [flags]");
//
// Flags are declared with underscores (ABSL_FLAG(double, kv_cache_gb, ...)). On the command line
// --kv-cache-gb 2, --kv-cache-gb=2 and --kv_cache_gb=2 are the same, and so are
// --no-batch-invariant, --nobatch-invariant and --nobatch_invariant. Only a flag's name is
// rewritten: its value (--model=/a-b/c-d, or the argument after a non-boolean flag given without
// "=": --model /a-b), single-dash arguments (-1, -, -x-y) and everything after a bare "--" stay as
// given. Names inside --flagfile files are Abseil's to read: underscores only there.
//
// --version prints ProgramVersion(): "<program> <version> (<git describe>, <build type>,
// CUDA on|off)", e.g. "moebatch-plan 0.1.0 (40328fa-dirty, Release, CUDA on)". The version is
// CMake's PROJECT_VERSION, the commit `git describe --always --dirty` when CMake configured the
// build ("unknown" outside a git checkout).
//
// Not thread-safe: call from main() before any thread reads a flag.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace moebatch {

// "kv-cache-gb" -> "kv_cache_gb": every dash of a flag name (or a --config JSON key) becomes an
// underscore.
std::string FlagNameWithUnderscores(std::string_view name);

// argv with every flag argument's name spelt as Abseil's parser wants it (see the top of this
// file), and the flags the command line names (underscored, without a negating "no":
// "--no-batch-invariant" gives "batch_invariant"). Looks flags up in Abseil's registry: to leave
// the value after a non-boolean flag alone, and to tell --no-foo-bar (the negation of foo_bar,
// rewritten --nofoo_bar) from a flag named no_foo_bar. args[0] is argv[0].
struct ProgramArgs {
  std::vector<std::string> args;
  std::set<std::string> given_flags;
};
ProgramArgs NormalizeFlagArgs(int argc, const char* const* argv);

// "<program> <version> (<git describe or unknown>, <build type>, CUDA on|off)", no newline.
std::string ProgramVersion(std::string_view program);

// What every main() calls instead of absl::ParseCommandLine: sets the usage message (when
// non-empty; absl::SetProgramUsageMessage must not have been called), makes --version print
// ProgramVersion(<argv[0]'s file name>), keeping the rest of the program's FlagsUsageConfig (so
// call it after ShowEngineFlagsInHelp or any absl::SetFlagsUsageConfig), rewrites the flag names
// (NormalizeFlagArgs) and parses. Returns what absl::ParseCommandLine returns: argv[0] and the
// positional arguments, pointing into argv. On --help, --version or a bad flag Abseil prints and
// exits (--version 0; --help and a bad flag 1). `given_flags`, when not null, receives the
// flags the command line names (NormalizeFlagArgs).
std::vector<char*> ParseProgramFlags(int argc, char** argv, std::string_view usage,
                                     std::set<std::string>* given_flags = nullptr);

}  // namespace moebatch
