#include "common/rpc/peer_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/match.h"

namespace e3 {
namespace {

// The address part of "ipv4:A:port" or "ipv6:[A]:port" (percent-decoded
// zone ids are left in place and make the parse fail: not this host).
bool ParsePeer(const std::string& peer, int* family, std::string* address) {
  if (absl::StartsWith(peer, "ipv4:")) {
    const std::string rest = peer.substr(5);
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos) return false;
    *family = AF_INET;
    *address = rest.substr(0, colon);
    return true;
  }
  if (absl::StartsWith(peer, "ipv6:[")) {
    const size_t close = peer.find(']');
    if (close == std::string::npos) return false;
    *family = AF_INET6;
    *address = peer.substr(6, close - 6);
    return true;
  }
  return false;
}

}  // namespace

bool PeerIsThisHost(const std::string& grpc_peer) {
  if (absl::StartsWith(grpc_peer, "unix:") || absl::StartsWith(grpc_peer, "unix-abstract:")) return true;
  int family = 0;
  std::string text;
  if (!ParsePeer(grpc_peer, &family, &text)) return false;
  unsigned char bytes[16] = {0};
  if (inet_pton(family, text.c_str(), bytes) != 1) return false;
  if (family == AF_INET && bytes[0] == 127) return true;
  static const unsigned char kLoopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  if (family == AF_INET6 && std::memcmp(bytes, kLoopback6, 16) == 0) return true;
  // An IPv4 peer reaching an IPv6 socket arrives as ::ffff:a.b.c.d.
  static const unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (family == AF_INET6 && std::memcmp(bytes, kMapped, 12) == 0) {
    family = AF_INET;
    std::memmove(bytes, bytes + 12, 4);
    if (bytes[0] == 127) return true;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool mine = false;
  for (ifaddrs* i = list; i != nullptr && !mine; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != family) continue;
    if (family == AF_INET) {
      mine = std::memcmp(&reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, bytes, 4) == 0;
    } else {
      mine = std::memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, bytes, 16) == 0;
    }
  }
  freeifaddrs(list);
  return mine;
}

}  // namespace e3
