#include "common/torch/process_group.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef E3_HAS_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/loopback_host.h"

namespace e3 {
namespace {

absl::Status FromC10(const c10::Error& e, const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
}

class C10dPending : public PendingCollective {
 public:
  explicit C10dPending(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  absl::Status Wait() override {
    try {
      work_->wait();
    } catch (const c10::Error& e) {
      return FromC10(e, "c10d collective");
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("c10d collective: ", e.what()));
    }
    return absl::OkStatus();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
};

// `Backend` is ProcessGroupGloo (1.13: a c10d::ProcessGroup) or
// ProcessGroupNCCL (2.x: a c10d::Backend); both have the same collective
// methods, which is all this uses.
template <typename Backend>
class C10dProcessGroup : public ProcessGroup {
 public:
  C10dProcessGroup(c10::intrusive_ptr<c10d::Store> store, int store_port, c10::intrusive_ptr<Backend> pg, int rank,
                   int world)
      : store_(std::move(store)), store_port_(store_port), pg_(std::move(pg)), rank_(rank), world_(world) {}

  absl::StatusOr<std::unique_ptr<PendingCollective>> AllReduceSum(at::Tensor tensor) override {
    try {
      std::vector<at::Tensor> t = {std::move(tensor)};
      return std::unique_ptr<PendingCollective>(new C10dPending(pg_->allreduce(t)));
    } catch (const c10::Error& e) {
      return FromC10(e, "all-reduce");
    }
  }
  absl::Status AllGather(const at::Tensor& input, std::vector<at::Tensor>& outputs) override {
    try {
      std::vector<std::vector<at::Tensor>> out = {outputs};
      std::vector<at::Tensor> in = {input};
      return C10dPending(pg_->allgather(out, in)).Wait();
    } catch (const c10::Error& e) {
      return FromC10(e, "all-gather");
    }
  }
  absl::Status Broadcast(at::Tensor tensor, int root) override {
    try {
      std::vector<at::Tensor> t = {std::move(tensor)};
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      return C10dPending(pg_->broadcast(t, opts)).Wait();
    } catch (const c10::Error& e) {
      return FromC10(e, "broadcast");
    }
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int store_port() const override { return store_port_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int store_port_;
  c10::intrusive_ptr<Backend> pg_;
  int rank_, world_;
};

// The store the ranks meet through, and the port it listens on (0: a
// file, nothing listens).
struct Rendezvous {
  c10::intrusive_ptr<c10d::Store> store;
  int port = 0;
};

Rendezvous OpenStore(const ProcessGroupOptions& o, std::chrono::milliseconds timeout) {
  if (!o.rendezvous_file.empty()) {
    auto file = c10::make_intrusive<c10d::FileStore>(o.rendezvous_file, o.world_size);
    file->setTimeout(timeout);
    return {file, 0};
  }
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(o.master_port);
  so.isServer = o.rank == 0;
  so.numWorkers = static_cast<size_t>(o.world_size);
  so.timeout = timeout;
  auto tcp = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
  const int port = tcp->getPort();
  return {tcp, port};
}

}  // namespace

std::string DescribeRendezvous(const ProcessGroupOptions& o) {
  return o.rendezvous_file.empty() ? absl::StrCat("at ", o.master_addr, ":", o.master_port)
                                   : absl::StrCat("through ", o.rendezvous_file);
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(const ProcessGroupOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("process group: rank ", o.rank, " outside world size ", o.world_size));
  }
  if (o.master_port < 0 || o.master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("process group: master port ", o.master_port));
  }
  const std::chrono::milliseconds timeout(absl::ToInt64Milliseconds(o.timeout));
  try {
    Rendezvous rendezvous = OpenStore(o, timeout);
    auto& store = rendezvous.store;
#ifdef E3_HAS_CUDA
    if (!o.cuda) {
      return absl::UnimplementedError(
          "process group on CPU tensors needs Gloo, whose headers this (pip) LibTorch lacks; train on GPUs");
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, o.rank, o.world_size);
    return std::unique_ptr<ProcessGroup>(
        new C10dProcessGroup<c10d::ProcessGroupNCCL>(store, rendezvous.port, pg, o.rank, o.world_size));
#else
    if (o.cuda) {
      return absl::UnimplementedError("process group on GPU tensors needs NCCL: this LibTorch has no CUDA");
    }
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->timeout = timeout;
    // Ranks that meet on loopback are on this machine: their Gloo pairs
    // listen there too, not on the address the host name resolves to.
    opts->devices.push_back(IsLoopbackHost(o.master_addr)
                                ? c10d::ProcessGroupGloo::createDeviceForHostname(o.master_addr)
                                : c10d::ProcessGroupGloo::createDefaultDevice());
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world_size, opts);
    return std::unique_ptr<ProcessGroup>(
        new C10dProcessGroup<c10d::ProcessGroupGloo>(store, rendezvous.port, pg, o.rank, o.world_size));
#endif
  } catch (const c10::Error& e) {
    return FromC10(e, absl::StrCat("process group rendezvous ", DescribeRendezvous(o)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("process group rendezvous ", DescribeRendezvous(o), ": ", e.what()));
  }
}

}  // namespace e3
