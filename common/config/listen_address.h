// Checks of the addresses and ports the services are told to bind, made
// before anything binds: gRPC reads a port past 65535 modulo 2^16 and
// binds another port than the one asked for.
#ifndef E3_COMMON_CONFIG_LISTEN_ADDRESS_H_
#define E3_COMMON_CONFIG_LISTEN_ADDRESS_H_

#include <string>

#include "absl/status/status.h"

namespace e3 {

// `address` is host:port, [ipv6]:port or unix:path, with a port in
// [0, 65535] (0 picks a free one). InvalidArgument naming `flag`.
absl::Status CheckListenAddress(const std::string& address, const std::string& flag);

// A port flag: [min, 65535], where `min` is -1 when -1 means "none" and 0
// when 0 means "pick one". InvalidArgument naming `flag`.
absl::Status CheckPortFlag(int port, int min, const std::string& flag);

}  // namespace e3

#endif  // E3_COMMON_CONFIG_LISTEN_ADDRESS_H_
