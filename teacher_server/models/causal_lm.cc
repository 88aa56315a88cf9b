#include "teacher_server/models/causal_lm.h"

#include "absl/strings/str_cat.h"
#include "teacher_server/models/decoder_lm.h"
#include "teacher_server/models/deepseek_lm.h"
#include "teacher_server/models/gpt_oss_lm.h"
#include "teacher_server/parallel/micro_batches.h"

namespace e3 {

absl::Status SetBackend(const std::string& backend, ModelOptions* options) {
  if (backend != "hf" && backend != "sgl") {
    return absl::InvalidArgumentError(absl::StrCat("backend \"", backend, "\": expected hf or sgl"));
  }
  const bool sgl = backend == "sgl";
  options->fuse_projections = sgl;
  options->fused_kernels = sgl;
  options->attention = sgl ? AttentionKernel::kFlashVarlen : AttentionKernel::kSdpa;
  options->gemm = sgl ? GemmPath::kCublasLtTuned : GemmPath::kAten;
  options->residual_in_gemm = sgl;
  options->argmax_in_gemm = sgl;
  options->argmax_fp8 = sgl;
  options->cuda_graphs = sgl;
  options->tp_overlap = sgl;
  options->grouped_experts = sgl;
  return absl::OkStatus();
}

int64_t MicroBatchSplit(const ModelOptions& options, const std::vector<int64_t>& cu_seqlens) {
  return options.tp_overlap ? OverlapSplitPoint(cu_seqlens, options.tp_overlap_min_tokens) : 0;
}

absl::StatusOr<std::unique_ptr<CausalLM>> LoadCausalLM(const ModelDir& dir, const ModelOptions& options) {
  if (dir.config().IsDeepseek()) {
    auto model = DeepseekLM::Load(dir, options);
    if (!model.ok()) return model.status();
    return std::unique_ptr<CausalLM>(std::move(model).value());
  }
  if (dir.config().architecture == Architecture::kGptOss) {
    auto gpt_oss = GptOssLM::Load(dir, options);
    if (!gpt_oss.ok()) return gpt_oss.status();
    return std::unique_ptr<CausalLM>(std::move(gpt_oss).value());
  }
  // Every other supported architecture is a DecoderLM variant.
  auto model = DecoderLM::Load(dir, options);
  if (!model.ok()) return model.status();
  return std::unique_ptr<CausalLM>(std::move(model).value());
}

}  // namespace e3
