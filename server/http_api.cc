#include "server/http_api.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/batch/batch_reader.h"
#include "engine/batch/openai_batch.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

using Json = nlohmann::json;

constexpr const char* kJsonType = "application/json";
constexpr size_t kMaxQuoted = 100;       // bytes of a value quoted in an error message
constexpr int64_t kMaxSmallField = 256;  // bytes of a multipart field other than the file
constexpr int64_t kResultsPerRead = 256;
constexpr int64_t kMaxWindowHours = 24 * 365;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json NullIfZero(int64_t v) { return v == 0 ? Json(nullptr) : Json(v); }

// OpenAI's error object with the HTTP status of `status`'s code (or `http_status` when given).
void SendError(httplib::Response& res, const absl::Status& status, std::string param = "",
               int http_status = 0) {
  std::string type = "invalid_request_error";
  Json code = nullptr;
  int http = 500;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      http = 400;
      if (param.empty()) param = ErrorParam(std::string(status.message()));
      break;
    case absl::StatusCode::kUnauthenticated:
      http = 401;
      code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      http = 403;
      break;
    case absl::StatusCode::kNotFound:
      http = 404;
      break;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      http = 409;
      break;
    case absl::StatusCode::kResourceExhausted:
      http = 429;
      type = "rate_limit_error";
      code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      http = 503;
      type = "server_error";
      break;
    default:
      http = 500;
      type = "server_error";
  }
  if (http_status != 0) http = http_status;
  res.status = http;
  Json error = {{"message", std::string(status.message())},
                {"type", type},
                {"param", param.empty() ? Json(nullptr) : Json(param)},
                {"code", code}};
  res.set_content(Dump({{"error", error}}), kJsonType);
}

void SendJson(httplib::Response& res, const Json& body) {
  res.status = 200;
  res.set_content(Dump(body), kJsonType);
}

absl::Status Invalid(const std::string& param, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(param, ": ", why));
}

// The job id of a result view id (ResultFileId of a "job_" id), or nullopt; `failed`: the error
// file.
std::optional<std::string> ViewJob(const std::string& file_id, bool* failed) {
  const std::string prefix = absl::StrCat(kResultFilePrefix, "job_");
  if (!absl::StartsWith(file_id, prefix)) return std::nullopt;
  for (const auto& [suffix, is_error] :
       {std::pair{kOutputFileSuffix, false}, {kErrorFileSuffix, true}}) {
    const size_t cut = std::char_traits<char>::length(suffix);
    if (file_id.size() >= prefix.size() + cut && absl::EndsWith(file_id, suffix)) {
      *failed = is_error;
      const size_t start = std::char_traits<char>::length(kResultFilePrefix);
      return file_id.substr(start, file_id.size() - start - cut);
    }
  }
  return std::nullopt;
}

Json FileJson(const FileRecord& f) {
  return {{"id", f.id},
          {"object", "file"},
          {"bytes", f.bytes},
          {"created_at", f.created_at},
          {"filename", f.filename},
          {"purpose", f.purpose},
          {"status", "processed"},
          {"status_details", nullptr},
          {"expires_at", nullptr}};
}

Json ViewJson(const JobRecord& job, bool failed, int64_t bytes) {
  FileRecord f;
  f.id = failed ? ErrorFileId(job.id) : OutputFileId(job.id);
  f.bytes = bytes;
  f.created_at = job.finished_at;
  f.filename = absl::StrCat(job.id, failed ? "_errors.jsonl" : "_output.jsonl");
  f.purpose = "batch_output";
  return FileJson(f);
}

// The OpenAI batch object of a job (the output / error file ids are given while those files
// exist: HasResultFile).
Json BatchJson(const JobRecord& job) {
  const bool failed_validation = job.state == JobState::kFailed && job.total == 0;
  Json errors = nullptr;
  if (!job.errors.empty()) {
    Json data = Json::array();
    for (const JobLineError& e : job.errors) {
      data.push_back({{"code", e.code},
                      {"message", e.message},
                      {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
                      {"line", e.line == 0 ? Json(nullptr) : Json(e.line)}});
    }
    errors = {{"object", "list"}, {"data", std::move(data)}};
  } else if (job.state == JobState::kFailed && !job.error.empty()) {
    errors = {{"object", "list"},
              {"data", Json::array({{{"code", "batch_failed"},
                                     {"message", job.error},
                                     {"param", nullptr},
                                     {"line", nullptr}}})}};
  }
  Json metadata = Json::object();
  for (const auto& [k, v] : job.metadata) metadata[k] = v;
  const int64_t finished = job.finished_at;
  Json counts = {{"total", job.total},
                 {"completed", job.completed},
                 {"failed", job.failed},
                 {"cancelled", job.cancelled}};
  return {
      {"id", job.id},
      {"object", "batch"},
      {"endpoint", job.endpoint.empty() ? Json(nullptr) : Json(job.endpoint)},
      {"model", job.model},
      {"errors", errors},
      {"input_file_id", job.input_file_id.empty() ? Json(nullptr) : Json(job.input_file_id)},
      {"completion_window",
       job.completion_window.empty() ? Json(nullptr) : Json(job.completion_window)},
      {"status", std::string(JobStateName(job.state))},
      {"output_file_id", HasResultFile(job, false) ? Json(OutputFileId(job.id)) : nullptr},
      {"error_file_id", HasResultFile(job, true) ? Json(ErrorFileId(job.id)) : nullptr},
      {"created_at", job.created_at},
      {"in_progress_at", failed_validation ? Json(nullptr) : Json(job.created_at)},
      {"expires_at", NullIfZero(job.expires_at)},
      {"finalizing_at", job.state == JobState::kCompleted ? NullIfZero(finished) : nullptr},
      {"completed_at", job.state == JobState::kCompleted ? NullIfZero(finished) : nullptr},
      {"failed_at", job.state == JobState::kFailed ? NullIfZero(finished) : nullptr},
      {"expired_at", job.state == JobState::kExpired ? NullIfZero(finished) : nullptr},
      {"cancelling_at", NullIfZero(job.cancelling_at)},
      {"cancelled_at", job.state == JobState::kCancelled ? NullIfZero(finished) : nullptr},
      {"request_counts", counts},
      {"usage",
       {{"input_tokens", job.prompt_tokens},
        {"input_tokens_details", {{"cached_tokens", 0}}},
        {"output_tokens", job.generated_tokens},
        {"output_tokens_details", {{"reasoning_tokens", 0}}},
        {"total_tokens", job.prompt_tokens + job.generated_tokens}}},
      {"metadata", metadata},
  };
}

// OpenAI's cursor page: {"object": "list", "data", "first_id", "last_id", "has_more"}.
Json ListJson(Json data, bool has_more) {
  Json first = data.empty() ? Json(nullptr) : data.front()["id"];
  Json last = data.empty() ? Json(nullptr) : data.back()["id"];
  return {{"object", "list"},
          {"data", std::move(data)},
          {"first_id", std::move(first)},
          {"last_id", std::move(last)},
          {"has_more", has_more}};
}

// A query parameter as an integer in [lo, hi], `fallback` when absent.
absl::StatusOr<int32_t> IntParam(const httplib::Request& req, const std::string& name,
                                 int32_t fallback, int32_t lo, int32_t hi) {
  if (!req.has_param(name.c_str())) return fallback;
  const std::string text = req.get_param_value(name.c_str());
  int32_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < lo || v > hi) {
    return Invalid(name, absl::StrCat("must be an integer in [", lo, ", ", hi, "], got ",
                                      QuoteBounded(text, kMaxQuoted)));
  }
  return v;
}

// "<N>h" (OpenAI's form, "24h"), or "<N>s", "<N>m", "<N>d" -> seconds, 1 s to a year.
absl::StatusOr<int64_t> WindowSeconds(const std::string& window) {
  int64_t n = 0, unit = 0;
  if (!window.empty()) {
    switch (window.back()) {
      case 's':
        unit = 1;
        break;
      case 'm':
        unit = 60;
        break;
      case 'h':
        unit = 3600;
        break;
      case 'd':
        unit = 86400;
        break;
      default:
        break;
    }
  }
  if (unit == 0 || !absl::SimpleAtoi(window.substr(0, window.size() - 1), &n) || n < 1 ||
      n > kMaxWindowHours * 3600 / unit) {
    return Invalid("completion_window",
                   absl::StrCat("must be a duration such as \"24h\" (a number and s, m, h or d; "
                                "at most a year), got ",
                                QuoteBounded(window, kMaxQuoted)));
  }
  return n * unit;
}

int64_t NowSeconds() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace

std::string OutputFileId(const std::string& job_id) {
  return ResultFileId(job_id, /*failed=*/false);
}
std::string ErrorFileId(const std::string& job_id) { return ResultFileId(job_id, /*failed=*/true); }

// The handlers, with what they share.
struct OpenAiHttpApi::Routes {
  OpenAiHttpApi* api;

  absl::StatusOr<Principal> Who(const httplib::Request& req) const {
    if (api->auth_ == nullptr) return LocalPrincipal();
    return api->auth_->Authenticate(req.get_header_value("Authorization"));
  }

  // A file record the caller may see.
  absl::StatusOr<FileRecord> VisibleFile(const Principal& who, const std::string& id) const {
    auto f = api->files_->Get(id);
    if (!f.ok()) return f.status();
    if (!who.admin && f->tenant != who.tenant) {
      return absl::NotFoundError(absl::StrCat("file ", id, " not found"));
    }
    return f;
  }

  // The job behind a result view the caller may see, when the view exists (HasResultFile: the
  // job finished with such lines and they were not deleted; what ListResultFiles lists).
  absl::StatusOr<JobRecord> ViewOwner(const Principal& who, const std::string& file_id,
                                      const std::string& job_id, bool failed) const {
    auto job = api->service_->VisibleJob(who, job_id);
    if (!job.ok() || !HasResultFile(*job, failed)) {
      return absl::NotFoundError(absl::StrCat("file ", file_id.substr(0, 64), " not found"));
    }
    return job;
  }

  // The view's bytes: its lines as a JSONL file.
  absl::StatusOr<int64_t> ViewBytes(const std::string& job_id, bool failed) const {
    auto stats = api->jobs_->ResultSizes(job_id);
    if (!stats.ok()) return stats.status();
    return failed ? stats->failed_bytes : stats->ok_bytes;
  }

  // The job behind a result view with the view's bytes, when the view exists (ViewOwner).
  absl::StatusOr<std::pair<JobRecord, int64_t>> VisibleView(const Principal& who,
                                                            const std::string& file_id,
                                                            const std::string& job_id,
                                                            bool failed) const {
    auto job = ViewOwner(who, file_id, job_id, failed);
    if (!job.ok()) return job.status();
    auto bytes = ViewBytes(job_id, failed);
    if (!bytes.ok()) return bytes.status();
    return std::pair{*std::move(job), *bytes};
  }

  // The created_at of a file the caller may see (an upload, or a result view: its job's
  // finished_at); NotFound otherwise.
  absl::StatusOr<int64_t> CreatedAt(const Principal& who, const std::string& id) const {
    bool failed = false;
    if (auto job_id = ViewJob(id, &failed)) {
      auto job = ViewOwner(who, id, *job_id, failed);
      if (!job.ok()) return job.status();
      return job->finished_at;
    }
    auto f = VisibleFile(who, id);
    if (!f.ok()) return f.status();
    return f->created_at;
  }

  void Models(const httplib::Request& req, httplib::Response& res) const {
    auto who = Who(req);
    if (!who.ok()) return SendError(res, who.status());
    const std::string model = api->service_->model_name();
    Json m = {{"id", model},
              {"object", "model"},
              {"created", api->options_.started_at},
              {"owned_by", "moebatch"}};
    if (req.matches.size() > 1) {
      if (req.matches[1] != model || model.empty()) {
        return SendError(res,
                         absl::NotFoundError(absl::StrCat(
                             "model ", QuoteBounded(req.matches[1].str(), kMaxQuoted),
                             " not found; this daemon serves ", QuoteBounded(model, kMaxQuoted))),
                         "model");
      }
      return SendJson(res, m);
    }
    Json data = Json::array();
    if (!model.empty()) data.push_back(m);
    SendJson(res, {{"object", "list"}, {"data", data}});
  }

  void UploadFile(const httplib::Request& req, httplib::Response& res,
                  const httplib::ContentReader& content_reader) const {
    // Refused before the body is read: the connection closes after the answer (the unread body
    // would otherwise be taken for the next request).
    auto who = Who(req);
    if (!who.ok()) {
      res.set_header("Connection", "close");
      return SendError(res, who.status());
    }
    if (!req.is_multipart_form_data()) {
      res.set_header("Connection", "close");
      return SendError(res, Invalid("file",
                                    "the body must be multipart/form-data with the "
                                    "fields file and purpose"));
    }
    std::unique_ptr<FileStore::Upload> upload;
    std::string field, purpose, filename;
    bool have_file = false;
    absl::Status failure;
    int failure_http = 0;
    int64_t small_bytes = 0;
    content_reader(
        [&](const httplib::MultipartFormData& part) {
          field = part.name;
          if (field != "file") return true;
          if (have_file) {
            failure = Invalid("file", "given more than once");
            return false;
          }
          have_file = true;
          filename = part.filename;
          auto begun = api->files_->BeginUpload(api->options_.max_upload_bytes);
          if (!begun.ok()) {
            failure = begun.status();
            failure_http = 500;
            return false;
          }
          upload = *std::move(begun);
          return true;
        },
        [&](const char* data, size_t n) {
          if (field == "file") {
            if (absl::Status s = upload->Append(data, n); !s.ok()) {
              failure = s;
              failure_http = s.code() == absl::StatusCode::kResourceExhausted &&
                                     absl::StrContains(s.message(), "limit")
                                 ? 413
                                 : 500;
              return false;
            }
            return true;
          }
          small_bytes += static_cast<int64_t>(n);
          if (small_bytes > kMaxSmallField) {
            failure = Invalid(field, "too long");
            return false;
          }
          if (field == "purpose") purpose.append(data, n);
          return true;
        });
    if (!failure.ok()) {
      res.set_header("Connection", "close");  // the rest of the body was not read
      return SendError(res, failure,
                       failure.code() == absl::StatusCode::kInvalidArgument ? "" : "file",
                       failure_http);
    }
    if (!have_file || upload == nullptr) return SendError(res, Invalid("file", "required"));
    if (purpose != "batch") {
      return SendError(res, Invalid("purpose", absl::StrCat("must be \"batch\" (moebatchd keeps "
                                                            "batch input files only), got ",
                                                            QuoteBounded(purpose, kMaxQuoted))));
    }
    if (filename.empty()) filename = "upload.jsonl";
    auto record = upload->Commit(who->tenant, purpose, filename);
    if (!record.ok()) return SendError(res, record.status(), "file");
    spdlog::info("file {} uploaded by tenant '{}': {} bytes", record->id, record->tenant,
                 record->bytes);
    SendJson(res, FileJson(*record));
  }

  void ListFiles(const httplib::Request& req, httplib::Response& res) const {
    auto who = Who(req);
    if (!who.ok()) return SendError(res, who.status());
    auto limit = IntParam(req, "limit", 10000, 1, 10000);
    if (!limit.ok()) return SendError(res, limit.status());
    const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
    if (order != "asc" && order != "desc") {
      return SendError(res, Invalid("order", absl::StrCat("must be \"asc\" or \"desc\", got ",
                                                          QuoteBounded(order, kMaxQuoted))));
    }
    const bool ascending = order == "asc";
    const std::string tenant = who->admin ? "" : who->tenant;
    const std::string purpose = req.get_param_value("purpose");
    // The cursor: (created_at, id) of a file the caller may see, an upload or a result view.
    const std::string after = req.get_param_value("after");
    int64_t after_created_at = 0;
    if (!after.empty()) {
      auto at = CreatedAt(*who, after);
      if (absl::IsNotFound(at.status())) return SendError(res, Invalid("after", "no such file"));
      if (!at.ok()) return SendError(res, at.status());
      after_created_at = *at;
    }
    // Uploads (purpose "batch") and result views ("batch_output"), each in the order (created_at,
    // id) after the cursor; merged, the first `limit` of both.
    FileStore::Page uploads;
    if (purpose != "batch_output") {
      auto page = api->files_->List(tenant, purpose, after_created_at, after, *limit, ascending);
      if (!page.ok()) return SendError(res, page.status());
      uploads = *std::move(page);
    }
    JobStore::ResultFilePage views;
    if (purpose.empty() || purpose == "batch_output") {
      auto page = api->jobs_->ListResultFiles(tenant, after_created_at, after, *limit, ascending);
      if (!page.ok()) return SendError(res, page.status());
      views = *std::move(page);
    }
    auto before = [ascending](int64_t t1, const std::string& id1, int64_t t2,
                              const std::string& id2) {
      return ascending ? std::tie(t1, id1) < std::tie(t2, id2)
                       : std::tie(t2, id2) < std::tie(t1, id1);
    };
    Json data = Json::array();
    size_t u = 0, v = 0;
    while (static_cast<int64_t>(data.size()) < *limit &&
           (u < uploads.files.size() || v < views.files.size())) {
      const bool take_upload =
          v == views.files.size() ||
          (u < uploads.files.size() && before(uploads.files[u].created_at, uploads.files[u].id,
                                              views.files[v].created_at, views.files[v].id));
      if (take_upload) {
        data.push_back(FileJson(uploads.files[u++]));
        continue;
      }
      const JobStore::ResultFile& view = views.files[v++];
      // Only the views on the page are sized. A job deleted since it was listed is left out.
      auto bytes = ViewBytes(view.job_id, view.failed);
      if (absl::IsNotFound(bytes.status())) continue;
      if (!bytes.ok()) return SendError(res, bytes.status());
      JobRecord job;
      job.id = view.job_id;
      job.finished_at = view.created_at;
      data.push_back(ViewJson(job, view.failed, *bytes));
    }
    const bool has_more =
        u < uploads.files.size() || v < views.files.size() || uploads.has_more || views.has_more;
    SendJson(res, ListJson(std::move(data), has_more));
  }

  void GetFile(const httplib::Request& req, httplib::Response& res) const {
    auto who = Who(req);
    if (!who.ok()) return SendError(res, who.status());
    const std::string id = req.matches[1];
    bool failed = false;
    if (auto job_id = ViewJob(id, &failed)) {
      auto view = VisibleView(*who, id, *job_id, failed);
      if (!view.ok()) return SendError(res, view.status());
      return SendJson(res, ViewJson(view->first, failed, view->second));
    }
    auto f = VisibleFile(*who, id);
    if (!f.ok()) return SendError(res, f.status());
    SendJson(res, FileJson(*f));
  }

  void FileContent(const httplib::Request& req, httplib::Response& res) const {
    auto who = Who(req);
    if (!who.ok()) return SendError(res, who.status());
    const std::string id = req.matches[1];
    bool failed = false;
    if (auto job_id = ViewJob(id, &failed)) {
      auto view = ViewOwner(*who, id, *job_id, failed);
      if (!view.ok()) return SendError(res, view.status());
      // Streamed from the job store in index order, kResultsPerRead lines at a time.
      JobStore* jobs = api->jobs_;
      auto next = std::make_shared<int64_t>(0);
      const std::string job = *job_id;
      res.set_chunked_content_provider(
          "application/octet-stream", [jobs, job, failed, next](size_t, httplib::DataSink& sink) {
            auto results = jobs->Results(job, *next, kResultsPerRead, failed);
            if (!results.ok()) return false;  // the connection closes: the client sees it cut
            if (results->empty()) {
              sink.done();
              return true;
            }
            std::string chunk;
            for (const StoredResult& r : *results) {
              chunk += r.line;
              chunk += '\n';
            }
            *next = results->back().index + 1;
            return sink.write(chunk.data(), chunk.size());
          });
      return;
    }
    auto f = VisibleFile(*who, id);
    if (!f.ok()) return SendError(res, f.status());
    const int fd = open(api->files_->PathOf(id).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return SendError(res, absl::NotFoundError(absl::StrCat("file ", id, " not found")));
    res.set_content_provider(
        static_cast<size_t>(f->bytes), "application/octet-stream",
        [fd](size_t offset, size_t length, httplib::DataSink& sink) {
          char buf[1 << 16];
          const ssize_t n =
              pread(fd, buf, std::min(length, sizeof(buf)), static_cast<off_t>(offset));
          if (n <= 0) return false;
          return sink.write(buf, static_cast<size_t>(n));
        },
        [fd](bool) { close(fd); });
  }

  void DeleteFile(const httplib::Request& req, httplib::Response& res) const {
    auto who = Who(req);
    if (!who.ok()) return SendError(res, who.status());
    const std::string id = req.matches[1];
    bool failed = false;
    if (auto job_id = ViewJob(id, &failed)) {
      auto view = ViewOwner(*who, id, *job_id, failed);
      if (!view.ok()) return SendError(res, view.status());
      auto deleted = api->jobs_->DeleteResults(*job_id, failed);
      if (!deleted.ok()) return SendError(res, deleted.status());
      spdlog::info("file {} deleted: {} result lines of job {}", id, *deleted, *job_id);
    } else {
      auto f = VisibleFile(*who, id);
      if (!f.ok()) return SendError(res, f.status());
      if (absl::Status s = api->files_->Delete(id); !s.ok()) return SendError(res, s);
      spdlog::info("file {} of tenant '{}' deleted", id, f->tenant);
    }
    SendJson(res, {{"id", id}, {"object", "file"}, {"deleted", true}});
  }

  void CreateBatch(const httplib::Request& req, httplib::Response& res) const {
    auto who = Who(req);
    if (!who.ok()) return SendError(res, who.status());
    const Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded() || !body.is_object()) {
      return SendError(res, Invalid("body", "must be a JSON object"));
    }
    auto string_field = [&](const char* name) -> absl::StatusOr<std::string> {
      if (!body.contains(name) || body[name].is_null()) return Invalid(name, "required");
      if (!body[name].is_string()) return Invalid(name, "must be a string");
      return body[name].get<std::string>();
    };
    auto input_file_id = string_field("input_file_id");
    if (!input_file_id.ok()) return SendError(res, input_file_id.status());
    auto endpoint = string_field("endpoint");
    if (!endpoint.ok()) return SendError(res, endpoint.status());
    if (*endpoint != EndpointUrl(Endpoint::kChatCompletions) &&
        *endpoint != EndpointUrl(Endpoint::kCompletions) &&
        *endpoint != EndpointUrl(Endpoint::kResponses)) {
      return SendError(res, Invalid("endpoint", absl::StrCat("must be /v1/chat/completions, "
                                                             "/v1/completions or /v1/responses, "
                                                             "got ",
                                                             QuoteBounded(*endpoint, kMaxQuoted))));
    }
    auto window = string_field("completion_window");
    if (!window.ok()) return SendError(res, window.status());
    auto window_seconds = WindowSeconds(*window);
    if (!window_seconds.ok()) return SendError(res, window_seconds.status());
    v1::CreateJobRequest request;
    if (body.contains("metadata") && !body["metadata"].is_null()) {
      if (!body["metadata"].is_object()) {
        return SendError(res, Invalid("metadata", "must be an object of strings"));
      }
      for (const auto& [k, v] : body["metadata"].items()) {
        if (!v.is_string()) {
          return SendError(res,
                           Invalid(absl::StrCat("metadata.", k.substr(0, 64)), "must be a string"));
        }
        (*request.mutable_metadata())[k] = v.get<std::string>();
      }
    }
    auto file = VisibleFile(*who, *input_file_id);
    if (!file.ok()) return SendError(res, file.status(), "input_file_id");
    if (file->purpose != "batch") {
      return SendError(
          res, Invalid("input_file_id",
                       absl::StrCat("the file's purpose is ",
                                    QuoteBounded(file->purpose, kMaxQuoted), ", not \"batch\"")));
    }
    {
      std::ifstream in(api->files_->PathOf(file->id), std::ios::binary);
      if (!in) {
        return SendError(res, absl::NotFoundError(absl::StrCat("file ", file->id, " not found")),
                         "input_file_id");
      }
      std::string jsonl;
      jsonl.reserve(static_cast<size_t>(file->bytes));
      jsonl.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      request.set_jsonl(std::move(jsonl));
    }
    BatchFields fields;
    fields.endpoint = *endpoint;
    fields.completion_window = *window;
    fields.input_file_id = file->id;
    fields.expires_at = NowSeconds() + *window_seconds;
    auto job = api->service_->Submit(*who, request, fields, /*store_invalid=*/true);
    if (!job.ok()) {
      // The whole file was refused (no requests, too many): the file is the parameter at fault.
      const std::string named = ErrorParam(std::string(job.status().message()));
      const std::string param = job.status().code() == absl::StatusCode::kInvalidArgument &&
                                        (named.empty() || named == "requests")
                                    ? "input_file_id"
                                    : "";
      return SendError(res, job.status(), param);
    }
    SendJson(res, BatchJson(*job));
  }

  void ListBatches(const httplib::Request& req, httplib::Response& res) const {
    auto who = Who(req);
    if (!who.ok()) return SendError(res, who.status());
    auto limit = IntParam(req, "limit", 20, 1, 100);
    if (!limit.ok()) return SendError(res, limit.status());
    auto page = api->jobs_->ListJobsAfter(req.get_param_value("after"), *limit,
                                          who->admin ? "" : who->tenant);
    if (!page.ok()) return SendError(res, page.status());
    Json data = Json::array();
    for (const JobRecord& job : page->jobs) {
      data.push_back(BatchJson(job));
    }
    SendJson(res, ListJson(std::move(data), page->has_more));
  }

  void GetBatch(const httplib::Request& req, httplib::Response& res) const {
    auto who = Who(req);
    if (!who.ok()) return SendError(res, who.status());
    auto job = api->service_->VisibleJob(*who, req.matches[1]);
    if (!job.ok()) return SendError(res, job.status());
    SendJson(res, BatchJson(*job));
  }

  void CancelBatch(const httplib::Request& req, httplib::Response& res) const {
    auto who = Who(req);
    if (!who.ok()) return SendError(res, who.status());
    auto job = api->service_->Cancel(*who, req.matches[1]);
    if (!job.ok()) return SendError(res, job.status());
    SendJson(res, BatchJson(*job));
  }
};

OpenAiHttpApi::OpenAiHttpApi(BatchServiceImpl* service, JobStore* jobs, FileStore* files,
                             const TokenAuthenticator* auth, HttpApiOptions options)
    : service_(service), jobs_(jobs), files_(files), auth_(auth), options_(options) {}

absl::Status OpenAiHttpApi::Start(const std::string& listen_address, HttpEndpointOptions endpoint) {
  // Uploads and downloads take as long as the bytes need: generous timeouts between reads. An idle
  // kept-alive connection still closes after keep_alive_timeout_s (1 s): a stop waits that long.
  endpoint.read_timeout_s = std::max(endpoint.read_timeout_s, 30);
  endpoint.write_timeout_s = std::max(endpoint.write_timeout_s, 30);
  // The body limit httplib enforces (413) before a handler runs: an upload's file plus its
  // multipart framing.
  endpoint.max_body_bytes = static_cast<size_t>(options_.max_upload_bytes) + (64 << 10);
  auto routes = std::make_shared<Routes>(Routes{this});
  // The handlers share `routes`: it lives as long as the server's handlers.
  auto started = HttpEndpoint::Start(listen_address, endpoint, [routes](httplib::Server& s) {
    const std::shared_ptr<Routes>& r = routes;
    using Req = const httplib::Request&;
    using Res = httplib::Response&;
    s.Get("/v1/models", [r](Req q, Res p) { r->Models(q, p); });
    s.Get("/v1/models/(.+)", [r](Req q, Res p) { r->Models(q, p); });
    s.Post("/v1/files", [r](Req q, Res p, const httplib::ContentReader& reader) {
      r->UploadFile(q, p, reader);
    });
    s.Get("/v1/files", [r](Req q, Res p) { r->ListFiles(q, p); });
    s.Get("/v1/files/([^/]+)", [r](Req q, Res p) { r->GetFile(q, p); });
    s.Get("/v1/files/([^/]+)/content", [r](Req q, Res p) { r->FileContent(q, p); });
    s.Delete("/v1/files/([^/]+)", [r](Req q, Res p) { r->DeleteFile(q, p); });
    s.Post("/v1/batches", [r](Req q, Res p) { r->CreateBatch(q, p); });
    s.Get("/v1/batches", [r](Req q, Res p) { r->ListBatches(q, p); });
    s.Get("/v1/batches/([^/]+)", [r](Req q, Res p) { r->GetBatch(q, p); });
    s.Post("/v1/batches/([^/]+)/cancel", [r](Req q, Res p) { r->CancelBatch(q, p); });
    // Anything else that ends in an error without a body gets OpenAI's error object: an unknown
    // path (404), a body over the limit (413), a method the path does not take.
    s.set_error_handler(httplib::Server::HandlerWithResponse([](Req q, Res p) {
      if (!p.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      const int http = p.status;
      absl::Status st = absl::InvalidArgumentError(
          http == 404   ? absl::StrCat("unknown path ", QuoteBounded(q.path, kMaxQuoted))
          : http == 413 ? "the request body is larger than this server takes (--max_upload_bytes)"
                        : absl::StrCat("HTTP ", http));
      SendError(p, st, "", http);
      return httplib::Server::HandlerResponse::Handled;
    }));
    s.set_exception_handler([](Req, Res p, std::exception_ptr e) {
      std::string what = "unknown error";
      try {
        if (e) std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        what = ex.what();
      } catch (...) {
      }
      spdlog::warn("http api: a handler failed: {}", what);
      SendError(p, absl::InternalError(absl::StrCat("internal error: ", what)));
    });
  });
  if (!started.ok()) return started.status();
  endpoint_ = *std::move(started);
  return absl::OkStatus();
}

int OpenAiHttpApi::port() const { return endpoint_ != nullptr ? endpoint_->port() : 0; }

void OpenAiHttpApi::Stop() { endpoint_.reset(); }

}  // namespace moebatch
