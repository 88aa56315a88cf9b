// gRPC keepalive for both services, so that a peer that stops answering
// (a frozen host, a dead NIC, a partition that drops packets without a
// reset) is noticed in seconds through HTTP/2 pings instead of TCP's
// retransmission timeout (about 15 minutes on Linux). Each side pings an
// idle connection every `ping_every`, and a ping unanswered for
// `ping_timeout` closes it: its streams end with UNAVAILABLE.
#ifndef E3_COMMON_RPC_KEEPALIVE_H_
#define E3_COMMON_RPC_KEEPALIVE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>

namespace e3 {

// The most often a client may ping (student --keepalive_ping_s >= 1).
inline constexpr std::chrono::milliseconds kMinClientPing{1000};

struct KeepaliveOptions {
  std::chrono::milliseconds ping_every{10000};
  std::chrono::milliseconds ping_timeout{5000};
};

// Client side: pings while streams are open and while idle.
void AddClientKeepalive(const KeepaliveOptions& options, grpc::ChannelArguments* args);
// Server side: pings its clients too, and accepts their pings as often as
// they send them (the default would call a ping every 10 s abuse).
void AddServerKeepalive(const KeepaliveOptions& options, grpc::ServerBuilder* builder);

}  // namespace e3

#endif  // E3_COMMON_RPC_KEEPALIVE_H_
