// TTT attention without materialised scores, for the fast TTT step.
//
// At TTT step j the query at position t attends to the step-0 keys at
// positions <= t of its own sample (a causal block) and to the keys of
// steps 1..j at t (one "diagonal" key per earlier step, the draft's own
// steps at that position; DESIGN.md "Numerics"). The causal block runs in
// varlen flash attention, which also returns each query's log-sum-exp; the
// j diagonal scores merge into its output through that log-sum-exp. The
// backward hands flash attention the merged output and log-sum-exp, so
// its gradients are the block's share of the merged softmax's, and the
// diagonal terms get theirs from two small kernels. Nothing of size T^2 is
// stored, GQA keys are never repeated and packed samples are one call.
//
// The steps share a TttAttentionCache: each step's roped q/k/v (the keys
// later steps read) and, in backward, fp32 accumulators for every step's
// key and value gradients. Autograd runs the steps' backward in reverse
// order (each step's output feeds the next step), so when step j's
// backward runs, every later step has added its share to step j's key and
// value gradients, and step j returns the whole gradient of its projection.
//
// Where flash attention or a kernel cannot run (the CPU, fp32 or fp64, the
// kernels switched off), the same decomposition runs in ATen: the block
// per sample with its log-sum-exp, the same merge, the same backward
// formulas. The CPU tests hold that path to the reference TTT step.
#ifndef E3_STUDENT_TRAINER_OPS_TTT_ATTENTION_H_
#define E3_STUDENT_TRAINER_OPS_TTT_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/torch/torch_core.h"

namespace e3::ops {

struct TttAttentionConfig {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  double scale = 1.0;  // softmax scale, 1 / sqrt(head_dim)
};

class TttAttentionCache {
 public:
  // The packing: cu_seqlens on the host [B + 1], and the same offsets on
  // the draft's device (any integer dtype; kept as int32).
  TttAttentionCache(const TttAttentionConfig& config, std::vector<int64_t> cu_seqlens,
                    const at::Tensor& cu_device);

  const TttAttentionConfig& config() const { return config_; }
  int64_t steps() const { return static_cast<int64_t>(roped_.size()); }
  int64_t tokens() const { return cu_host_.back(); }

  // The steps' roped projections [T, q_heads + 2 kv_heads, head_dim] and
  // views of their parts. A projection may carry zero rows after the T
  // tokens (cuDNN's padding; padded() has them, the views do not).
  void Append(at::Tensor roped) { roped_.push_back(std::move(roped)); }
  const at::Tensor& padded(int64_t step) const { return roped_[step]; }
  at::Tensor Query(int64_t step) const;
  at::Tensor Key(int64_t step) const;
  at::Tensor Value(int64_t step) const;

  const std::vector<int64_t>& cu_host() const { return cu_host_; }
  const at::Tensor& cu_device() const { return cu_device_; }  // int32
  int64_t max_seqlen() const { return max_seqlen_; }

  // Backward bookkeeping: the fp32 (fp64 for fp64 drafts) key and value
  // gradients of a step, created at first use.
  at::Tensor& KeyGrad(int64_t step, at::ScalarType type);
  at::Tensor& ValueGrad(int64_t step, at::ScalarType type);
  // Marks step j's backward done and frees what only it still needed;
  // throws unless every later step's backward already ran.
  void FinishBackward(int64_t step);

 private:
  TttAttentionConfig config_;
  std::vector<int64_t> cu_host_;
  at::Tensor cu_device_;
  int64_t max_seqlen_ = 0;
  std::vector<at::Tensor> roped_;
  std::vector<at::Tensor> key_grads_, value_grads_;
  std::vector<bool> backward_done_;
};

// Whether one long sequence (4096+ tokens) may run cuDNN's fused attention
// for the causal block (default on; where cuDNN refuses, the process says
// so once and uses varlen flash). For benchmarks and tests; the number of
// cuDNN forward and backward calls so far.
void SetTttCudnnAttention(bool on);
int64_t TttCudnnAttentionCalls();

// One TTT step: ropes the step's raw projection qkv [T, (q_heads + 2
// kv_heads) * head_dim] with this step's cos/sin [T, rotary_dim], appends
// it to the cache and attends. Returns [T, q_heads * head_dim]. Steps must
// be called in order on one cache.
at::Tensor TttAttentionStep(const std::shared_ptr<TttAttentionCache>& cache, const at::Tensor& qkv,
                            const at::Tensor& cos, const at::Tensor& sin);

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_TTT_ATTENTION_H_
