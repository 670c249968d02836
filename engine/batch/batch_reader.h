// The batch front end: an OpenAI batch JSONL payload (or a list of request lines) to validated
// requests, by one set of rules shared by moebatchd (server/job_request.h) and moebatch-run.
//
// Lines: split on '\n' (a '\r' before it is dropped). Blank and whitespace-only lines are skipped;
// line numbers stay the file's: 1-based physical lines, blank lines counted. A list of lines
// (inline CreateJob requests) is numbered by position, 1-based. Every non-blank line is one
// request, `index` 0-based among them (the request's position in the job and in the output).
//
// Each line is checked, in this order, and gets at most one error:
//   the byte limit (`max_line_bytes`); JSON nesting (kMaxJsonDepth); ParseBatchLine (format and
//   ranges, engine/batch/openai_batch.h); a duplicate custom_id (a line reusing the custom_id of
//   any earlier line, valid or not); `body.model` (ModelPolicy::kCheck); max_tokens over
//   `max_tokens_limit`; then the caller's `check_line` (the daemon tokenizes there).
// The whole input is refused, whatever the policy, when it has more than `max_requests` requests.
//
// What becomes of a bad line is the InvalidLinePolicy:
//   kFailRequest: it stays in `lines` with its error in `parsed.request`; the caller writes it as
//     a failed request (FormatBatchError) and runs the rest (moebatch-run);
//   kRefuseJob: ReadBatch returns InvalidArgument listing every bad line (FormatBatchErrors,
//     bounded), nothing else (moebatchd).
// Either way `report` lists every bad line.
//
// Thread-safety: the functions are reentrant; `check_line` is called on the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/batch/openai_batch.h"

namespace moebatch {

enum class InvalidLinePolicy {
  kFailRequest,  // a bad line becomes a failed request; the others run
  kRefuseJob,    // one bad line refuses the whole input
};

enum class ModelPolicy {
  kAccept,  // body.model is only echoed back
  kCheck,   // body.model must be empty or BatchReadOptions::model_name
};

struct BatchLine {
  int64_t line_number = 0;  // 1-based physical line (inline requests: 1-based position)
  int64_t index = 0;        // 0-based among the input's requests (its non-blank lines)
  std::string text;         // the line, without its line terminator
  ParsedBatchLine parsed;   // the request, or (kFailRequest) the line's error
  bool ok() const { return parsed.request.ok(); }
};

struct BatchReadOptions {
  InvalidLinePolicy invalid_lines = InvalidLinePolicy::kFailRequest;
  ModelPolicy model = ModelPolicy::kAccept;
  std::string model_name;        // kCheck: the model being served
  BatchDefaults defaults;        // max_tokens of lines that give none
  int64_t max_requests = 0;      // more requests refuse the whole input; 0 = no limit
  int64_t max_line_bytes = 0;    // a longer line is bad; 0 = no limit
  int32_t max_tokens_limit = 0;  // a request's max_tokens at most; 0 = no limit
  // Called for each line that passed every check above (lines[i] is final but for this call);
  // a non-OK status is the line's error. Empty: no extra check.
  std::function<absl::Status(const BatchLine&)> check_line;
};

// One bad line.
struct BatchLineError {
  int64_t line_number = 0;  // as in BatchLine
  std::string custom_id;    // as far as it could be read; "" when unknown
  std::string param;        // the field path ("body.temperature"); "" when the message names none
  std::string message;      // the whole message, starting with `param` when there is one:
                            // "body.temperature: must be in [0, 100], got 7000"
};

struct BatchErrorReport {
  int64_t lines = 0;                   // requests read (non-blank lines)
  std::vector<BatchLineError> errors;  // every bad line, in line order
  bool ok() const { return errors.empty(); }
};

struct BatchInput {
  std::vector<BatchLine> lines;  // every request, in order (kRefuseJob: all valid)
  BatchErrorReport report;       // kRefuseJob: always empty here (bad lines refuse)
};

// `jsonl`: the text of a batch input file (any encoding problem is reported per line).
// Errors: InvalidArgument "requests: N requests, more than the limit (max_requests_per_job) of M
// per job"; (kRefuseJob) InvalidArgument with FormatBatchErrors(report).
absl::StatusOr<BatchInput> ReadBatch(std::string_view jsonl, const BatchReadOptions& options);

// The same for requests given one per string (no '\n' splitting), numbered by position.
absl::StatusOr<BatchInput> ReadBatchLines(std::vector<std::string> lines,
                                          const BatchReadOptions& options);

// Bounds of FormatBatchErrors, so that its text fits a gRPC status (the grpc-message header,
// under gRPC's 8-16 KiB metadata limits) whatever the input.
struct ErrorReportBounds {
  size_t max_entries = 20;         // bad lines quoted; the rest are counted ("and N more")
  size_t max_value_bytes = 200;    // of a quoted custom_id (then "...")
  size_t max_message_bytes = 512;  // of one line's message (then "...")
  // The whole text at most, counting each byte that gRPC percent-encodes in grpc-message (outside
  // 0x20-0x7E, and '%') as 3: entries that would pass it are counted in "and N more" instead.
  size_t max_total_bytes = 6144;
};

// "3 of 10 lines are invalid: line 2 (custom_id \"a\"): body.temperature: must be in [0, 100],
// got 7000; line 5: invalid JSON: ...; line 9 (custom_id \"x\"): custom_id: duplicate, first
// used on line 4", then "; and N more" past the bounds. "" for a report without errors.
std::string FormatBatchErrors(const BatchErrorReport& report, const ErrorReportBounds& bounds = {});

// `value` as a JSON string literal for a message (nlohmann's escaping, ill-formed UTF-8 replaced
// by U+FFFD), cut to at most `max_bytes` bytes between the quotes and then followed by "...".
std::string QuoteBounded(std::string_view value, size_t max_bytes);

// Bytes of `text` once gRPC percent-encodes it as a grpc-message (3 for each byte outside
// 0x20-0x7E and for '%').
size_t GrpcMessageBytes(std::string_view text);

}  // namespace moebatch
