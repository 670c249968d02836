// The golden fixtures (tests/fixtures/*/golden.jsonl, written by
// tests/fixtures/make_tiny_mixtral.py with transformers): prompts, their token ids, transformers'
// greedy tokens and text, and the last prompt token's logits. Shared by the cpu (test_golden.cc)
// and cuda (test_cuda_backend.cc) tests.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moebatch::testing {

struct Golden {
  std::string prompt;
  std::vector<int32_t> prompt_ids, greedy_ids;
  std::string greedy_text;
  std::vector<float> last_logits;  // [vocab], f32
};

inline std::string FixtureDir(const std::string& name) {
  return std::string(MOEBATCH_FIXTURES_DIR) + "/" + name;
}

inline std::vector<Golden> LoadGolden(const std::string& dir) {
  std::ifstream in(dir + "/golden.jsonl");
  INFO("reading " << dir << "/golden.jsonl (generate with tests/fixtures/make_tiny_mixtral.py)");
  REQUIRE(in.good());
  std::vector<Golden> out;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    Golden g;
    g.prompt = j.at("prompt").get<std::string>();
    g.prompt_ids = j.at("prompt_token_ids").get<std::vector<int32_t>>();
    g.greedy_ids = j.at("greedy_token_ids").get<std::vector<int32_t>>();
    g.greedy_text = j.at("greedy_text").get<std::string>();
    g.last_logits = j.at("last_logits").get<std::vector<float>>();
    out.push_back(std::move(g));
  }
  REQUIRE(out.size() >= 6);
  return out;
}

}  // namespace moebatch::testing
