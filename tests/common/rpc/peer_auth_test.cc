// PeerAuth on real calls over loopback, with certificates the test makes
// with openssl: a TLS server admits a client that trusts its CA and no
// other; a mutual-TLS server also wants the client's certificate; a token
// server answers only calls that carry its token. Bad flags are errors
// naming the flag and the file.
#include "common/rpc/peer_auth.h"

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>

#include <chrono>
#include <fstream>
#include <future>
#include <memory>
#include <string>

#include "common/base/file_util.h"
#include "tests/common/rpc/test_certs.h"

namespace e3 {
namespace {

PeerAuthOptions Opts(std::string cert = "", std::string key = "", std::string ca = "", std::string token = "") {
  PeerAuthOptions o;
  o.tls_cert = std::move(cert);
  o.tls_key = std::move(key);
  o.tls_ca = std::move(ca);
  o.auth_token_file = std::move(token);
  return o;
}

// Any method: echoes the request when Authorize lets the call in.
class AuthorizingService : public grpc::CallbackGenericService {
 public:
  explicit AuthorizingService(const PeerAuth* auth) : auth_(auth) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    return new Reactor(auth_->Authorize(*ctx));
  }

 private:
  class Reactor : public grpc::ServerGenericBidiReactor {
   public:
    explicit Reactor(const grpc::Status& authorized) {
      if (!authorized.ok()) {
        Finish(authorized);
        return;
      }
      StartRead(&message_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      StartWriteAndFinish(&message_, grpc::WriteOptions(), grpc::Status::OK);
    }
    void OnDone() override { delete this; }

   private:
    grpc::ByteBuffer message_;
  };
  const PeerAuth* auth_;
};

class PeerAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = MakeTempDir("peer_auth_test_");
    ASSERT_TRUE(dir.ok()) << dir.status();
    ASSERT_TRUE(testing::MakeTestCerts(*dir, &certs_)) << "openssl could not make the test certificates";
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    (void)RemoveAll(certs_.dir);
  }

  // The echo service on a free loopback port.
  void Serve(const PeerAuthOptions& options) {
    auto auth = PeerAuth::ForServer(options);
    ASSERT_TRUE(auth.ok()) << auth.status();
    server_auth_ = std::make_unique<PeerAuth>(*auth);
    service_ = std::make_unique<AuthorizingService>(server_auth_.get());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", server_auth_->ServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  // One call by a client with these options: its status (UNAVAILABLE when
  // the handshake fails).
  grpc::Status Call(const PeerAuthOptions& options) {
    auto auth = PeerAuth::ForClient(options);
    EXPECT_TRUE(auth.ok()) << auth.status();
    if (!auth.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad client options");
    grpc::ChannelArguments args;
    auth->AddChannelArguments(&args);
    auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_), auth->ChannelCredentials(), args);
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    auth->Attach(&context);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    grpc::Slice slice(std::string("ping"));
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, "/e3.test.Echo/Ping", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) { done.set_value(s); });
    return done.get_future().get();
  }
  bool Connects(const PeerAuthOptions& options) { return Call(options).ok(); }

  testing::TestCerts certs_;
  std::unique_ptr<PeerAuth> server_auth_;
  std::unique_ptr<AuthorizingService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(PeerAuthTest, ATlsServerAdmitsOnlyClientsThatTrustItsCa) {
  Serve(Opts(certs_.server_cert, certs_.server_key, "", ""));
  EXPECT_TRUE(Connects(Opts("", "", certs_.ca, "")));
  EXPECT_FALSE(Connects(Opts("", "", certs_.other_ca, ""))) << "a CA that signed nothing here";
  EXPECT_FALSE(Connects(Opts())) << "plaintext against TLS";
}

TEST_F(PeerAuthTest, AMutualTlsServerWantsTheClientsCertificate) {
  Serve(Opts(certs_.server_cert, certs_.server_key, certs_.ca, ""));
  EXPECT_TRUE(Connects(Opts(certs_.client_cert, certs_.client_key, certs_.ca, "")));
  EXPECT_FALSE(Connects(Opts("", "", certs_.ca, ""))) << "no client certificate";
  // A client certificate is not enough: the client must also trust the
  // server's CA.
  EXPECT_FALSE(Connects(Opts(certs_.client_cert, certs_.client_key, certs_.other_ca, "")))
      << "the client does not trust the server's CA";
}

TEST_F(PeerAuthTest, ATlsNameOverrideReachesACertificateForAnotherName) {
  Serve(Opts(certs_.server_cert, certs_.server_key, "", ""));
  PeerAuthOptions o = Opts("", "", certs_.ca);
  o.tls_server_name = "localhost";
  EXPECT_TRUE(Connects(o));
  o.tls_server_name = "teacher.example";
  EXPECT_FALSE(Connects(o)) << "the certificate names localhost and 127.0.0.1 only";
}

TEST_F(PeerAuthTest, ATokenServerAnswersOnlyCallsCarryingItsToken) {
  const std::string token = certs_.dir + "/token", wrong = certs_.dir + "/wrong";
  std::ofstream(token) << "s3cret\n";
  std::ofstream(wrong) << "s3cres\n";
  Serve(Opts("", "", "", token));
  EXPECT_TRUE(Call(Opts("", "", "", token)).ok());
  EXPECT_EQ(Call(Opts("", "", "", wrong)).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(Opts()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(PeerAuthTest, TlsAndATokenTogether) {
  const std::string token = certs_.dir + "/token";
  std::ofstream(token) << "s3cret\n";
  Serve(Opts(certs_.server_cert, certs_.server_key, certs_.ca, token));
  EXPECT_TRUE(Call(Opts(certs_.client_cert, certs_.client_key, certs_.ca, token)).ok());
  EXPECT_EQ(Call(Opts(certs_.client_cert, certs_.client_key, certs_.ca, "")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(Opts("", "", certs_.ca, token)).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "no client certificate: the handshake fails first";
}

TEST_F(PeerAuthTest, BadFlagsNameTheFlagAndTheFile) {
  auto no_key = PeerAuth::ForServer(Opts(certs_.server_cert, "", "", ""));
  ASSERT_FALSE(no_key.ok());
  EXPECT_NE(std::string(no_key.status().message()).find("--tls_key"), std::string::npos);
  auto ca_alone = PeerAuth::ForServer(Opts("", "", certs_.ca, ""));
  ASSERT_FALSE(ca_alone.ok());
  EXPECT_NE(std::string(ca_alone.status().message()).find("mutual TLS"), std::string::npos);
  auto missing = PeerAuth::ForServer(Opts(certs_.dir + "/nope.pem", certs_.server_key, "", ""));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("--tls_cert=" + certs_.dir + "/nope.pem"),
            std::string::npos)
      << missing.status();
  // A key of another pair is named as such, not as a port that cannot bind.
  auto mismatch = PeerAuth::ForServer(Opts(certs_.server_cert, certs_.client_key, "", ""));
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(std::string(mismatch.status().message())
                .find("--tls_key=" + certs_.client_key + " is not the key of the certificate in --tls_cert=" +
                      certs_.server_cert),
            std::string::npos)
      << mismatch.status();
  EXPECT_FALSE(PeerAuth::ForClient(Opts(certs_.client_cert, certs_.server_key, certs_.ca, "")).ok());
  auto not_pem = PeerAuth::ForClient(Opts("", "", certs_.dir + "/make_certs.sh", ""));
  ASSERT_FALSE(not_pem.ok());
  EXPECT_NE(std::string(not_pem.status().message()).find("not a PEM file"), std::string::npos);

  const std::string token = certs_.dir + "/token";
  std::ofstream(token) << "\n";
  auto empty = PeerAuth::ForServer(Opts("", "", "", token));
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(std::string(empty.status().message()).find("--auth_token_file=" + token), std::string::npos);
  std::ofstream(token) << "two words\n";
  EXPECT_FALSE(PeerAuth::ForServer(Opts("", "", "", token)).ok());
  std::ofstream(token) << "  s3cret-Token_1 \nsecond line ignored\n";
  auto ok = PeerAuth::ForServer(Opts("", "", "", token));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->token());
  EXPECT_EQ(ok->Describe(), "a shared token");
}

TEST_F(PeerAuthTest, ATokenFileOthersCanReadIsWarnedAbout) {
  const std::string token = certs_.dir + "/open_token";
  std::ofstream(token) << "s3cret\n";
  ASSERT_EQ(::chmod(token.c_str(), 0644), 0);
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(PeerAuth::ForServer(Opts("", "", "", token)).ok());
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warned, "warning: --auth_token_file=" + token +
                        " is readable or writable by group or others (mode 0644); anyone who can "
                        "read it can act as a peer: chmod 600 " + token + "\n");
  ASSERT_EQ(::chmod(token.c_str(), 0600), 0);
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(PeerAuth::ForClient(Opts("", "", "", token)).ok());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(PeerAuthAddressTest, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1:50051", "localhost:1", "[::1]:9", "127.1.2.3:0", "unix:/tmp/s"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:50051", "[::]:50051", "10.0.0.5:1", "teacher-0.svc:50051", ":50051"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

}  // namespace
}  // namespace e3
