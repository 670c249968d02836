// moebatch-perplexity: the perplexity of a model on a text, computed as llama.cpp's
// llama-perplexity computes it (tools/perplexity/perplexity.cpp, its default mode), so the two
// can be compared on the same file:
//
//   moebatch-perplexity --model DIR|FILE.gguf --text FILE.txt [--ctx 512] [--chunks N] [flags]
//
// The text is tokenized whole (Tokenizer::Encode with the model's BOS policy) — or --tokens gives
// the ids (a JSON array, e.g. llama.cpp's own tokenization) — and cut into chunks of --ctx tokens
// (the remainder is dropped); a chunk's first token is replaced by BOS when the tokenizer adds
// one. In each chunk the tokens of its second half are scored, each given all the chunk's tokens
// before it: positions ctx/2 + 1 .. ctx - 1, ctx/2 - 1 tokens per chunk. Perplexity =
// exp(mean negative log-likelihood) over every scored token, printed as llama-perplexity prints it
// ("[1]12.3456,[2]..." then "Final estimate: PPL = 12.3456 +/- 0.1234", the uncertainty being
// PPL times the standard error of the mean negative log-likelihood). Several chunks share a pass
// (Engine::ScoreTokens), as many as --max_tokens_per_pass holds.
// --json FILE also writes {"ppl", "ppl_error", "tokens_scored", "chunks", "ctx", "nll_sum"}.
// Exit status: 0 done, 1 a fatal error (model, text), 2 usage.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "engine/engine.h"
#include "engine/tools/engine_flags.h"
#include "engine/tools/program_flags.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "",
          "the model: a Hugging Face directory or a GGUF file (as moebatch-run's --model)");
ABSL_FLAG(std::string, text, "", "the text to score (UTF-8)");
ABSL_FLAG(std::string, tokens, "",
          "instead of --text: a JSON array of token ids (a tokenization to reuse)");
ABSL_FLAG(int64_t, ctx, 512, "tokens per chunk (llama-perplexity's -c)");
ABSL_FLAG(int64_t, chunks, 0, "chunks to score (0: all the text holds)");
ABSL_FLAG(std::string, json, "", "also write the result as JSON to this file");
ABSL_FLAG(std::string, log_level, "warn", "trace, debug, info, warn, error");

namespace moebatch {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int Run() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string text_path = absl::GetFlag(FLAGS_text),
                    tokens_path = absl::GetFlag(FLAGS_tokens);
  const int64_t ctx = absl::GetFlag(FLAGS_ctx);
  if (model.empty() || text_path.empty() == tokens_path.empty()) {
    std::cerr << "moebatch-perplexity: --model and one of --text or --tokens are required\n";
    return 2;
  }
  if (ctx < 4) {
    std::cerr << "moebatch-perplexity: --ctx: must be at least 4, got " << ctx << "\n";
    return 2;
  }
  auto input = ReadFile(tokens_path.empty() ? text_path : tokens_path);
  if (!input.ok()) {
    std::cerr << "moebatch-perplexity: " << input.status().message() << "\n";
    return 1;
  }
  auto options = EngineOptionsFromFlags(model);
  if (!options.ok()) {
    std::cerr << "moebatch-perplexity: " << options.status().message() << "\n";
    return 2;
  }
  auto engine_or = Engine::Create(*options);
  if (!engine_or.ok()) {
    std::cerr << "moebatch-perplexity: " << engine_or.status().message() << "\n";
    return 1;
  }
  Engine& engine = **engine_or;
  std::vector<int32_t> ids;
  if (tokens_path.empty()) {
    ids = engine.tokenizer().Encode(*input, /*add_bos=*/true);
  } else {
    nlohmann::json j = nlohmann::json::parse(*input, nullptr, /*allow_exceptions=*/false);
    if (!j.is_array()) {
      std::cerr << "moebatch-perplexity: --tokens " << tokens_path << ": not a JSON array\n";
      return 1;
    }
    for (const auto& v : j) {
      if (!v.is_number_integer()) {
        std::cerr << "moebatch-perplexity: --tokens " << tokens_path << ": not all integers\n";
        return 1;
      }
      ids.push_back(v.get<int32_t>());
    }
  }
  // llama-perplexity: BOS starts every chunk when the tokenizer adds one.
  const std::vector<int32_t> bos_probe = engine.tokenizer().Encode("a", /*add_bos=*/true);
  const std::vector<int32_t> plain = engine.tokenizer().Encode("a", /*add_bos=*/false);
  const bool add_bos = bos_probe.size() > plain.size() && engine.tokenizer().bos_id() >= 0;
  int64_t chunks = static_cast<int64_t>(ids.size()) / ctx;
  if (absl::GetFlag(FLAGS_chunks) > 0) chunks = std::min(chunks, absl::GetFlag(FLAGS_chunks));
  if (chunks < 1) {
    std::cerr << "moebatch-perplexity: the text has " << ids.size() << " tokens, fewer than --ctx "
              << ctx << "\n";
    return 1;
  }
  std::cerr << absl::StrFormat("moebatch-perplexity: %d tokens, %d chunks of %d, BOS %s\n",
                               ids.size(), chunks, ctx, add_bos ? "yes" : "no");
  const int64_t first = ctx / 2 + 1;  // llama-perplexity's first = n_ctx / 2, + 1: the token
                                      // its logits row predicts
  const int64_t per_pass = std::max<int64_t>(1, engine.plan().schedule.max_tokens_per_pass / ctx);
  double nll = 0, nll2 = 0;
  int64_t scored = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t c0 = 0; c0 < chunks; c0 += per_pass) {
    std::vector<std::vector<int32_t>> batch;
    for (int64_t c = c0; c < std::min(chunks, c0 + per_pass); ++c) {
      batch.emplace_back(ids.begin() + c * ctx, ids.begin() + (c + 1) * ctx);
      if (add_bos) batch.back()[0] = engine.tokenizer().bos_id();
    }
    auto logprobs = engine.ScoreTokens(batch, first);
    if (!logprobs.ok()) {
      std::cerr << "moebatch-perplexity: " << logprobs.status().message() << "\n";
      return 1;
    }
    for (size_t b = 0; b < logprobs->size(); ++b) {
      for (double lp : (*logprobs)[b]) {
        nll -= lp;
        nll2 += lp * lp;
        ++scored;
      }
      std::cout << "[" << c0 + static_cast<int64_t>(b) + 1 << "]"
                << absl::StrFormat("%.4f", std::exp(nll / scored)) << "," << std::flush;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double mean = nll / scored;
  const double var = std::max(0.0, nll2 / scored - mean * mean);
  const double ppl = std::exp(mean);
  const double error = ppl * std::sqrt(var / std::max<int64_t>(1, scored - 1));
  std::cout << "\n" << absl::StrFormat("Final estimate: PPL = %.4f +/- %.5f", ppl, error) << "\n";
  std::cerr << absl::StrFormat(
      "moebatch-perplexity: %d tokens scored in %d chunks, %.1f s (%.0f tokens/s prefilled)\n",
      scored, chunks, seconds, chunks * ctx / seconds);
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    nlohmann::json j = {{"ppl", ppl},        {"ppl_error", error}, {"tokens_scored", scored},
                        {"chunks", chunks},  {"ctx", ctx},         {"nll_sum", nll},
                        {"seconds", seconds}};
    std::ofstream out(path);
    out << j.dump(1) << "\n";
    if (!out) {
      std::cerr << "moebatch-perplexity: cannot write --json " << path << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  moebatch::ShowEngineFlagsInHelp();
  moebatch::ParseProgramFlags(
      argc, argv,
      "moebatch-perplexity --model DIR|FILE.gguf --text FILE.txt [--ctx 512] [flags]\n"
      "The perplexity of a model on a text, as llama.cpp's llama-perplexity computes it.");
  spdlog::set_default_logger(spdlog::stderr_color_mt("moebatch-perplexity"));
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  return moebatch::Run();
}
