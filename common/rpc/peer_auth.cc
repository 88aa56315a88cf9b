#include "common/rpc/peer_auth.h"

#include <sys/stat.h>

#include <cstdio>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/loopback_host.h"
#include "common/base/status_macros.h"
#include "common/rpc/tls_key_pair.h"

namespace e3 {
namespace {

constexpr char kAuthorization[] = "authorization";
constexpr char kBearer[] = "Bearer ";

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": ", text.status().message()));
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": not a PEM file (no -----BEGIN line)"));
  }
  return *text;
}

// Whoever reads the token file is a peer, and whoever writes it picks
// the token: a file open to group or others is worth a warning (not an
// error: a shared filesystem may give no other choice).
void WarnIfTokenFileIsOpen(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & 077) == 0) return;
  std::fprintf(stderr,
               "warning: --auth_token_file=%s is readable or writable by group or others (mode %04o); "
               "anyone who can read it can act as a peer: chmod 600 %s\n",
               path.c_str(), static_cast<unsigned>(st.st_mode & 07777), path.c_str());
}

// The token: the file's first line, without surrounding whitespace; it
// travels as an HTTP/2 header value, so printable ASCII only.
absl::StatusOr<std::string> ReadToken(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--auth_token_file=", path, ": ", text.status().message()));
  std::string token(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("--auth_token_file=", path, ": the first line is empty"));
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth_token_file=", path, ": the token must be printable ASCII without spaces"));
    }
  }
  WarnIfTokenFileIsOpen(path);
  return token;
}

// Equal strings, in time that does not depend on where they differ.
bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<PeerAuth> PeerAuth::ForServer(const PeerAuthOptions& o) {
  PeerAuth a;
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together: give both, or neither for plaintext");
  }
  if (!o.tls_ca.empty() && o.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_ca asks for mutual TLS, which needs the server's own --tls_cert and --tls_key");
  }
  if (!o.tls_cert.empty()) {
    a.tls_ = true;
    E3_ASSIGN_OR_RETURN(a.cert_pem_, ReadPem("tls_cert", o.tls_cert));
    E3_ASSIGN_OR_RETURN(a.key_pem_, ReadPem("tls_key", o.tls_key));
    E3_RETURN_IF_ERROR(CheckKeyMatchesCertificate(a.cert_pem_, o.tls_cert, a.key_pem_, o.tls_key));
  }
  if (!o.tls_ca.empty()) {
    a.mutual_ = true;
    E3_ASSIGN_OR_RETURN(a.ca_pem_, ReadPem("tls_ca", o.tls_ca));
  }
  if (!o.auth_token_file.empty()) {
    E3_ASSIGN_OR_RETURN(a.token_, ReadToken(o.auth_token_file));
  }
  return a;
}

absl::StatusOr<PeerAuth> PeerAuth::ForClient(const PeerAuthOptions& o) {
  PeerAuth a;
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: a client presents both (mutual TLS), or neither");
  }
  // Any TLS flag turns TLS on: the CA verifies the server (the system's
  // roots without one), the certificate identifies this client.
  a.tls_ = !o.tls_ca.empty() || !o.tls_cert.empty() || !o.tls_server_name.empty();
  if (!o.tls_ca.empty()) {
    E3_ASSIGN_OR_RETURN(a.ca_pem_, ReadPem("tls_ca", o.tls_ca));
  }
  if (!o.tls_cert.empty()) {
    a.mutual_ = true;
    E3_ASSIGN_OR_RETURN(a.cert_pem_, ReadPem("tls_cert", o.tls_cert));
    E3_ASSIGN_OR_RETURN(a.key_pem_, ReadPem("tls_key", o.tls_key));
    E3_RETURN_IF_ERROR(CheckKeyMatchesCertificate(a.cert_pem_, o.tls_cert, a.key_pem_, o.tls_key));
  }
  a.server_name_ = o.tls_server_name;
  if (!o.auth_token_file.empty()) {
    E3_ASSIGN_OR_RETURN(a.token_, ReadToken(o.auth_token_file));
  }
  return a;
}

std::string PeerAuth::Describe() const {
  std::vector<std::string> parts;
  if (tls_) parts.push_back(mutual_ ? "mutual TLS" : "TLS");
  if (token()) parts.push_back("a shared token");
  return parts.empty() ? "nothing (plaintext, no token)" : absl::StrJoin(parts, " and ");
}

std::shared_ptr<grpc::ServerCredentials> PeerAuth::ServerCredentials() const {
  if (!tls_) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(mutual_ ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                    : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = ca_pem_;
  options.pem_key_cert_pairs.push_back({key_pem_, cert_pem_});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> PeerAuth::ChannelCredentials() const {
  if (!tls_) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca_pem_;
  options.pem_private_key = key_pem_;
  options.pem_cert_chain = cert_pem_;
  return grpc::SslCredentials(options);
}

void PeerAuth::AddChannelArguments(grpc::ChannelArguments* args) const {
  if (tls_ && !server_name_.empty()) args->SetSslTargetNameOverride(server_name_);
}

grpc::Status PeerAuth::Authorize(const grpc::CallbackServerContext& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kAuthorization);
  if (found != metadata.end() &&
      ConstantTimeEqual(std::string(found->second.data(), found->second.size()), absl::StrCat(kBearer, token_))) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "this teacher needs the shared token (--auth_token_file) on every call");
}

void PeerAuth::Attach(grpc::ClientContext* context) const {
  if (!token_.empty()) context->AddMetadata(kAuthorization, absl::StrCat(kBearer, token_));
}

bool IsLoopbackAddress(const std::string& address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) return true;
  std::string host = address;
  if (absl::StartsWith(host, "[")) {
    host = host.substr(1, host.find(']') == std::string::npos ? std::string::npos : host.find(']') - 1);
  } else if (host.rfind(':') != std::string::npos && host.find(':') == host.rfind(':')) {
    host = host.substr(0, host.rfind(':'));  // host:port, not a bare IPv6 address
  }
  return IsLoopbackHost(host);
}

}  // namespace e3
