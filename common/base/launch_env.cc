#include "common/base/launch_env.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace e3 {
namespace {

// `flag` when set (>= 0), else $name when set, else `fallback`.
absl::StatusOr<int> IntFrom(int flag, const std::string& flag_name, const char* name, int fallback,
                            const EnvLookup& env) {
  if (flag >= 0) return flag;
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return fallback;
  int out;
  if (!absl::SimpleAtoi(v, &out) || out < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "$", name, "=\"", v, "\": expected a non-negative integer (or give --", flag_name, ")"));
  }
  return out;
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

absl::StatusOr<LaunchEnv> ResolveLaunchEnv(const LaunchFlags& flags, const EnvLookup& env) {
  LaunchEnv out;
  absl::StatusOr<int> rank = IntFrom(flags.rank, flags.rank_flag, "RANK", 0, env);
  absl::StatusOr<int> world = IntFrom(flags.world_size, "world_size", "WORLD_SIZE", 1, env);
  absl::StatusOr<int> local = IntFrom(-1, "local_rank", "LOCAL_RANK", -1, env);
  absl::StatusOr<int> port =
      IntFrom(flags.master_port, "master_port", "MASTER_PORT", flags.default_master_port, env);
  for (const auto* s : {&rank, &world, &local, &port}) {
    if (!s->ok()) return s->status();
  }
  out.rank = *rank;
  out.world_size = *world;
  out.local_rank = *local;
  out.master_port = *port;
  if (out.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", out.world_size, ": expected at least 1"));
  }
  if (out.rank >= out.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", out.rank, " is outside world size ", out.world_size));
  }
  if (out.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("master port ", out.master_port, ": expected at most 65535"));
  }
  out.master_addr = flags.master_addr;
  if (out.master_addr.empty()) {
    const char* addr = env("MASTER_ADDR");
    out.master_addr = addr != nullptr && *addr != '\0' ? addr : "127.0.0.1";
  }
  out.rendezvous_file = flags.rendezvous_file;
  return out;
}

}  // namespace e3
