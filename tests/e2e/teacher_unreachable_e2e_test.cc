// A teacher that stops answering without closing its connection (a hung
// host, a partition that drops packets) is noticed through keepalive in
// seconds, not after TCP's retransmission timeout: the real student talks
// to the real teacher through a loopback proxy (tests/common/rpc/
// tcp_proxy.h) that is frozen mid-run. The student must log that the
// teacher is unreachable within a few seconds, then continue once the
// proxy thaws, and finish with every sample committed exactly once.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "tests/common/rpc/tcp_proxy.h"
#include "tests/e2e/ledger_scan.h"
#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::Subprocess;
using Clock = std::chrono::steady_clock;

const std::string kSrc = E3_SOURCE_DIR;

// With pings every second, unanswered for a second, a frozen link is
// noticed within about 2 s; 8 s leaves room for a loaded CI machine and is
// still far from TCP's minutes.
constexpr auto kNoticeWithin = 8s;

TEST(TeacherUnreachableE2eTest, FrozenLinkIsNoticedInSecondsAndTheRunContinuesAfterIt) {
  const std::string dir = testing::ScratchDir("teacher_unreachable");
  Subprocess teacher({testing::TeacherBinary(), "--model_dir=" + kSrc + "/examples/tiny-code-llama",
                      "--data=" + kSrc + "/examples/data/train_conversations.jsonl", "--max_samples=30",
                      "--max_seq_len=128", "--tokens_per_batch=256", "--draft_vocab_size=256",
                      "--listen=127.0.0.1:0", "--port_file=" + dir + "/port", "--ledger=" + dir + "/ledger.jsonl",
                      "--exit_when_done", "--subscriber_timeout_s=2", "--metrics_port=-1", "--threads=1"},
                     dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 120s)) << teacher.Log();
  testing::TcpProxy proxy(std::stoi(testing::ReadPortFile(dir + "/port")));
  const std::string address = "127.0.0.1:" + std::to_string(proxy.port());
  Subprocess student({testing::StudentBinary(), "--teacher=" + address, "--lr=1e-3",
                      "--checkpoint_dir=" + dir + "/ckpt", "--checkpoint_every=3", "--log_every=1", "--threads=1",
                      "--credit_window=2", "--teacher_wait_s=120", "--initial_backoff_s=0.2",
                      "--keepalive_ping_s=1", "--keepalive_timeout_s=1", "--metrics_port=-1"},
                     dir + "/student.log");
  for (int i = 0; i < 2400 && student.Log().find("step 2/") == std::string::npos; ++i) {
    ASSERT_FALSE(student.Wait(0ms).has_value()) << student.Log();
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_NE(student.Log().find("step 2/"), std::string::npos) << student.Log();

  proxy.Freeze();
  const auto frozen_at = Clock::now();
  while (student.Log().find(address + " unreachable") == std::string::npos && Clock::now() - frozen_at < 60s) {
    std::this_thread::sleep_for(20ms);
  }
  const auto noticed_after = Clock::now() - frozen_at;
  ASSERT_NE(student.Log().find(address + " unreachable"), std::string::npos) << student.Log();
  std::printf("frozen link noticed after %.2f s\n", std::chrono::duration<double>(noticed_after).count());
  EXPECT_LT(noticed_after, kNoticeWithin) << student.Log();

  // Partitioned a little longer than noticing takes, then healed.
  std::this_thread::sleep_for(2s);
  ASSERT_FALSE(student.Wait(0ms).has_value()) << student.Log();
  proxy.Thaw();
  auto st = student.Wait(240s);
  ASSERT_TRUE(st.has_value()) << "the student did not finish\n" << student.Log();
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << student.Log();
  EXPECT_NE(student.Log().find(address + " is back after"), std::string::npos) << student.Log();
  ASSERT_TRUE(teacher.Wait(30s).has_value()) << teacher.Log();
  const testing::LedgerScan end = testing::ScanLedger(dir + "/ledger.jsonl");
  EXPECT_TRUE(end.ExactlyOnce()) << end.Describe();
}

}  // namespace
}  // namespace e3
