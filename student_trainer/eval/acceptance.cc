#include "student_trainer/eval/acceptance.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/torch/process_group.h"

namespace e3 {
AcceptanceCounts CountAcceptance(const at::Tensor& chains, const EvalBatch& batch, int64_t chain_length) {
  AcceptanceCounts c;
  const at::Tensor ch = chains.to(at::kLong).contiguous();
  const int64_t width = ch.size(1);
  const int64_t* y = ch.data_ptr<int64_t>();
  const int64_t* s = batch.input_ids.data_ptr<int64_t>();
  const int64_t k = std::min(chain_length, width);
  for (size_t b = 0; b + 1 < batch.cu_seqlens.size(); ++b) {
    const int64_t begin = batch.cu_seqlens[b], n = batch.cu_seqlens[b + 1] - begin;
    // Known tokens run through s[t + 1]; the prefill produced s[p].
    for (int64_t t = batch.prompt_lengths[b] - 1;;) {
      const int64_t remaining = n - 2 - t;
      if (remaining <= 0) break;
      const int64_t* chain = y + (begin + t) * width;
      int64_t accepted = 0;
      while (accepted < std::min(k, remaining) && chain[accepted] == s[begin + t + 2 + accepted]) ++accepted;
      const int64_t advance = std::min(accepted + 1, remaining);
      c.rounds += 1;
      c.tokens += advance;
      t += advance;
    }
  }
  return c;
}

std::vector<int64_t> ReportedChainLengths(int64_t chain) {
  std::vector<int64_t> out;
  for (int64_t k : {int64_t{3}, int64_t{5}}) {
    if (k < chain) out.push_back(k);
  }
  out.push_back(chain);
  return out;
}

std::string AcceptanceReport::Summary() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < chain_lengths.size(); ++i) {
    parts.push_back(absl::StrFormat("chain %d: tau %.3f", chain_lengths[i], counts[i].tau()));
  }
  return absl::StrCat(absl::StrJoin(parts, " | "), absl::StrFormat(" (%d prompts, %d rounds at chain %d, %.1f s)",
                                                                   samples, counts.empty() ? 0 : counts.back().rounds,
                                                                   chain_lengths.empty() ? 0 : chain_lengths.back(),
                                                                   seconds));
}

double AcceptanceReport::TauAt(int64_t chain_length) const {
  for (size_t i = 0; i < chain_lengths.size(); ++i) {
    if (chain_lengths[i] == chain_length) return counts[i].tau();
  }
  return 0.0;
}

absl::StatusOr<AcceptanceReport> MeasureAcceptance(DraftModel& draft, const std::vector<EvalBatch>& batches,
                                                   const std::vector<int64_t>& chain_lengths, ProcessGroup* group,
                                                   const ParallelLayout& layout) {
  const auto t0 = std::chrono::steady_clock::now();
  AcceptanceReport r;
  r.chain_lengths = chain_lengths;
  std::sort(r.chain_lengths.begin(), r.chain_lengths.end());
  r.counts.resize(r.chain_lengths.size());
  if (r.chain_lengths.empty()) return r;
  // [rounds, tokens] per chain length, then the samples.
  std::vector<int64_t> sums(2 * r.chain_lengths.size() + 1, 0);
  for (size_t i = 0; i < batches.size(); ++i) {
    if (!layout.OwnsRoundRobin(static_cast<int64_t>(i))) continue;
    E3_ASSIGN_OR_RETURN(at::Tensor chains, draft.ProposeChains(batches[i], r.chain_lengths.back()));
    for (size_t c = 0; c < r.chain_lengths.size(); ++c) {
      const AcceptanceCounts counts = CountAcceptance(chains, batches[i], r.chain_lengths[c]);
      sums[2 * c] += counts.rounds;
      sums[2 * c + 1] += counts.tokens;
    }
    sums.back() += static_cast<int64_t>(batches[i].prompt_lengths.size());
  }
  if (group != nullptr) {
    at::Tensor t = torch::tensor(sums, torch::kLong).to(draft.device());
    E3_ASSIGN_OR_RETURN(auto pending, group->AllReduceSum(t));
    E3_RETURN_IF_ERROR(pending->Wait());
    t = t.to(at::kCPU);
    for (size_t i = 0; i < sums.size(); ++i) sums[i] = t[static_cast<int64_t>(i)].item<int64_t>();
  }
  for (size_t c = 0; c < r.chain_lengths.size(); ++c) r.counts[c] = {sums[2 * c], sums[2 * c + 1]};
  r.samples = sums.back();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace e3
