// The lm_head's outputs for a forward's final hidden states: the target
// argmax and, when asked, the logits, in chunks of about 1 GiB of logits so
// that the full [T, V] never exists unless requested. Under tensor
// parallelism the head holds this rank's vocabulary rows; each rank's best
// column and value are combined by TpGroup::VocabParallelArgmax (ties to
// the lowest id, as at::argmax), and requested logits are all-gathered.
//
// Every architecture's head. DecoderLM asks its sgl kernels (the FP8
// candidate search, the argmax in the GEMM's epilogue) for a lone argmax
// first and comes here where they do not answer.
#ifndef E3_TEACHER_SERVER_MODELS_LM_HEAD_H_
#define E3_TEACHER_SERVER_MODELS_LM_HEAD_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "common/torch/gemm.h"
#include "common/torch/torch_core.h"
#include "teacher_server/models/forward_types.h"
#include "teacher_server/parallel/tp_group.h"

namespace e3 {

struct LmHeadOptions {
  int64_t vocab_size = 0;   // the whole vocabulary
  int64_t vocab_begin = 0;  // this rank's first row
  GemmPath gemm = GemmPath::kAten;
  bool fused_argmax = false;  // RowArgmax's kernel (fused_ops.h)
  std::shared_ptr<TpGroup> tp;  // null: one process
};

class LmHead {
 public:
  LmHead() = default;
  LmHead(at::Tensor weight, LmHeadOptions options) : weight_(std::move(weight)), options_(std::move(options)) {}

  // Sets out->target_argmax and out->logits for out->last_hidden as
  // `forward` asks (return_argmax, return_logits).
  void Apply(const ForwardOptions& forward, ForwardOutput* out) const;

 private:
  // Calls fn with this rank's logits for x's rows, chunk by chunk.
  void ForEachChunk(const at::Tensor& x, const std::function<void(const at::Tensor&)>& fn) const;
  // This rank's logits of a chunk gathered into the whole vocabulary.
  at::Tensor Gathered(const at::Tensor& chunk) const;
  at::Tensor Argmax(const at::Tensor& x) const;

  at::Tensor weight_;  // [rows, H]
  LmHeadOptions options_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_LM_HEAD_H_
