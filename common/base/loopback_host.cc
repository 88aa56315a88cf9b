#include "common/base/loopback_host.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace e3 {

bool IsLoopbackHost(const std::string& host) {
  const std::string h = absl::AsciiStrToLower(host);
  return h == "localhost" || h == "::1" || absl::StartsWith(h, "127.");
}

}  // namespace e3
