#include "student_trainer/step/batch_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace e3 {
namespace {

absl::Status FieldError(const std::string& field, const std::string& what) {
  return TttBatchError(field, what);
}

std::string ShapeOf(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes().vec(), ", "), "]");
}

absl::Status CheckShape(const std::string& field, const at::Tensor& t,
                        const std::vector<int64_t>& shape, bool integer) {
  if (!t.defined()) return FieldError(field, "missing");
  if (t.sizes().vec() != shape) {
    return FieldError(
        field, absl::StrCat("expected shape [", absl::StrJoin(shape, ", "), "], got ", ShapeOf(t)));
  }
  if (integer && (t.is_floating_point() || t.is_complex() || t.scalar_type() == at::kBool)) {
    return FieldError(
        field, absl::StrCat("expected an integer dtype, got ", c10::toString(t.scalar_type())));
  }
  if (!integer && !t.is_floating_point()) {
    return FieldError(
        field, absl::StrCat("expected a floating dtype, got ", c10::toString(t.scalar_type())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TttBatchError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("TTT batch: ", field, ": ", what));
}

absl::Status ValidateTttOptions(const TttOptions& options) {
  if (options.length < 1)
    return absl::InvalidArgumentError("TTT options: length must be at least 1");
  if (!std::isfinite(options.step_weight))
    return absl::InvalidArgumentError("TTT options: step_weight must be finite");
  if (!(options.kl_scale >= 0 && std::isfinite(options.kl_scale)) ||
      !(options.kl_decay >= 0 && std::isfinite(options.kl_decay))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TTT options: kl_scale and kl_decay must be finite and >= 0, got ", options.kl_scale,
        " and ", options.kl_decay));
  }
  return absl::OkStatus();
}

absl::Status CheckTttBatchShapes(const Eagle3DraftConfig& c, const TeacherBatch& batch) {
  if (!batch.input_ids.defined() || batch.input_ids.dim() != 1 || batch.input_ids.size(0) == 0) {
    return FieldError("input_ids", "expected a non-empty 1-D tensor");
  }
  const int64_t total = batch.input_ids.size(0);
  E3_RETURN_IF_ERROR(CheckShape("input_ids", batch.input_ids, {total}, /*integer=*/true));
  if (!batch.cu_seqlens.defined() || batch.cu_seqlens.dim() != 1 || batch.cu_seqlens.size(0) < 2) {
    return FieldError("cu_seqlens", "expected a 1-D tensor of at least 2 offsets");
  }
  E3_RETURN_IF_ERROR(
      CheckShape("cu_seqlens", batch.cu_seqlens, {batch.cu_seqlens.size(0)}, /*integer=*/true));
  if (!batch.loss_mask.defined() || batch.loss_mask.sizes().vec() != std::vector<int64_t>{total}) {
    return FieldError("loss_mask", absl::StrCat("expected shape [", total, "]"));
  }
  E3_RETURN_IF_ERROR(CheckShape("aux_hidden", batch.aux_hidden,
                                {total, c.num_aux * c.target_hidden_size},
                                /*integer=*/false));
  E3_RETURN_IF_ERROR(CheckShape("last_hidden", batch.last_hidden, {total, c.target_hidden_size},
                                /*integer=*/false));
  return CheckShape("target_argmax", batch.target_argmax, {total}, /*integer=*/true);
}

absl::Status CheckCuSeqlens(const std::vector<int64_t>& cu, int64_t total) {
  if (cu.size() < 2 || cu.front() != 0 || cu.back() != total) {
    return FieldError("cu_seqlens", absl::StrCat("must start at 0 and end at T = ", total,
                                                 ", got [", absl::StrJoin(cu, ", "), "]"));
  }
  for (size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) return FieldError("cu_seqlens", absl::StrCat("decreases at index ", i));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ValidateTttBatch(const Eagle3DraftConfig& c,
                                                      const TeacherBatch& batch) {
  E3_RETURN_IF_ERROR(CheckTttBatchShapes(c, batch));
  const at::Tensor cu_cpu = batch.cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> cu(cu_cpu.data_ptr<int64_t>(), cu_cpu.data_ptr<int64_t>() + cu_cpu.numel());
  E3_RETURN_IF_ERROR(CheckCuSeqlens(cu, batch.input_ids.size(0)));
  return cu;
}

absl::Status CheckIdRange(const std::string& field, const at::Tensor& ids, int64_t vocab) {
  const int64_t lo = ids.min().item<int64_t>();
  const int64_t hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= vocab) {
    return FieldError(field,
                      absl::StrCat("ids must lie in [0, ", vocab, "), got min ", lo, ", max ", hi));
  }
  return absl::OkStatus();
}

}  // namespace e3
