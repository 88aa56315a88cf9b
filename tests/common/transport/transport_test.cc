#include "common/transport/transport.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/transport/shm_segment.h"

namespace e3 {
namespace {

using K = TransportKind;

TEST(TransportTest, PicksTheFastestCommonTransportThePlacementAllows) {
  const std::vector<K> all = {K::kInline, K::kShm, K::kCudaIpc, K::kNccl};
  Placement cpu_same_host{true, false, false};
  EXPECT_EQ(*NegotiateTransport(all, all, cpu_same_host), K::kShm);
  Placement cpu_remote{false, false, false};
  EXPECT_EQ(*NegotiateTransport(all, all, cpu_remote), K::kInline);
  Placement gpu_same_host{true, true, true, /*nccl_unique_id=*/true};
  EXPECT_EQ(*NegotiateTransport(all, all, gpu_same_host), K::kNccl);
  // Without the student's NCCL unique id, CUDA IPC is the best on one host.
  Placement gpu_no_id{true, true, true, false};
  EXPECT_EQ(*NegotiateTransport(all, all, gpu_no_id), K::kCudaIpc);
  EXPECT_EQ(*NegotiateTransport(all, {K::kInline, K::kShm, K::kCudaIpc}, gpu_same_host), K::kCudaIpc);
  Placement gpu_remote{false, true, true, true};
  EXPECT_EQ(*NegotiateTransport({K::kInline, K::kCudaIpc, K::kNccl}, all, gpu_remote), K::kNccl);
  // Teacher and student sharing one GPU: NCCL cannot, CUDA IPC can.
  Placement one_gpu{true, true, true, true, /*same_gpu=*/true};
  EXPECT_EQ(*NegotiateTransport(all, all, one_gpu), K::kCudaIpc);
  auto refused = NegotiateTransport({K::kNccl}, all, one_gpu);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("two ranks on one GPU"), std::string::npos) << refused.status();
  // A GPU teacher feeding a CPU student falls back to shm on one host.
  Placement mixed{true, true, false};
  EXPECT_EQ(*NegotiateTransport(all, all, mixed), K::kShm);
  // The student's list order does not matter, only membership.
  EXPECT_EQ(*NegotiateTransport(all, {K::kShm, K::kInline}, cpu_same_host), K::kShm);
}

TEST(TransportTest, NoCommonTransportExplainsWhy) {
  auto r = NegotiateTransport({K::kShm}, {K::kShm, K::kCudaIpc}, Placement{false, true, true});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("teacher offers [shm]"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("shm needs both on one host"), std::string::npos);
  EXPECT_FALSE(NegotiateTransport({K::kNccl}, {K::kInline}, Placement{true, false, false}).ok());
  auto no_id = NegotiateTransport({K::kNccl}, {K::kNccl}, Placement{false, true, true, false});
  ASSERT_FALSE(no_id.ok());
  EXPECT_NE(no_id.status().message().find("nccl needs the student's NCCL unique id"), std::string::npos)
      << no_id.status();
  auto cpu_student = NegotiateTransport({K::kCudaIpc}, {K::kCudaIpc}, Placement{true, true, false, true});
  ASSERT_FALSE(cpu_student.ok());
  EXPECT_NE(cpu_student.status().message().find("cuda_ipc needs both on GPUs"), std::string::npos);
}

TEST(TransportTest, ParsesLists) {
  auto l = ParseTransportList("shm, inline");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(*l, (std::vector<K>{K::kShm, K::kInline}));
  auto bad = ParseTransportList("shm,rdma");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"rdma\""), std::string::npos);
  EXPECT_FALSE(ParseTransportList("").ok());
}

TEST(ShmSegmentTest, CreateOpenReadAndUnlink) {
  const std::string name = "/e3-test-" + std::to_string(::getpid());
  {
    auto seg = ShmSegment::Create(name, 4096);
    ASSERT_TRUE(seg.ok()) << seg.status();
    for (int i = 0; i < 4096; ++i) (*seg)->data()[i] = static_cast<uint8_t>(i * 7);
    auto reader = ShmSegment::Open(name, 4096);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->data()[4095], static_cast<uint8_t>(4095 * 7));
    EXPECT_FALSE(ShmSegment::Open(name, 8192).ok());  // smaller than described
    EXPECT_FALSE(ShmSegment::Create(name, 16).ok());  // exclusive
  }
  // The creator's destruction unlinked it.
  auto gone = ShmSegment::Open(name, 1);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(ShmSegment::Create("no-slash", 16).ok());
}

}  // namespace
}  // namespace e3
