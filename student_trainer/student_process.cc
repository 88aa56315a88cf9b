#include "student_trainer/student_process.h"

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/torch/torch_core.h"

namespace e3 {
namespace {

absl::StatusOr<LaunchEnv> ResolveLaunch(const StudentsSettings& s, const EnvLookup& env) {
  LaunchFlags flags;
  flags.rank = static_cast<int>(s.rank);
  flags.world_size = s.world_size > 0 ? static_cast<int>(s.world_size) : -1;
  flags.master_addr = s.master_addr;
  flags.master_port = static_cast<int>(s.master_port);
  flags.rendezvous_file = s.rendezvous_file;
  return ResolveLaunchEnv(flags, env);
}

std::string HostName() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

absl::StatusOr<StudentProcess> ResolveStudentProcess(const RunConfig& config, const EnvLookup& env,
                                                     const std::atomic<bool>* stop) {
  const StudentsSettings& s = config.students;
  StudentProcess p;
  p.teachers = absl::StrSplit(s.teacher, ',', absl::SkipWhitespace());
  if (p.teachers.empty()) return absl::InvalidArgumentError("--teacher (students.teacher) is empty");
  E3_ASSIGN_OR_RETURN(p.launch, ResolveLaunch(s, env));
  E3_ASSIGN_OR_RETURN(p.layout, ParallelLayout::DataParallel(p.launch.rank, p.launch.world_size));
  p.subscriber_id = s.subscriber_id.empty() ? absl::StrCat("rank-", p.launch.rank) : s.subscriber_id;
  p.device = s.device;
  if (p.device.empty()) {
    // torchrun's LOCAL_RANK picks the GPU; without one, the CPU.
    p.device = p.launch.local_rank >= 0 && torch::cuda::is_available() ? absl::StrCat("cuda:", p.launch.local_rank)
                                                                        : "cpu";
  }
  if (s.transports.empty()) {
    p.transports = DefaultTransports(absl::StartsWith(p.device, "cuda"));
  } else {
    auto transports = ParseTransportList(s.transports);
    if (!transports.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--transports: ", transports.status().message()));
    }
    p.transports = *transports;
  }
  p.host = HostName();
  p.stop = stop;
  return p;
}

}  // namespace e3
