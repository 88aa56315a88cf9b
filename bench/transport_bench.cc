// Hidden-state transfer between two GPUs of one host, GB/s per transport,
// against the named baseline measured in the same run: c10d's
// ProcessGroupNCCL send/recv of the same bytes (the anchor: 370 GB/s for
// 1 GiB over NV18 on nvidia-h200-x2).
//
// The process forks at start (before any CUDA call): the parent is the
// teacher on GPU 0, the child the student on GPU 1. They meet on a c10d
// TCPStore, which also carries the NCCL unique id and the IPC handles.
// Each transport moves `--iters` payloads per size; the student's clock
// gives the rate (bytes received / time from the first receive posted to
// the last byte landed in its GPU memory).
//
//   transports measured
//   c10d_nccl   baseline: ProcessGroupNCCL send/recv
//   nccl        our NcclChannel (the teacher's NCCL transport)
//   cuda_ipc    the teacher's pool buffer, mapped and copied out by the student
//   shm         device -> POSIX shm -> device (the host fallback's copies)
//   inline      device -> host -> a BatchDescriptor's inline bytes on a real
//               gRPC Subscribe stream over loopback -> host -> device
//
//   ./build/bench/transport_bench --sizes_mib=64,256,1024
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/gpu/cuda_ipc.h"
#include "common/gpu/cuda_runtime.h"
#include "common/gpu/device_pool.h"
#include "common/gpu/nccl_channel.h"
#include "common/torch/torch_core.h"
#include "common/transport/shm_segment.h"
#include "proto/teacher.grpc.pb.h"

ABSL_FLAG(std::string, sizes_mib, "64,256,1024", "payload sizes in MiB");
ABSL_FLAG(int, iters, 10, "payloads per size and transport");
ABSL_FLAG(int, port, 29611, "TCPStore port on 127.0.0.1");

namespace e3 {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string Str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

void Check(const absl::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(st.message()).c_str());
    std::exit(1);
  }
}

// The teacher's side of the inline path: a TeacherService whose Subscribe
// streams `iters` descriptors, each carrying the payload as inline bytes
// copied from GPU memory, as the real teacher does for the CPU fallback.
class InlineTeacher final : public v1::TeacherService::CallbackService {
 public:
  InlineTeacher(const at::Tensor* source, size_t bytes, int iters) : source_(source), bytes_(bytes), iters_(iters) {}
  grpc::ServerWriteReactor<v1::BatchDescriptor>* Subscribe(grpc::CallbackServerContext*,
                                                           const v1::SubscribeRequest*) override {
    class Writer : public grpc::ServerWriteReactor<v1::BatchDescriptor> {
     public:
      explicit Writer(InlineTeacher* t) : t_(t) { Next(); }
      void OnWriteDone(bool ok) override {
        if (!ok) return Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
        Next();
      }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (sent_ == t_->iters_) return Finish(grpc::Status::OK);
        msg_.Clear();
        msg_.set_batch_id(sent_++);
        v1::TensorRef* ref = msg_.add_tensors();
        ref->set_name("aux_hidden");
        ref->set_dtype(v1::DTYPE_U8);
        ref->add_shape(static_cast<int64_t>(t_->bytes_));
        std::string* data = ref->mutable_inline_data();
        data->resize(t_->bytes_);
        Check(CudaCopy(data->data(), t_->source_->data_ptr(), t_->bytes_, 0), "inline d2h");
        StartWrite(&msg_);
      }
      InlineTeacher* t_;
      int sent_ = 0;
      v1::BatchDescriptor msg_;
    };
    return new Writer(this);
  }

 private:
  const at::Tensor* source_;
  size_t bytes_;
  int iters_;
};

class Bench {
 public:
  Bench(int rank, c10::intrusive_ptr<c10d::Store> store) : rank_(rank), store_(std::move(store)) {
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank_));
    pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, rank_, 2);
  }

  void Barrier(const std::string& name) {
    store_->set(absl::StrCat(name, "/", rank_), Bytes("1"));
    store_->wait({absl::StrCat(name, "/0"), absl::StrCat(name, "/1")});
  }

  // Returns the student's GB/s (rank 1) or 0 (rank 0).
  double Run(const std::string& transport, size_t bytes, int iters) {
    at::Tensor buf = torch::full({static_cast<int64_t>(bytes)}, rank_ == 0 ? 7 : 0,
                                 torch::TensorOptions().dtype(torch::kUInt8).device(device_));
    torch::cuda::synchronize();
    const std::string key = absl::StrCat(transport, "/", bytes);
    double seconds = 0;
    if (transport == "c10d_nccl") {
      std::vector<at::Tensor> t = {buf};
      Barrier(key);
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        auto w = rank_ == 0 ? pg_->send(t, 1, 0) : pg_->recv(t, 0, 0);
        w->wait();
      }
      torch::cuda::synchronize();
      seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    } else if (transport == "nccl") {
      if (nccl_ == nullptr) {
        if (rank_ == 1) {
          auto id = NcclChannel::NewUniqueId();
          Check(id.status(), "nccl id");
          store_->set("nccl_id", Bytes(*id));
        }
        auto ch = NcclChannel::Create(Str(store_->get("nccl_id")), rank_, rank_);
        Check(ch.status(), "nccl channel");
        nccl_ = std::move(ch).value();
        Check(nccl_->WaitReady(absl::Seconds(60)), "nccl join");
      }
      Barrier(key);
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        Check(rank_ == 0 ? nccl_->Send(buf.data_ptr(), bytes, absl::Seconds(60))
                         : nccl_->Recv(buf.data_ptr(), bytes, absl::Seconds(60)),
              "nccl transfer");
      }
      seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    } else if (transport == "cuda_ipc") {
      std::shared_ptr<DeviceMemory> held;
      if (rank_ == 0) {
        if (pool_ == nullptr) pool_ = *DevicePool::Create(0);
        auto mem = pool_->Acquire(bytes);
        Check(mem.status(), "pool");
        held = *mem;
        Check(CudaCopy(held->data(), buf.data_ptr(), bytes, 0), "fill");
        store_->set(key + "/handle", Bytes(held->ipc_handle()));
      }
      if (rank_ == 1 && ipc_ == nullptr) ipc_ = std::make_unique<CudaIpcImporter>(1);
      const std::string handle = Str(store_->get(key + "/handle"));
      if (rank_ == 1) Check(ipc_->CopyOut(handle, 0, bytes, buf.data_ptr()), "ipc warm-up");  // maps once
      Barrier(key);
      auto t0 = Clock::now();
      for (int i = 0; rank_ == 1 && i < iters; ++i) Check(ipc_->CopyOut(handle, 0, bytes, buf.data_ptr()), "ipc copy");
      seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      Barrier(key + "/done");  // the teacher keeps its buffer until the student is done
    } else if (transport == "inline") {
      // The teacher serves; the student subscribes and copies each
      // descriptor's inline bytes to its GPU.
      std::unique_ptr<InlineTeacher> service;
      std::unique_ptr<grpc::Server> server;
      if (rank_ == 0) {
        service = std::make_unique<InlineTeacher>(&buf, bytes, iters);
        int port = 0;
        grpc::ServerBuilder builder;
        builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
        builder.SetMaxSendMessageSize(-1);
        builder.RegisterService(service.get());
        server = builder.BuildAndStart();
        store_->set(key + "/port", Bytes(std::to_string(port)));
      }
      const std::string port = Str(store_->get(key + "/port"));
      Barrier(key);
      auto t0 = Clock::now();
      if (rank_ == 1) {
        grpc::ChannelArguments args;
        args.SetMaxReceiveMessageSize(-1);
        auto channel = grpc::CreateCustomChannel("127.0.0.1:" + port, grpc::InsecureChannelCredentials(), args);
        auto stub = v1::TeacherService::NewStub(channel);
        grpc::ClientContext ctx;
        v1::SubscribeRequest req;
        auto reader = stub->Subscribe(&ctx, req);
        v1::BatchDescriptor d;
        int got = 0;
        while (reader->Read(&d)) {
          const std::string& data = d.tensors(0).inline_data();
          Check(CudaCopy(buf.data_ptr(), data.data(), data.size(), 1), "inline h2d");
          ++got;
        }
        const grpc::Status st = reader->Finish();
        if (!st.ok()) Check(absl::UnavailableError(st.error_message()), "inline stream");
        if (got != iters) Check(absl::DataLossError(absl::StrCat(got, " of ", iters, " payloads")), "inline");
      }
      seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      Barrier(key + "/done");
      if (server) server->Shutdown();
    } else if (transport == "shm") {
      std::unique_ptr<ShmSegment> seg;
      if (rank_ == 0) {
        auto s = ShmSegment::Create(absl::StrCat("/e3tb-", bytes), bytes);
        Check(s.status(), "shm create");
        seg = std::move(s).value();
        seg->set_unlink_on_destroy(true);
      }
      Barrier(key + "/created");
      if (rank_ == 1) {
        auto s = ShmSegment::Open(absl::StrCat("/e3tb-", bytes), bytes);
        Check(s.status(), "shm open");
        seg = std::move(s).value();
      }
      // One payload = teacher device->shm, then student shm->device, in
      // turn (the host fallback's two copies; time on both clocks).
      double mine = 0;
      for (int i = 0; i < iters; ++i) {
        if (rank_ == 0) {
          auto t0 = Clock::now();
          Check(CudaCopy(seg->data(), buf.data_ptr(), bytes, 0), "d2h");
          mine += std::chrono::duration<double>(Clock::now() - t0).count();
          Barrier(absl::StrCat(key, "/w", i));
          Barrier(absl::StrCat(key, "/r", i));
        } else {
          Barrier(absl::StrCat(key, "/w", i));
          auto t0 = Clock::now();
          Check(CudaCopy(buf.data_ptr(), seg->data(), bytes, 1), "h2d");
          mine += std::chrono::duration<double>(Clock::now() - t0).count();
          Barrier(absl::StrCat(key, "/r", i));
        }
      }
      if (rank_ == 0) store_->set(key + "/d2h", Bytes(std::to_string(mine)));
      seconds = mine + (rank_ == 1 ? std::stod(Str(store_->get(key + "/d2h"))) : 0);
    }
    if (rank_ == 1) {
      // Every byte landed: the first and last bytes equal the teacher's fill.
      auto ends = buf.index({torch::indexing::Slice(0, 1)}).cpu().item<int>() +
                  buf.index({torch::indexing::Slice(bytes - 1, bytes)}).cpu().item<int>();
      if (ends != 14) {
        std::fprintf(stderr, "%s: payload did not arrive intact\n", transport.c_str());
        std::exit(1);
      }
    }
    Barrier(key + "/end");
    return rank_ == 1 ? static_cast<double>(bytes) * iters / seconds / 1e9 : 0;
  }

 private:
  int rank_;
  torch::Device device_{torch::kCPU};
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  std::unique_ptr<NcclChannel> nccl_;
  std::shared_ptr<DevicePool> pool_;
  std::unique_ptr<CudaIpcImporter> ipc_;
};

int Main(int rank) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(absl::GetFlag(FLAGS_port));
  so.isServer = rank == 0;
  so.numWorkers = 2;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  Bench bench(rank, store);
  const int iters = absl::GetFlag(FLAGS_iters);
  const std::vector<std::string> transports = {"c10d_nccl", "nccl", "cuda_ipc", "shm", "inline"};
  if (rank == 1) {
    std::printf("%-10s %10s %12s %14s %8s\n", "size", "transport", "GB/s", "c10d GB/s", "ratio");
  }
  // Warm every path once at a small size (communicator setup, mappings).
  for (const auto& t : transports) bench.Run(t, 1 << 20, 2);
  for (const std::string& mib : std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_sizes_mib), ','))) {
    const size_t bytes = static_cast<size_t>(std::stoll(mib)) << 20;
    std::map<std::string, double> rate;
    for (const auto& t : transports) rate[t] = bench.Run(t, bytes, iters);
    if (rank == 1) {
      for (const auto& t : transports) {
        std::printf("%7s MiB %10s %12.1f %14.1f %8.2f\n", mib.c_str(), t.c_str(), rate[t], rate["c10d_nccl"],
                    rate[t] / rate["c10d_nccl"]);
        std::printf("{\"bench\":\"transport\",\"transport\":\"%s\",\"bytes\":%zu,\"gb_per_s\":%.2f,"
                    "\"baseline\":\"c10d_nccl_send_recv\",\"baseline_gb_per_s\":%.2f,\"ratio\":%.3f}\n",
                    t.c_str(), bytes, rate[t], rate["c10d_nccl"], rate[t] / rate["c10d_nccl"]);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace e3

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Fork before any CUDA call: the child is the student on GPU 1.
  const pid_t child = ::fork();
  if (child == 0) return e3::Main(1);
  const int rc = e3::Main(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
