#include "common/metrics/metrics_server.h"

#include <sys/socket.h>

#include <chrono>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "prometheus/text_serializer.h"

namespace e3 {
namespace {

constexpr size_t kWorkers = 32;
constexpr time_t kIdleSeconds = 1;

}  // namespace

std::string RenderMetrics(const prometheus::Collectable& registry) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry.Collect());
  return out.str();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(std::shared_ptr<prometheus::Collectable> registry,
                                                                    const std::string& host, int port) {
  auto out = std::unique_ptr<MetricsServer>(new MetricsServer());
  out->registry_ = std::move(registry);
  out->server_ = std::make_unique<httplib::Server>();
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let
  // a second process silently share a busy metrics port.
  out->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Each connection holds a worker while it idles between requests. With
  // httplib's defaults (one worker a core, five idle seconds) a few dozen
  // idle connections kept scrapes waiting for seconds: more workers, and
  // an idle or silent connection lets its worker go after a second.
  out->server_->new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  out->server_->set_keep_alive_timeout(kIdleSeconds);
  out->server_->set_read_timeout(kIdleSeconds, 0);
  out->server_->set_write_timeout(kIdleSeconds, 0);
  const prometheus::Collectable* reg = out->registry_.get();
  out->server_->Get("/metrics", [reg](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderMetrics(*reg), "text/plain; version=0.0.4; charset=utf-8");
  });
  out->server_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  if (port == 0) {
    out->port_ = out->server_->bind_to_any_port(host.c_str());
    if (out->port_ <= 0) return absl::UnavailableError(absl::StrCat("metrics: cannot bind ", host));
  } else {
    if (!out->server_->bind_to_port(host.c_str(), port)) {
      return absl::UnavailableError(absl::StrCat("metrics: cannot bind ", host, ":", port, " (in use?)"));
    }
    out->port_ = port;
  }
  httplib::Server* server = out->server_.get();
  out->thread_ = std::thread([server] { server->listen_after_bind(); });
  // stop() is a no-op until the loop runs; wait so the destructor can stop it.
  while (!server->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return out;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace e3
