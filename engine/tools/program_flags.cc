#include "engine/tools/program_flags.h"

#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"

// Compile definitions from engine/CMakeLists.txt (the version from the top-level project(), the
// commit from `git describe` at configure time).
#ifndef MOEBATCH_VERSION
#define MOEBATCH_VERSION "unknown"
#endif
#ifndef MOEBATCH_GIT_DESCRIBE
#define MOEBATCH_GIT_DESCRIBE "unknown"
#endif
#ifndef MOEBATCH_BUILD_TYPE
#define MOEBATCH_BUILD_TYPE ""
#endif
#ifndef MOEBATCH_CUDA
#define MOEBATCH_CUDA 0
#endif

namespace moebatch {
namespace {

bool IsFlag(const std::string& name) { return absl::FindCommandLineFlag(name) != nullptr; }

}  // namespace

std::string FlagNameWithUnderscores(std::string_view name) {
  std::string out(name);
  for (char& c : out) {
    if (c == '-') c = '_';
  }
  return out;
}

ProgramArgs NormalizeFlagArgs(int argc, const char* const* argv) {
  ProgramArgs out;
  out.args.reserve(argc > 0 ? argc : 0);
  bool flags_done = false;  // after a bare "--" every argument is positional
  bool next_is_value = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    const bool is_flag = i > 0 && !flags_done && !next_is_value && arg.size() > 2 &&
                         arg[0] == '-' && arg[1] == '-' && arg[2] != '-';
    if (i > 0 && !next_is_value && arg == "--") flags_done = true;
    next_is_value = false;
    if (!is_flag) {
      out.args.push_back(std::move(arg));
      continue;
    }
    const size_t eq = arg.find('=');
    std::string name = FlagNameWithUnderscores(
        arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2));
    // --no-foo-bar: Abseil negates a boolean as --nofoo_bar; no_foo_bar stays when it is a flag.
    if (name.rfind("no_", 0) == 0 && !IsFlag(name) && IsFlag(name.substr(3))) {
      name = absl::StrCat("no", name.substr(3));
    }
    std::string given = name;
    if (given.rfind("no", 0) == 0 && !IsFlag(given) && IsFlag(given.substr(2))) {
      given = given.substr(2);
    }
    if (eq == std::string::npos) {
      // "--model DIR": Abseil takes the next argument as the value of a non-boolean flag.
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      next_is_value = flag != nullptr && !flag->IsOfType<bool>();
    }
    out.given_flags.insert(std::move(given));
    out.args.push_back(eq == std::string::npos ? absl::StrCat("--", name)
                                               : absl::StrCat("--", name, arg.substr(eq)));
  }
  return out;
}

std::string ProgramVersion(std::string_view program) {
  const std::string build_type = MOEBATCH_BUILD_TYPE;
  return absl::StrCat(std::string(program), " ", MOEBATCH_VERSION, " (", MOEBATCH_GIT_DESCRIBE,
                      ", ", build_type.empty() ? "unknown build type" : build_type, ", CUDA ",
                      MOEBATCH_CUDA ? "on" : "off", ")");
}

std::vector<char*> ParseProgramFlags(int argc, char** argv, std::string_view usage,
                                     std::set<std::string>* given_flags) {
  if (!usage.empty()) absl::SetProgramUsageMessage(absl::string_view(usage.data(), usage.size()));

  // Abseil has no public getter for the usage configuration, and SetFlagsUsageConfig replaces it
  // whole: read it (flags_internal, in the public header usage_config.h) to keep what the program
  // set (ShowEngineFlagsInHelp's contains_help_flags, ...) and add the version.
  std::string program = argc > 0 ? argv[0] : "moebatch";
  if (const size_t slash = program.rfind('/'); slash != std::string::npos) {
    program = program.substr(slash + 1);
  }
  absl::FlagsUsageConfig config = absl::flags_internal::GetUsageConfig();
  config.version_string = [program] { return ProgramVersion(program) + "\n"; };
  absl::SetFlagsUsageConfig(config);

  ProgramArgs normalized = NormalizeFlagArgs(argc, argv);
  if (given_flags != nullptr) *given_flags = std::move(normalized.given_flags);
  // Unchanged arguments point into argv, so that the positional arguments Abseil returns do;
  // rewritten ones (always flags, never returned) live in `normalized` during the parse.
  std::vector<char*> pointers;
  pointers.reserve(normalized.args.size());
  for (int i = 0; i < argc; ++i) {
    std::string& arg = normalized.args[static_cast<size_t>(i)];
    pointers.push_back(arg == argv[i] ? argv[i] : arg.data());
  }
  return absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
}

}  // namespace moebatch
