#include "common/config/listen_address.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace e3 {
namespace {

constexpr int kMaxPort = 65535;

absl::Status Bad(const std::string& flag, const std::string& address, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, "=", address, ": ", what));
}

}  // namespace

absl::Status CheckListenAddress(const std::string& address, const std::string& flag) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) return absl::OkStatus();
  const size_t colon = address.rfind(':');
  const bool bracketed = absl::StartsWith(address, "[");
  if (colon == std::string::npos || colon == 0 || (bracketed && address[colon - 1] != ']')) {
    return Bad(flag, address, "expected host:port, [ipv6]:port or unix:path");
  }
  const std::string port = address.substr(colon + 1);
  int value = -1;
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) || port.size() > 5 ||
      !absl::SimpleAtoi(port, &value) || value > kMaxPort) {
    return Bad(flag, address, absl::StrCat("the port \"", port, "\" is not in [0, ", kMaxPort, "] (0 picks one)"));
  }
  return absl::OkStatus();
}

absl::Status CheckPortFlag(int port, int min, const std::string& flag) {
  if (port >= min && port <= kMaxPort) return absl::OkStatus();
  const std::string meaning = min < 0 ? " (-1: none, 0: pick one)" : (min == 0 ? " (0: pick one)" : "");
  return absl::InvalidArgumentError(
      absl::StrCat(flag, "=", port, ": expected a port in [", min, ", ", kMaxPort, "]", meaning));
}

}  // namespace e3
