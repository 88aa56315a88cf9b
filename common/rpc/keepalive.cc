#include "common/rpc/keepalive.h"

#include <algorithm>

namespace e3 {
namespace {

int Ms(std::chrono::milliseconds d) { return static_cast<int>(std::max<int64_t>(1, d.count())); }

}  // namespace

void AddClientKeepalive(const KeepaliveOptions& o, grpc::ChannelArguments* args) {
  args->SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Ms(o.ping_every));
  args->SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Ms(o.ping_timeout));
  args->SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Keep pinging a stream that carries no data (a student waiting for its
  // teacher's next batch): 0 lifts the default cap of two such pings.
  args->SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

void AddServerKeepalive(const KeepaliveOptions& o, grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Ms(o.ping_every));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Ms(o.ping_timeout));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Clients ping as often as their own ping_every (students may set it
  // down to a second); the server must not take that for abuse (GOAWAY
  // "too_many_pings").
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              std::max(1, std::min(Ms(o.ping_every), Ms(kMinClientPing)) / 2));
}

}  // namespace e3
