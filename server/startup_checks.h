// What moebatchd checks before it binds or opens its store, so that a misconfigured start fails at
// once with the flag named instead of serving something broken:
//   * the TLS certificate and key (--tls_cert, --tls_key): both PEM, the key is the certificate's,
//     the certificate valid now (gRPC would log "Invalid private key" and then fail every
//     handshake while health says SERVING);
//   * the data directory (--data_dir): one daemon at a time (an exclusive flock on
//     <data_dir>/moebatchd.lock that holds the owner's PID; two daemons on one job store would
//     both run its pending requests).
//
// Threading: the functions are thread-safe; a DataDirLock is owned by the thread that holds it.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moebatch {

// InvalidArgument naming the flag (--tls_cert or --tls_key) when cert_pem holds no certificate,
// key_pem no private key, the key is not the first certificate's, or the certificate is not valid
// at `now` (Unix seconds): expired ("expired on ...") or not yet valid ("valid from ...").
absl::Status CheckServerCertificate(const std::string& cert_pem, const std::string& key_pem,
                                    std::time_t now = std::time(nullptr));

// Holds the exclusive lock on a data directory for as long as it lives (the kernel drops it when
// the process ends, kill -9 included).
class DataDirLock {
 public:
  // Creates `data_dir` if missing and takes the lock. FailedPrecondition naming the other
  // daemon's PID when another process holds it; Internal (with errno's text) when the directory or
  // the lock file cannot be made.
  static absl::StatusOr<std::unique_ptr<DataDirLock>> Acquire(const std::string& data_dir);
  ~DataDirLock();
  DataDirLock(const DataDirLock&) = delete;
  DataDirLock& operator=(const DataDirLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  DataDirLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
};

}  // namespace moebatch
