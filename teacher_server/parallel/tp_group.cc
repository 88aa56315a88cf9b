#include "teacher_server/parallel/tp_group.h"

#include <string>

namespace e3 {
namespace {

void ThrowIfError(const absl::Status& st) {
  TORCH_CHECK(st.ok(), "tensor parallel: ", std::string(st.message()));
}

}  // namespace

void TpGroup::AllReduceSum(at::Tensor& t) { Finish(StartAllReduceSum(t)); }

std::unique_ptr<PendingCollective> TpGroup::StartAllReduceSum(at::Tensor& t) {
  auto pending = group_->AllReduceSum(t);
  ThrowIfError(pending.status());
  return std::move(pending).value();
}

void TpGroup::Finish(std::unique_ptr<PendingCollective> pending) { ThrowIfError(pending->Wait()); }

std::vector<at::Tensor> TpGroup::AllGather(const at::Tensor& t) {
  at::Tensor in = t.contiguous();
  std::vector<at::Tensor> out;
  for (int r = 0; r < size(); ++r) out.push_back(torch::empty_like(in));
  ThrowIfError(group_->AllGather(in, out));
  return out;
}

at::Tensor TpGroup::VocabParallelEmbedding(const at::Tensor& ids, const at::Tensor& table, int64_t begin) {
  at::Tensor local = ids - begin;
  at::Tensor outside = (local < 0).logical_or(local >= table.size(0));
  at::Tensor h = at::embedding(table, local.masked_fill(outside, 0));
  h.masked_fill_(outside.unsqueeze(-1), 0);
  AllReduceSum(h);  // exactly one rank holds each row: the sum is exact
  return h;
}

at::Tensor TpGroup::VocabParallelArgmax(const at::Tensor& local_argmax, const at::Tensor& local_best, int64_t begin) {
  return PickVocabParallelArgmax(AllGather(local_best.to(at::kFloat)), AllGather(local_argmax.to(at::kLong) + begin));
}

at::Tensor PickVocabParallelArgmax(const std::vector<at::Tensor>& best, const std::vector<at::Tensor>& ids) {
  // [ranks, n]: ranks hold ascending vocab ranges, so the first rank with
  // the maximum (or the first NaN: argmax ranks a NaN above everything)
  // holds its lowest id.
  at::Tensor rank_of_best = torch::stack(best).argmax(0, /*keepdim=*/true);
  return torch::stack(ids).gather(0, rank_of_best).squeeze(0).to(at::kInt);
}

}  // namespace e3
