// PeerIsThisHost on gRPC's peer strings: loopback and unix sockets, this
// machine's own interface addresses (read with getifaddrs here), and
// addresses that are not this machine's or do not parse.
#include "common/rpc/peer_address.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <string>

namespace e3 {
namespace {

TEST(PeerAddressTest, LoopbackAndUnixSocketsAreThisHost) {
  EXPECT_TRUE(PeerIsThisHost("ipv4:127.0.0.1:41234"));
  EXPECT_TRUE(PeerIsThisHost("ipv4:127.8.9.10:1"));
  EXPECT_TRUE(PeerIsThisHost("ipv6:[::1]:41234"));
  EXPECT_TRUE(PeerIsThisHost("ipv6:[::ffff:127.0.0.1]:41234"));
  EXPECT_TRUE(PeerIsThisHost("unix:/tmp/teacher.sock"));
}

TEST(PeerAddressTest, OwnInterfaceAddressesAreThisHost) {
  ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  int checked = 0;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text));
    EXPECT_TRUE(PeerIsThisHost(std::string("ipv4:") + text + ":5000")) << text;
    ++checked;
  }
  freeifaddrs(list);
  EXPECT_GE(checked, 1);
}

TEST(PeerAddressTest, OtherAndMalformedPeersAreNot) {
  // TEST-NET-3 (RFC 5737): assigned to no real interface.
  EXPECT_FALSE(PeerIsThisHost("ipv4:203.0.113.7:41234"));
  EXPECT_FALSE(PeerIsThisHost("ipv6:[2001:db8::7]:41234"));  // the documentation prefix
  EXPECT_FALSE(PeerIsThisHost("ipv4:not-an-address:1"));
  EXPECT_FALSE(PeerIsThisHost("ipv4:127.0.0.1"));  // no port
  EXPECT_FALSE(PeerIsThisHost("ipv6:[::1"));
  EXPECT_FALSE(PeerIsThisHost(""));
  EXPECT_FALSE(PeerIsThisHost("dns:teacher:1"));
}

}  // namespace
}  // namespace e3
