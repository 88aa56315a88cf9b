#include "student_trainer/optim/data_parallel.h"

#include <cstdio>

#include "common/base/status_macros.h"

namespace e3 {

absl::StatusOr<std::unique_ptr<ProcessGroup>> JoinDataParallelGroup(const LaunchEnv& launch,
                                                                    const at::Device& device) {
  if (launch.world_size <= 1) return nullptr;
  ProcessGroupOptions po;
  po.master_addr = launch.master_addr;
  po.master_port = launch.master_port;
  po.rendezvous_file = launch.rendezvous_file;
  po.rank = launch.rank;
  po.world_size = launch.world_size;
  po.cuda = device.is_cuda();
  E3_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> group, ProcessGroup::Create(po));
  std::printf("student[%d]: data parallel over %d ranks (c10d %s %s)\n", launch.rank,
              launch.world_size, device.is_cuda() ? "NCCL" : "Gloo", DescribeRendezvous(po).c_str());
  return group;
}

absl::Status BroadcastTrainedWeights(ProcessGroup* group, DraftModel& trained,
                                     DraftOptimizer& optimizer) {
  if (group != nullptr) {
    torch::NoGradGuard no_grad;
    for (const at::Tensor& p : trained.parameters())
      E3_RETURN_IF_ERROR(group->Broadcast(p.detach(), 0));
  }
  optimizer.SyncWorkingWeights();
  return absl::OkStatus();
}

absl::StatusOr<bool> AgreeWithRank0(ProcessGroup* group, const at::Device& device, bool value) {
  if (group == nullptr) return value;
  // A broadcast of one element: NCCL needs a tensor on the device.
  at::Tensor flag = torch::full({1}, value ? 1.0 : 0.0, torch::TensorOptions().device(device));
  E3_RETURN_IF_ERROR(group->Broadcast(flag, 0));
  return flag.item<double>() != 0.0;
}

absl::StatusOr<bool> AnyRank(ProcessGroup* group, bool local, const at::Device& device) {
  if (group == nullptr) return local;
  at::Tensor flag = torch::full({1}, local ? 1.0f : 0.0f, torch::TensorOptions().device(device));
  E3_ASSIGN_OR_RETURN(std::unique_ptr<PendingCollective> sum, group->AllReduceSum(flag));
  E3_RETURN_IF_ERROR(sum->Wait());
  return flag.item<float>() > 0;
}

}  // namespace e3
