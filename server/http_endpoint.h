// An HTTP or HTTPS endpoint of moebatchd on cpp-httplib: the Prometheus endpoint
// (server/metrics.h) and the OpenAI API (server/http_api.h) share it.
//
//   auto endpoint = HttpEndpoint::Start("127.0.0.1:8080", {.label = "http"},
//                                       [&](httplib::Server& s) { s.Get("/x", handler); });
//
// Threading: handlers run on the endpoint's worker threads (std::thread, default stacks; the
// newest connection is served first, so a few slow clients do not hold a quick request behind
// them). The destructor stops the accept loop and joins every thread: at once when no request is
// in flight; an idle kept-alive connection holds a worker up to keep_alive_timeout_s, a request
// being read up to read_timeout_s more.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace moebatch {

struct HttpEndpointOptions {
  std::string label = "http";  // names the endpoint in messages ("metrics listen address ...")
  int threads = 2;             // worker threads (each serves one connection at a time)
  // HTTPS when both are set (PEM files, read once at Start); with tls_client_ca, clients must
  // present a certificate it signed.
  std::string tls_cert, tls_key, tls_client_ca;
  int keep_alive_timeout_s = 1;
  int read_timeout_s = 2;
  int write_timeout_s = 2;
  size_t max_body_bytes = 0;  // a longer request body answers 413; 0: httplib's default
};

class HttpEndpoint {
 public:
  // `listen_address`: "HOST:PORT" (an IPv4 address, or a host name, bound to its first IPv4
  // address), "[IPV6]:PORT" ("[::]:PORT": every IPv6 and IPv4 address) or "PORT" (every IPv4
  // address); port 0 picks a free port (port()). `routes` adds the handlers. Returns once the
  // socket is bound and listening. InvalidArgument for a malformed address (an IPv6 address
  // without brackets included) or TLS files OpenSSL refuses; Unavailable, with the system's
  // reason, when the address cannot be bound (in use, not local, host name not found, ...) or the
  // threads cannot be started.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(
      const std::string& listen_address, const HttpEndpointOptions& options,
      const std::function<void(httplib::Server&)>& routes);
  ~HttpEndpoint();

  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const;  // the bound port

 private:
  struct Impl;
  explicit HttpEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moebatch
