#include "student_trainer/feed/eval_batch.h"

#include "absl/strings/str_cat.h"

namespace e3 {

absl::StatusOr<EvalBatch> EvalBatchFromWire(at::Tensor input_ids, at::Tensor cu_seqlens, at::Tensor loss_mask,
                                            at::Tensor aux_hidden) {
  EvalBatch b;
  b.input_ids = input_ids.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor cu = cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  b.cu_seqlens.assign(cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel());
  const int64_t T = b.input_ids.numel();
  if (b.cu_seqlens.size() < 2 || b.cu_seqlens.front() != 0 || b.cu_seqlens.back() != T ||
      loss_mask.numel() != T || aux_hidden.dim() != 2 || aux_hidden.size(0) != T) {
    return absl::DataLossError(absl::StrCat("eval batch: ", T, " input_ids, ", cu.numel(), " offsets ending at ",
                                            b.cu_seqlens.empty() ? -1 : b.cu_seqlens.back(), ", ", loss_mask.numel(),
                                            " loss_mask values, aux_hidden of ", aux_hidden.dim(), " dims and ",
                                            aux_hidden.dim() > 0 ? aux_hidden.size(0) : 0, " rows"));
  }
  const at::Tensor mask = loss_mask.to(at::kCPU, at::kByte).contiguous();
  const uint8_t* m = mask.data_ptr<uint8_t>();
  for (size_t s = 0; s + 1 < b.cu_seqlens.size(); ++s) {
    const int64_t begin = b.cu_seqlens[s], end = b.cu_seqlens[s + 1];
    int64_t p = begin;
    while (p < end && m[p] == 0) ++p;
    for (int64_t t = p; t < end; ++t) {
      if (m[t] != 1) {
        return absl::DataLossError(absl::StrCat("eval batch sample ", s, ": loss_mask is not 0 on the prompt, "
                                                "then 1 on the continuation"));
      }
    }
    if (p == begin || end - p < 1) {
      return absl::DataLossError(absl::StrCat("eval batch sample ", s, ": ", p - begin, " prompt and ", end - p,
                                              " continuation tokens; expected at least one of each"));
    }
    b.prompt_lengths.push_back(p - begin);
  }
  b.aux_hidden = aux_hidden.to(at::kCPU);
  return b;
}

}  // namespace e3
