// Whether a gRPC peer (ServerContext::peer(), e.g. "ipv4:10.0.0.5:41234",
// "ipv6:[::1]:41234", "unix:/tmp/s") is a process on this machine: a unix
// socket, a loopback address, or an address of one of this machine's own
// interfaces. The teacher offers shm and CUDA IPC only to such peers, on
// this evidence as well as the host name a student claims.
#ifndef E3_COMMON_RPC_PEER_ADDRESS_H_
#define E3_COMMON_RPC_PEER_ADDRESS_H_

#include <string>

namespace e3 {

bool PeerIsThisHost(const std::string& grpc_peer);

}  // namespace e3

#endif  // E3_COMMON_RPC_PEER_ADDRESS_H_
