// How the ranks of a tensor-parallel teacher move together. Rank 0 (the
// leader) is the only one with a gRPC server, a dataset and an engine; the
// other ranks (followers) only compute. Before each forward the leader
// broadcasts the packed batch and the forward options over the group, then
// every rank runs the same forward, whose collectives meet in order.
//
// An idle leader broadcasts a heartbeat now and then, so that the
// followers' pending broadcast never reaches the group's timeout while no
// student is asking for data. When the leader ends, it broadcasts a
// shutdown and the followers return.
#ifndef E3_TEACHER_SERVER_RUNTIME_TP_CONTROL_H_
#define E3_TEACHER_SERVER_RUNTIME_TP_CONTROL_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/time/time.h"
#include "teacher_server/models/causal_lm.h"

namespace e3 {

// Rank 0's model: the local shard, wrapped so that each Forward first
// starts the same forward on every follower.
class TpLeader : public CausalLM {
 public:
  TpLeader(std::unique_ptr<CausalLM> shard, absl::Duration heartbeat = absl::Seconds(20));
  ~TpLeader() override;  // Shutdown()

  // Stops the heartbeat and tells the followers to exit; later calls do
  // nothing. For a leader that gives up before serving (a startup error).
  void Shutdown();

  absl::Status CheckForward(const PackedBatch& batch, const ForwardOptions& options) const override {
    return shard_->CheckForward(batch, options);
  }
  absl::StatusOr<ForwardOutput> Forward(const PackedBatch& batch, const ForwardOptions& options) override;
  const ModelConfig& config() const override { return shard_->config(); }
  const ModelOptions& options() const override { return shard_->options(); }
  at::Tensor embed_tokens() const override { return shard_->embed_tokens(); }
  at::Tensor lm_head() const override { return shard_->lm_head(); }
  std::string Techniques() const override { return shard_->Techniques(); }
  absl::StatusOr<GemmTuningResult> TuneGemms(const GemmTuningOptions& options) override {
    return shard_->TuneGemms(options);
  }

 private:
  void HeartbeatLoop(absl::Duration period);

  std::unique_ptr<CausalLM> shard_;
  std::mutex mu_;  // one broadcast sequence at a time on the group
  std::condition_variable wake_;
  bool stopping_ = false;
  bool shut_down_ = false;
  absl::Time last_message_;
  std::thread heartbeat_;
};

// A follower's life: runs each forward the leader broadcasts until the
// leader's shutdown (OK) or a failure of the group (the error).
absl::Status RunTpFollower(CausalLM& shard);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_RUNTIME_TP_CONTROL_H_
