// The teacher's Prometheus families (DESIGN.md "Operations"): one owner of
// the registry; the service and the stats poller update through it.
#ifndef E3_TEACHER_SERVER_SERVICE_TEACHER_METRICS_H_
#define E3_TEACHER_SERVER_SERVICE_TEACHER_METRICS_H_

#include <memory>

#include "common/transport/transport.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "teacher_server/engine/engine.h"

namespace e3 {

class TeacherMetrics {
 public:
  TeacherMetrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  void AddBytesSent(TransportKind transport, double bytes);
  void BatchSent() { batches_sent_->Increment(); }
  void SetSubscribers(double n) { subscribers_->Set(n); }
  // Mirrors the gRPC health status (1 SERVING, 0 NOT_SERVING while draining),
  // so that an alert sees a draining teacher whose /metrics still answers.
  void SetServing(bool serving) { serving_->Set(serving ? 1 : 0); }
  // Mirrors the engine's counters (called periodically).
  void Update(const EngineStats& stats);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* bytes_sent_;
  prometheus::Counter* tokens_;
  prometheus::Counter* batches_;
  prometheus::Counter* batches_sent_;
  prometheus::Counter* forward_seconds_;
  prometheus::Counter* reclaimed_;
  prometheus::Gauge* queue_depth_;
  prometheus::Gauge* buffered_bytes_;
  prometheus::Gauge* subscribers_;
  prometheus::Gauge* serving_;
  prometheus::Gauge* cuda_graphs_;
  prometheus::Counter* graph_forwards_;
  EngineStats last_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_SERVICE_TEACHER_METRICS_H_
