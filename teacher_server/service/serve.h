// The teacher's serving stage: the gRPC server (TeacherService and the
// standard health service), /metrics, the port file a launcher waits for,
// a progress line every 10 s, and the drain on a signal or, with
// exit_when_done, once every rank of every student group has committed
// every epoch.
#ifndef E3_TEACHER_SERVER_SERVICE_SERVE_H_
#define E3_TEACHER_SERVER_SERVICE_SERVE_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/run_config.h"
#include "common/rpc/keepalive.h"
#include "common/rpc/peer_auth.h"
#include "teacher_server/engine/student_groups.h"
#include "teacher_server/service/teacher_metrics.h"
#include "teacher_server/service/teacher_service.h"

namespace e3 {

struct ServeOptions {
  std::string listen = "127.0.0.1:50051";  // port 0 picks one
  std::string port_file;                   // the bound port is written here once serving
  std::string metrics_host = "127.0.0.1";
  int metrics_port = 0;  // 0 picks one, -1 disables
  bool exit_when_done = false;
  // After a signal, how long the server keeps taking the final commits of
  // students stopped by the same signal (Engine::DrainSettled). Below
  // Slurm's default KillWait (30 s), after which SIGKILL follows.
  double drain_timeout_s = 20;
  int64_t epochs = 1;  // what "done" means with exit_when_done
  // With exit_when_done: once every rank committed every epoch, how long
  // the server waits for ranks it has not handed the end of their data
  // (students of a teacher restarted after their last commit come back to
  // learn it) before it exits without them.
  double exit_grace_s = 60;
  MessageLimits messages;  // the server's gRPC message caps (ApplyMessageLimits)
  std::shared_ptr<const PeerAuth> auth;  // TLS credentials (and the token); null: plaintext
  KeepaliveOptions keepalive;

  // From the teachers and data sections; errors name the TLS file that
  // does not load.
  static absl::StatusOr<ServeOptions> From(const RunConfig& config);
};

// Serves until `signal` is set (or the work is done), then drains: health
// goes NOT_SERVING, every group's engine finishes what is in flight, the
// students that still held uncommitted batches get up to drain_timeout_s
// to send their final checkpoint's commit, the server shuts down, and
// each group's ledger summary is logged.
absl::Status Serve(const ServeOptions& o, StudentGroups* groups, TeacherServiceImpl* service,
                   TeacherMetrics* metrics, const std::atomic<int>& signal);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_SERVICE_SERVE_H_
