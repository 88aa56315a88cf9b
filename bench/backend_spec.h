// Backend names for the benchmarks: the two --backend names of the teacher
// and variants for comparisons and ablations.
#ifndef E3_BENCH_BACKEND_SPEC_H_
#define E3_BENCH_BACKEND_SPEC_H_

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "teacher_server/models/causal_lm.h"

namespace e3::bench {

// "hf", "sgl", "hf-eager", or "sgl-no-fusion" / "-no-kernels" / "-no-varlen"
// / "-no-lt" (LibTorch's matmul, so no residual add in the GEMM either) /
// "-no-residual-gemm" / "-no-argmax-gemm" / "-no-fp8-argmax" / "-no-graphs"
// / "-no-tp-overlap" / "-no-grouped-experts" / "-no-gemm-tuning" (one sgl
// technique off, for ablations).
inline absl::Status ApplyBackendSpec(const std::string& spec, ModelOptions* o) {
  if (spec == "hf-eager") {
    E3_RETURN_IF_ERROR(SetBackend("hf", o));
    o->attention = AttentionKernel::kEager;
    return absl::OkStatus();
  }
  const std::string off = absl::StartsWith(spec, "sgl-no-") ? spec.substr(7) : "";
  E3_RETURN_IF_ERROR(SetBackend(off.empty() ? spec : "sgl", o));
  if (off == "fusion") {
    o->fuse_projections = false;
  } else if (off == "kernels") {
    o->fused_kernels = false;
  } else if (off == "varlen") {
    o->attention = AttentionKernel::kSdpa;
  } else if (off == "lt") {
    o->gemm = GemmPath::kAten;
  } else if (off == "residual-gemm") {
    o->residual_in_gemm = false;
  } else if (off == "argmax-gemm") {
    o->argmax_in_gemm = false;
  } else if (off == "fp8-argmax") {
    o->argmax_fp8 = false;
  } else if (off == "graphs") {
    o->cuda_graphs = false;
  } else if (off == "tp-overlap") {
    o->tp_overlap = false;
  } else if (off == "grouped-experts") {
    o->grouped_experts = false;
  } else if (off == "gemm-tuning") {
    o->gemm = GemmPath::kCublasLt;
  } else if (!off.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("backend ", spec,
                                                   ": expected sgl-no-fusion, -kernels, -varlen, -lt, "
                                                   "-residual-gemm, -argmax-gemm, -fp8-argmax, -graphs, "
                                                   "-tp-overlap, -grouped-experts or -gemm-tuning"));
  }
  return absl::OkStatus();
}

}  // namespace e3::bench

#endif  // E3_BENCH_BACKEND_SPEC_H_
