#include "teacher_server/models/forward_types.h"

#include "absl/strings/str_cat.h"

namespace e3 {

absl::StatusOr<PackedBatch> MakePackedBatch(at::Tensor input_ids, std::vector<int64_t> cu_seqlens,
                                            int64_t vocab_size, const at::Device& device) {
  if (input_ids.dim() != 1) return absl::InvalidArgumentError("input_ids must be 1-D (packed)");
  const int64_t T = input_ids.size(0);
  if (cu_seqlens.size() < 2 || cu_seqlens.front() != 0 || cu_seqlens.back() != T) {
    return absl::InvalidArgumentError(
        absl::StrCat("cu_seqlens must start at 0 and end at the token count ", T));
  }
  std::vector<int64_t> positions(T);
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    if (cu_seqlens[s + 1] <= cu_seqlens[s]) {
      return absl::InvalidArgumentError(absl::StrCat("cu_seqlens is not strictly increasing at sample ", s));
    }
    for (int64_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; ++t) positions[t] = t - cu_seqlens[s];
  }
  at::Tensor ids = input_ids.to(at::kCPU, at::kLong);
  if (T > 0) {
    int64_t lo = ids.min().item<int64_t>();
    int64_t hi = ids.max().item<int64_t>();
    if (lo < 0 || hi >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("input_ids hold ", lo < 0 ? lo : hi, ", outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  PackedBatch batch;
  batch.input_ids = ids.to(device);
  batch.position_ids = torch::tensor(positions, torch::kLong).to(device);
  batch.cu_seqlens = std::move(cu_seqlens);
  return batch;
}

absl::StatusOr<PackedBatch> PackSamples(const std::vector<std::vector<int32_t>>& samples,
                                        int64_t vocab_size, const at::Device& device) {
  std::vector<int64_t> ids;
  std::vector<int64_t> cu{0};
  for (size_t s = 0; s < samples.size(); ++s) {
    if (samples[s].empty()) return absl::InvalidArgumentError(absl::StrCat("sample ", s, " is empty"));
    ids.insert(ids.end(), samples[s].begin(), samples[s].end());
    cu.push_back(static_cast<int64_t>(ids.size()));
  }
  return MakePackedBatch(torch::tensor(ids, torch::kLong), std::move(cu), vocab_size, device);
}

}  // namespace e3
