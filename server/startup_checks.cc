#include "server/startup_checks.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace moebatch {
namespace {

// "Nov 26 11:24:07 2026 GMT": how OpenSSL prints an ASN.1 time.
std::string TimeText(const ASN1_TIME* t) {
  BIO* bio = BIO_new(BIO_s_mem());
  ASN1_TIME_print(bio, t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string text(data, static_cast<size_t>(n));
  BIO_free(bio);
  return text;
}

}  // namespace

absl::Status CheckServerCertificate(const std::string& cert_pem, const std::string& key_pem,
                                    std::time_t now) {
  BIO* cert_bio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* cert = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  BIO_free(cert_bio);
  if (cert == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("--tls_cert: no PEM certificate in the file");
  }
  BIO* key_bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  absl::Status status;
  if (key == nullptr) {
    status = absl::InvalidArgumentError(
        "--tls_key: no PEM private key in the file (or it is encrypted: moebatchd takes an "
        "unencrypted key)");
  } else if (X509_check_private_key(cert, key) != 1) {
    status = absl::InvalidArgumentError(
        "--tls_key: the private key does not belong to the certificate of --tls_cert");
  } else if (X509_cmp_time(X509_get0_notAfter(cert), &now) < 0) {
    status = absl::InvalidArgumentError(absl::StrCat("--tls_cert: the certificate expired on ",
                                                     TimeText(X509_get0_notAfter(cert))));
  } else if (X509_cmp_time(X509_get0_notBefore(cert), &now) > 0) {
    status = absl::InvalidArgumentError(
        absl::StrCat("--tls_cert: the certificate is not valid yet (valid from ",
                     TimeText(X509_get0_notBefore(cert)), ")"));
  }
  ERR_clear_error();
  EVP_PKEY_free(key);
  X509_free(cert);
  return status;
}

absl::StatusOr<std::unique_ptr<DataDirLock>> DataDirLock::Acquire(const std::string& data_dir) {
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("--data_dir ", data_dir, ": cannot create it: ", ec.message()));
  }
  const std::string path = (std::filesystem::path(data_dir) / "moebatchd.lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("--data_dir: cannot open ", path, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string owner;
    char buffer[64] = {};
    const ssize_t n = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
    int64_t pid = 0;
    if (n > 0 && absl::SimpleAtoi(absl::StripAsciiWhitespace(buffer), &pid)) {
      owner = absl::StrCat(" (pid ", pid, ")");
    }
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("--data_dir ", data_dir, " is in use by another moebatchd", owner,
                       ": one daemon per data dir (its lock: ", path, ")"));
    }
    return absl::InternalError(
        absl::StrCat("--data_dir: cannot lock ", path, ": ", std::strerror(err)));
  }
  // The owner's PID, for the message a second daemon prints.
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(
        absl::StrCat("--data_dir: cannot write ", path, ": ", std::strerror(err)));
  }
  return std::unique_ptr<DataDirLock>(new DataDirLock(fd, path));
}

DataDirLock::~DataDirLock() { ::close(fd_); }

}  // namespace moebatch
