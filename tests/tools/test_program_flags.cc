// engine/tools/program_flags.h: flag names with dashes rewritten for Abseil, values and positional
// arguments left alone, --version's text, and one whole parse.
#include <catch2/catch.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "engine/tools/program_flags.h"

// Flags of the kinds the programs have (the engine's names; engine_flags.cc is not linked here).
ABSL_FLAG(double, kv_cache_gb, 1.0, "test: a double");
ABSL_FLAG(std::string, model, "", "test: a string");
ABSL_FLAG(bool, pin_cpu_threads, false, "test: a bool, default false");
ABSL_FLAG(bool, batch_invariant, true, "test: a bool, default true");
ABSL_FLAG(bool, no_color, false, "test: a flag whose own name starts with no_");

namespace moebatch {
namespace {

std::vector<std::string> Rewrite(std::vector<std::string> args,
                                 std::set<std::string>* given = nullptr) {
  args.insert(args.begin(), "/usr/bin/moebatch-run");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  ProgramArgs out = NormalizeFlagArgs(static_cast<int>(argv.size()), argv.data());
  REQUIRE(out.args.size() == args.size());
  CHECK(out.args[0] == "/usr/bin/moebatch-run");  // argv[0] is never a flag
  if (given != nullptr) *given = out.given_flags;
  return std::vector<std::string>(out.args.begin() + 1, out.args.end());
}

using Args = std::vector<std::string>;

TEST_CASE("FlagNameWithUnderscores", "[program_flags]") {
  CHECK(FlagNameWithUnderscores("kv-cache-gb") == "kv_cache_gb");
  CHECK(FlagNameWithUnderscores("kv_cache_gb") == "kv_cache_gb");
  CHECK(FlagNameWithUnderscores("max-tokens_per-pass") == "max_tokens_per_pass");
  CHECK(FlagNameWithUnderscores("") == "");
}

TEST_CASE("flag names: dashes become underscores, with or without =value", "[program_flags]") {
  CHECK(Rewrite({"--kv-cache-gb", "2"}) == Args{"--kv_cache_gb", "2"});
  CHECK(Rewrite({"--kv-cache-gb=2"}) == Args{"--kv_cache_gb=2"});
  CHECK(Rewrite({"--kv_cache_gb=2"}) == Args{"--kv_cache_gb=2"});
  CHECK(Rewrite({"--kv_cache-gb=2"}) == Args{"--kv_cache_gb=2"});
  // Unknown names are rewritten too; Abseil then refuses them under the underscore name.
  CHECK(Rewrite({"--not-a-flag=1"}) == Args{"--not_a_flag=1"});
  // A bad value keeps its text (Abseil refuses it).
  CHECK(Rewrite({"--kv-cache-gb=abc"}) == Args{"--kv_cache_gb=abc"});
}

TEST_CASE("values keep their dashes", "[program_flags]") {
  CHECK(Rewrite({"--model=/a-b/c-d"}) == Args{"--model=/a-b/c-d"});
  CHECK(Rewrite({"--model", "/a-b/c-d"}) == Args{"--model", "/a-b/c-d"});
  CHECK(Rewrite({"--model=--x-y"}) == Args{"--model=--x-y"});
  // A non-boolean flag without "=" takes the next argument as its value, even one like a flag.
  CHECK(Rewrite({"--model", "--x-y", "--kv-cache-gb", "-2"}) ==
        Args{"--model", "--x-y", "--kv_cache_gb", "-2"});
  CHECK(Rewrite({"--kv-cache-gb=1", "--model", "a-b"}) ==
        Args{"--kv_cache_gb=1", "--model", "a-b"});
  // A boolean flag takes no separate value: what follows is an argument of its own.
  CHECK(Rewrite({"--pin-cpu-threads", "--kv-cache-gb=3"}) ==
        Args{"--pin_cpu_threads", "--kv_cache_gb=3"});
  CHECK(Rewrite({"--pin-cpu-threads", "in-file"}) == Args{"--pin_cpu_threads", "in-file"});
  CHECK(Rewrite({"--pin-cpu-threads=false"}) == Args{"--pin_cpu_threads=false"});
}

TEST_CASE("single-dash and positional arguments are left alone", "[program_flags]") {
  CHECK(Rewrite({"-kv-cache-gb=2"}) == Args{"-kv-cache-gb=2"});
  CHECK(Rewrite({"-"}) == Args{"-"});
  CHECK(Rewrite({"-1"}) == Args{"-1"});
  CHECK(Rewrite({"-x-y", "in-file.jsonl"}) == Args{"-x-y", "in-file.jsonl"});
  CHECK(Rewrite({"---x-y"}) == Args{"---x-y"});
}

TEST_CASE("nothing after a bare -- is rewritten", "[program_flags]") {
  CHECK(Rewrite({"--kv-cache-gb=2", "--", "--kv-cache-gb=3", "--no-pin-cpu-threads", "a-b"}) ==
        Args{"--kv_cache_gb=2", "--", "--kv-cache-gb=3", "--no-pin-cpu-threads", "a-b"});
  CHECK(Rewrite({"--", "--"}) == Args{"--", "--"});
  // "--" as a string flag's value is the value, not the end of the flags (as Abseil reads it).
  CHECK(Rewrite({"--model", "--", "--kv-cache-gb=3"}) == Args{"--model", "--", "--kv_cache_gb=3"});
}

TEST_CASE("negated booleans: --no-foo-bar and --nofoo-bar", "[program_flags]") {
  std::set<std::string> given;
  CHECK(Rewrite({"--no-pin-cpu-threads"}, &given) == Args{"--nopin_cpu_threads"});
  CHECK(given == std::set<std::string>{"pin_cpu_threads"});
  CHECK(Rewrite({"--no-batch-invariant"}, &given) == Args{"--nobatch_invariant"});
  CHECK(given == std::set<std::string>{"batch_invariant"});
  CHECK(Rewrite({"--nobatch-invariant"}) == Args{"--nobatch_invariant"});
  CHECK(Rewrite({"--nobatch_invariant"}) == Args{"--nobatch_invariant"});
  CHECK(Rewrite({"--no_batch_invariant"}) == Args{"--nobatch_invariant"});
  // A flag whose own name starts with no_ is that flag, not a negation.
  CHECK(Rewrite({"--no-color"}, &given) == Args{"--no_color"});
  CHECK(given == std::set<std::string>{"no_color"});
  // Not a known flag after the "no": left for Abseil to refuse under the name given.
  CHECK(Rewrite({"--no-such-flag"}) == Args{"--no_such_flag"});
}

TEST_CASE("the flags given, by their underscore names", "[program_flags]") {
  std::set<std::string> given;
  Rewrite({"--kv-cache-gb", "2", "--model=/a-b", "--nopin-cpu-threads", "x", "--", "--no-color"},
          &given);
  CHECK(given == std::set<std::string>{"kv_cache_gb", "model", "pin_cpu_threads"});
}

TEST_CASE("ProgramVersion: program, version, commit, build type, CUDA", "[program_flags]") {
  const std::string v = ProgramVersion("moebatch-plan");
  INFO(v);
  CHECK(std::regex_match(
      v,
      std::regex(R"(moebatch-plan [0-9]+\.[0-9]+\.[0-9]+ \([^,()]+, [^,()]+, CUDA (on|off)\))")));
  CHECK(absl::StrContains(v, " 0.1.0 "));  // top-level CMakeLists.txt's project(VERSION)
}

// The only test that parses (Abseil's usage message may be set once per process).
TEST_CASE("ParseProgramFlags: rewrites, parses, keeps the usage config, sets --version",
          "[program_flags]") {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "test_program_flags.cc");
  };
  absl::SetFlagsUsageConfig(config);

  std::vector<std::string> storage = {
      "/bin/test-prog", "--kv-cache-gb",    "2.5", "--no-batch-invariant", "--pin-cpu-threads",
      "in-file",        "--model=/a-b/c-d", "--",  "--kv-cache-gb=7"};
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  std::set<std::string> given;
  std::vector<char*> rest = ParseProgramFlags(static_cast<int>(argv.size()), argv.data(),
                                              "test_program_flags [flags]", &given);

  CHECK(absl::GetFlag(FLAGS_kv_cache_gb) == 2.5);
  CHECK_FALSE(absl::GetFlag(FLAGS_batch_invariant));
  CHECK(absl::GetFlag(FLAGS_pin_cpu_threads));
  CHECK(absl::GetFlag(FLAGS_model) == "/a-b/c-d");
  CHECK(given ==
        std::set<std::string>{"kv_cache_gb", "batch_invariant", "pin_cpu_threads", "model"});
  // argv[0] and the positional arguments, as given, pointing into argv.
  REQUIRE(rest.size() == 3);
  CHECK(rest[0] == argv[0]);
  CHECK(rest[1] == argv[5]);
  CHECK(rest[2] == argv[8]);
  CHECK(std::string(rest[2]) == "--kv-cache-gb=7");

  // The program's help configuration stays; --version prints ProgramVersion.
  const absl::FlagsUsageConfig after = absl::flags_internal::GetUsageConfig();
  REQUIRE(after.contains_help_flags);
  CHECK(after.contains_help_flags("tests/tools/test_program_flags.cc"));
  CHECK_FALSE(after.contains_help_flags("engine/tools/engine_flags.cc"));
  REQUIRE(after.version_string);
  CHECK(after.version_string() == ProgramVersion("test-prog") + "\n");
}

}  // namespace
}  // namespace moebatch
