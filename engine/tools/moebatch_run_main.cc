// moebatch-run: runs an OpenAI-batch JSONL file through the engine, offline, on this host.
//
//   moebatch-run --model DIR --input IN.jsonl --output OUT.jsonl [--compute-dtype f32|bf16] ...
//
// Every input line becomes one output line, written in input order as soon as every earlier line
// is done (so a partial OUT.jsonl is a usable prefix). A line that fails to parse or validate
// becomes an error line; the others still run. A progress bar goes to stderr.
// Exit status: 0 when the run completed (even with error lines), 1 on a fatal error (bad flags,
// unreadable model, I/O failure), 2 on usage errors.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/engine.h"
#include "engine/tools/engine_flags.h"
#include "engine/batch/openai_batch.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "",
          "Hugging Face model directory (config.json, *.safetensors, "
          "tokenizer.model)");
ABSL_FLAG(std::string, input, "", "input JSONL file, OpenAI batch format ('-' for stdin)");
ABSL_FLAG(std::string, output, "", "output JSONL file, OpenAI batch output format");
ABSL_FLAG(int32_t, default_max_tokens, 256, "max_tokens for lines that give none");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error|off");
ABSL_FLAG(bool, progress, true, "show a progress bar on stderr");

namespace moebatch {
namespace {

struct LineState {
  ParsedBatchLine parsed;
  std::optional<std::string> output;  // the formatted output line once done
  Completion completion;
};

class ProgressBar {
 public:
  ProgressBar(bool enabled, int64_t total)
      : enabled_(enabled),
        tty_(isatty(STDERR_FILENO) != 0),
        total_(total),
        start_(std::chrono::steady_clock::now()) {}
  void Update(int64_t done, int64_t generated, bool force = false) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    const double since_last = std::chrono::duration<double>(now - last_).count();
    if (!force && since_last < (tty_ ? 0.2 : 10.0)) return;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? generated / elapsed : 0.0;
    const double frac = total_ > 0 ? static_cast<double>(done) / total_ : 1.0;
    const int width = 30, filled = static_cast<int>(frac * width);
    std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
    std::string eta = "--";
    if (done > 0 && done < total_) {
      eta = absl::StrFormat("%.0fs", elapsed / done * (total_ - done));
    }
    std::fprintf(stderr, "%s[%s] %lld/%lld requests | %lld tokens | %.1f tok/s | %.0fs | ETA %s%s",
                 tty_ ? "\r" : "", bar.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_), static_cast<long long>(generated), rate, elapsed,
                 eta.c_str(), tty_ ? "  " : "\n");
    std::fflush(stderr);
  }
  void Done() {
    if (enabled_ && tty_) std::fputc('\n', stderr);
  }

 private:
  bool enabled_, tty_;
  int64_t total_;
  std::chrono::steady_clock::time_point start_, last_{};
};

int Run() {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const std::string input_path = absl::GetFlag(FLAGS_input);
  const std::string output_path = absl::GetFlag(FLAGS_output);
  if (model_dir.empty() || input_path.empty() || output_path.empty()) {
    std::cerr << "moebatch-run: --model, --input and --output are required (see --help)\n";
    return 2;
  }
  auto options = EngineOptionsFromFlags(model_dir);
  if (!options.ok()) {
    std::cerr << "moebatch-run: " << options.status().message() << "\n";
    return 2;
  }
  auto engine_or = Engine::Create(*options);
  if (!engine_or.ok()) {
    std::cerr << "moebatch-run: cannot load model: " << engine_or.status() << "\n";
    return 1;
  }
  Engine& engine = **engine_or;

  // Read and parse every line first: a bad line becomes an error line, never a failed run.
  std::ifstream file;
  std::istream* in = &std::cin;
  if (input_path != "-") {
    file.open(input_path);
    if (!file) {
      std::cerr << "moebatch-run: cannot open --input " << input_path << "\n";
      return 1;
    }
    in = &file;
  }
  std::ofstream out(output_path, std::ios::trunc);
  if (!out) {
    std::cerr << "moebatch-run: cannot write --output " << output_path << "\n";
    return 1;
  }
  BatchDefaults defaults;
  defaults.max_tokens = absl::GetFlag(FLAGS_default_max_tokens);
  std::vector<LineState> lines;
  std::map<int64_t, size_t> line_of_request;
  std::string text;
  const std::string batch_tag = absl::StrFormat("%x", static_cast<uint64_t>(std::time(nullptr)));
  auto request_id = [&](size_t i) { return absl::StrCat("batch_req_", batch_tag, "_", i); };
  while (std::getline(*in, text)) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    LineState line;
    line.parsed = ParseBatchLine(text, defaults);
    const size_t index = lines.size();
    if (line.parsed.request.ok()) {
      const BatchRequest& req = *line.parsed.request;
      GenerationRequest gen;
      gen.sampling = req.sampling;
      absl::Status st;
      if (req.endpoint == Endpoint::kChatCompletions) {
        auto ids = engine.tokenizer().EncodeChat(req.messages);
        if (ids.ok()) {
          gen.prompt_token_ids = *std::move(ids);
        } else {  // the tokenizer names messages[i]; the line's field is body.messages[i]
          st = absl::Status(ids.status().code(), absl::StrCat("body.", ids.status().message()));
        }
      } else if (req.prompt_token_ids) {
        gen.prompt_token_ids = *req.prompt_token_ids;
      } else {
        gen.prompt_token_ids = engine.tokenizer().Encode(req.prompt, /*add_bos=*/true);
      }
      if (st.ok()) {
        line.completion.prompt_tokens = static_cast<int64_t>(gen.prompt_token_ids.size());
        auto id = engine.AddRequest(std::move(gen));
        if (id.ok()) {
          line_of_request[*id] = index;
        } else {
          st = id.status();
        }
      }
      if (!st.ok()) line.output = FormatBatchError(line.parsed, request_id(index), st);
    } else {
      line.output = FormatBatchError(line.parsed, request_id(index), line.parsed.request.status());
    }
    lines.push_back(std::move(line));
  }
  spdlog::info("{} input lines, {} queued", lines.size(), line_of_request.size());

  ProgressBar bar(absl::GetFlag(FLAGS_progress), static_cast<int64_t>(lines.size()));
  size_t written = 0, done = lines.size() - line_of_request.size();
  int64_t generated = 0;
  auto flush_prefix = [&]() {
    while (written < lines.size() && lines[written].output) {
      out << *lines[written].output << '\n';
      lines[written].output.reset();
      ++written;
    }
    out.flush();
  };
  flush_prefix();
  const auto start = std::chrono::steady_clock::now();
  std::vector<GenerationOutput> step_outputs;
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  while (engine.HasUnfinished()) {
    step_outputs.clear();
    if (auto st = engine.Step(&step_outputs); !st.ok()) {
      std::cerr << "\nmoebatch-run: engine failed: " << st << "\n";
      return 1;
    }
    for (GenerationOutput& o : step_outputs) {
      const size_t index = line_of_request.at(o.request_id);
      LineState& line = lines[index];
      Completion& c = line.completion;
      c.token_ids.insert(c.token_ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      c.text += o.new_text;
      generated += static_cast<int64_t>(o.new_token_ids.size());
      if (o.finished) {
        c.finish_reason = FinishReasonName(o.finish_reason);
        c.completion_tokens = o.completion_tokens;
        line.output = FormatBatchOutput(*line.parsed.request, request_id(index), c, created);
        ++done;
      }
    }
    flush_prefix();
    bar.Update(static_cast<int64_t>(done), generated);
  }
  flush_prefix();
  bar.Update(static_cast<int64_t>(done), generated, /*force=*/true);
  bar.Done();
  if (!out) {
    std::cerr << "moebatch-run: write to " << output_path << " failed\n";
    return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const EngineStats s = engine.stats();
  spdlog::info(
      "done: {} requests, {} prompt tokens prefilled, {} generated in {:.2f} s: {:.1f} generated "
      "tok/s, {:.1f} total tok/s, {} passes, {} preemptions",
      lines.size(), s.prefill_tokens, s.generated_tokens, seconds,
      seconds > 0 ? s.generated_tokens / seconds : 0.0,
      seconds > 0 ? (s.prefill_tokens + s.decode_tokens) / seconds : 0.0, s.passes, s.preemptions);
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "moebatch-run --model DIR --input IN.jsonl --output OUT.jsonl [flags]\n"
      "Runs an OpenAI-batch JSONL file through a Mixtral checkpoint on this host.");
  moebatch::ShowEngineFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  const std::string level = absl::GetFlag(FLAGS_log_level);
  spdlog::set_default_logger(spdlog::stderr_color_mt("moebatch-run"));
  spdlog::set_level(spdlog::level::from_str(level));
  return moebatch::Run();
}
