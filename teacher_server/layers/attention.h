// Causal GQA self-attention over packed samples: each sample attends only
// within itself (cu_seqlens), never across samples.
#ifndef E3_TEACHER_SERVER_LAYERS_ATTENTION_H_
#define E3_TEACHER_SERVER_LAYERS_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "common/torch/gemm.h"
#include "common/torch/torch_core.h"

namespace e3 {

enum class AttentionKernel {
  kEager,  // transformers' eager_attention_forward: matmul, fp32 softmax, matmul
  kSdpa,   // scaled_dot_product_attention per sample (fused kernels on GPU)
  // One fused call over the whole packed batch (CUDA, bf16/fp16, LibTorch
  // 2.x): no per-sample loop, no copies, GQA without repeating k/v. Ragged
  // batches go through the varlen flash kernel; batches whose samples all
  // have one length through cuDNN's batched kernel, the faster of the two
  // (bench/results/2026-12-02-teacher-kernels-gemm-tuning.md). Elsewhere it falls back to kSdpa.
  kFlashVarlen,
};

// Where the packed samples start, for the attention of one forward.
struct PackedLayout {
  std::vector<int64_t> cu_seqlens;  // B + 1 offsets (host)
  int64_t max_seqlen = 0;
  bool uniform = false;  // every sample has max_seqlen tokens
  at::Tensor cu_seqlens_device;  // int32 on the model's device; set only for kFlashVarlen
};

// Whether kFlashVarlen runs its fused kernels for these tensors (CUDA with
// LibTorch 2.5+, bf16/fp16, head_dim a multiple of 8 up to 256); else it
// falls back to kSdpa per sample.
bool FlashVarlenAppliesTo(at::ScalarType dtype, int64_t head_dim, const at::Device& device);

// False once cuDNN's batched kernel has failed in this process (uniform
// batches then use the varlen flash kernel too); for tests and logs.
bool CudnnAttentionUsable();

// The offsets as int32 in pinned host memory (CUDA builds only): a copy
// from there to the GPU is queued behind the work already on the stream
// instead of waiting for it, as a copy from pageable memory does.
at::Tensor PinnedCuSeqlens(const std::vector<int64_t>& cu_seqlens);

PackedLayout MakePackedLayout(const std::vector<int64_t>& cu_seqlens, const at::Device& device,
                              AttentionKernel kernel);

struct AttentionOptions {
  AttentionKernel kernel = AttentionKernel::kSdpa;
  // Rotate q and k in place, as one kernel each on CUDA (fused_ops.h),
  // instead of building new tensors.
  bool rope_in_place = false;
  // Which GEMM the q/k/v and o projections run (gemm.h).
  GemmPath gemm = GemmPath::kAten;
};

struct AttentionShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  double qk_norm_eps = 1e-6;  // used when q_norm/k_norm are set
  // The q/k norms multiply by their weight in fp32 before the cast back
  // (RmsNormWeightInFp32): Qwen3-Next's zero-centred norms, whose fp32
  // weight the loader stores as 1 + w.
  bool qk_norm_weight_in_fp32 = false;
  // Qwen3-Next's gated attention: q_proj's rows hold, per head, D query
  // rows then D gate rows, and the attention output is multiplied by
  // sigmoid(gate) before o_proj.
  bool output_gate = false;
  // Keys a query sees, itself included, on a sliding-window layer (GPT-OSS;
  // sink_attention.h). 0: every earlier key of its sample.
  int64_t sliding_window = 0;
};

struct AttentionWeights {
  at::Tensor q_proj, k_proj, v_proj, o_proj;  // [out, in], nn.Linear layout
  at::Tensor q_bias, k_bias, v_bias, o_bias;  // undefined when absent
  at::Tensor q_norm, k_norm;  // [D] per-head RMSNorm before rope (Qwen3); undefined when absent
  at::Tensor sinks;           // [heads] learned softmax sinks (GPT-OSS); undefined when absent
  // Set by FuseQkv: [q_out + 2 kv_out, in] (and its bias); q/k/v_proj are
  // then released.
  at::Tensor qkv_proj, qkv_bias;
};

// Concatenates q/k/v into qkv_proj (rows q, then k, then v).
void FuseQkv(AttentionWeights* w);

class KvCache;  // layers/kv_cache.h
// A generation's cache and this layer's index in it (no cache: a plain
// prefill).
struct KvCacheSlot {
  KvCache* cache = nullptr;
  int64_t layer = 0;
};

// x: [T, H]; cos/sin: [T, rotary_dim]. Returns [T, H]: the attention
// output, plus `residual` when that is defined (added in the o_proj GEMM).
// With sinks or a sliding window the core is FlashSinkAttention where
// options.kernel is kFlashVarlen and the kernel applies, else
// PackedSinkAttention, or over a cache CachedSinkAttention
// (sink_attention.h).
// With a cache the new tokens' keys and values are stored there and the
// tokens attend over their sequences' cached ones too.
at::Tensor SelfAttention(const at::Tensor& x, const AttentionWeights& w, const AttentionShape& shape,
                         const at::Tensor& cos, const at::Tensor& sin, const PackedLayout& layout,
                         const AttentionOptions& options, const at::Tensor& residual = at::Tensor(),
                         KvCacheSlot cache = {});

// q/k: [T, heads or kv_heads, D], v: [T, kv_heads, Dv] (last dimension
// contiguous). Returns [T, heads, Dv]. kFlashVarlen needs Dv == D.
at::Tensor PackedCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const PackedLayout& layout, double scaling, AttentionKernel kernel);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_ATTENTION_H_
