#include "engine/offload/pipeline_profiler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace moebatch {

absl::StatusOr<LineFit> FitLine(const std::vector<ProfilePoint>& points) {
  std::set<int64_t> distinct;
  for (const ProfilePoint& p : points) distinct.insert(p.tokens);
  if (distinct.size() < 2) {
    return absl::InvalidArgumentError("profile: a line needs points at two or more token counts");
  }
  const double n = static_cast<double>(points.size());
  double sx = 0, sy = 0;
  for (const ProfilePoint& p : points) {
    sx += static_cast<double>(p.tokens);
    sy += p.seconds;
  }
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0, syy = 0;
  for (const ProfilePoint& p : points) {
    const double dx = static_cast<double>(p.tokens) - mx, dy = p.seconds - my;
    sxx += dx * dx;
    sxy += dx * dy;
    syy += dy * dy;
  }
  LineFit fit;
  fit.slope = sxy / sxx;
  fit.intercept = my - fit.slope * mx;
  fit.r2 = syy > 0 ? (sxy * sxy) / (sxx * syy) : 1.0;
  return fit;
}

absl::StatusOr<int64_t> TokensToSaturate(const LineFit& fit, double layer_transfer_seconds) {
  if (!(fit.slope > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile: the device time does not grow with tokens (slope ", fit.slope, " s/token)"));
  }
  if (!(layer_transfer_seconds > 0)) {
    return absl::InvalidArgumentError(
        "profile: no weight transfer to overlap (a backend whose weights do not move)");
  }
  return static_cast<int64_t>(std::floor(layer_transfer_seconds / fit.slope));
}

absl::StatusOr<std::vector<ProfilePoint>> MeasureLayerTimes(Device& device,
                                                            const std::vector<int64_t>& tokens,
                                                            int repeats) {
  const ModelConfig& c = device.config();
  std::vector<ProfilePoint> points;
  // In the memory the engine's own buffers use (page-locked on the cuda backend), so the copies
  // take the time they take in a pass; allocated once, for the largest count.
  HostBuffer<float> q(device.host_buffer_allocator()), k(device.host_buffer_allocator()),
      v(device.host_buffer_allocator()), attn(device.host_buffer_allocator());
  auto size_buffers = [&](int64_t n) {
    for (auto [buffer, size] : {std::pair{&q, n * c.q_size()}, std::pair{&k, n * c.kv_size()},
                                std::pair{&v, n * c.kv_size()}, std::pair{&attn, n * c.q_size()}}) {
      if (absl::Status st = buffer->Resize(static_cast<size_t>(size)); !st.ok()) return st;
    }
    return absl::OkStatus();
  };
  for (int64_t n : tokens) {
    if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("profile: token count ", n));
  }
  if (!tokens.empty()) {
    if (absl::Status st = size_buffers(*std::max_element(tokens.begin(), tokens.end())); !st.ok()) {
      return st;
    }
  }
  for (int64_t n : tokens) {
    std::vector<int32_t> ids(n);
    std::vector<int64_t> positions(n);
    for (int64_t i = 0; i < n; ++i) {
      ids[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
      positions[i] = i % c.max_position_embeddings;
    }
    if (absl::Status st = size_buffers(n); !st.ok()) return st;
    std::fill(attn.data(), attn.data() + attn.size(), 0.01f);
    double best = 1e300;
    for (int r = 0; r <= repeats; ++r) {  // r == 0 warms up (weights, GEMM plans)
      device.BeginPass(1);
      if (auto st = device.Embed(0, ids.data(), positions.data(), n); !st.ok()) return st;
      const auto t0 = std::chrono::steady_clock::now();
      if (auto st = device.TaskA(0, 0, q.data(), k.data(), v.data(), nullptr); !st.ok()) return st;
      if (auto st = device.TaskB(0, 0, attn.data(), nullptr); !st.ok()) return st;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) best = std::min(best, s);
    }
    points.push_back(ProfilePoint{n, best});
  }
  return points;
}

std::string ProfileKey(const ModelConfig& c, const std::string& device_name,
                       int64_t gpu_budget_bytes) {
  std::string key =
      absl::StrFormat("%s-h%d-f%d-l%d-e%dk%d-a%dkv%dd%d-%s-%.2fGiB", c.architecture, c.hidden_size,
                      c.intermediate_size, c.num_hidden_layers, c.num_local_experts,
                      c.num_experts_per_tok, c.num_attention_heads, c.num_key_value_heads,
                      c.head_dim, device_name, gpu_budget_bytes / double(int64_t{1} << 30));
  for (char& ch : key) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '-' || ch == '.';
    if (!ok) ch = '_';
  }
  return key;
}

namespace {
std::filesystem::path ProfilePath(const std::string& data_dir, const std::string& key) {
  return std::filesystem::path(data_dir) / "profiles" / (key + ".json");
}
}  // namespace

absl::Status SaveProfile(const std::string& data_dir, const std::string& key,
                         const PipelineProfile& profile) {
  const auto path = ProfilePath(data_dir, key);
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("profile: cannot create ", path.parent_path().string(), ": ", ec.message()));
  }
  nlohmann::json points = nlohmann::json::array();
  for (const ProfilePoint& p : profile.points) {
    points.push_back({{"tokens", p.tokens}, {"seconds", p.seconds}});
  }
  const nlohmann::json doc = {{"key", key},
                              {"points", points},
                              {"intercept_seconds", profile.fit.intercept},
                              {"slope_seconds_per_token", profile.fit.slope},
                              {"r2", profile.fit.r2},
                              {"layer_transfer_seconds", profile.layer_transfer_seconds},
                              {"n_real", profile.n_real}};
  // Write then rename, so a crash never leaves half a file under the real name.
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << doc.dump(2) << "\n";
    if (!out.good()) return absl::InternalError(absl::StrCat("profile: cannot write ", tmp));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("profile: cannot rename to ", path.string()));
  return absl::OkStatus();
}

absl::StatusOr<PipelineProfile> LoadProfile(const std::string& data_dir, const std::string& key) {
  const auto path = ProfilePath(data_dir, key);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("profile: no ", path.string()));
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  PipelineProfile p;
  if (!doc.is_object() || !doc.contains("points") || !doc["points"].is_array() ||
      !doc.contains("n_real") || !doc["n_real"].is_number_integer() ||
      !doc.contains("slope_seconds_per_token") || !doc.contains("intercept_seconds") ||
      !doc.contains("layer_transfer_seconds")) {
    return absl::DataLossError(absl::StrCat("profile: ", path.string(), " is not a profile"));
  }
  for (const auto& point : doc["points"]) {
    if (!point.is_object() || !point.contains("tokens") || !point.contains("seconds") ||
        !point["tokens"].is_number_integer() || !point["seconds"].is_number()) {
      return absl::DataLossError(absl::StrCat("profile: ", path.string(), ": a bad point"));
    }
    p.points.push_back(
        ProfilePoint{point["tokens"].get<int64_t>(), point["seconds"].get<double>()});
  }
  if (!doc["slope_seconds_per_token"].is_number() || !doc["intercept_seconds"].is_number() ||
      !doc["layer_transfer_seconds"].is_number()) {
    return absl::DataLossError(absl::StrCat("profile: ", path.string(), ": a bad number"));
  }
  p.fit.slope = doc["slope_seconds_per_token"].get<double>();
  p.fit.intercept = doc["intercept_seconds"].get<double>();
  p.fit.r2 = doc.contains("r2") && doc["r2"].is_number() ? doc["r2"].get<double>() : 0.0;
  p.layer_transfer_seconds = doc["layer_transfer_seconds"].get<double>();
  p.n_real = doc["n_real"].get<int64_t>();
  return p;
}

}  // namespace moebatch
