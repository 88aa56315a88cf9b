// Whether a host name or address stays on this machine. Both the gRPC
// side (common/rpc/peer_auth.h: a bind needs no token on loopback) and
// the c10d side (common/torch/process_group.h: Gloo binds loopback when
// the ranks meet there) ask it, so they agree on what loopback is.
#ifndef E3_COMMON_BASE_LOOPBACK_HOST_H_
#define E3_COMMON_BASE_LOOPBACK_HOST_H_

#include <string>

namespace e3 {

// "localhost", "::1" and 127.0.0.0/8 (any case); not a host name that
// merely resolves there, which would take a lookup.
bool IsLoopbackHost(const std::string& host);

}  // namespace e3

#endif  // E3_COMMON_BASE_LOOPBACK_HOST_H_
