// moebatch-run: runs an OpenAI-batch JSONL file through the engine, offline, on this host.
//
//   moebatch-run --model DIR|FILE.gguf --input IN.jsonl --output OUT.jsonl [flags]
//
// Lines go through the batch front end (engine/batch/batch_reader.h) with InvalidLinePolicy::
// kFailRequest and ModelPolicy::kAccept: every non-blank input line becomes one output line,
// written in input order as soon as every earlier line is done (so a partial OUT.jsonl is a usable
// prefix); a line that fails to parse or validate becomes an error line and the others still run
// (a warning lists the bad lines). --input ('-': stdin) and --output are checked before the model
// loads. A progress bar goes to stderr, and a summary from the job's clock
// (engine/batch/job_clock.h) at the end.
// Exit status: 0 when the run completed (even with error lines), 1 on a fatal error (unreadable
// --input, unwritable --output, unreadable model, I/O failure), 2 on usage errors.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/batch/batch_reader.h"
#include "engine/batch/job_clock.h"
#include "engine/batch/openai_batch.h"
#include "engine/engine.h"
#include "engine/tools/engine_flags.h"
#include "engine/tools/program_flags.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "",
          "the model: a Hugging Face directory (config.json, *.safetensors, tokenizer.json or "
          "tokenizer.model) or a GGUF file (llama.cpp's format: Q4_K, Q8_0, ... kept quantized)");
ABSL_FLAG(std::string, input, "", "input JSONL file, OpenAI batch format ('-' for stdin)");
ABSL_FLAG(std::string, output, "", "output JSONL file, OpenAI batch output format");
ABSL_FLAG(int32_t, default_max_tokens, 256, "max_tokens for lines that give none");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error|off");
ABSL_FLAG(bool, progress, true, "show a progress bar on stderr");

namespace moebatch {
namespace {

struct LineState {
  BatchLine line;                     // from the batch front end: the request or its error
  std::vector<int32_t> prompt;        // the prompt's token ids (valid lines)
  std::optional<std::string> output;  // the formatted output line once done
  std::vector<Completion> choices;    // [n], by choice index
  int32_t finished = 0;               // choices whose final output came
  absl::Status error;                 // the first failed choice's
};

// The progress line on stderr: at most every 0.2 s on a terminal, every 10 s otherwise; the
// figures are the JobClock's (requests that run, generated tokens, rates since the start, ETA).
class ProgressBar {
 public:
  ProgressBar(bool enabled, int64_t failed_lines)
      : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0), failed_lines_(failed_lines) {}
  void Update(const JobClock& clock, bool force = false) {
    if (!enabled_) return;
    const JobClock::Reading r = clock.Read();
    if (!force && printed_ && r.elapsed_seconds - last_ < (tty_ ? 0.2 : 10.0)) return;
    printed_ = true;
    last_ = r.elapsed_seconds;
    const double frac =
        r.requests_total > 0 ? static_cast<double>(r.requests_done) / r.requests_total : 1.0;
    const int width = 30, filled = static_cast<int>(frac * width);
    const std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
    const std::string failed =
        failed_lines_ > 0 ? absl::StrCat(" (+", failed_lines_, " failed lines)") : "";
    const std::string eta = r.eta_seconds ? absl::StrFormat("%.0fs", *r.eta_seconds) : "--";
    std::fprintf(stderr,
                 "%s[%s] %lld/%lld requests%s | %lld tokens | %.1f tok/s | %.2f req/s | %.1fs | "
                 "ETA %s%s",
                 tty_ ? "\r" : "", bar.c_str(), static_cast<long long>(r.requests_done),
                 static_cast<long long>(r.requests_total), failed.c_str(),
                 static_cast<long long>(r.tokens_done), r.tokens_per_second, r.requests_per_second,
                 r.elapsed_seconds, eta.c_str(), tty_ ? "  " : "\n");
    std::fflush(stderr);
  }
  void Done() {
    if (enabled_ && tty_ && printed_) std::fputc('\n', stderr);
  }

 private:
  bool enabled_, tty_;
  int64_t failed_lines_;
  bool printed_ = false;
  double last_ = 0;  // elapsed seconds at the last line printed
};

// --input must be readable ('-': standard input); opens it into `file`.
absl::Status OpenInput(const std::string& path, std::ifstream* file) {
  if (path == "-") return absl::OkStatus();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("--input ", path, ": is a directory"));
  }
  if (access(path.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--input ", path, ": cannot read: ", std::strerror(errno)));
  }
  file->open(path, std::ios::binary);
  if (!*file) return absl::InvalidArgumentError(absl::StrCat("--input ", path, ": cannot open"));
  return absl::OkStatus();
}

// --output must be a writable file or creatable in an existing, writable directory. Nothing is
// created or truncated here: a run that fails to load the model leaves the file as it was.
absl::Status CheckOutput(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::exists(status)) {
    if (fs::is_directory(status)) {
      return absl::InvalidArgumentError(absl::StrCat("--output ", path, ": is a directory"));
    }
    if (access(path.c_str(), W_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--output ", path, ": cannot write: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--output ", path, ": cannot create: no directory ", dir.string()));
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--output ", path, ": cannot create in ",
                                                   dir.string(), ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

int Run() {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const std::string input_path = absl::GetFlag(FLAGS_input);
  const std::string output_path = absl::GetFlag(FLAGS_output);
  if (DryRunRequested() && !model_dir.empty()) {  // the plan from config.json; nothing is loaded
    auto options = EngineOptionsFromFlags(model_dir);
    absl::Status st = options.ok() ? PrintDryRun(*options) : options.status();
    if (!st.ok()) std::cerr << "moebatch-run: " << st.message() << "\n";
    return st.ok() ? 0 : 1;
  }
  if (model_dir.empty() || input_path.empty() || output_path.empty()) {
    std::cerr << "moebatch-run: --model, --input and --output are required (see --help)\n";
    return 2;
  }
  // The files first: a wrong path fails at once, not after the model has loaded.
  std::ifstream file;
  if (absl::Status st = OpenInput(input_path, &file); !st.ok()) {
    std::cerr << "moebatch-run: " << st.message() << "\n";
    return 1;
  }
  if (absl::Status st = CheckOutput(output_path); !st.ok()) {
    std::cerr << "moebatch-run: " << st.message() << "\n";
    return 1;
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

  // Every line through the batch front end first (moebatch-run's policies: a bad line becomes an
  // error line, never a failed run; body.model is only echoed), tokenized as its last check.
  std::istream& in = input_path == "-" ? std::cin : file;
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) {
    std::cerr << "moebatch-run: --input " << input_path << ": read failed\n";
    return 1;
  }
  std::map<int64_t, std::vector<int32_t>> prompts;  // by request index
  BatchReadOptions read_options;
  read_options.invalid_lines = InvalidLinePolicy::kFailRequest;
  read_options.model = ModelPolicy::kAccept;
  read_options.defaults.max_tokens = absl::GetFlag(FLAGS_default_max_tokens);
  read_options.check_line = [&](const BatchLine& line) -> absl::Status {
    const BatchRequest& req = *line.parsed.request;
    std::vector<int32_t>& prompt = prompts[line.index];
    if (TakesMessages(req.endpoint)) {
      auto ids = engine.tokenizer().EncodeChat(req.messages);
      if (!ids.ok()) return ChatPromptError(req, ids.status());
      prompt = *std::move(ids);
    } else if (req.prompt_token_ids) {
      prompt = *req.prompt_token_ids;
    } else {
      prompt = engine.tokenizer().Encode(req.prompt, /*add_bos=*/true);
    }
    return absl::OkStatus();
  };
  absl::StatusOr<BatchInput> input = ReadBatch(text, read_options);
  text = std::string();
  if (!input.ok()) {
    std::cerr << "moebatch-run: --input " << input_path << ": " << input.status().message() << "\n";
    return 1;
  }
  if (!input->report.ok()) spdlog::warn("{}", FormatBatchErrors(input->report));

  std::ofstream out(output_path, std::ios::trunc);
  if (!out) {
    std::cerr << "moebatch-run: cannot write --output " << output_path << "\n";
    return 1;
  }
  std::vector<LineState> lines(input->lines.size());
  std::map<int64_t, size_t> line_of_request;
  int64_t queued_max_tokens = 0;
  const std::string batch_tag = absl::StrFormat("%x", static_cast<uint64_t>(std::time(nullptr)));
  auto request_id = [&](size_t i) { return absl::StrCat("batch_req_", batch_tag, "_", i); };
  for (size_t index = 0; index < lines.size(); ++index) {
    LineState& line = lines[index];
    line.line = std::move(input->lines[index]);
    line.line.text = std::string();  // parsed; not needed any more
    absl::Status st = line.line.parsed.request.status();
    if (st.ok()) {
      const BatchRequest& req = *line.line.parsed.request;
      GenerationRequest gen;
      gen.sampling = req.sampling;
      gen.prompt_token_ids = std::move(prompts[line.line.index]);
      line.choices.resize(req.sampling.n);
      for (Completion& c : line.choices) {
        c.prompt_tokens = static_cast<int64_t>(gen.prompt_token_ids.size());
      }
      auto id = engine.AddRequest(std::move(gen));
      if (id.ok()) {
        line_of_request[*id] = index;
        queued_max_tokens += int64_t{req.sampling.max_tokens} * req.sampling.n;
      } else {
        st = id.status();
      }
    }
    if (!st.ok()) line.output = FormatBatchError(line.line.parsed, request_id(index), st);
  }
  prompts.clear();
  const int64_t queued = static_cast<int64_t>(line_of_request.size());
  const int64_t failed_lines = static_cast<int64_t>(lines.size()) - queued;
  spdlog::info("{} input lines, {} queued", lines.size(), queued);

  size_t written = 0;
  auto flush_prefix = [&]() {
    while (written < lines.size() && lines[written].output) {
      out << *lines[written].output << '\n';
      lines[written].output.reset();
      ++written;
    }
    out.flush();
  };
  flush_prefix();
  // The job starts now: rates and the ETA count the requests that run and the tokens they
  // generate, against the sum of their max_tokens.
  JobClock clock(queued, queued_max_tokens);
  ProgressBar bar(absl::GetFlag(FLAGS_progress), failed_lines);
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
      Completion& c = line.choices.at(o.index);
      c.token_ids.insert(c.token_ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      c.logprobs.insert(c.logprobs.end(), std::make_move_iterator(o.new_logprobs.begin()),
                        std::make_move_iterator(o.new_logprobs.end()));
      c.text += o.new_text;
      clock.AddTokens(static_cast<int64_t>(o.new_token_ids.size()));
      if (o.finished) {
        c.finish_reason = FinishReasonName(o.finish_reason);
        c.completion_tokens = o.completion_tokens;
        if (line.error.ok()) line.error = o.error;
        // One output line per request, once its last choice finished.
        if (++line.finished < static_cast<int32_t>(line.choices.size())) continue;
        line.output = line.error.ok()
                          ? FormatBatchOutput(*line.line.parsed.request, request_id(index),
                                              line.choices, created, &engine.tokenizer())
                          : FormatBatchError(line.line.parsed, request_id(index), line.error);
        line.choices.clear();
        clock.AddRequests(1);
      }
    }
    flush_prefix();
    bar.Update(clock);
  }
  flush_prefix();
  bar.Update(clock, /*force=*/true);
  bar.Done();
  if (!out) {
    std::cerr << "moebatch-run: write to " << output_path << " failed\n";
    return 1;
  }
  const JobClock::Reading r = clock.Read();
  const EngineStats s = engine.stats();
  spdlog::info(
      "done: {} lines, {} requests ran, {} failed lines; {} tokens generated in {:.2f} s: {:.1f} "
      "tok/s, {:.2f} requests/s; {} prompt tokens prefilled, {:.1f} total tok/s, {} passes, {} "
      "preemptions",
      lines.size(), r.requests_done, failed_lines, r.tokens_done, r.elapsed_seconds,
      r.tokens_per_second, r.requests_per_second, s.prefill_tokens,
      r.elapsed_seconds > 0 ? (s.prefill_tokens + s.decode_tokens) / r.elapsed_seconds : 0.0,
      s.passes, s.preemptions);
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  moebatch::ShowEngineFlagsInHelp();
  moebatch::ParseProgramFlags(
      argc, argv,
      "moebatch-run --model DIR|FILE.gguf --input IN.jsonl --output OUT.jsonl [flags]\n"
      "Runs an OpenAI-batch JSONL file through a Hugging Face checkpoint (Mixtral, Qwen3-MoE, "
      "Qwen2-MoE, OLMoE, Llama, Mistral, Qwen2, Qwen3) on this host.");
  const std::string level = absl::GetFlag(FLAGS_log_level);
  spdlog::set_default_logger(spdlog::stderr_color_mt("moebatch-run"));
  spdlog::set_level(spdlog::level::from_str(level));
  return moebatch::Run();
}
