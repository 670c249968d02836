#include "engine/backend.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moebatch {
namespace {

// Function-local, so registrars in other translation units may run first.
std::vector<std::unique_ptr<Backend>>& Registry() {
  static auto* backends = new std::vector<std::unique_ptr<Backend>>();
  return *backends;
}

}  // namespace

std::optional<WeightSource> WeightSourceFromString(std::string_view name) {
  if (name == "mapped") return WeightSource::kMapped;
  if (name == "host") return WeightSource::kHostCopy;
  if (name == "synthetic") return WeightSource::kSynthetic;
  return std::nullopt;
}

const char* WeightSourceName(WeightSource source) {
  switch (source) {
    case WeightSource::kMapped:
      return "mapped";
    case WeightSource::kHostCopy:
      return "host";
    case WeightSource::kSynthetic:
      return "synthetic";
  }
  return "unknown";
}

void RegisterBackend(std::unique_ptr<Backend> backend) {
  for (const auto& b : Registry()) {
    if (std::string_view(b->name()) == backend->name()) return;
  }
  Registry().push_back(std::move(backend));
}

std::vector<const Backend*> RegisteredBackends() {
  std::vector<const Backend*> out;
  for (const auto& b : Registry()) out.push_back(b.get());
  return out;
}

absl::StatusOr<const Backend*> FindBackend(std::string_view name, const EngineOptions& options) {
  std::vector<std::string> names;
  for (const auto& b : Registry()) names.emplace_back(b->name());
  if (name == "auto") {
    std::vector<std::string> why;
    for (const auto& b : Registry()) {
      if (!b->automatic()) continue;
      auto probe = b->Probe(options);
      if (probe.ok()) return b.get();
      why.push_back(absl::StrCat(b->name(), ": ", probe.status().message()));
    }
    return absl::UnavailableError(absl::StrCat("backend auto: no automatic backend has a device (",
                                               absl::StrJoin(why, "; "), ")"));
  }
  for (const auto& b : Registry()) {
    if (std::string_view(b->name()) == name) return b.get();
  }
  return absl::NotFoundError(
      absl::StrCat("backend '", std::string(name), "' is not registered in this build (",
                   names.empty() ? "none" : absl::StrJoin(names, ", "), " are)"));
}

}  // namespace moebatch
