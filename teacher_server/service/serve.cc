#include "teacher_server/service/serve.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics_server.h"

namespace e3 {
namespace {

using Clock = std::chrono::steady_clock;

// Written to a temporary name and renamed, so a reader never sees a
// partial port.
void WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

// A port file names this process's port only while it serves: one left
// behind would send the next launch's students to a dead port.
void RemovePortFile(const std::string& path, int port) {
  std::ifstream in(path);
  int written = -1;
  if (in >> written && written == port) std::remove(path.c_str());
}

// With every epoch committed (in every student group): true once every rank has the end of its data
// from this process, or exit_grace_s after the ledger was first seen
// complete (a rank that never comes back).
bool DoneWaiting(const ServeOptions& o, const StudentGroups& groups, std::optional<Clock::time_point>* complete_since) {
  const auto now = Clock::now();
  if (groups.EveryRankToldTheEnd()) {
    std::printf("teacher: every rank committed every epoch and has the end of its data; exiting\n");
    return true;
  }
  if (!complete_since->has_value()) {
    *complete_since = now;
    std::printf("teacher: every rank committed every epoch; waiting up to %.0f s (--exit_grace_s) for the ranks "
                "not yet handed the end of their data (after a restart they come back to learn it)\n",
                o.exit_grace_s);
    std::fflush(stdout);
  }
  if (now - **complete_since < std::chrono::duration<double>(o.exit_grace_s)) return false;
  std::printf("teacher: not every rank came back for the end of its data within %.0f s; exiting\n",
              o.exit_grace_s);
  return true;
}

// Until `signal` or, with exit_when_done, every rank has committed every
// epoch: exports the engine's stats to Prometheus and logs progress.
void WatchUntilDone(const ServeOptions& o, StudentGroups* groups, TeacherServiceImpl* service,
                    TeacherMetrics* metrics, const std::atomic<int>& signal) {
  auto last_print = Clock::now();
  std::optional<Clock::time_point> complete_since;
  int64_t last_tokens = 0;
  while (signal == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const EngineStats st = groups->stats();
    metrics->Update(st);
    const auto now = Clock::now();
    const double dt = std::chrono::duration<double>(now - last_print).count();
    if (dt >= 10) {
      std::printf("teacher: %ld batches, %ld tokens (%.0f tok/s), %ld buffered, %d streams\n",
                  static_cast<long>(st.batches_computed), static_cast<long>(st.tokens_computed),
                  (st.tokens_computed - last_tokens) / dt, static_cast<long>(st.buffered_batches),
                  service->open_streams());
      std::fflush(stdout);
      last_print = now;
      last_tokens = st.tokens_computed;
    }
    if (o.exit_when_done && groups->EveryEpochCommitted(o.epochs) && DoneWaiting(o, *groups, &complete_since)) {
      return;
    }
  }
  std::printf("teacher: signal %d: draining\n", signal.load());
  std::fflush(stdout);
}

// Acks still reach the engine while it drains, so a student stopped by the
// same signal can commit the checkpoint it writes as it stops.
// After a signal, always logs the outcome: a student stopped by the same
// signal may have committed before this teacher noticed it, which settles
// the drain at once. A teacher done with its data has nothing to report.
void WaitForFinalCommits(const ServeOptions& o, StudentGroups* groups, bool signalled) {
  if (!signalled && groups->DrainSettled()) return;
  if (!groups->DrainSettled()) {
    std::printf("teacher: waiting up to %.0f s for %d rank(s) to commit their final checkpoint\n", o.drain_timeout_s,
                groups->DrainPending());
    std::fflush(stdout);
    const auto deadline = Clock::now() + std::chrono::duration<double>(o.drain_timeout_s);
    while (!groups->DrainSettled() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  const int pending = groups->DrainPending();
  if (pending == 0) {
    std::printf("teacher: every draining rank committed its final checkpoint (%d rank(s) held uncommitted "
                "batches when the drain began)\n",
                groups->DrainWaitedRanks());
  } else {
    std::printf("teacher: %d rank(s) sent no final commit within %.0f s (--drain_timeout_s); their batches "
                "are delivered again when they resume\n",
                pending, o.drain_timeout_s);
  }
}

}  // namespace

absl::Status Serve(const ServeOptions& o, StudentGroups* groups, TeacherServiceImpl* service,
                   TeacherMetrics* metrics, const std::atomic<int>& signal) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(o.listen, o.auth != nullptr ? o.auth->ServerCredentials() : grpc::InsecureServerCredentials(),
                           &bound_port);
  // gRPC sets SO_REUSEPORT by default, which lets a second teacher bind a
  // running one's port and take half its students.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service);
  AddServerKeepalive(o.keepalive, &builder);
  ApplyMessageLimits(o.messages, &builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o.listen, " (in use?)"));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  metrics->SetServing(true);

  std::unique_ptr<MetricsServer> metrics_server;
  if (o.metrics_port >= 0) {
    auto ms = MetricsServer::Start(metrics->registry(), o.metrics_host, o.metrics_port);
    if (!ms.ok()) return ms.status();
    metrics_server = std::move(ms).value();
  }
  const std::string host = o.listen.substr(0, o.listen.rfind(':'));
  const std::string guard = o.auth != nullptr ? o.auth->Describe() : "nothing (plaintext, no token)";
  std::printf("teacher: serving on %s:%d (metrics on :%d), %ld batches/epoch for one rank; peers checked by %s\n",
              host.c_str(), bound_port, metrics_server ? metrics_server->port() : -1,
              static_cast<long>(groups->default_group().batches_per_epoch(1)), guard.c_str());
  if (!IsLoopbackAddress(o.listen) && (o.auth == nullptr || (!o.auth->tls() && !o.auth->token()))) {
    std::fprintf(stderr,
                 "teacher: WARNING: %s is reachable beyond this machine with neither TLS nor a token: anyone "
                 "who reaches the port can subscribe, commit, stop an --exit_when_done teacher and download "
                 "embed_tokens and the target head (--tls_cert/--tls_key, --auth_token_file)\n",
                 o.listen.c_str());
  } else if (o.auth == nullptr || !o.auth->token()) {
    std::fprintf(stderr,
                 "teacher: note: no --auth_token_file: any local process can subscribe as a student, supersede "
                 "one, or commit for it (e3_launch gives every run a fresh token)\n");
  }
  std::fflush(stdout);
  if (!o.port_file.empty()) WritePortFile(o.port_file, bound_port);

  WatchUntilDone(o, groups, service, metrics, signal);
  server->GetHealthCheckService()->SetServingStatus(false);
  metrics->SetServing(false);
  groups->Drain();
  WaitForFinalCommits(o, groups, signal != 0);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!o.port_file.empty()) RemovePortFile(o.port_file, bound_port);
  for (const auto& [group, report] : groups->ledger_reports()) {
    const std::string which = group.empty() ? "" : absl::StrCat(" of student group ", group);
    std::printf("teacher: ledger%s %s\n", which.c_str(), report.ToJson().c_str());
  }
  std::fflush(stdout);
  const absl::Status ledger = groups->ledger_failure();
  if (!ledger.ok()) {
    return absl::DataLossError(absl::StrCat("the ledger misses what this teacher could not write: ", ledger.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ServeOptions> ServeOptions::From(const RunConfig& c) {
  const TeachersSettings& t = c.teachers;
  ServeOptions o;
  o.listen = t.listen;
  o.port_file = t.port_file;
  o.metrics_host = t.metrics_host;
  o.metrics_port = static_cast<int>(t.metrics_port);
  o.exit_when_done = t.exit_when_done;
  o.drain_timeout_s = t.drain_timeout_s;
  o.exit_grace_s = t.exit_grace_s;
  o.epochs = c.data.epochs;
  o.messages.max_receive_bytes = t.max_receive_message_bytes;
  o.messages.max_send_bytes = t.max_send_message_bytes;
  PeerAuthOptions auth;
  auth.tls_cert = t.tls_cert;
  auth.tls_key = t.tls_key;
  auth.tls_ca = t.tls_ca;
  auth.auth_token_file = t.auth_token_file;
  E3_ASSIGN_OR_RETURN(PeerAuth peer_auth, PeerAuth::ForServer(auth));
  o.auth = std::make_shared<const PeerAuth>(std::move(peer_auth));
  return o;
}

}  // namespace e3
