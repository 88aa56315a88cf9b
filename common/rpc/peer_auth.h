// Who may talk to a service, for both sides of every gRPC connection: TLS
// (server certificate; mutual TLS when a CA is given to the server) and a
// shared token that every RPC carries ("authorization: Bearer <token>").
// The trust model and its limits are in docs/decisions/0047-peers.md.
//
// The server checks the token in each handler (Authorize) rather than in
// an interceptor or an AuthMetadataProcessor: gRPC C++ server interceptors
// cannot refuse a call, and an AuthMetadataProcessor runs only on TLS
// credentials, while a token must also guard a plaintext loopback bind.
#ifndef E3_COMMON_RPC_PEER_AUTH_H_
#define E3_COMMON_RPC_PEER_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace e3 {

// PEM files and the token file, as the flags name them; empty = unused.
struct PeerAuthOptions {
  std::string tls_cert;  // --tls_cert: this side's certificate chain
  std::string tls_key;   // --tls_key: its private key
  // --tls_ca: on a server, clients must present a certificate it signed
  // (mutual TLS); on a client, the CA that signed the server's certificate
  // (default: the system's roots).
  std::string tls_ca;
  std::string auth_token_file;  // --auth_token_file: the shared token (first line)
  // Client only: the name the server's certificate must carry, when the
  // address dialled is not it (e.g. an IP while the certificate says a
  // host name).
  std::string tls_server_name;
};

class PeerAuth {
 public:
  // Reads the files: every error names the flag and the file. A server
  // needs --tls_cert with --tls_key (or neither); a client with one needs
  // the other; a token file must hold a non-empty token of printable
  // characters, and one that group or others may read or write gets a
  // warning on stderr.
  static absl::StatusOr<PeerAuth> ForServer(const PeerAuthOptions& options);
  static absl::StatusOr<PeerAuth> ForClient(const PeerAuthOptions& options);

  bool tls() const { return tls_; }
  bool mutual_tls() const { return mutual_; }
  bool token() const { return !token_.empty(); }
  // "TLS", "mutual TLS", "a shared token", combinations, or "nothing".
  std::string Describe() const;

  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;
  // Channel arguments the credentials need (the TLS name override).
  void AddChannelArguments(grpc::ChannelArguments* args) const;

  // OK when the call carries the token (always OK without one);
  // UNAUTHENTICATED otherwise, without saying what was wrong with it.
  grpc::Status Authorize(const grpc::CallbackServerContext& context) const;
  // Adds the token to a call's metadata (nothing without one).
  void Attach(grpc::ClientContext* context) const;

 private:
  bool tls_ = false, mutual_ = false;
  std::string cert_pem_, key_pem_, ca_pem_, server_name_;
  std::string token_;
};

// Whether `address` (host:port) binds or dials only this machine.
bool IsLoopbackAddress(const std::string& address);

}  // namespace e3

#endif  // E3_COMMON_RPC_PEER_AUTH_H_
