#include "student_trainer/draft_builder.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "student_trainer/draft/draft_export.h"

namespace e3 {

absl::StatusOr<Eagle3Draft> BuiltDraft::Initial() const {
  Eagle3DraftOptions initial = options;
  initial.dtype = (master.has_value() ? **master : *draft).options().dtype;
  initial.keep_full_target_head = false;  // it only drafts
  E3_ASSIGN_OR_RETURN(Eagle3Draft d, CreateEagle3Draft(initial, frozen));
  if (!init_from.empty()) E3_RETURN_IF_ERROR(LoadDraftExport(*d, init_from, OtherTarget::kWarn));
  return d;
}

absl::StatusOr<at::Device> ParseStudentDevice(const std::string& name) {
  return ParseUsableDevice(name, "--device");
}

absl::StatusOr<BuiltDraft> BuildDraft(const TeacherInfo& info, const FrozenWeights& frozen,
                                      const DraftBuildOptions& o, ProcessGroup* group) {
  ModelConfig target = info.config;
  if (o.intermediate_size > 0) target.intermediate_size = o.intermediate_size;
  BuiltDraft b;
  E3_ASSIGN_OR_RETURN(b.options.config,
                      DraftConfigFromTarget(target, info.draft_vocab_size, info.aux_layer_ids));
  b.options.config.target = info.target;
  b.dtype_name = o.dtype.empty() ? (o.device.is_cuda() ? "bfloat16" : "float32") : o.dtype;
  b.options.seed = o.init_seed;
  b.options.device = o.device;
  b.options.keep_full_target_head = o.keep_full_target_head;
  E3_ASSIGN_OR_RETURN(b.options.dtype, ParseComputeScalarType(b.dtype_name));
  // The frozen tensors go to the device once, in the dtypes the draft keeps
  // them in, so the working draft and the fp32 master share them.
  try {
    b.frozen = {frozen.embed_tokens.to(o.device),
                frozen.target_head.to(o.device, b.options.target_head_dtype), frozen.vocab};
    if (frozen.target_head_rest.defined()) {
      b.frozen.target_head_rest = frozen.target_head_rest.to(o.device, b.options.target_head_dtype);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("moving the frozen weights to ", o.device.str(), ": ",
                                            e.what_without_backtrace()));
  }
  E3_ASSIGN_OR_RETURN(b.draft, CreateEagle3Draft(b.options, b.frozen));
  if (b.options.dtype != at::kFloat) {
    Eagle3DraftOptions master = b.options;
    master.dtype = at::kFloat;
    master.keep_full_target_head = false;  // the master is never run
    E3_ASSIGN_OR_RETURN(b.master, CreateEagle3Draft(master, b.frozen));
  }
  const DraftOptimizerKind kind =
      o.kernels == TttKernels::kFast ? DraftOptimizerKind::kFused : DraftOptimizerKind::kReference;
  E3_ASSIGN_OR_RETURN(b.optimizer, CreateDraftOptimizer(
                                       kind, *b.draft, b.master.has_value() ? &**b.master : nullptr,
                                       group, o.optimizer));
  return b;
}

}  // namespace e3
