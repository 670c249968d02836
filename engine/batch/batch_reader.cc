// The batch front end (batch_reader.h). Messages are built with absl::StrCat; the values they quote
// go through nlohmann-json (QuoteBounded), so they are escaped as JSON strings and valid UTF-8.
#include "engine/batch/batch_reader.h"

#include <exception>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/model/json_depth.h"
#include "nlohmann/json.hpp"

namespace moebatch {
namespace {

using json = nlohmann::json;

constexpr std::string_view kWhiteSpace = " \t\r\n\v\f";
constexpr size_t kMaxModelNameBytes = 80;  // of body.model quoted in its error message
constexpr size_t kTailBytes = 40;          // room kept for "; and N more"

std::string Dump(const json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

// The longest prefix of `s` of at most `limit` bytes that does not end inside a UTF-8 sequence
// (it backs up over at most 3 continuation bytes, so ill-formed text still gets a prefix).
size_t Utf8Prefix(std::string_view s, size_t limit) {
  if (limit >= s.size()) return s.size();
  size_t k = limit;
  while (k > 0 && limit - k < 3 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return k;
}

// `s` cut to at most `max_bytes` bytes (then "..."), ill-formed UTF-8 replaced by U+FFFD.
std::string Truncated(std::string_view s, size_t max_bytes) {
  const size_t n = Utf8Prefix(s, max_bytes);
  std::string out;
  try {
    out = json::parse(Dump(json(std::string(s.substr(0, n))))).get<std::string>();
  } catch (const std::exception&) {
    out = std::string(s.substr(0, n));
  }
  if (n < s.size()) out += "...";
  return out;
}

bool IsBlank(std::string_view line) { return line.find_first_not_of(kWhiteSpace) == line.npos; }

absl::Status CheckCount(size_t requests, const BatchReadOptions& options) {
  if (options.max_requests > 0 && static_cast<int64_t>(requests) > options.max_requests) {
    return absl::InvalidArgumentError(absl::StrCat("requests: ", requests,
                                                   " requests, more than the limit "
                                                   "(max_requests_per_job) of ",
                                                   options.max_requests, " per job"));
  }
  return absl::OkStatus();
}

// The front end's own checks of one line (batch_reader.h, in that order), then check_line.
// `first_line_of` maps each custom_id seen so far to its first line.
void CheckLine(const BatchReadOptions& options,
               const std::unordered_map<std::string, int64_t>& first_line_of, BatchLine* line) {
  ParsedBatchLine& parsed = line->parsed;
  if (options.max_line_bytes > 0 &&
      static_cast<int64_t>(line->text.size()) > options.max_line_bytes) {
    parsed.json_ok = true;  // unread: a 400 response, not an "invalid_json" error
    parsed.request = absl::InvalidArgumentError(
        absl::StrCat("the line has ", line->text.size(), " bytes, more than the limit of ",
                     options.max_line_bytes, " bytes per line"));
    return;
  }
  // Stored lines are re-serialized (the daemon freezes max_tokens into them), which recurses once
  // per nesting level: deeper lines are refused before anything touches them.
  if (JsonNestsDeeperThan(line->text, kMaxJsonDepth)) {
    parsed.json_ok = false;
    parsed.request = absl::InvalidArgumentError(
        absl::StrCat("invalid JSON: nested deeper than ", kMaxJsonDepth, " levels"));
    return;
  }
  parsed = ParseBatchLine(line->text, options.defaults);
  if (!parsed.request.ok()) return;
  const BatchRequest& request = *parsed.request;
  absl::Status status;
  if (auto first = first_line_of.find(request.custom_id); first != first_line_of.end()) {
    status = absl::InvalidArgumentError(
        absl::StrCat("custom_id: duplicate, first used on line ", first->second));
  } else if (options.model == ModelPolicy::kCheck && !request.model.empty() &&
             request.model != options.model_name) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "body.model: this server runs ", QuoteBounded(options.model_name, kMaxModelNameBytes),
        ", got ", QuoteBounded(request.model, kMaxModelNameBytes)));
  } else if (options.max_tokens_limit > 0 &&
             request.sampling.max_tokens > options.max_tokens_limit) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "body.", std::string(MaxTokensField(request.endpoint)), ": ", request.sampling.max_tokens,
        " is over the limit (max_tokens_per_request) of ", options.max_tokens_limit));
  } else if (options.check_line) {
    status = options.check_line(*line);
  }
  if (!status.ok()) parsed.request = status;
}

// Checks every line; `raw` holds the non-blank lines with their line numbers.
absl::StatusOr<BatchInput> ReadRaw(std::vector<std::pair<int64_t, std::string>> raw,
                                   const BatchReadOptions& options) {
  BatchInput input;
  input.report.lines = static_cast<int64_t>(raw.size());
  input.lines.reserve(raw.size());
  std::unordered_map<std::string, int64_t> first_line_of;
  for (size_t i = 0; i < raw.size(); ++i) {
    BatchLine line;
    line.line_number = raw[i].first;
    line.index = static_cast<int64_t>(i);
    line.text = std::move(raw[i].second);
    CheckLine(options, first_line_of, &line);
    if (!line.parsed.custom_id.empty()) {
      first_line_of.emplace(line.parsed.custom_id, line.line_number);
    }
    if (!line.ok()) {
      const std::string message(line.parsed.request.status().message());
      input.report.errors.push_back(
          BatchLineError{line.line_number, line.parsed.custom_id, ErrorParam(message), message});
    }
    input.lines.push_back(std::move(line));
  }
  if (options.invalid_lines == InvalidLinePolicy::kRefuseJob && !input.report.ok()) {
    return absl::InvalidArgumentError(FormatBatchErrors(input.report));
  }
  return input;
}

}  // namespace

std::string QuoteBounded(std::string_view value, size_t max_bytes) {
  size_t n = Utf8Prefix(value, max_bytes);
  while (true) {
    std::string quoted;
    try {
      quoted = Dump(json(std::string(value.substr(0, n))));
    } catch (const std::exception&) {
      quoted = "\"\"";
      n = 0;
    }
    // Escapes (\u0001, \") and U+FFFD replacements make the literal longer than the prefix:
    // shrink the prefix until it fits.
    if (quoted.size() <= max_bytes + 2 || n == 0) {
      if (n < value.size()) quoted += "...";
      return quoted;
    }
    n = Utf8Prefix(value, n * max_bytes / quoted.size());
  }
}

size_t GrpcMessageBytes(std::string_view text) {
  size_t bytes = 0;
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    bytes += (u >= 0x20 && u <= 0x7E && u != '%') ? 1 : 3;
  }
  return bytes;
}

std::string FormatBatchErrors(const BatchErrorReport& report, const ErrorReportBounds& bounds) {
  const size_t bad = report.errors.size();
  if (bad == 0) return std::string();
  std::string out =
      absl::StrCat(bad, " of ", report.lines, report.lines == 1 ? " line " : " lines ",
                   bad == 1 ? "is" : "are", " invalid: ");
  size_t used = GrpcMessageBytes(out);
  size_t shown = 0;
  for (const BatchLineError& e : report.errors) {
    if (shown == bounds.max_entries) break;
    std::string entry = absl::StrCat(shown > 0 ? "; " : "", "line ", e.line_number);
    if (!e.custom_id.empty()) {
      absl::StrAppend(&entry, " (custom_id ", QuoteBounded(e.custom_id, bounds.max_value_bytes),
                      ")");
    }
    absl::StrAppend(&entry, ": ", Truncated(e.message, bounds.max_message_bytes));
    const size_t cost = GrpcMessageBytes(entry);
    const size_t tail = shown + 1 < bad ? kTailBytes : 0;
    if (used + cost + tail > bounds.max_total_bytes) break;
    out += entry;
    used += cost;
    ++shown;
  }
  if (shown < bad) absl::StrAppend(&out, shown > 0 ? "; " : "", "and ", bad - shown, " more");
  return out;
}

absl::StatusOr<BatchInput> ReadBatch(std::string_view jsonl, const BatchReadOptions& options) {
  std::vector<std::pair<int64_t, std::string_view>> views;
  int64_t number = 0;
  size_t start = 0;
  while (start < jsonl.size()) {
    size_t end = jsonl.find('\n', start);
    if (end == std::string_view::npos) end = jsonl.size();
    std::string_view line = jsonl.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    ++number;
    if (!IsBlank(line)) views.emplace_back(number, line);
    start = end + 1;
  }
  if (absl::Status s = CheckCount(views.size(), options); !s.ok()) return s;
  std::vector<std::pair<int64_t, std::string>> raw;
  raw.reserve(views.size());
  for (const auto& [n, line] : views) raw.emplace_back(n, std::string(line));
  return ReadRaw(std::move(raw), options);
}

absl::StatusOr<BatchInput> ReadBatchLines(std::vector<std::string> lines,
                                          const BatchReadOptions& options) {
  std::vector<std::pair<int64_t, std::string>> raw;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!IsBlank(lines[i])) raw.emplace_back(static_cast<int64_t>(i) + 1, std::move(lines[i]));
  }
  if (absl::Status s = CheckCount(raw.size(), options); !s.ok()) return s;
  return ReadRaw(std::move(raw), options);
}

}  // namespace moebatch
