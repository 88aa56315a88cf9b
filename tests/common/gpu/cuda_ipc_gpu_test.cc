// CUDA IPC between two real processes: this test (the teacher) writes a
// payload into a pool buffer on GPU 0 and re-runs its own binary as the
// student, which maps the buffer by its handle, copies it to its own GPU
// (1 when there are two, else 0) and checks every byte. The pool reuses a
// released buffer (same handle), so a student maps each buffer once.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/gpu/cuda_ipc.h"
#include "common/gpu/cuda_runtime.h"
#include "common/gpu/device_pool.h"
#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed ^ (i * 167 + (i >> 11)));
  return v;
}

// The student's half, run in a child process (E3_IPC_CHILD names the job
// file). Each line: hex handle, offset, bytes, seed, start: the bytes must
// equal Pattern(start + bytes, seed)[start:].
TEST(CudaIpcGpuTest, ChildRole) {
  const char* job = std::getenv("E3_IPC_CHILD");
  if (job == nullptr) GTEST_SKIP() << "runs only as the child of TeacherToStudentAcrossProcesses";
  const int device = CudaDeviceCount() > 1 ? 1 : 0;
  CudaIpcImporter importer(device);
  std::ifstream in(job);
  std::string hex;
  size_t offset = 0, bytes = 0, start = 0;
  int seed = 0, jobs = 0;
  while (in >> hex >> offset >> bytes >> seed >> start) {
    void* dst = nullptr;
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dst, bytes), cudaSuccess);
    absl::Status st = importer.CopyOut(absl::HexStringToBytes(hex), offset, bytes, dst);
    ASSERT_TRUE(st.ok()) << st;
    std::vector<uint8_t> got(bytes);
    cudaMemcpy(got.data(), dst, bytes, cudaMemcpyDeviceToHost);
    cudaFree(dst);
    auto want = Pattern(start + bytes, static_cast<uint8_t>(seed));
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + start)) << "job " << jobs;
    ++jobs;
  }
  EXPECT_EQ(jobs, 3);
  // Jobs 0 and 1 read the same buffer: it is mapped once.
  EXPECT_EQ(importer.mapped_buffers(), 2u);
}

TEST(CudaIpcGpuTest, TeacherToStudentAcrossProcesses) {
  if (std::getenv("E3_IPC_CHILD") != nullptr) GTEST_SKIP();
  if (!CudaRuntimeAvailable()) GTEST_SKIP() << "needs a GPU";
  auto pool = DevicePool::Create(0);
  ASSERT_TRUE(pool.ok()) << pool.status();

  // Payloads of two tensors: 7 id bytes, then the rest at offset 64.
  auto make = [&](size_t n, uint8_t seed) {
    auto host = Pattern(n, seed);
    std::vector<PayloadSource> src = {{"ids", DType::kU8, {7}, host.data(), 7},
                                      {"body", DType::kU8, {static_cast<int64_t>(n - 7)}, host.data() + 7, n - 7}};
    auto p = BuildDevicePayload(TransportKind::kCudaIpc, src, **pool);
    EXPECT_TRUE(p.ok()) << p.status();
    return std::move(p).value();
  };
  auto a = make(5 << 20, 1);
  ASSERT_EQ(a->tensors()[1].offset, 64u);
  const std::string first_handle = a->device_memory()->ipc_handle();
  auto b = make(9 << 20, 2);  // a second buffer, as the first is held
  EXPECT_NE(b->device_memory()->ipc_handle(), first_handle);
  a.reset();                  // releases the first buffer to the pool
  auto c = make(3 << 20, 3);  // the smallest free buffer that fits: the first
  EXPECT_EQ(c->device_memory()->ipc_handle(), first_handle);
  EXPECT_EQ((*pool)->buffers(), 2u);
  EXPECT_EQ(BuildDevicePayload(TransportKind::kShm, {}, **pool).status().code(), absl::StatusCode::kInvalidArgument);

  auto dir = MakeTempDir("e3-ipc");
  ASSERT_TRUE(dir.ok());
  const std::string job = *dir + "/jobs.txt";
  {
    std::ofstream out(job);
    const std::string hc = absl::BytesToHexString(c->device_memory()->ipc_handle());
    const std::string hb = absl::BytesToHexString(b->device_memory()->ipc_handle());
    out << hc << " 0 7 3 0\n";
    out << hc << " 64 " << (3 << 20) - 7 << " 3 7\n";
    out << hb << " 64 " << (9 << 20) - 7 << " 2 7\n";
  }
  ::setenv("E3_IPC_CHILD", job.c_str(), 1);
  testing::Subprocess child({"/proc/self/exe", "--gtest_filter=CudaIpcGpuTest.ChildRole"}, *dir + "/child.log");
  ::unsetenv("E3_IPC_CHILD");
  auto status = child.Wait(std::chrono::seconds(120));
  ASSERT_TRUE(status.has_value()) << "the student process did not finish";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << child.Log();
  EXPECT_NE(child.Log().find("[  PASSED  ] 1 test"), std::string::npos) << child.Log();
}

}  // namespace
}  // namespace e3
