#include "student_trainer/step/dflash_blocks.h"

#include <algorithm>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"

namespace e3 {
namespace {

std::vector<int64_t> HostLongs(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU).to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Rows whose token and next token, in the same sample, are supervised.
std::vector<int64_t> AnchorCandidates(const std::vector<int64_t>& cu, const std::vector<int64_t>& supervised) {
  std::vector<int64_t> rows;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    for (int64_t t = cu[s]; t + 1 < cu[s + 1]; ++t) {
      if (supervised[t] != 0 && supervised[t + 1] != 0) rows.push_back(t);
    }
  }
  return rows;
}

}  // namespace

absl::StatusOr<DFlashBlockBatch> PlanDFlashBlocks(const TeacherBatch& batch, const DFlashBlockOptions& o,
                                                  uint64_t draw) {
  const std::vector<int64_t> ids = HostLongs(batch.input_ids);
  const std::vector<int64_t> cu = HostLongs(batch.cu_seqlens);
  const std::vector<int64_t> supervised = HostLongs(batch.loss_mask.ne(0));
  const auto T = static_cast<int64_t>(ids.size());
  if (cu.size() < 2 || cu.front() != 0 || cu.back() != T || !std::is_sorted(cu.begin(), cu.end())) {
    return absl::InvalidArgumentError(absl::StrCat("DFlash batch: cu_seqlens must rise from 0 to ", T, " rows"));
  }
  if (static_cast<int64_t>(supervised.size()) != T) {
    return absl::InvalidArgumentError(absl::StrCat("DFlash batch: loss_mask has ", supervised.size(), " rows, not ", T));
  }
  std::vector<int64_t> argmax;
  if (o.labels != DFlashLabels::kInputIds) {
    argmax = HostLongs(batch.target_argmax);
    if (static_cast<int64_t>(argmax.size()) != T) {
      return absl::InvalidArgumentError(
          absl::StrCat("DFlash batch: target_argmax has ", argmax.size(), " rows, not ", T));
    }
  }
  std::vector<int64_t> anchors = AnchorCandidates(cu, supervised);
  if (static_cast<int64_t>(anchors.size()) > o.num_anchors) {
    std::mt19937_64 rng(draw);
    std::shuffle(anchors.begin(), anchors.end(), rng);
    anchors.resize(static_cast<size_t>(o.num_anchors));
    std::sort(anchors.begin(), anchors.end());
  }
  DFlashBlockBatch out;
  out.blocks.anchor_rows = anchors;
  out.blocks.cu_seqlens = cu;
  const int64_t B = o.block_size;
  std::vector<int64_t> tokens, labels, sources;
  size_t s = 0;
  for (int64_t a : anchors) {
    while (a >= cu[s + 1]) ++s;
    const int64_t end = cu[s + 1];
    tokens.push_back(ids[a]);
    labels.push_back(-1);  // the anchor predicts nothing
    sources.push_back(0);
    for (int64_t k = 1; k < B; ++k) {
      tokens.push_back(o.mask_token_id);
      const int64_t p = a + k;
      if (p >= end || supervised[p] == 0) {
        labels.push_back(-1);
        sources.push_back(0);
      } else {
        // The target's prediction at row p - 1 is its next token, at p.
        labels.push_back(o.labels == DFlashLabels::kInputIds ? ids[p] : argmax[p - 1]);
        sources.push_back(p - 1);
      }
    }
  }
  out.block_tokens = torch::tensor(tokens, torch::kLong);
  out.labels = torch::tensor(labels, torch::kLong);
  out.source_rows = torch::tensor(sources, torch::kLong);
  return out;
}

}  // namespace e3
