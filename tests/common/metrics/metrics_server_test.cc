// A real HTTP scrape of a live MetricsServer on loopback.
#include "common/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "httplib.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"

namespace e3 {
namespace {

TEST(MetricsServerTest, ServesTheRegistryOverHttp) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& tokens = prometheus::BuildCounter().Name("e3_test_tokens_total").Help("tokens").Register(*registry);
  tokens.Add({{"rank", "0"}}).Increment(42);
  auto& lr = prometheus::BuildGauge().Name("e3_test_learning_rate").Help("lr").Register(*registry);
  lr.Add({}).Set(3e-4);
  auto server = MetricsServer::Start(registry, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << "no response";
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("e3_test_tokens_total{rank=\"0\"} 42"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("e3_test_learning_rate 0.0003"), std::string::npos) << res->body;
  tokens.Add({{"rank", "0"}}).Increment(8);
  res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_NE(res->body.find("e3_test_tokens_total{rank=\"0\"} 50"), std::string::npos);
  EXPECT_EQ(client.Get("/nope")->status, 404);
}

TEST(MetricsServerTest, PortInUseIsAnError) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsServer::Start(registry, "127.0.0.1", 0);
  ASSERT_TRUE(first.ok());
  auto second = MetricsServer::Start(registry, "127.0.0.1", (*first)->port());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use"), std::string::npos);
}

// Idle connections (a port scanner, clients that connect and say nothing,
// keep-alives left open) must not keep a scrape waiting: before the server
// bounded them, forty of these held every worker for five seconds each.
TEST(MetricsServerTest, IdleConnectionsDoNotHoldUpAScrape) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto server = MetricsServer::Start(registry, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>((*server)->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    idle.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  auto res = client.Get("/metrics");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(res) << "no response";
  EXPECT_EQ(res->status, 200);
  EXPECT_LT(seconds, 3.0) << "the scrape waited behind idle connections";
  for (int fd : idle) ::close(fd);
}

}  // namespace
}  // namespace e3
