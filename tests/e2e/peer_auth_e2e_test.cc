// Peers authenticated, with the real binaries on loopback: a teacher with
// mutual TLS and a shared token (certificates made by openssl at test
// time) refuses a student without the token (UNAUTHENTICATED, at its
// first call) and one without a client certificate (the handshake), then
// trains one that has both, unaffected by the refusals. A teacher bound
// beyond loopback with neither TLS nor a token warns.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>

#include "tests/common/rpc/test_certs.h"
#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::Subprocess;

const std::string kSrc = E3_SOURCE_DIR;

std::vector<std::string> TeacherArgs(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> a = {testing::TeacherBinary(),
                                "--model_dir=" + kSrc + "/examples/tiny-code-llama",
                                "--data=" + kSrc + "/examples/data/train_conversations.jsonl",
                                "--max_samples=40",
                                "--max_seq_len=256",
                                "--tokens_per_batch=512",
                                "--draft_vocab_size=512",
                                "--port_file=" + dir + "/port",
                                "--metrics_port=-1",
                                "--threads=1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> StudentArgs(const std::string& port, std::vector<std::string> extra) {
  std::vector<std::string> a = {testing::StudentBinary(), "--teacher=127.0.0.1:" + port, "--max_steps=3",
                                "--metrics_port=-1", "--threads=1", "--connect_attempts=2", "--log_every=1",
                                "--initial_backoff_s=0.2"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Runs a student to its end: (exit code, log).
std::pair<int, std::string> RunStudent(const std::vector<std::string>& args, const std::string& log) {
  Subprocess s(args, log);
  auto st = s.Wait(180s);
  EXPECT_TRUE(st.has_value()) << "student did not finish in 180 s\n" << s.Log();
  return {st.has_value() && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1, s.Log()};
}

TEST(PeerAuthE2eTest, MutualTlsAndATokenLetInOnlyTheRightStudent) {
  const std::string dir = testing::ScratchDir("peer_auth_e2e");
  testing::TestCerts certs;
  ASSERT_TRUE(testing::MakeTestCerts(dir, &certs)) << "openssl could not make the test certificates";
  const std::string token = dir + "/token";
  std::ofstream(token) << "e2e-shared-token\n";
  const std::string wrong = dir + "/wrong_token";
  std::ofstream(wrong) << "not-the-token\n";
  Subprocess teacher(TeacherArgs(dir, {"--listen=127.0.0.1:0", "--tls_cert=" + certs.server_cert,
                                       "--tls_key=" + certs.server_key, "--tls_ca=" + certs.ca,
                                       "--auth_token_file=" + token}),
                     dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 60s)) << teacher.Log();
  const std::string port = testing::ReadPortFile(dir + "/port");
  EXPECT_NE(teacher.Log().find("peers checked by mutual TLS and a shared token"), std::string::npos)
      << teacher.Log();
  const std::vector<std::string> tls = {"--tls_ca=" + certs.ca, "--tls_cert=" + certs.client_cert,
                                        "--tls_key=" + certs.client_key};

  std::vector<std::string> no_token = tls;
  no_token.push_back("--auth_token_file=" + wrong);
  auto [code, log] = RunStudent(StudentArgs(port, no_token), dir + "/wrong_token.log");
  EXPECT_NE(code, 0) << log;
  EXPECT_NE(log.find("shared token"), std::string::npos) << log;

  auto [code2, log2] = RunStudent(StudentArgs(port, {"--tls_ca=" + certs.ca, "--auth_token_file=" + token}),
                                  dir + "/no_cert.log");
  EXPECT_NE(code2, 0) << log2;

  std::vector<std::string> right = tls;
  right.push_back("--auth_token_file=" + token);
  right.push_back("--subscriber_id=right");
  auto [code3, log3] = RunStudent(StudentArgs(port, right), dir + "/right.log");
  EXPECT_EQ(code3, 0) << log3;
  EXPECT_NE(log3.find("step 3/3"), std::string::npos) << log3;
}

TEST(PeerAuthE2eTest, AnOpenBindWithoutTlsOrATokenWarns) {
  const std::string dir = testing::ScratchDir("peer_auth_e2e_open");
  Subprocess teacher(TeacherArgs(dir, {"--listen=0.0.0.0:0"}), dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 60s)) << teacher.Log();
  for (int i = 0; i < 50 && teacher.Log().find("WARNING") == std::string::npos; ++i) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_NE(teacher.Log().find("reachable beyond this machine with neither TLS nor a token"), std::string::npos)
      << teacher.Log();
}

}  // namespace
}  // namespace e3
