// Encode throughput of a tokenizer.json (or tokenizer.model) tokenizer: single-threaded
// Tokenizer::Encode (add_special_tokens, special tokens parsed: HF `tokenizer(text)`) over the
// lines of a JSONL file of strings, the best of --reps passes after one warm-up pass (which fills
// the per-word cache, as HF's warm-up does; its time is printed too). Prints texts, bytes, tokens,
// seconds, tokens/s and MB/s; bench/tokenizer_throughput.py runs it beside Hugging Face
// `tokenizers` on the same text.
//
//   bench_tokenizer_throughput --tokenizer .deps/tokenizers/bpe/llama3
//       --texts .deps/tokenizers/bpe/texts.jsonl [--reps 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "engine/text/tokenizer.h"
#include "engine/tools/program_flags.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, tokenizer, "", "model directory with tokenizer.json (or tokenizer.model)");
ABSL_FLAG(std::string, texts, "",
          "JSONL file, one JSON string per line (the AlpacaEval "
          "instructions: .deps/tokenizers/bpe/texts.jsonl)");
ABSL_FLAG(int, reps, 5,
          "timed passes over all texts (after one warm-up pass); the best is reported");

namespace moebatch {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_tokenizer);
  auto tok = Tokenizer::LoadFromModelDir(dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "bench_tokenizer_throughput: %s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::ifstream in(absl::GetFlag(FLAGS_texts));
  std::vector<std::string> texts;
  size_t bytes = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    texts.push_back(nlohmann::json::parse(line).get<std::string>());
    bytes += texts.back().size();
  }
  if (texts.empty()) {
    std::fprintf(stderr, "bench_tokenizer_throughput: no texts in %s\n",
                 absl::GetFlag(FLAGS_texts).c_str());
    return 1;
  }
  size_t tokens = 0;
  const double cold_start = Now();
  for (const std::string& t : texts) tokens += (*tok)->Encode(t, /*add_bos=*/true).size();
  const double cold = Now() - cold_start;
  double best = 1e30;
  for (int r = 0; r < std::max(1, absl::GetFlag(FLAGS_reps)); ++r) {
    const double t0 = Now();
    size_t n = 0;
    for (const std::string& t : texts) n += (*tok)->Encode(t, /*add_bos=*/true).size();
    best = std::min(best, Now() - t0);
    if (n != tokens) return 2;
  }
  std::printf(
      "tokenizer %s: %zu texts, %zu bytes, %zu tokens; best pass %.4f s: %.0f tokens/s, "
      "%.1f MB/s (one thread); first pass (empty word cache) %.4f s: %.0f tokens/s\n",
      dir.c_str(), texts.size(), bytes, tokens, best, tokens / best, bytes / best / 1e6, cold,
      tokens / cold);
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  moebatch::ParseProgramFlags(argc, argv,
                              "bench_tokenizer_throughput --tokenizer DIR --texts FILE [--reps N]");
  return moebatch::Main();
}
