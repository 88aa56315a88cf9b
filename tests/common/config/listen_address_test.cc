// Addresses and ports are checked before anything binds: gRPC reads a
// port past 65535 modulo 2^16 (--listen=...:99999 bound 34463).
#include "common/config/listen_address.h"

#include <gtest/gtest.h>

#include <string>

namespace e3 {
namespace {

TEST(ListenAddressTest, AcceptsWhatGrpcBinds) {
  for (const char* ok : {"127.0.0.1:0", "0.0.0.0:50051", "localhost:65535", "[::1]:8080", "[::]:0",
                         "unix:/tmp/teacher.sock"}) {
    EXPECT_TRUE(CheckListenAddress(ok, "--listen").ok()) << ok;
  }
}

TEST(ListenAddressTest, RefusesPortsPastTheLastAndMalformedAddresses) {
  const absl::Status wrap = CheckListenAddress("127.0.0.1:99999", "--listen");
  EXPECT_EQ(wrap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(wrap.message()),
            "--listen=127.0.0.1:99999: the port \"99999\" is not in [0, 65535] (0 picks one)");
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", ":50051", "127.0.0.1:-1", "127.0.0.1:5x", "[::1:80",
                          "127.0.0.1:065536"}) {
    EXPECT_FALSE(CheckListenAddress(bad, "--listen").ok()) << bad;
  }
}

TEST(ListenAddressTest, PortFlagsKeepTheirSpecialValues) {
  EXPECT_TRUE(CheckPortFlag(-1, -1, "--metrics_port").ok());
  EXPECT_TRUE(CheckPortFlag(0, -1, "--metrics_port").ok());
  EXPECT_TRUE(CheckPortFlag(65535, 0, "--master_port").ok());
  const absl::Status past = CheckPortFlag(70000, -1, "--metrics_port");
  EXPECT_EQ(std::string(past.message()),
            "--metrics_port=70000: expected a port in [-1, 65535] (-1: none, 0: pick one)");
  EXPECT_FALSE(CheckPortFlag(-1, 0, "--master_port").ok());
}

}  // namespace
}  // namespace e3
