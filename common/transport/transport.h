// Which bulk-tensor transport a teacher and a student use. At subscribe
// time both sides list what they can do; the fastest transport in both
// lists that the placement allows wins (DESIGN.md "Data flow").
#ifndef E3_COMMON_TRANSPORT_TRANSPORT_H_
#define E3_COMMON_TRANSPORT_TRANSPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace e3 {

// Ordered slowest to fastest.
enum class TransportKind { kInline = 0, kShm = 1, kCudaIpc = 2, kNccl = 3 };

const char* TransportName(TransportKind kind);
absl::StatusOr<TransportKind> ParseTransport(const std::string& name);
// What a process offers (teacher) or accepts (student) unless told
// otherwise: every transport its placement can use, fastest first.
std::vector<TransportKind> DefaultTransports(bool on_gpu);

// "inline,shm" -> kinds; an unknown name is an error naming it.
absl::StatusOr<std::vector<TransportKind>> ParseTransportList(const std::string& list);

struct Placement {
  bool same_host = false;     // shm and CUDA IPC need one host
  bool teacher_on_gpu = false;  // CUDA IPC and NCCL move device memory
  bool student_on_gpu = false;
  bool nccl_unique_id = false;  // the student sent one (it makes the NCCL communicator's id)
  // Teacher and student on the very same GPU (same host, same device
  // index). NCCL refuses a communicator with two ranks on one device.
  bool same_gpu = false;
};

// The fastest transport offered by the teacher, accepted by the student and
// possible for the placement. FailedPrecondition when none is, with a
// message listing both sides' lists and why each candidate was excluded.
absl::StatusOr<TransportKind> NegotiateTransport(const std::vector<TransportKind>& offered,
                                                 const std::vector<TransportKind>& accepted,
                                                 const Placement& placement);

}  // namespace e3

#endif  // E3_COMMON_TRANSPORT_TRANSPORT_H_
