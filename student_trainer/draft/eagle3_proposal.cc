// The EAGLE-3 draft's proposal in a serving engine's chain mode, as
// eval/acceptance.h describes it: one pass of K steps over every row of a
// batch gives the chain a round would draft from each row.
#include "absl/strings/str_cat.h"
#include "student_trainer/draft/eagle3_draft.h"

namespace e3 {
namespace {

// Row r's extend token: the sample's next token s[r + 1] (0 on a sample's
// last row, whose chain nobody reads).
at::Tensor NextTokens(const at::Tensor& ids, const std::vector<int64_t>& cu) {
  at::Tensor next = torch::zeros_like(ids);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t n = cu[s + 1] - cu[s];
    if (n > 1) next.narrow(0, cu[s], n - 1).copy_(ids.narrow(0, cu[s] + 1, n - 1));
  }
  return next;
}

}  // namespace

absl::StatusOr<at::Tensor> Eagle3DraftImpl::ProposeChains(const EvalBatch& batch, int64_t chain_length) {
  if (chain_length < 1) return absl::InvalidArgumentError("chain length must be at least 1");
  const at::Device device = options_.device;
  const at::ScalarType dtype = options_.dtype;
  try {
    torch::NoGradGuard no_grad;
    at::Tensor hidden = ProjectAux(batch.aux_hidden.to(device, dtype));
    at::Tensor embeds = Embed(NextTokens(batch.input_ids, batch.cu_seqlens).to(device));
    at::Tensor chains = torch::empty({batch.tokens(), chain_length}, torch::TensorOptions().dtype(at::kLong).device(device));
    TttKvCache cache;
    for (int64_t j = 0; j < chain_length; ++j) {
      // Step j of a round sits j positions after its row, as the engine's
      // draft steps advance the position by one each.
      const PackedRope rope = MakePackedRope(batch.cu_seqlens, /*offset=*/j);
      const HeadOutput head = Head(Step(embeds, hidden, rope, &cache));
      const at::Tensor drafted = head.logits.argmax(-1);
      const at::Tensor target_ids = drafted + d2t.index_select(0, drafted);
      chains.select(1, j).copy_(target_ids);
      embeds = Embed(target_ids);
      hidden = head.next_hidden;
    }
    return chains.to(at::kCPU);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("drafting the eval chains: ", e.what_without_backtrace()));
  }
}


}  // namespace e3
