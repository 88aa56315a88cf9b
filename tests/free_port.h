// A TCP port that nothing listens on right now, for tests that must name a
// port up front (a c10d store, whose clients need the port before the
// server exists; a teacher restarted on the port it had; a Slurm job
// submitted twice with the same settings).
//
// The port comes from below the kernel's ephemeral range
// (ip_local_port_range). A port from bind(0) lies inside that range, where
// any connect() on the machine may be given it implicitly in the seconds
// before the test's process binds it, and CI runs loopback-heavy tests side
// by side. Below the range only an explicit bind takes a port. Candidates
// start at a random point, so that tests running at once rarely try the
// same one; each is bound on every address to prove it free, and one
// process never hands out the same port twice.
#ifndef E3_TESTS_FREE_PORT_H_
#define E3_TESTS_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <random>
#include <set>

namespace e3::testing {

// Whether `port` (0: any) binds on every address now; its number in *bound.
inline bool BindsNow(int port, int* bound) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  socklen_t len = sizeof(addr);
  ok = ok && ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (ok) *bound = ntohs(addr.sin_port);
  return ok;
}

// The first port of the kernel's ephemeral range (32768 where unreadable).
inline int EphemeralRangeStart() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  if (!(in >> low)) low = 32768;
  return low;
}

inline int FreePort() {
  static std::mutex mu;
  static std::set<int> handed_out;
  std::lock_guard<std::mutex> lock(mu);
  constexpr int kFirst = 10000;  // above the well-known and most service ports
  const int last = std::min(EphemeralRangeStart(), 65536) - 1;
  int port = 0;
  if (last - kFirst >= 1000) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> pick(kFirst, last);
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const int candidate = pick(rng);
      if (handed_out.count(candidate) == 0 && BindsNow(candidate, &port)) {
        handed_out.insert(port);
        return port;
      }
    }
  }
  // A machine whose ephemeral range starts low: the kernel's choice.
  BindsNow(0, &port);
  handed_out.insert(port);
  return port;
}

}  // namespace e3::testing

#endif  // E3_TESTS_FREE_PORT_H_
