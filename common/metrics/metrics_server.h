// Serves a prometheus-cpp registry (or any Collectable) at GET /metrics over
// cpp-httplib (not civetweb, whose 100 KiB thread stacks overflow in a
// LibTorch process; see shared/device/README.md). Port 0 picks a free port.
#ifndef E3_COMMON_METRICS_METRICS_SERVER_H_
#define E3_COMMON_METRICS_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/registry.h"

namespace httplib {
class Server;
}

namespace e3 {

class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(std::shared_ptr<prometheus::Collectable> registry,
                                                              const std::string& host, int port);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::shared_ptr<prometheus::Collectable> registry_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// The registry's text exposition (what /metrics returns).
std::string RenderMetrics(const prometheus::Collectable& registry);

}  // namespace e3

#endif  // E3_COMMON_METRICS_METRICS_SERVER_H_
