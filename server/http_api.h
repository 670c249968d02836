// The OpenAI Files and Batches API over HTTP(S) (docs/api.md), for code written against OpenAI's
// Batch API (the official SDK, LiteLLM) with only base_url and api_key changed:
//
//   POST   /v1/files                 multipart: file, purpose=batch       -> file object
//   GET    /v1/files                 ?purpose, after, limit, order        -> list of files
//   GET    /v1/files/{id}                                                 -> file object
//   GET    /v1/files/{id}/content                                         -> the bytes
//   DELETE /v1/files/{id}                                                 -> {"id", "deleted"}
//   POST   /v1/batches               {input_file_id, endpoint, completion_window, metadata}
//   GET    /v1/batches               ?after, limit                        -> list of batches
//   GET    /v1/batches/{id}                                               -> batch object
//   POST   /v1/batches/{id}/cancel                                        -> batch object
//   GET    /v1/models, /v1/models/{id}                                    -> the daemon's model
//
// A batch is a job of the gRPC API (server/batch_service.h) and the reverse: one job store, one
// engine queue, the same tenants and tokens (`Authorization: Bearer <token>`), the same limits.
// A batch's output and error files are views of its results in the job store (ids
// "file-<job id>-output" / "-errors", purpose "batch_output"), present once the batch is finished
// and has such lines (HasResultFile, server/job_store.h); DELETE on one deletes those result lines.
// GET /v1/files lists them with the uploads in one order, (created_at, id), where a view's
// created_at is its batch's finished_at: exactly the ids GET /v1/files/{id} finds. Only the views
// on the page returned are sized (JobStore::ResultSizes).
//
// Errors: OpenAI's error object {"error": {"message", "type", "param", "code"}} with 400
// (invalid_request_error, param names the field), 401, 404 (an unknown id or another tenant's),
// 409 (a running batch cannot be deleted), 413 (an upload over --max_upload_bytes), 429 (tenant
// limits), 503 (loading, shutting down). A batch whose input file has bad lines is created with
// status "failed" and every bad line in errors.data (line, param, code, message), as OpenAI does.
//
// Uploads stream to disk (server/file_store.h) and downloads stream from disk or the job store: a
// file never sits whole in memory, except an input file while its batch is created (bounded by
// --max_upload_bytes).
//
// Threading: handlers run on the HTTP endpoint's threads (server/http_endpoint.h); everything they
// use is thread-safe. Nothing here aborts on input.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/auth.h"
#include "server/batch_service.h"
#include "server/file_store.h"
#include "server/http_endpoint.h"
#include "server/job_store.h"

namespace moebatch {

struct HttpApiOptions {
  int64_t max_upload_bytes = int64_t{512} << 20;  // an uploaded file at most (413 beyond)
  int64_t started_at = 0;  // Unix seconds: the model's "created" in /v1/models
};

class OpenAiHttpApi {
 public:
  // Borrows everything; it must outlive the API. `auth` null: authentication off.
  OpenAiHttpApi(BatchServiceImpl* service, JobStore* jobs, FileStore* files,
                const TokenAuthenticator* auth, HttpApiOptions options);

  // Serves on `listen_address` (HttpEndpoint::Start's forms and errors). TLS per `endpoint`.
  absl::Status Start(const std::string& listen_address, HttpEndpointOptions endpoint);
  int port() const;  // once started
  // Stops serving and joins the HTTP threads.
  void Stop();

 private:
  struct Routes;
  BatchServiceImpl* service_;
  JobStore* jobs_;
  FileStore* files_;
  const TokenAuthenticator* auth_;
  HttpApiOptions options_;
  std::unique_ptr<HttpEndpoint> endpoint_;
};

// "file-<job id>-output" / "-errors": the ids of a batch's result views.
std::string OutputFileId(const std::string& job_id);
std::string ErrorFileId(const std::string& job_id);

}  // namespace moebatch
