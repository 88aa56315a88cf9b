// The NCCL point-to-point channel between two GPUs: a teacher thread on GPU
// 0 and a student thread on GPU 1 join one communicator from a unique id,
// move payloads of several sizes in order, and a receiver that never shows
// up makes the sender fail within its timeout instead of hanging.
#include "common/gpu/nccl_channel.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "common/gpu/cuda_runtime.h"

namespace e3 {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 131 + (i >> 9));
  return v;
}

class NcclChannelGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs two GPUs";
  }
};

TEST_F(NcclChannelGpuTest, MovesPayloadsInOrderBetweenTwoGpus) {
  auto id = NcclChannel::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const std::vector<size_t> sizes = {1, 4096, 3 << 20, 64 << 20};
  absl::Status teacher_status, student_status;
  std::vector<std::vector<uint8_t>> received(sizes.size());

  std::thread teacher([&] {
    auto ch = NcclChannel::Create(*id, NcclChannel::kTeacherRank, 0);
    if (!ch.ok()) {
      teacher_status = ch.status();
      return;
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto host = Pattern(sizes[i], static_cast<uint8_t>(i));
      void* dev = nullptr;
      cudaSetDevice(0);
      cudaMalloc(&dev, sizes[i]);
      cudaMemcpy(dev, host.data(), sizes[i], cudaMemcpyHostToDevice);
      teacher_status = (*ch)->Send(dev, sizes[i], absl::Seconds(60));
      cudaFree(dev);
      if (!teacher_status.ok()) return;
    }
  });
  std::thread student([&] {
    auto ch = NcclChannel::Create(*id, NcclChannel::kStudentRank, 1);
    if (!ch.ok()) {
      student_status = ch.status();
      return;
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      void* dev = nullptr;
      cudaSetDevice(1);
      cudaMalloc(&dev, sizes[i]);
      student_status = (*ch)->Recv(dev, sizes[i], absl::Seconds(60));
      if (!student_status.ok()) return;
      received[i].resize(sizes[i]);
      cudaMemcpy(received[i].data(), dev, sizes[i], cudaMemcpyDeviceToHost);
      cudaFree(dev);
    }
  });
  teacher.join();
  student.join();
  ASSERT_TRUE(teacher_status.ok()) << teacher_status;
  ASSERT_TRUE(student_status.ok()) << student_status;
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(received[i] == Pattern(sizes[i], static_cast<uint8_t>(i))) << "payload " << i << " differs";
  }
}

TEST_F(NcclChannelGpuTest, SenderGivesUpWhenTheReceiverNeverPosts) {
  auto id = NcclChannel::NewUniqueId();
  ASSERT_TRUE(id.ok());
  absl::Status send_status;
  std::thread teacher([&] {
    auto ch = NcclChannel::Create(*id, NcclChannel::kTeacherRank, 0);
    ASSERT_TRUE(ch.ok()) << ch.status();
    void* dev = nullptr;
    cudaSetDevice(0);
    cudaMalloc(&dev, 1 << 20);
    const absl::Time t0 = absl::Now();
    send_status = (*ch)->Send(dev, 1 << 20, absl::Seconds(2));
    EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
    ch->reset();  // aborts the stuck send
    cudaFree(dev);
  });
  // The student joins the communicator but never receives.
  auto ch = NcclChannel::Create(*id, NcclChannel::kStudentRank, 1);
  ASSERT_TRUE(ch.ok()) << ch.status();
  ASSERT_TRUE((*ch)->WaitReady(absl::Seconds(60)).ok());
  teacher.join();
  EXPECT_EQ(send_status.code(), absl::StatusCode::kDeadlineExceeded) << send_status;
}

TEST_F(NcclChannelGpuTest, JoiningAloneTimesOutAndCancelReturnsAtOnce) {
  auto id = NcclChannel::NewUniqueId();
  ASSERT_TRUE(id.ok());
  auto ch = NcclChannel::Create(*id, NcclChannel::kTeacherRank, 0);
  ASSERT_TRUE(ch.ok()) << ch.status();
  absl::Status st = (*ch)->WaitReady(absl::Seconds(1));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;

  auto id2 = NcclChannel::NewUniqueId();
  auto ch2 = NcclChannel::Create(*id2, NcclChannel::kStudentRank, 1);
  ASSERT_TRUE(ch2.ok());
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    (*ch2)->Cancel();
  });
  const absl::Time t0 = absl::Now();
  st = (*ch2)->WaitReady(absl::Seconds(60));
  canceller.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

// Memory a LibTorch allocator hands out may still be written by kernels
// queued on the default stream by its previous owner. A receive into it must
// land after them: queue ~100 ms of work on the legacy default stream, then
// a write into the receive buffer, then receive; the received bytes win.
TEST_F(NcclChannelGpuTest, ReceiveLandsAfterWorkQueuedOnTheDefaultStream) {
  auto id = NcclChannel::NewUniqueId();
  ASSERT_TRUE(id.ok());
  constexpr size_t kBytes = 8 << 20;
  absl::Status teacher_status;
  std::thread teacher([&] {
    auto ch = NcclChannel::Create(*id, NcclChannel::kTeacherRank, 0);
    ASSERT_TRUE(ch.ok()) << ch.status();
    auto host = Pattern(kBytes, 5);
    void* dev = nullptr;
    cudaSetDevice(0);
    cudaMalloc(&dev, kBytes);
    cudaMemcpy(dev, host.data(), kBytes, cudaMemcpyHostToDevice);
    teacher_status = (*ch)->Send(dev, kBytes, absl::Seconds(60));
    cudaFree(dev);
  });
  auto ch = NcclChannel::Create(*id, NcclChannel::kStudentRank, 1);
  ASSERT_TRUE(ch.ok()) << ch.status();
  ASSERT_TRUE((*ch)->WaitReady(absl::Seconds(60)).ok());
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  void* big = nullptr;
  void* dst = nullptr;
  ASSERT_EQ(cudaMalloc(&big, size_t{1} << 30), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, kBytes), cudaSuccess);
  for (int i = 0; i < 200; ++i) cudaMemsetAsync(big, i, size_t{1} << 30, cudaStreamLegacy);
  cudaMemsetAsync(dst, 0xAB, kBytes, cudaStreamLegacy);  // the previous owner's last write
  ASSERT_TRUE((*ch)->Recv(dst, kBytes, absl::Seconds(60)).ok());
  std::vector<uint8_t> got(kBytes);
  cudaMemcpy(got.data(), dst, kBytes, cudaMemcpyDeviceToHost);
  teacher.join();
  ASSERT_TRUE(teacher_status.ok()) << teacher_status;
  EXPECT_TRUE(got == Pattern(kBytes, 5)) << "a write queued before the receive landed after it";
  cudaFree(big);
  cudaFree(dst);
}

TEST(NcclChannelArgsTest, RejectsBadIdsRanksAndDevices) {
  if (!CudaRuntimeAvailable()) GTEST_SKIP() << "needs a GPU";
  EXPECT_EQ(NcclChannel::Create("short", 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  auto id = NcclChannel::NewUniqueId();
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(NcclChannel::Create(*id, 2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclChannel::Create(*id, 0, 99).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace e3
