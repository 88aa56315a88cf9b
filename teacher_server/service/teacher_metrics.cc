#include "teacher_server/service/teacher_metrics.h"

namespace e3 {

TeacherMetrics::TeacherMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  tokens_ = &BuildCounter().Name("e3_teacher_tokens_total").Help("Tokens run through the teacher forward.")
                 .Register(*registry_).Add({});
  batches_ = &BuildCounter().Name("e3_teacher_batches_total").Help("Rank batches computed.")
                  .Register(*registry_).Add({});
  batches_sent_ = &BuildCounter().Name("e3_teacher_batches_sent_total").Help("Batch descriptors sent, redeliveries included.")
                       .Register(*registry_).Add({});
  forward_seconds_ = &BuildCounter().Name("e3_teacher_forward_seconds_total").Help("Wall seconds spent in forward passes.")
                          .Register(*registry_).Add({});
  reclaimed_ = &BuildCounter().Name("e3_teacher_reclaimed_batches_total")
                    .Help("Buffered batches dropped because their subscriber went away.")
                    .Register(*registry_).Add({});
  bytes_sent_ = &BuildCounter().Name("e3_teacher_bytes_sent_total").Help("Payload bytes handed to students, per transport.")
                     .Register(*registry_);
  queue_depth_ = &BuildGauge().Name("e3_teacher_queue_depth").Help("Batches computed and not yet acked, all ranks.")
                      .Register(*registry_).Add({});
  buffered_bytes_ = &BuildGauge().Name("e3_teacher_buffered_bytes").Help("Bytes held for computed, unacked batches.")
                         .Register(*registry_).Add({});
  subscribers_ = &BuildGauge().Name("e3_teacher_subscribers").Help("Open Subscribe streams.")
                      .Register(*registry_).Add({});
  serving_ = &BuildGauge().Name("e3_teacher_serving")
                  .Help("1 while the gRPC health status is SERVING, 0 while draining.")
                  .Register(*registry_).Add({});
  cuda_graphs_ = &BuildGauge().Name("e3_teacher_cuda_graphs")
                      .Help("Token budgets whose forward is kept as a CUDA graph (sgl on a GPU).")
                      .Register(*registry_).Add({});
  graph_forwards_ = &BuildCounter().Name("e3_teacher_graph_forwards_total")
                         .Help("Forwards replayed from a CUDA graph (the rest ran eagerly).")
                         .Register(*registry_).Add({});
}

void TeacherMetrics::AddBytesSent(TransportKind transport, double bytes) {
  bytes_sent_->Add({{"transport", TransportName(transport)}}).Increment(bytes);
}

void TeacherMetrics::Update(const EngineStats& s) {
  tokens_->Increment(static_cast<double>(s.tokens_computed - last_.tokens_computed));
  batches_->Increment(static_cast<double>(s.batches_computed - last_.batches_computed));
  forward_seconds_->Increment(s.forward_seconds - last_.forward_seconds);
  reclaimed_->Increment(static_cast<double>(s.reclaimed_batches - last_.reclaimed_batches));
  queue_depth_->Set(static_cast<double>(s.buffered_batches));
  buffered_bytes_->Set(static_cast<double>(s.buffered_bytes));
  cuda_graphs_->Set(static_cast<double>(s.cuda_graphs));
  graph_forwards_->Increment(static_cast<double>(s.graph_forwards - last_.graph_forwards));
  last_ = s;
}

}  // namespace e3
