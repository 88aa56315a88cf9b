// Two data-parallel ranks in one test process: each a thread with its own
// c10d Gloo process group, meeting on a loopback TCPStore.
#ifndef E3_TESTS_STUDENT_TRAINER_TWO_RANKS_H_
#define E3_TESTS_STUDENT_TRAINER_TWO_RANKS_H_

#include <array>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/torch/process_group.h"
#include "tests/free_port.h"

namespace e3::testing {

// Runs `body(rank, group)` on two ranks; returns each rank's status (a
// failed rendezvous, or what `body` returned).
inline std::array<absl::Status, 2> RunTwoRanks(
    const std::function<absl::Status(int, ProcessGroup*)>& body) {
  const int port = FreePort();
  std::array<absl::Status, 2> status;
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::thread([&, r] {
      ProcessGroupOptions o;
      o.master_port = port;
      o.rank = r;
      o.world_size = 2;
      o.timeout = absl::Seconds(60);
      auto group = ProcessGroup::Create(o);
      status[r] = group.ok() ? body(r, group->get()) : group.status();
    });
  }
  for (auto& t : ranks) t.join();
  return status;
}

}  // namespace e3::testing

#endif  // E3_TESTS_STUDENT_TRAINER_TWO_RANKS_H_
