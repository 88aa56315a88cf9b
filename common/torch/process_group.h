// The c10d process group the student's data parallelism runs on:
// ProcessGroupGloo for CPU tensors (Debian's LibTorch ships Gloo),
// ProcessGroupNCCL for GPU tensors (pip's CUDA LibTorch; it ships no Gloo
// headers). Rendezvous through a c10d TCPStore at master_addr:master_port
// (rank 0 listens on every interface), or a FileStore at a path the ranks
// share (nothing listens). Collectives are c10d's own;
// this wrapper only hides the 1.13 / 2.x class differences and turns
// exceptions into statuses.
#ifndef E3_COMMON_TORCH_PROCESS_GROUP_H_
#define E3_COMMON_TORCH_PROCESS_GROUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/torch/torch_core.h"

namespace e3 {

struct ProcessGroupOptions {
  // A loopback address also keeps Gloo's own connections on loopback
  // (whatever the store), instead of the address the host name resolves to.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // rank 0 listens here (0: any free port, for tests)
  // Non-empty: rendezvous through a c10d FileStore at this path instead of
  // the TCPStore: every rank on this machine, or on a filesystem they all
  // see. The path must be new to this group: a file an earlier group left
  // (a killed run) holds that group's keys, which would mislead this one.
  std::string rendezvous_file;
  int rank = 0;
  int world_size = 1;
  bool cuda = false;  // NCCL for GPU tensors, else Gloo
  absl::Duration timeout = absl::Minutes(5);
};

// A collective in flight.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual absl::Status Wait() = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  // Rank 0 creates the store; the others connect to it.
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Create(const ProcessGroupOptions& options);

  // Sum over ranks, in place.
  virtual absl::StatusOr<std::unique_ptr<PendingCollective>> AllReduceSum(at::Tensor tensor) = 0;
  // Every rank's `input`, in rank order, into `outputs` (world_size tensors
  // shaped like `input`, allocated by the caller).
  virtual absl::Status AllGather(const at::Tensor& input, std::vector<at::Tensor>& outputs) = 0;
  // `root`'s values, in place on every rank.
  virtual absl::Status Broadcast(at::Tensor tensor, int root) = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The TCPStore port rank 0 listens on (useful with master_port 0); 0
  // with a FileStore.
  virtual int store_port() const = 0;
};

// Where `options` meet, for messages: "at 127.0.0.1:29500" or "through
// <file>".
std::string DescribeRendezvous(const ProcessGroupOptions& options);

}  // namespace e3

#endif  // E3_COMMON_TORCH_PROCESS_GROUP_H_
