// An HTTP or HTTPS endpoint of moebatchd on cpp-httplib (Debian's libcpp-httplib, built with
// OpenSSL): the Prometheus endpoint (server/metrics.h) and the OpenAI API (server/http_api.h).
// What it adds to httplib: a strict listen address parser, the system's reason when binding
// fails, SO_REUSEADDR without SO_REUSEPORT, worker threads of default stack size that serve the
// newest connection first, and a stop that joins everything.
#include "server/http_endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

// A listen address, parsed: what to bind.
struct ListenAddress {
  std::string host;  // numeric IPv4 / IPv6 address or host name; "0.0.0.0" when none was given
  int port = 0;
  int family = AF_INET;  // AF_INET6 for a bracketed address
};

// One plain HOST:PORT, [IPV6]:PORT or PORT. Strict on purpose: getaddrinfo alone would take
// things like "1.2" or "0x7f.1" as addresses.
absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& address,
                                                 const std::string& label) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, " listen address \"", address, "\": ", why,
                     " (expected HOST:PORT, [IPV6]:PORT or PORT, e.g. 127.0.0.1:9464)"));
  };
  if (address.empty()) return bad("empty");
  ListenAddress parsed;
  std::string port;
  bool has_host = false;
  if (address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos) return bad("no ']' after the IPv6 address");
    if (close + 1 >= address.size() || address[close + 1] != ':') {
      return bad("no ':PORT' after the ']'");
    }
    parsed.host = address.substr(1, close - 1);
    parsed.family = AF_INET6;
    port = address.substr(close + 2);
    in6_addr in6{};
    if (inet_pton(AF_INET6, parsed.host.c_str(), &in6) != 1) {
      return bad("not an IPv6 address between the brackets");
    }
    has_host = true;
  } else {
    const size_t colon = address.rfind(':');
    if (colon != std::string::npos) {
      parsed.host = address.substr(0, colon);
      port = address.substr(colon + 1);
      has_host = true;
    } else {
      port = address;
    }
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); }) ||
      std::stoi(port) > 65535) {
    return bad("the port must be a number from 0 to 65535");
  }
  parsed.port = std::stoi(port);
  if (!has_host) {
    parsed.host = "0.0.0.0";
    return parsed;
  }
  if (parsed.family == AF_INET6) return parsed;
  if (parsed.host.empty()) return bad("no host before the ':'");
  if (parsed.host.find(':') != std::string::npos) {
    return bad("an IPv6 address must be in brackets, e.g. [::1]:9464");
  }
  if (!std::all_of(parsed.host.begin(), parsed.host.end(),
                   [](unsigned char c) { return std::isalnum(c) || c == '.' || c == '-'; })) {
    return bad("the host must be an IP address or a host name");
  }
  const bool numeric = std::all_of(parsed.host.begin(), parsed.host.end(),
                                   [](unsigned char c) { return std::isdigit(c) || c == '.'; });
  in_addr in4{};
  if (numeric && inet_pton(AF_INET, parsed.host.c_str(), &in4) != 1) {
    return bad("not an IPv4 address");
  }
  return parsed;
}

// httplib says only that binding failed. The system's reason comes from doing what it does (its
// create_socket: getaddrinfo, then socket, SO_REUSEADDR, bind and listen on each address) once
// more: the first error met.
std::string BindFailureReason(const ListenAddress& address) {
  addrinfo hints{};
  hints.ai_family = address.family;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(address.port);
  if (const int rc = getaddrinfo(address.host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc);
  }
  std::string reason;
  for (const addrinfo* ai = found; ai != nullptr && reason.empty(); ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) {
      reason = std::strerror(errno);
      continue;
    }
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1) != 0) {
      reason = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(found);
  return reason.empty() ? "the bind failed (the address is free again now)" : reason;
}

// SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second endpoint on a port
// in use binds as well and the two share the scrapes.
void ListenSocketOptions(socket_t fd) {
  const int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

// The HTTP worker threads (std::thread: default stacks). httplib::ThreadPool, but its constructor
// would std::terminate when a thread cannot be started (a joinable std::thread destroyed) and its
// destructor does not join; this one throws, and joins in both. And it serves the newest
// connection first: each connection holds a thread until its request has arrived or the read
// timeout (2 s) passes, so with connections served in arrival order, a few hundred that send part
// of a request and wait would hold a scrape behind them for minutes; newest first, a scrape waits
// for one thread to come free, 2 s at most, whatever is queued. The older ones are still served
// (or time out) when the threads are idle.
class WorkerPool : public httplib::TaskQueue {
 public:
  WorkerPool(size_t n, std::string label) : label_(std::move(label)) {
    try {
      for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { Work(); });
    } catch (...) {
      shutdown();
      throw;
    }
  }
  ~WorkerPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }
  // Runs what is queued, then joins (httplib calls it when the accept loop ends).
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;      // stopping
        job = std::move(jobs_.back());  // newest first
        jobs_.pop_back();
      }
      try {
        job();  // httplib catches the handler's exceptions; this is for anything else
      } catch (const std::exception& e) {
        spdlog::warn("{} http: {}", label_, e.what());
      } catch (...) {
        spdlog::warn("{} http: unknown error", label_);
      }
    }
  }

  std::string label_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Closes the socket bind_to_port made when listen_after_bind never ran (stop() closes it only
// while the accept loop runs): httplib::Server or httplib::SSLServer.
template <class Base>
class ClosableServer : public Base {
 public:
  using Base::Base;
  void CloseUnlistenedSocket() {
    const socket_t fd = this->svr_sock_.exchange(INVALID_SOCKET);
    if (fd != INVALID_SOCKET) close(fd);
  }
};

}  // namespace

struct HttpEndpoint::Impl {
  std::string label;
  int port = 0;
  std::unique_ptr<WorkerPool> pending_pool;
  std::unique_ptr<httplib::Server> server;
  std::function<void()> close_unlistened;
  std::thread listener;  // runs listen_after_bind (the accept loop)
  std::atomic<bool> listener_done{false};

  ~Impl() {
    if (server != nullptr && !listener.joinable() && close_unlistened) close_unlistened();
    if (listener.joinable()) {
      // stop() does nothing before the listener thread has set is_running (Start waits for it;
      // this is for safety).
      while (!server->is_running() && !listener_done.load()) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      server->stop();
      listener.join();  // listen_after_bind returns after joining the workers
    }
    pending_pool.reset();  // never handed to the server (Start failed before listening)
  }
};

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& listen_address, const HttpEndpointOptions& options,
    const std::function<void(httplib::Server&)>& routes) {
  absl::StatusOr<ListenAddress> address = ParseListenAddress(listen_address, options.label);
  if (!address.ok()) return address.status();
  const auto unavailable = [&](const std::string& why) {
    return absl::UnavailableError(
        absl::StrCat(options.label, " endpoint: cannot listen on ", listen_address, ": ", why));
  };
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.label, " endpoint: the TLS certificate and key go together"));
  }
  auto impl = std::make_unique<Impl>();
  impl->label = options.label;
  Impl* raw = impl.get();
  try {
    if (!options.tls_cert.empty()) {
      auto tls = std::make_unique<ClosableServer<httplib::SSLServer>>(
          options.tls_cert.c_str(), options.tls_key.c_str(),
          options.tls_client_ca.empty() ? nullptr : options.tls_client_ca.c_str());
      if (!tls->is_valid()) {
        return absl::InvalidArgumentError(absl::StrCat(
            options.label, " endpoint: OpenSSL refused the certificate, key or client CA"));
      }
      auto* closable = tls.get();
      impl->close_unlistened = [closable] { closable->CloseUnlistenedSocket(); };
      impl->server = std::move(tls);
    } else {
      auto plain = std::make_unique<ClosableServer<httplib::Server>>();
      auto* closable = plain.get();
      impl->close_unlistened = [closable] { closable->CloseUnlistenedSocket(); };
      impl->server = std::move(plain);
    }
    httplib::Server& server = *impl->server;
    server.set_address_family(address->family);
    server.set_socket_options(ListenSocketOptions);
    // Bounds on how long a connection may hold a worker, so the destructor stops promptly.
    server.set_keep_alive_timeout(options.keep_alive_timeout_s);
    server.set_read_timeout(options.read_timeout_s, 0);
    server.set_write_timeout(options.write_timeout_s, 0);
    if (options.max_body_bytes > 0) server.set_payload_max_length(options.max_body_bytes);
    routes(server);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(options.label, " endpoint: ", e.what()));
  }

  // Bind and listen here, on the calling thread: connections queue from now on.
  httplib::Server& server = *impl->server;
  try {
    int port = address->port;
    bool bound;
    if (port == 0) {
      port = server.bind_to_any_port(address->host);
      bound = port > 0;
    } else {
      bound = server.bind_to_port(address->host, port);
    }
    if (!bound) return unavailable(BindFailureReason(*address));
    impl->port = port;
  } catch (const std::exception& e) {
    return unavailable(e.what());
  }

  // The worker threads, then the accept loop: std::thread, default stacks. A failure from here on
  // leaves a bound socket, which ~Impl closes (and joins what started).
  try {
    impl->pending_pool = std::make_unique<WorkerPool>(
        static_cast<size_t>(std::max(options.threads, 1)), options.label);
    server.new_task_queue = [raw]() -> httplib::TaskQueue* {
      if (raw->pending_pool != nullptr) return raw->pending_pool.release();
      return new WorkerPool(1, raw->label);  // not reached: listen_after_bind runs once
    };
    impl->listener = std::thread([raw] {
      try {
        if (!raw->server->listen_after_bind()) {
          spdlog::error("{} endpoint: the accept loop failed; no more requests are served",
                        raw->label);
        }
      } catch (const std::exception& e) {
        spdlog::error("{} endpoint: the accept loop failed: {}", raw->label, e.what());
      } catch (...) {
        spdlog::error("{} endpoint: the accept loop failed", raw->label);
      }
      raw->listener_done = true;
    });
  } catch (const std::exception& e) {
    return unavailable(absl::StrCat("starting the HTTP threads: ", e.what()));
  }
  // Until is_running, stop() would be a no-op: wait, so that the destructor can always stop it.
  while (!server.is_running() && !impl->listener_done.load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (!server.is_running()) return unavailable("the accept loop ended at once");
  return std::unique_ptr<HttpEndpoint>(new HttpEndpoint(std::move(impl)));
}

HttpEndpoint::HttpEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpEndpoint::~HttpEndpoint() = default;

int HttpEndpoint::port() const { return impl_->port; }

}  // namespace moebatch
