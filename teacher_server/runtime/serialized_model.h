// A CausalLM that runs one forward at a time, in arrival order. The
// engine's batches, the eval set's generation and Generate calls share one
// model from different threads; each forward takes a ticket, so a thread
// that keeps issuing forwards (the engine, while students want data) never
// starves the others, and generation interleaves with training batches
// instead of stalling them.
#ifndef E3_TEACHER_SERVER_RUNTIME_SERIALIZED_MODEL_H_
#define E3_TEACHER_SERVER_RUNTIME_SERIALIZED_MODEL_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "teacher_server/models/causal_lm.h"

namespace e3 {

// First come, first served (a ticket lock).
class FairMutex {
 public:
  void lock() {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t ticket = next_ticket_++;
    turn_cv_.wait(l, [&] { return serving_ == ticket; });
  }
  void unlock() {
    std::lock_guard<std::mutex> l(mu_);
    ++serving_;
    turn_cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable turn_cv_;
  uint64_t next_ticket_ = 0, serving_ = 0;
};

class SerializedCausalLM : public CausalLM {
 public:
  explicit SerializedCausalLM(CausalLM* model) : model_(model) {}

  absl::Status CheckForward(const PackedBatch& batch, const ForwardOptions& options) const override {
    return model_->CheckForward(batch, options);
  }
  absl::StatusOr<ForwardOutput> Forward(const PackedBatch& batch, const ForwardOptions& options) override {
    std::lock_guard<FairMutex> lock(turn_);
    return model_->Forward(batch, options);
  }
  const ModelConfig& config() const override { return model_->config(); }
  const ModelOptions& options() const override { return model_->options(); }
  at::Tensor embed_tokens() const override { return model_->embed_tokens(); }
  at::Tensor lm_head() const override { return model_->lm_head(); }
  std::string Techniques() const override { return model_->Techniques(); }
  absl::StatusOr<GemmTuningResult> TuneGemms(const GemmTuningOptions& options) override {
    std::lock_guard<FairMutex> lock(turn_);
    return model_->TuneGemms(options);
  }

 private:
  CausalLM* model_;
  FairMutex turn_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_RUNTIME_SERIALIZED_MODEL_H_
