#include "student_trainer/ops/ttt_attention.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

#include "common/torch/torch_compat.h"
#include "student_trainer/ops/autograd_capsule.h"
#include "student_trainer/ops/kernel_switch.h"
#include "student_trainer/ops/rope_qkv.h"

namespace e3::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType MathType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// Which kernel computed the causal block (its backward runs the same one).
enum class BlockKernel { kAten = 0, kFlash = 1, kCudnn = 2 };

// The causal block's result: output [T, H, D] and log-sum-exp [H, T]
// (fp32; fp64 for fp64 drafts), and the RNG state the kernel's backward
// takes (flash: rng_state and unused; cuDNN: philox seed and offset).
struct BlockResult {
  at::Tensor out, lse, state_a, state_b;
  BlockKernel kernel = BlockKernel::kAten;
  bool fused() const { return kernel != BlockKernel::kAten; }
};

bool FlashTakes(const at::Tensor& q) {
  if (!compat::kHasFlashVarlen || !StudentKernelsEnabled() || !q.is_cuda()) return false;
  const int64_t d = q.size(-1);
  return (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf) && d % 8 == 0 &&
         d <= 256;
}

// One long sequence runs cuDNN's fused attention instead: it computes
// the causal block faster than varlen flash at such lengths
// (bench/results/2026-12-02-student-step-vs-eager.md). cuDNN builds a graph per shape, which is slow,
// so the rows are padded to a multiple of kCudnnRowStep: zero queries and
// keys after the last token, which no real query attends to (causal) and
// whose output gradient is zero, so they change nothing.
constexpr int64_t kCudnnMinTokens = 4096;
constexpr int64_t kCudnnRowStep = 512;
std::atomic<bool> g_cudnn_ttt{true};
std::atomic<int64_t> g_cudnn_ttt_calls{0};

void DisableCudnnTtt(const std::string& why) {
  if (g_cudnn_ttt.exchange(false)) {
    std::fprintf(stderr, "TTT attention: cuDNN's kernel failed (%s); using varlen flash attention\n",
                 why.substr(0, 300).c_str());
  }
}

bool CudnnTakes(const TttAttentionCache& c, const at::Tensor& q) {
  return g_cudnn_ttt.load(std::memory_order_relaxed) && FlashTakes(q) && c.cu_host().size() == 2 &&
         c.tokens() >= kCudnnMinTokens && q.size(-1) <= 128;
}

int64_t PaddedRows(int64_t t) { return (t + kCudnnRowStep - 1) / kCudnnRowStep * kCudnnRowStep; }

// x [n, ...] in `rows` rows, zeros after the first n.
at::Tensor PadRows(const at::Tensor& x, int64_t rows) {
  if (x.size(0) == rows) return x;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = rows;
  at::Tensor out = at::zeros(shape, x.options());
  out.narrow(0, 0, x.size(0)).copy_(x);
  return out;
}

// [rows, heads, D] -> [1, heads, rows, D], the layout cuDNN takes (a view).
at::Tensor Bhsd(const at::Tensor& x) { return x.unsqueeze(0).transpose(1, 2); }
// And back, keeping the first t rows: [1, heads, rows, D] -> [t, heads, D].
at::Tensor Thd(const at::Tensor& x, int64_t t) { return x.squeeze(0).transpose(0, 1).narrow(0, 0, t).contiguous(); }

// Query head h reads kv head h / group: [n, kv_heads, D] -> [n, heads, D].
at::Tensor RepeatHeads(const at::Tensor& x, int64_t group) {
  return group == 1 ? x : x.repeat_interleave(group, /*dim=*/1);
}
// The transpose: sums the query heads of each kv head.
at::Tensor SumGroups(const at::Tensor& x, int64_t group) {
  if (group == 1) return x;
  return x.view({x.size(0), x.size(1) / group, group, x.size(2)}).sum(2);
}

// Scores of one sample's queries against its step-0 keys, [H, n, n], with
// -inf above the diagonal.
at::Tensor CausalScores(const at::Tensor& q, const at::Tensor& k, double scale, int64_t group) {
  const at::ScalarType f = MathType(q.scalar_type());
  const at::Tensor qh = q.to(f).transpose(0, 1);                      // [H, n, D]
  const at::Tensor kh = RepeatHeads(k, group).to(f).transpose(0, 1);  // [H, n, D]
  const int64_t n = q.size(0);
  const at::Tensor mask =
      at::full({n, n}, -std::numeric_limits<double>::infinity(), qh.options()).triu(1);
  return at::baddbmm(mask.expand({qh.size(0), n, n}), qh, kh.transpose(1, 2), /*beta=*/1.0,
                     /*alpha=*/scale);
}

BlockResult BlockForwardAten(const TttAttentionCache& c, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v) {
  const int64_t group = c.config().q_heads / c.config().kv_heads;
  const at::ScalarType f = MathType(q.scalar_type());
  std::vector<at::Tensor> outs, lses;
  const auto& cu = c.cu_host();
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t begin = cu[s], n = cu[s + 1] - cu[s];
    if (n == 0) continue;
    const at::Tensor scores =
        CausalScores(q.narrow(0, begin, n), k.narrow(0, begin, n), c.config().scale, group);
    const at::Tensor lse = at::logsumexp(scores, -1);  // [H, n]
    const at::Tensor probs = (scores - lse.unsqueeze(-1)).exp();
    const at::Tensor vh = RepeatHeads(v.narrow(0, begin, n), group).to(f).transpose(0, 1);
    outs.push_back(at::bmm(probs, vh).transpose(0, 1));  // [n, H, D]
    lses.push_back(lse);
  }
  return {at::cat(outs, 0), at::cat(lses, 1), {}, {}, BlockKernel::kAten};
}

// The block through cuDNN over the step's padded rows; nullopt (and cuDNN
// off for the process, said once) where cuDNN refuses.
std::optional<BlockResult> BlockForwardCudnn(const TttAttentionCache& c, int64_t step) {
  const auto& cfg = c.config();
  const int64_t t = c.tokens();
  const at::Tensor padded = c.padded(step), padded0 = c.padded(0);
  try {
    compat::CudnnAttentionResult r = compat::CudnnCausalAttentionWithLse(
        Bhsd(padded.narrow(1, 0, cfg.q_heads)), Bhsd(padded0.narrow(1, cfg.q_heads, cfg.kv_heads)),
        Bhsd(padded0.narrow(1, cfg.q_heads + cfg.kv_heads, cfg.kv_heads)), cfg.scale);
    g_cudnn_ttt_calls.fetch_add(1, std::memory_order_relaxed);
    at::Tensor lse = r.lse.reshape({cfg.q_heads, padded.size(0)}).narrow(1, 0, t).contiguous();
    return BlockResult{Thd(r.out, t), lse, r.philox_seed, r.philox_offset, BlockKernel::kCudnn};
  } catch (const c10::OutOfMemoryError&) {
    throw;  // transient: the step fails, cuDNN stays in use
  } catch (const c10::Error& e) {
    DisableCudnnTtt(e.what_without_backtrace());
    return std::nullopt;
  }
}

BlockResult BlockForward(const TttAttentionCache& c, int64_t step) {
  const at::Tensor q = c.Query(step), k = c.Key(0), v = c.Value(0);
  if (!FlashTakes(q)) return BlockForwardAten(c, q, k, v);
  if (CudnnTakes(c, q)) {
    if (auto r = BlockForwardCudnn(c, step)) return *r;
  }
  compat::FlashVarlenResult r =
      compat::FlashVarlenAttentionWithLse(q, k, v, c.cu_device(), c.max_seqlen(), c.config().scale);
  TORCH_CHECK(r.lse.dim() == 2 && r.lse.size(0) == q.size(1) && r.lse.size(1) == q.size(0),
              "flash attention returned a log-sum-exp of shape ", r.lse.sizes(),
              "; the TTT merge expects [", q.size(1), ", ", q.size(0), "] (the varlen layout)");
  return {r.out, r.lse, r.rng_state, r.unused, BlockKernel::kFlash};
}

// The causal block's gradients through cuDNN over the padded rows: the
// padding's output gradient is zero (and its log-sum-exp 0, finite over
// its zero scores), so its rows add nothing.
std::tuple<at::Tensor, at::Tensor, at::Tensor> BlockBackwardCudnn(const TttAttentionCache& c, int64_t step,
                                                                  const at::Tensor& d_o, const at::Tensor& out,
                                                                  const at::Tensor& lse,
                                                                  const compat::CudnnAttentionResult& state) {
  const auto& cfg = c.config();
  const int64_t t = c.tokens();
  const at::Tensor padded = c.padded(step), padded0 = c.padded(0);
  const int64_t rows = padded.size(0);
  at::Tensor lse_padded = at::zeros({cfg.q_heads, rows}, lse.options());
  lse_padded.narrow(1, 0, t).copy_(lse);
  auto [dq, dk, dv] = compat::CudnnCausalAttentionBackward(
      Bhsd(PadRows(d_o, rows)), Bhsd(padded.narrow(1, 0, cfg.q_heads)),
      Bhsd(padded0.narrow(1, cfg.q_heads, cfg.kv_heads)),
      Bhsd(padded0.narrow(1, cfg.q_heads + cfg.kv_heads, cfg.kv_heads)), Bhsd(PadRows(out, rows)),
      lse_padded.view({1, cfg.q_heads, rows, 1}), state, cfg.scale);
  g_cudnn_ttt_calls.fetch_add(1, std::memory_order_relaxed);
  return {Thd(dq, t), Thd(dk, t), Thd(dv, t)};
}

// The causal block's gradients given the merged output and log-sum-exp:
// P = exp(S - lse) over the block, D = rowsum(do * out),
// dS = P (do v^T - D), dq = scale dS k, dk = scale dS^T q, dv = P^T do.
std::tuple<at::Tensor, at::Tensor, at::Tensor> BlockBackwardAten(
    const TttAttentionCache& c, const at::Tensor& d_o, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse) {
  const int64_t group = c.config().q_heads / c.config().kv_heads;
  const double scale = c.config().scale;
  const at::ScalarType f = lse.scalar_type();
  std::vector<at::Tensor> dqs, dks, dvs;
  const auto& cu = c.cu_host();
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t begin = cu[s], n = cu[s + 1] - cu[s];
    if (n == 0) continue;
    const at::Tensor qs = q.narrow(0, begin, n), ks = k.narrow(0, begin, n),
                     vs = v.narrow(0, begin, n);
    const at::Tensor probs =
        (CausalScores(qs, ks, scale, group) - lse.narrow(1, begin, n).unsqueeze(-1)).exp();
    const at::Tensor doh = d_o.narrow(0, begin, n).to(f).transpose(0, 1);  // [H, n, D]
    const at::Tensor oh = out.narrow(0, begin, n).to(f).transpose(0, 1);
    const at::Tensor vh = RepeatHeads(vs, group).to(f).transpose(0, 1);
    const at::Tensor kh = RepeatHeads(ks, group).to(f).transpose(0, 1);
    const at::Tensor qh = qs.to(f).transpose(0, 1);
    const at::Tensor d_sum = (doh * oh).sum(-1, /*keepdim=*/true);             // [H, n, 1]
    const at::Tensor ds = probs * (at::bmm(doh, vh.transpose(1, 2)) - d_sum);  // [H, n, n]
    dqs.push_back((at::bmm(ds, kh) * scale).transpose(0, 1));
    dks.push_back(
        SumGroups((at::bmm(ds.transpose(1, 2), qh) * scale).transpose(0, 1).contiguous(), group));
    dvs.push_back(
        SumGroups(at::bmm(probs.transpose(1, 2), doh).transpose(0, 1).contiguous(), group));
  }
  return {at::cat(dqs, 0), at::cat(dks, 0), at::cat(dvs, 0)};
}

// Diagonal scores of step j's queries against keys 1..j: [T, H, j].
at::Tensor DiagScores(const TttAttentionCache& c, const at::Tensor& q, int64_t step) {
  const auto& cfg = c.config();
  const int64_t group = cfg.q_heads / cfg.kv_heads, t = q.size(0);
  const at::ScalarType f = MathType(q.scalar_type());
  const at::Tensor qg = q.to(f).reshape({t, cfg.kv_heads, group, cfg.head_dim});
  std::vector<at::Tensor> cols;
  for (int64_t i = 1; i <= step; ++i) {
    const at::Tensor k = c.Key(i).to(f).unsqueeze(2);  // [T, KVH, 1, D]
    cols.push_back(((qg * k).sum(-1) * cfg.scale).reshape({t, cfg.q_heads}));
  }
  return at::stack(cols, -1);
}

// Diagonal values weighted by p [T, H, j]: sum_i p_i v_i, [T, H, D].
at::Tensor WeightedValues(const TttAttentionCache& c, const at::Tensor& p, int64_t step) {
  const auto& cfg = c.config();
  const int64_t group = cfg.q_heads / cfg.kv_heads, t = p.size(0);
  at::Tensor acc = at::zeros({t, cfg.kv_heads, group, cfg.head_dim}, p.options());
  const at::Tensor pg = p.reshape({t, cfg.kv_heads, group, step});
  for (int64_t i = 1; i <= step; ++i) {
    acc = acc + pg.select(-1, i - 1).unsqueeze(-1) * c.Value(i).to(p.scalar_type()).unsqueeze(2);
  }
  return acc.reshape({t, cfg.q_heads, cfg.head_dim});
}

std::pair<at::Tensor, at::Tensor> DiagForwardAten(const TttAttentionCache& c, const at::Tensor& q,
                                                  int64_t step, const BlockResult& block) {
  const at::ScalarType f = MathType(q.scalar_type());
  const at::Tensor scores = DiagScores(c, q, step);  // [T, H, j]
  const at::Tensor lse_blk = block.lse.to(f).t();    // [T, H]
  const at::Tensor lse = at::logsumexp(at::cat({lse_blk.unsqueeze(-1), scores}, -1), -1);
  const at::Tensor out = (lse_blk - lse).exp().unsqueeze(-1) * block.out.to(f) +
                         WeightedValues(c, (scores - lse.unsqueeze(-1)).exp(), step);
  return {out.to(q.scalar_type()), lse.t().contiguous()};
}

#ifdef E3_HAS_CUDA
// Step j's layout and its diagonal keys and values (steps 1..j), as the
// merge kernels take them.
kernels::TttAttentionShape KernelShape(const TttAttentionCache& c, int64_t step) {
  const auto& cfg = c.config();
  return {c.tokens(),
          cfg.q_heads,
          cfg.kv_heads,
          cfg.head_dim,
          c.padded(step).stride(0),
          static_cast<float>(cfg.scale)};
}

kernels::DiagKeys KernelDiagKeys(const TttAttentionCache& c, int64_t step) {
  kernels::DiagKeys diag;
  diag.num_diag = static_cast<int>(step);
  for (int64_t i = 1; i <= step; ++i) {
    diag.keys[i - 1] = c.Key(i).data_ptr();
    diag.values[i - 1] = c.Value(i).data_ptr();
  }
  return diag;
}
#endif

std::pair<at::Tensor, at::Tensor> DiagForward(const TttAttentionCache& c, const at::Tensor& q,
                                              int64_t step, const BlockResult& block) {
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (block.fused() && StudentKernelDtype(q, &dt) && step <= kernels::kMaxDiagKeys &&
      block.out.is_contiguous() && block.lse.is_contiguous()) {
    const kernels::TttAttentionShape shape = KernelShape(c, step);
    const kernels::DiagKeys diag = KernelDiagKeys(c, step);
    at::Tensor out = at::empty_like(block.out);
    at::Tensor lse = at::empty_like(block.lse);
    if (kernels::TttDiagForward(dt, shape, q.data_ptr(), diag, block.out.data_ptr(),
                                        block.lse.data_ptr<float>(), out.data_ptr(),
                                        lse.data_ptr<float>(), StudentKernelStream(q))) {
      CheckStudentKernelLaunch("TttDiagForward");
      return {out, lse};
    }
  }
#endif
  return DiagForwardAten(c, q, step, block);
}

// The diagonal terms' backward: returns dq (dq_blk plus theirs, in the
// accumulators' type) and adds into the key/value gradients of steps 1..j.
at::Tensor DiagBackwardAten(TttAttentionCache& c, const at::Tensor& q, int64_t step,
                            const at::Tensor& out, const at::Tensor& lse, const at::Tensor& d_o,
                            const at::Tensor& dq_blk, at::ScalarType f) {
  at::Tensor dq = dq_blk.to(f);
  if (step == 0) return dq;
  const auto& cfg = c.config();
  const int64_t group = cfg.q_heads / cfg.kv_heads;
  const at::Tensor dof = d_o.to(f);
  const at::Tensor d_sum = (dof * out.to(f)).sum(-1);                                 // [T, H]
  const at::Tensor p = (DiagScores(c, q, step) - lse.to(f).t().unsqueeze(-1)).exp();  // [T, H, j]
  const at::Tensor qf = q.to(f);
  for (int64_t i = 1; i <= step; ++i) {
    const at::Tensor k = RepeatHeads(c.Key(i), group).to(f),
                     v = RepeatHeads(c.Value(i), group).to(f);
    const at::Tensor pi = p.select(-1, i - 1);  // [T, H]
    const at::Tensor ds = pi * ((dof * v).sum(-1) - d_sum);
    dq = dq + (ds * cfg.scale).unsqueeze(-1) * k;
    c.KeyGrad(i, f).add_(SumGroups((ds * cfg.scale).unsqueeze(-1) * qf, group));
    c.ValueGrad(i, f).add_(SumGroups(pi.unsqueeze(-1) * dof, group));
  }
  return dq;
}

at::Tensor DiagBackward(TttAttentionCache& c, const at::Tensor& q, int64_t step,
                        const at::Tensor& out, const at::Tensor& lse, const at::Tensor& d_o,
                        const at::Tensor& dq_blk, bool flash) {
  const at::ScalarType f = MathType(q.scalar_type());
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (flash && StudentKernelDtype(q, &dt) && step <= kernels::kMaxDiagKeys &&
      dq_blk.is_contiguous() && out.is_contiguous() && lse.is_contiguous()) {
    const kernels::TttAttentionShape shape = KernelShape(c, step);
    const kernels::DiagKeys diag = KernelDiagKeys(c, step);
    std::vector<float*> dk(static_cast<size_t>(std::max<int64_t>(step, 1))), dv(dk.size());
    for (int64_t i = 1; i <= step; ++i) {
      dk[i - 1] = c.KeyGrad(i, at::kFloat).data_ptr<float>();
      dv[i - 1] = c.ValueGrad(i, at::kFloat).data_ptr<float>();
    }
    at::Tensor dq = at::empty(q.sizes(), q.options().dtype(at::kFloat));
    at::Tensor scratch = at::empty({kernels::TttDiagScratchFloats(shape)}, dq.options());
    if (kernels::TttDiagBackward(dt, shape, q.data_ptr(), diag, out.data_ptr(),
                                         lse.data_ptr<float>(), d_o.data_ptr(), dq_blk.data_ptr(),
                                         dq.data_ptr<float>(), dk.data(), dv.data(),
                                         scratch.data_ptr<float>(), StudentKernelStream(q))) {
      CheckStudentKernelLaunch("TttDiagBackward");
      return dq;
    }
  }
#endif
  return DiagBackwardAten(c, q, step, out, lse, d_o, dq_blk, f);
}

class TttAttentionFunction : public torch::autograd::Function<TttAttentionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, const at::Tensor& capsule,
                            const at::Tensor& cos, const at::Tensor& sin) {
    auto cache = FromCapsule<TttAttentionCache>(capsule);
    const auto& cfg = cache->config();
    const int64_t step = cache->steps();
    at::Tensor roped = RopeQkvForward(qkv, cfg.q_heads, cfg.kv_heads, cfg.head_dim, cos, sin);
    // Step 0 decides for every step: the keys all attend to are its rows.
    if (step == 0 ? CudnnTakes(*cache, roped) : cache->padded(0).size(0) > cache->tokens()) {
      roped = PadRows(roped, PaddedRows(cache->tokens()));
    }
    cache->Append(std::move(roped));
    const at::Tensor q = cache->Query(step);
    BlockResult block = BlockForward(*cache, step);
    at::Tensor out = block.out, lse = block.lse;
    if (step > 0) std::tie(out, lse) = DiagForward(*cache, q, step, block);
    if (!block.fused()) out = out.to(qkv.scalar_type());
    ctx->saved_data["capsule"] = capsule;
    ctx->saved_data["step"] = step;
    ctx->saved_data["kernel"] = static_cast<int64_t>(block.kernel);
    ctx->save_for_backward({out, lse, cos, sin, block.state_a, block.state_b});
    return out.reshape({qkv.size(0), cfg.q_heads * cfg.head_dim});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto cache = FromCapsule<TttAttentionCache>(ctx->saved_data["capsule"].toTensor());
    const int64_t step = ctx->saved_data["step"].toInt();
    const auto kernel = static_cast<BlockKernel>(ctx->saved_data["kernel"].toInt());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &out = saved[0], &lse = saved[1], &cos = saved[2], &sin = saved[3];
    const auto& cfg = cache->config();
    const int64_t t = cache->tokens();
    const at::Tensor d_o = grads[0].reshape({t, cfg.q_heads, cfg.head_dim}).contiguous();
    const at::Tensor q = cache->Query(step), k0 = cache->Key(0), v0 = cache->Value(0);
    const at::ScalarType f = MathType(q.scalar_type());
    at::Tensor dq_blk, dk0, dv0;
    if (kernel == BlockKernel::kCudnn) {
      std::tie(dq_blk, dk0, dv0) = BlockBackwardCudnn(*cache, step, d_o, out, lse, {{}, {}, saved[4], saved[5]});
    } else if (kernel == BlockKernel::kFlash) {
      std::tie(dq_blk, dk0, dv0) =
          compat::FlashVarlenAttentionBackward(d_o, q, k0, v0, out, lse, cache->cu_device(),
                                               cache->max_seqlen(), cfg.scale, saved[4], saved[5]);
      dq_blk = dq_blk.contiguous();
    } else {
      std::tie(dq_blk, dk0, dv0) = BlockBackwardAten(*cache, d_o, q, k0, v0, out, lse);
    }
    cache->KeyGrad(0, f).add_(dk0);
    cache->ValueGrad(0, f).add_(dv0);
    const at::Tensor dq = DiagBackward(*cache, q, step, out, lse, d_o, dq_blk, kernel != BlockKernel::kAten);
    at::Tensor d_qkv = RopeQkvBackward(dq.to(f).contiguous(), cache->KeyGrad(step, f),
                                       cache->ValueGrad(step, f), cos, sin, out.scalar_type());
    cache->FinishBackward(step);
    return {d_qkv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

TttAttentionCache::TttAttentionCache(const TttAttentionConfig& config,
                                     std::vector<int64_t> cu_seqlens, const at::Tensor& cu_device)
    : config_(config), cu_host_(std::move(cu_seqlens)), cu_device_(cu_device.to(at::kInt)) {
  TORCH_CHECK(cu_host_.size() >= 2 && cu_device_.numel() == static_cast<int64_t>(cu_host_.size()) &&
                  config_.kv_heads > 0 && config_.q_heads % config_.kv_heads == 0,
              "TttAttentionCache: bad packing or heads");
  for (size_t s = 0; s + 1 < cu_host_.size(); ++s)
    max_seqlen_ = std::max(max_seqlen_, cu_host_[s + 1] - cu_host_[s]);
}

at::Tensor TttAttentionCache::Query(int64_t step) const {
  return roped_[step].narrow(0, 0, tokens()).narrow(1, 0, config_.q_heads);
}
at::Tensor TttAttentionCache::Key(int64_t step) const {
  return roped_[step].narrow(0, 0, tokens()).narrow(1, config_.q_heads, config_.kv_heads);
}
at::Tensor TttAttentionCache::Value(int64_t step) const {
  return roped_[step].narrow(0, 0, tokens()).narrow(1, config_.q_heads + config_.kv_heads, config_.kv_heads);
}

at::Tensor& TttAttentionCache::KeyGrad(int64_t step, at::ScalarType type) {
  if (key_grads_.size() < roped_.size()) key_grads_.resize(roped_.size());
  at::Tensor& g = key_grads_[step];
  if (!g.defined())
    g = at::zeros({tokens(), config_.kv_heads, config_.head_dim},
                  roped_[step].options().dtype(type));
  return g;
}

at::Tensor& TttAttentionCache::ValueGrad(int64_t step, at::ScalarType type) {
  if (value_grads_.size() < roped_.size()) value_grads_.resize(roped_.size());
  at::Tensor& g = value_grads_[step];
  if (!g.defined())
    g = at::zeros({tokens(), config_.kv_heads, config_.head_dim},
                  roped_[step].options().dtype(type));
  return g;
}

void TttAttentionCache::FinishBackward(int64_t step) {
  if (backward_done_.size() < roped_.size()) backward_done_.resize(roped_.size(), false);
  for (int64_t later = step + 1; later < steps(); ++later) {
    TORCH_CHECK(backward_done_[later], "TTT attention: the backward of step ", step,
                " ran before step ", later, "'s; its key and value gradients would be incomplete");
  }
  backward_done_[step] = true;
  key_grads_[step] = at::Tensor();
  value_grads_[step] = at::Tensor();
  // Step 0's keys and values serve every step's backward; a later step's
  // projection is needed by no earlier one.
  if (step > 0) roped_[step] = at::Tensor();
}

void SetTttCudnnAttention(bool on) { g_cudnn_ttt.store(on); }
int64_t TttCudnnAttentionCalls() { return g_cudnn_ttt_calls.load(); }

at::Tensor TttAttentionStep(const std::shared_ptr<TttAttentionCache>& cache, const at::Tensor& qkv,
                            const at::Tensor& cos, const at::Tensor& sin) {
  return TttAttentionFunction::apply(qkv, ToCapsule(cache), cos, sin);
}

}  // namespace e3::ops
