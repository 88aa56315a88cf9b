#include "teacher_server/models/lm_head.h"

#include <algorithm>
#include <vector>

#include "teacher_server/layers/fused_ops.h"

namespace e3 {

void LmHead::ForEachChunk(const at::Tensor& x, const std::function<void(const at::Tensor&)>& fn) const {
  const int64_t T = x.size(0);
  const int64_t rows = LmHeadChunkRows(weight_.size(0) * weight_.element_size());
  for (int64_t start = 0; start < T; start += rows) {
    fn(Gemm(x.narrow(0, start, std::min(rows, T - start)), weight_, at::Tensor(), at::Tensor(), options_.gemm));
  }
}

at::Tensor LmHead::Gathered(const at::Tensor& chunk) const {
  if (!options_.tp) return chunk;
  // Shards are ceil(V / tp) rows except the last: gather them padded.
  const int64_t rows = (options_.vocab_size + options_.tp->size() - 1) / options_.tp->size();
  const at::Tensor padded = at::constant_pad_nd(chunk, {0, rows - chunk.size(1)});
  return torch::cat(options_.tp->AllGather(padded), -1).narrow(-1, 0, options_.vocab_size);
}

at::Tensor LmHead::Argmax(const at::Tensor& x) const {
  std::vector<at::Tensor> ids, best;
  ForEachChunk(x, [&](const at::Tensor& logits) {
    ids.push_back(RowArgmax(logits, options_.fused_argmax));
    // Each rank's best logit, for combining the ranks' answers.
    if (options_.tp) best.push_back(logits.gather(-1, ids.back().to(at::kLong).unsqueeze(-1)).squeeze(-1));
  });
  const at::Tensor local = torch::cat(ids);
  if (!options_.tp) return local;
  return options_.tp->VocabParallelArgmax(local, torch::cat(best), options_.vocab_begin);
}

void LmHead::Apply(const ForwardOptions& forward, ForwardOutput* out) const {
  if (!forward.return_logits) {
    if (forward.return_argmax) out->target_argmax = Argmax(out->last_hidden);
    return;
  }
  std::vector<at::Tensor> logits, argmax;
  ForEachChunk(out->last_hidden, [&](const at::Tensor& chunk) {
    logits.push_back(Gathered(chunk));
    if (forward.return_argmax) argmax.push_back(RowArgmax(logits.back(), options_.fused_argmax));
  });
  out->logits = torch::cat(logits);
  if (forward.return_argmax) out->target_argmax = torch::cat(argmax);
}

}  // namespace e3
