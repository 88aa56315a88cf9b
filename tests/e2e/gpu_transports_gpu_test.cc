// The seed's core setup on real GPUs: a teacher_server process computing in
// bf16 on GPU 0 and a student_trainer process training in bf16 (fp32 master
// weights) on GPU 1, with the hidden states moving GPU to GPU over each
// device transport, and over shm for comparison. Each run trains until the
// data ends: the loss falls, acc_0 rises, and the teacher's ledger shows
// every sample committed exactly once.
#include <gtest/gtest.h>

#include <chrono>

#include "common/gpu/cuda_runtime.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;

const std::string kSrc = E3_SOURCE_DIR;

class GpuTransportsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuTransportsTest, TeacherOnOneGpuTrainsAStudentOnAnother) {
  const std::string transport = GetParam();
  const int gpus = CudaDeviceCount();
  if (gpus < 1) GTEST_SKIP() << "needs a GPU";
  // NCCL needs two ranks on two GPUs; CUDA IPC and shm also run on one.
  if (transport == "nccl" && gpus < 2) GTEST_SKIP() << "nccl needs two GPUs";
  const std::string student_gpu = gpus > 1 ? "cuda:1" : "cuda:0";

  const std::string dir = testing::ScratchDir("gpu_" + transport);
  Subprocess teacher({testing::TeacherBinary(), "--model_dir=" + kSrc + "/examples/tiny-code-llama",
                      "--data=" + kSrc + "/examples/data/train_conversations.jsonl", "--max_samples=400",
                      "--max_seq_len=512", "--tokens_per_batch=2048", "--draft_vocab_size=2048",
                      "--device=cuda:0", "--transports=" + transport, "--listen=127.0.0.1:0",
                      "--port_file=" + dir + "/port", "--ledger=" + dir + "/ledger.jsonl", "--exit_when_done"},
                     dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 120s)) << teacher.Log();
  const std::string port = testing::ReadPortFile(dir + "/port");
  Subprocess student({testing::StudentBinary(), "--teacher=127.0.0.1:" + port, "--device=" + student_gpu,
                      "--transports=" + transport, "--lr=2e-3", "--warmup_steps=2", "--log_every=10",
                      "--checkpoint_dir=" + dir + "/ckpt",
                      "--summary_json=" + dir + "/summary.json", "--output_dir=" + dir + "/export"},
                     dir + "/student.log");
  auto st = student.Wait(300s);
  ASSERT_TRUE(st.has_value()) << "student did not finish\n" << student.Log() << teacher.Log();
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << student.Log() << teacher.Log();
  auto tst = teacher.Wait(60s);
  ASSERT_TRUE(tst.has_value()) << "teacher did not exit when done\n" << teacher.Log();
  EXPECT_TRUE(WIFEXITED(*tst) && WEXITSTATUS(*tst) == 0) << teacher.Log();
  EXPECT_NE(teacher.Log().find("teacher: backend sgl on cuda:0"), std::string::npos)
      << "--backend=auto must pick sgl on a GPU\n" << teacher.Log();

  auto summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  std::printf("gpu e2e [%s]: %ld steps, %.0f tok/s, wait %.1f%%, loss %.3f -> %.3f, acc_0 %.3f -> %.3f\n",
              transport.c_str(), static_cast<long>(summary["steps"].get<int64_t>()),
              summary["tokens_per_second"].get<double>(), 100 * summary["data_wait_share"].get<double>(),
              summary["first"]["loss"].get<double>(), summary["last"]["loss"].get<double>(),
              summary["first"]["acc"][0].get<double>(), summary["last"]["acc"][0].get<double>());
  EXPECT_EQ(summary["transport"], transport);
  EXPECT_EQ(summary["device"], student_gpu);
  EXPECT_EQ(summary["dtype"], "bfloat16");
  EXPECT_NE(student.Log().find("with fp32 master weights"), std::string::npos) << student.Log();
  EXPECT_GE(summary["steps"].get<int64_t>(), 20);
  EXPECT_LT(summary["last"]["loss"].get<double>(), summary["first"]["loss"].get<double>());
  EXPECT_GT(summary["last"]["acc"][0].get<double>(), summary["first"]["acc"][0].get<double>());
  const std::string tlog = teacher.Log();
  EXPECT_NE(tlog.find("\"samples_committed_twice\":0"), std::string::npos) << tlog;
  EXPECT_NE(tlog.find("\"samples_never_committed\":0"), std::string::npos) << tlog;
}

INSTANTIATE_TEST_SUITE_P(Transports, GpuTransportsTest, ::testing::Values("nccl", "cuda_ipc", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace e3
