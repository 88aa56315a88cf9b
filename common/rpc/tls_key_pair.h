// Whether a PEM private key belongs to a PEM certificate. gRPC only finds
// out when the server binds, and then reports it as a port it cannot
// listen on; checking first gives the error its real cause.
#ifndef E3_COMMON_RPC_TLS_KEY_PAIR_H_
#define E3_COMMON_RPC_TLS_KEY_PAIR_H_

#include <string>

#include "absl/status/status.h"

namespace e3 {

// OK when `key_pem` is the private key of the first certificate in
// `cert_pem`; InvalidArgument naming the flags and files otherwise (a
// certificate or key that does not parse, or a key of another pair).
absl::Status CheckKeyMatchesCertificate(const std::string& cert_pem, const std::string& cert_path,
                                        const std::string& key_pem, const std::string& key_path);

}  // namespace e3

#endif  // E3_COMMON_RPC_TLS_KEY_PAIR_H_
