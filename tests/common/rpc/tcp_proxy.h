// A loopback TCP proxy for fault tests: it forwards every connection made
// to port() to a target port, until Freeze(), after which it moves no more
// bytes either way but keeps every socket open: to both ends the peer is
// still connected and has simply stopped answering, as a hung host or a
// partition that drops packets looks. Thaw() heals the partition: what
// waited in the sockets moves on. One thread, poll(2).
#ifndef E3_TESTS_COMMON_RPC_TCP_PROXY_H_
#define E3_TESTS_COMMON_RPC_TCP_PROXY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <thread>
#include <utility>
#include <vector>

namespace e3::testing {

class TcpProxy {
 public:
  explicit TcpProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(listen_fd_, 16);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;
  ~TcpProxy() {
    stop_ = true;
    thread_.join();
    for (auto [a, b] : pairs_) {
      ::close(a);
      ::close(b);
    }
    ::close(listen_fd_);
  }

  int port() const { return port_; }
  void Freeze() { frozen_ = true; }
  void Thaw() { frozen_ = false; }
  int connections() const { return accepted_.load(); }

 private:
  int Connect() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(target_port_));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  // Moves what `from` has to `to`; false when either end closed.
  static bool Pump(int from, int to) {
    char buf[65536];
    const ssize_t n = ::read(from, buf, sizeof(buf));
    if (n <= 0) return false;
    for (ssize_t sent = 0; sent < n;) {
      const ssize_t w = ::write(to, buf + sent, static_cast<size_t>(n - sent));
      if (w <= 0) return false;
      sent += w;
    }
    return true;
  }

  void Run() {
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      if (!frozen_) {
        for (auto [a, b] : pairs_) {
          fds.push_back({a, POLLIN, 0});
          fds.push_back({b, POLLIN, 0});
        }
      }
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        const int upstream = client >= 0 ? Connect() : -1;
        if (upstream >= 0) {
          pairs_.emplace_back(client, upstream);
          ++accepted_;
        } else if (client >= 0) {
          ::close(client);
        }
      }
      std::vector<bool> closed(pairs_.size(), false);
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const size_t p = (i - 1) / 2;
        const bool from_client = (i - 1) % 2 == 0;
        if (!closed[p] && !Pump(from_client ? pairs_[p].first : pairs_[p].second,
                                from_client ? pairs_[p].second : pairs_[p].first)) {
          closed[p] = true;
        }
      }
      for (size_t p = closed.size(); p-- > 0;) {
        if (!closed[p]) continue;
        ::close(pairs_[p].first);
        ::close(pairs_[p].second);
        pairs_.erase(pairs_.begin() + static_cast<std::ptrdiff_t>(p));
      }
    }
  }

  int target_port_, listen_fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false}, frozen_{false};
  std::atomic<int> accepted_{0};
  std::vector<std::pair<int, int>> pairs_;  // (client, upstream); touched by the thread only
  std::thread thread_;
};

}  // namespace e3::testing

#endif  // E3_TESTS_COMMON_RPC_TCP_PROXY_H_
