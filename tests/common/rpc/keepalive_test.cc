// Keepalive on a real connection: a client holds a stream open to an echo
// server through a loopback TCP proxy, the proxy freezes (the server stops
// answering, the socket stays open), and the client's stream ends with
// UNAVAILABLE within ping_every + ping_timeout plus slack; without
// keepalive the same stream is still waiting when the test gives up on it.
#include "common/rpc/keepalive.h"

#include <gtest/gtest.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "tests/common/rpc/tcp_proxy.h"

namespace e3 {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Echoes every message of a stream until the client closes it.
class EchoService : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new Reactor;
  }

 private:
  class Reactor : public grpc::ServerGenericBidiReactor {
   public:
    Reactor() { StartRead(&message_); }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      StartWrite(&message_);
    }
    void OnWriteDone(bool ok) override {
      if (ok) StartRead(&message_);
    }
    void OnDone() override { delete this; }

   private:
    grpc::ByteBuffer message_;
  };
};

// One stream: a message out, its echo back (echoed), then a read that no
// message will answer, until the stream ends (done, with its status).
class WaitingStream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  WaitingStream() {
    grpc::Slice slice(std::string("ping"));
    out_ = grpc::ByteBuffer(&slice, 1);
  }
  void Begin() {
    StartWrite(&out_);
    StartRead(&in_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (!echoed_set_) {
      echoed_set_ = true;
      echoed.set_value();
    }
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override { done.set_value(s); }

  std::promise<void> echoed;
  std::promise<grpc::Status> done;

 private:
  grpc::ByteBuffer out_, in_;
  bool echoed_set_ = false;
};

class KeepaliveTest : public ::testing::Test {
 protected:
  void Serve(std::optional<KeepaliveOptions> keepalive) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    if (keepalive) AddServerKeepalive(*keepalive, &builder);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    proxy_ = std::make_unique<testing::TcpProxy>(port_);
  }
  void TearDown() override {
    proxy_.reset();
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  // Opens a stream through the proxy, sees its echo, freezes the proxy, and
  // returns the stream's end status and how long after the freeze it came,
  // or nullopt when it had not ended within `wait`.
  std::optional<std::pair<grpc::Status, milliseconds>> FreezeAndWait(std::optional<KeepaliveOptions> keepalive,
                                                                     milliseconds wait) {
    grpc::ChannelArguments args;
    if (keepalive) AddClientKeepalive(*keepalive, &args);
    auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(proxy_->port()),
                                             grpc::InsecureChannelCredentials(), args);
    grpc::GenericStub stub(channel);
    auto context = std::make_unique<grpc::ClientContext>();
    auto stream = std::make_unique<WaitingStream>();
    auto echoed = stream->echoed.get_future();
    auto done = stream->done.get_future();
    stub.PrepareBidiStreamingCall(context.get(), "/e3.test.Echo/Stream", grpc::StubOptions(), stream.get());
    stream->Begin();
    EXPECT_EQ(echoed.wait_for(std::chrono::seconds(5)), std::future_status::ready) << "no echo through the proxy";
    proxy_->Freeze();
    const auto frozen_at = Clock::now();
    if (done.wait_for(wait) != std::future_status::ready) {
      context->TryCancel();  // end the stream before its reactor goes
      done.wait();
      return std::nullopt;
    }
    return std::make_pair(done.get(), std::chrono::duration_cast<milliseconds>(Clock::now() - frozen_at));
  }

  EchoService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<testing::TcpProxy> proxy_;
  int port_ = 0;
};

TEST_F(KeepaliveTest, AFrozenPeerIsNoticedInSeconds) {
  const KeepaliveOptions fast{milliseconds(1000), milliseconds(1000)};
  Serve(fast);
  auto ended = FreezeAndWait(fast, milliseconds(10000));
  ASSERT_TRUE(ended.has_value()) << "the stream did not end within 10 s of the freeze";
  EXPECT_EQ(ended->first.error_code(), grpc::StatusCode::UNAVAILABLE) << ended->first.error_message();
  EXPECT_LE(ended->second.count(), 6000) << "ping every 1 s, timeout 1 s";
}

TEST_F(KeepaliveTest, WithoutKeepaliveTheStreamWaitsOn) {
  Serve(std::nullopt);
  auto ended = FreezeAndWait(std::nullopt, milliseconds(5000));
  EXPECT_FALSE(ended.has_value()) << "ended without keepalive: " << ended->first.error_message();
}

}  // namespace
}  // namespace e3
