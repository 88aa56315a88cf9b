// A TCP port on loopback that nothing listens on right now, for tests that
// must name a port up front (a c10d store, whose clients need the port
// before the server exists). Another process could take it in between; on
// a test machine that race is negligible.
#ifndef E3_TESTS_FREE_PORT_H_
#define E3_TESTS_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace e3::testing {

inline int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace e3::testing

#endif  // E3_TESTS_FREE_PORT_H_
