#include "student_trainer/ops/dflash_block_attention.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/torch/torch_compat.h"
#include "student_trainer/ops/autograd_capsule.h"
#include "student_trainer/ops/kernel_switch.h"

namespace e3::ops {

// A run of consecutive blocks of one sample whose context part runs as
// one pair of GEMMs over the context rows [ctx_begin, ctx_begin + keys).
struct DFlashAttentionChunk {
  int64_t first_block = 0, num_blocks = 0;
  int64_t ctx_begin = 0, keys = 0;
  at::Tensor limit;  // [num_blocks * B] int64 on the device: query row i sees keys [0, limit[i])
};

struct DFlashAttentionPlan {
  int64_t block_size = 0, num_blocks = 0, num_heads = 0;
  std::vector<DFlashAttentionChunk> chunks;  // those with at least one context key
  // For the flash kernels (where options.flash): int32 on the device,
  // [context_begin (blocks), context_end (blocks), tile_first_block
  // (key_tiles), tile_end_block (key_tiles)] (kernels/student_ops.h).
  bool flash = false;
  int64_t key_tiles = 0, max_context_end = 0;
  at::Tensor flash_index;
};

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// A chunk's keys are padded to a multiple of this (where the context has
// the rows): 16-bit rows of 64 keys keep cuBLAS on its aligned kernels.
constexpr int64_t kKeyAlign = 64;

at::ScalarType WideType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// a @ b for batches of matrices with the product in `wide`: straight from
// cuBLAS's fp32 accumulator for 16-bit CUDA operands where LibTorch can,
// otherwise from widened operands (CPU) or a widened product.
at::Tensor WideBmm(const at::Tensor& a, const at::Tensor& b, at::ScalarType wide) {
  if (a.scalar_type() == wide) return at::bmm(a, b);
  if (!a.is_cuda()) return at::bmm(a.to(wide), b.to(wide));
  if (compat::kHasMmFloatOut && wide == at::kFloat) return compat::BmmFloatOut(a, b);
  return at::bmm(a, b).to(wide);
}

// Query rows grouped under their key/value head: [rows, Hq, D] ->
// [Hkv, g * rows, D] (g = Hq / Hkv), and back.
at::Tensor GroupQueries(const at::Tensor& x, int64_t kv_heads) {
  const int64_t rows = x.size(0), g = x.size(1) / kv_heads, d = x.size(2);
  return x.reshape({rows, kv_heads, g, d}).permute({1, 2, 0, 3}).reshape({kv_heads, g * rows, d});
}
at::Tensor UngroupQueries(const at::Tensor& x, int64_t rows) {
  const int64_t kv = x.size(0), g = x.size(1) / rows, d = x.size(2);
  return x.view({kv, g, rows, d}).permute({2, 0, 1, 3}).reshape({rows, kv * g, d});
}
// The same for one value per query row and head: [rows, Hq] <-> [Hkv, g * rows].
at::Tensor GroupRows(const at::Tensor& x, int64_t kv_heads) {
  const int64_t rows = x.size(0), g = x.size(1) / kv_heads;
  return x.reshape({rows, kv_heads, g}).permute({1, 2, 0}).reshape({kv_heads, g * rows});
}
at::Tensor UngroupRows(const at::Tensor& x, int64_t rows) {
  const int64_t kv = x.size(0), g = x.size(1) / rows;
  return x.view({kv, g, rows}).permute({2, 0, 1}).reshape({rows, kv * g});
}

// Block rows grouped per block and key/value head: queries [R, Hq, D] ->
// [nB, Hkv, g * B, D], keys and values [R, Hkv, D] -> [nB, Hkv, B, D].
at::Tensor BlockQueries(const at::Tensor& x, int64_t B, int64_t kv_heads) {
  const int64_t nb = x.size(0) / B, g = x.size(1) / kv_heads, d = x.size(2);
  return x.reshape({nb, B, kv_heads, g, d})
      .permute({0, 2, 3, 1, 4})
      .reshape({nb, kv_heads, g * B, d});
}
at::Tensor BlockKeys(const at::Tensor& x, int64_t B) {
  return x.reshape({x.size(0) / B, B, x.size(1), x.size(2)}).permute({0, 2, 1, 3});
}
// [nB, Hkv, g * B, D] -> [R, Hq, D] (d = 0: [nB, Hkv, g * B] -> [R, Hq]).
at::Tensor UngroupBlockQueries(const at::Tensor& x, int64_t B) {
  const int64_t nb = x.size(0), kv = x.size(1), g = x.size(2) / B;
  if (x.dim() == 3) return x.view({nb, kv, g, B}).permute({0, 3, 1, 2}).reshape({nb * B, kv * g});
  return x.view({nb, kv, g, B, x.size(3)})
      .permute({0, 3, 1, 2, 4})
      .reshape({nb * B, kv * g, x.size(3)});
}
// [nB, Hkv, B, D] -> [R, Hkv, D].
at::Tensor UngroupBlockKeys(const at::Tensor& x) {
  return x.permute({0, 2, 1, 3}).reshape({x.size(0) * x.size(2), x.size(1), x.size(3)});
}

// exp(s - lse) in place; a row without keys (lse -inf) gives zeros.
void ExpShifted(at::Tensor& s, const at::Tensor& lse) {
  s.sub_(lse.masked_fill(lse.isneginf(), 0.0).unsqueeze(-1)).exp_();
}

struct Inputs {
  at::Tensor q, k_ctx, v_ctx, k_blk, v_blk;
  double scale = 1.0;
  at::ScalarType wide = at::kFloat;
  int64_t kv_heads() const { return k_ctx.size(1); }
};

// A chunk's grouped queries [Hkv, g * rows, D], keys and values [Hkv,
// keys, D] (views of the context rows).
struct ChunkOperands {
  at::Tensor qg, k, v;
};
ChunkOperands Operands(const Inputs& in, const DFlashAttentionPlan& plan,
                       const DFlashAttentionChunk& c) {
  const int64_t rows = c.num_blocks * plan.block_size;
  return {GroupQueries(in.q.narrow(0, c.first_block * plan.block_size, rows), in.kv_heads()),
          in.k_ctx.narrow(0, c.ctx_begin, c.keys).transpose(0, 1),
          in.v_ctx.narrow(0, c.ctx_begin, c.keys).transpose(0, 1)};
}

// A chunk's scaled, masked context scores [Hkv, g * rows, keys] in the
// wide dtype.
at::Tensor ChunkScores(const Inputs& in, const DFlashAttentionChunk& c, const ChunkOperands& x) {
  at::Tensor s = WideBmm(x.qg, x.k.transpose(1, 2), in.wide).mul_(in.scale);
  const at::Tensor deny = at::arange(c.keys, c.limit.options()).unsqueeze(0).ge(c.limit.unsqueeze(1));
  s.view({in.kv_heads(), -1, deny.size(0), c.keys}).masked_fill_(deny, kNegInf);
  return s;
}

#ifdef E3_HAS_CUDA
// Where the fused softmax kernels take the chunk: 16-bit CUDA operands
// whose GEMMs can write fp32 scores.
bool FusedSoftmaxTakes(const Inputs& in, kernels::Dtype* dt) {
  return compat::kHasMmFloatOut && in.wide == at::kFloat && StudentKernelDtype(in.q, dt) &&
         in.k_ctx.scalar_type() == in.q.scalar_type() &&
         in.v_ctx.scalar_type() == in.q.scalar_type();
}

// Where the flash kernels take the context part: the plan allows them, the
// kernels take the dtype (16-bit CUDA, kernels on) and the shape.
bool FlashTakes(const Inputs& in, const DFlashAttentionPlan& plan, kernels::Dtype* dt,
                kernels::DFlashContextShape* shape) {
  // The kernels trust the ranges: past the context rows they decline, and
  // the chunks' narrow() names the mistake.
  if (!plan.flash || !plan.flash_index.defined() || plan.max_context_end > in.k_ctx.size(0) ||
      !StudentKernelDtype(in.q, dt) ||
      in.k_ctx.scalar_type() != in.q.scalar_type() || in.v_ctx.scalar_type() != in.q.scalar_type()) {
    return false;
  }
  shape->blocks = plan.num_blocks;
  shape->block_size = plan.block_size;
  shape->q_heads = in.q.size(1);
  shape->kv_heads = in.kv_heads();
  shape->head_dim = in.q.size(2);
  shape->context_rows = in.k_ctx.size(0);
  shape->key_tiles = plan.key_tiles;
  shape->scale = static_cast<float>(in.scale);
  return kernels::DFlashContextAttentionTakes(*shape);
}

kernels::DFlashContextBlocks FlashBlocks(const DFlashAttentionPlan& plan) {
  const int32_t* index = plan.flash_index.data_ptr<int32_t>();
  const int64_t nb = plan.num_blocks;
  return {index, index + nb, index + 2 * nb, index + 2 * nb + plan.key_tiles};
}

// The context part in the flash kernels (false: they declined).
bool FlashForward(const Inputs& in, const DFlashAttentionPlan& plan, at::Tensor* out, at::Tensor* lse) {
  kernels::Dtype dt;
  kernels::DFlashContextShape shape;
  if (!FlashTakes(in, plan, &dt, &shape)) return false;
  const at::Tensor q = in.q.contiguous(), k = in.k_ctx.contiguous(), v = in.v_ctx.contiguous();
  if (!kernels::DFlashContextForward(dt, shape, FlashBlocks(plan), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                     out->data_ptr<float>(), lse->data_ptr<float>(), StudentKernelStream(q))) {
    return false;
  }
  CheckStudentKernelLaunch("DFlashContextForward");
  return true;
}
#endif

// A chunk's probabilities [Hkv, g * rows, keys] (in the inputs' dtype, or
// wide on the ATen path) and log-sum-exp [Hkv, g * rows] (wide).
std::pair<at::Tensor, at::Tensor> ChunkSoftmax(const Inputs& in, const DFlashAttentionChunk& c,
                                               const ChunkOperands& x) {
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (FusedSoftmaxTakes(in, &dt)) {
    const at::Tensor s = compat::BmmFloatOut(x.qg, x.k.transpose(1, 2)).contiguous();
    at::Tensor p = at::empty(s.sizes(), in.q.options());
    at::Tensor l = at::empty({s.size(0), s.size(1)}, s.options());
    if (kernels::DFlashChunkSoftmaxForward(dt, s.data_ptr<float>(), c.limit.data_ptr<int64_t>(),
                                           c.limit.size(0), s.size(0) * s.size(1), c.keys,
                                           static_cast<float>(in.scale), p.data_ptr(),
                                           l.data_ptr<float>(), StudentKernelStream(s))) {
      CheckStudentKernelLaunch("DFlashChunkSoftmaxForward");
      return {p, l};
    }
  }
#endif
  at::Tensor s = ChunkScores(in, c, x);
  const at::Tensor l = at::logsumexp(s, -1);
  ExpShifted(s, l);
  return {s, l};
}

// The backward's probabilities P and dS = P * (dP - delta) * scale of a
// chunk, both in the inputs' dtype, from the merged log-sum-exp and delta
// (grouped, [Hkv, g * rows]) and the grouped output gradient.
std::pair<at::Tensor, at::Tensor> ChunkSoftmaxBackward(const Inputs& in,
                                                       const DFlashAttentionChunk& c,
                                                       const ChunkOperands& x,
                                                       const at::Tensor& dog, const at::Tensor& lse,
                                                       const at::Tensor& delta) {
  const at::ScalarType dt = in.q.scalar_type();
#ifdef E3_HAS_CUDA
  kernels::Dtype kdt;
  if (FusedSoftmaxTakes(in, &kdt) && dog.scalar_type() == dt) {
    const at::Tensor s = compat::BmmFloatOut(x.qg, x.k.transpose(1, 2)).contiguous();
    const at::Tensor dp = compat::BmmFloatOut(dog, x.v.transpose(1, 2)).contiguous();
    at::Tensor p = at::empty(s.sizes(), in.q.options()), ds = at::empty(s.sizes(), in.q.options());
    const at::Tensor l = lse.to(at::kFloat).contiguous(), d = delta.to(at::kFloat).contiguous();
    if (kernels::DFlashChunkSoftmaxBackward(
            kdt, s.data_ptr<float>(), dp.data_ptr<float>(), l.data_ptr<float>(),
            d.data_ptr<float>(), c.limit.data_ptr<int64_t>(), c.limit.size(0),
            s.size(0) * s.size(1), c.keys, static_cast<float>(in.scale), p.data_ptr(),
            ds.data_ptr(), StudentKernelStream(s))) {
      CheckStudentKernelLaunch("DFlashChunkSoftmaxBackward");
      return {p, ds};
    }
  }
#endif
  at::Tensor p = ChunkScores(in, c, x);
  p.sub_(lse.unsqueeze(-1)).exp_();
  at::Tensor ds = WideBmm(dog, x.v.transpose(1, 2), in.wide);  // dP
  ds.sub_(delta.unsqueeze(-1)).mul_(p).mul_(in.scale);
  return {p.to(dt), ds.to(dt)};
}

// Each block's grouped queries [nB, Hkv, g * B, D] (wide), and their
// scaled scores against the block's own rows, [nB, Hkv, g * B, B].
at::Tensor WideBlockQueries(const Inputs& in, int64_t B) {
  return BlockQueries(in.q, B, in.kv_heads()).to(in.wide);
}
at::Tensor BlockScores(const Inputs& in, const at::Tensor& qb, int64_t B) {
  return at::matmul(qb, BlockKeys(in.k_blk, B).to(in.wide).transpose(-1, -2)).mul_(in.scale);
}

// The context part: output [R, Hq, D] and log-sum-exp [R, Hq] (-inf for
// a row without context keys), in the wide dtype.
std::pair<at::Tensor, at::Tensor> ContextForward(const Inputs& in,
                                                 const DFlashAttentionPlan& plan) {
  const int64_t R = in.q.size(0), Hq = in.q.size(1), D = in.q.size(2), B = plan.block_size;
  at::Tensor out = at::zeros({R, Hq, D}, in.q.options().dtype(in.wide));
  at::Tensor lse = at::full({R, Hq}, kNegInf, in.q.options().dtype(in.wide));
#ifdef E3_HAS_CUDA
  if (FlashForward(in, plan, &out, &lse)) return {out, lse};
#endif
  for (const DFlashAttentionChunk& c : plan.chunks) {
    const int64_t rows = c.num_blocks * B, r0 = c.first_block * B;
    const ChunkOperands x = Operands(in, plan, c);
    const auto [p, l] = ChunkSoftmax(in, c, x);
    out.narrow(0, r0, rows)
        .copy_(UngroupQueries(WideBmm(p.to(in.v_ctx.scalar_type()), x.v, in.wide), rows));
    lse.narrow(0, r0, rows).copy_(UngroupRows(l, rows));
  }
  return {out, lse};
}

// The block part, likewise (every row has its block's keys).
std::pair<at::Tensor, at::Tensor> BlockForward(const Inputs& in, int64_t B) {
  at::Tensor s = BlockScores(in, WideBlockQueries(in, B), B);
  const at::Tensor l = at::logsumexp(s, -1);
  s.sub_(l.unsqueeze(-1)).exp_();
  const at::Tensor o = at::matmul(s, BlockKeys(in.v_blk, B).to(in.wide));
  return {UngroupBlockQueries(o, B), UngroupBlockQueries(l, B)};
}

struct Grads {
  at::Tensor q, k_ctx, v_ctx, k_blk, v_blk;  // wide
};

#ifdef E3_HAS_CUDA
// The context part's gradients in the flash kernels (false: they declined).
bool FlashBackward(const Inputs& in, const DFlashAttentionPlan& plan, const at::Tensor& dout,
                   const at::Tensor& lse, const at::Tensor& delta, Grads* g) {
  kernels::Dtype dt;
  kernels::DFlashContextShape shape;
  if (!FlashTakes(in, plan, &dt, &shape) || dout.scalar_type() != in.q.scalar_type() ||
      g->q.scalar_type() != at::kFloat) {
    return false;
  }
  const at::Tensor q = in.q.contiguous(), k = in.k_ctx.contiguous(), v = in.v_ctx.contiguous();
  const at::Tensor d = dout.contiguous(), l = lse.to(at::kFloat).contiguous(),
                   dl = delta.to(at::kFloat).contiguous();
  if (!kernels::DFlashContextBackward(dt, shape, FlashBlocks(plan), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                      d.data_ptr(), l.data_ptr<float>(), dl.data_ptr<float>(),
                                      g->q.data_ptr<float>(), g->k_ctx.data_ptr<float>(),
                                      g->v_ctx.data_ptr<float>(), StudentKernelStream(q))) {
    return false;
  }
  CheckStudentKernelLaunch("DFlashContextBackward");
  return true;
}
#endif

// The context part's share of the gradients, from the merged
// log-sum-exp `lse` and delta = rowsum(dout * out), both [R, Hq].
void ContextBackward(const Inputs& in, const DFlashAttentionPlan& plan, const at::Tensor& dout,
                     const at::Tensor& lse, const at::Tensor& delta, Grads* g) {
  const int64_t B = plan.block_size, kv = in.kv_heads();
#ifdef E3_HAS_CUDA
  if (FlashBackward(in, plan, dout, lse, delta, g)) return;
#endif
  for (const DFlashAttentionChunk& c : plan.chunks) {
    const int64_t rows = c.num_blocks * B, r0 = c.first_block * B;
    const ChunkOperands x = Operands(in, plan, c);
    const at::Tensor dog = GroupQueries(dout.narrow(0, r0, rows), kv);
    const auto [p, ds] = ChunkSoftmaxBackward(in, c, x, dog, GroupRows(lse.narrow(0, r0, rows), kv),
                                              GroupRows(delta.narrow(0, r0, rows), kv));
    g->v_ctx.narrow(0, c.ctx_begin, c.keys)
        .add_(WideBmm(p.transpose(1, 2), dog, in.wide).transpose(0, 1));
    g->q.narrow(0, r0, rows).add_(UngroupQueries(WideBmm(ds, x.k, in.wide), rows));
    g->k_ctx.narrow(0, c.ctx_begin, c.keys)
        .add_(WideBmm(ds.transpose(1, 2), x.qg, in.wide).transpose(0, 1));
  }
}

void BlockBackward(const Inputs& in, int64_t B, const at::Tensor& dout, const at::Tensor& lse,
                   const at::Tensor& delta, Grads* g) {
  const int64_t kv = in.kv_heads();
  const at::Tensor qb = WideBlockQueries(in, B);
  at::Tensor p = BlockScores(in, qb, B);
  p.sub_(BlockQueries(lse.unsqueeze(-1), B, kv)).exp_();
  const at::Tensor dob = BlockQueries(dout, B, kv).to(in.wide);
  g->v_blk = UngroupBlockKeys(at::matmul(p.transpose(-1, -2), dob));
  at::Tensor ds = at::matmul(dob, BlockKeys(in.v_blk, B).to(in.wide).transpose(-1, -2));
  ds.sub_(BlockQueries(delta.unsqueeze(-1), B, kv)).mul_(p).mul_(in.scale);
  g->q.add_(UngroupBlockQueries(at::matmul(ds, BlockKeys(in.k_blk, B).to(in.wide)), B));
  g->k_blk = UngroupBlockKeys(at::matmul(ds.transpose(-1, -2), qb));
}

class DFlashAttentionFunction : public torch::autograd::Function<DFlashAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k_ctx,
                               const at::Tensor& v_ctx, const at::Tensor& k_blk,
                               const at::Tensor& v_blk, const at::Tensor& plan_capsule,
                               double scale) {
    const auto plan = FromCapsule<DFlashAttentionPlan>(plan_capsule);
    const Inputs in{q, k_ctx, v_ctx, k_blk, v_blk, scale, WideType(q.scalar_type())};
    const auto [out_c, lse_c] = ContextForward(in, *plan);
    const auto [out_b, lse_b] = BlockForward(in, plan->block_size);
    const at::Tensor lse = at::logaddexp(lse_c, lse_b);
    const at::Tensor out =
        (out_c * (lse_c - lse).exp().unsqueeze(-1) + out_b * (lse_b - lse).exp().unsqueeze(-1))
            .to(q.scalar_type());
    ctx->save_for_backward({q, k_ctx, v_ctx, k_blk, v_blk, out, lse});
    ctx->saved_data["plan"] = plan_capsule;
    ctx->saved_data["scale"] = scale;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto plan = FromCapsule<DFlashAttentionPlan>(ctx->saved_data["plan"].toTensor());
    const Inputs in{saved[0],
                    saved[1],
                    saved[2],
                    saved[3],
                    saved[4],
                    ctx->saved_data["scale"].toDouble(),
                    WideType(saved[0].scalar_type())};
    const at::Tensor& out = saved[5];
    const at::Tensor& lse = saved[6];
    const at::Tensor dout = grads[0].to(in.q.scalar_type()).contiguous();
    const at::Tensor delta = (dout.to(in.wide) * out.to(in.wide)).sum(-1);
    Grads g;
    g.q = at::zeros(in.q.sizes(), in.q.options().dtype(in.wide));
    g.k_ctx = at::zeros(in.k_ctx.sizes(), in.k_ctx.options().dtype(in.wide));
    g.v_ctx = at::zeros(in.v_ctx.sizes(), in.v_ctx.options().dtype(in.wide));
    ContextBackward(in, *plan, dout, lse, delta, &g);
    BlockBackward(in, plan->block_size, dout, lse, delta, &g);
    return {g.q.to(in.q.scalar_type()),
            g.k_ctx.to(in.k_ctx.scalar_type()),
            g.v_ctx.to(in.v_ctx.scalar_type()),
            g.k_blk.to(in.k_blk.scalar_type()),
            g.v_blk.to(in.v_blk.scalar_type()),
            at::Tensor(),
            at::Tensor()};
  }
};

// The blocks from `first` on that share its context start and, together,
// compute at most `budget` scores (at least one block).
int64_t ChunkEnd(const DFlashAttentionBlocks& b, int64_t first, int64_t heads, int64_t budget) {
  const int64_t begin = b.context_begin[first];
  int64_t end = b.context_end[first], last = first + 1;
  for (; last < b.num_blocks() && b.context_begin[last] == begin; ++last) {
    const int64_t keys = std::max(end, b.context_end[last]) - begin;
    if (heads * (last - first + 1) * b.block_size * keys > budget) break;
    end = std::max(end, b.context_end[last]);
  }
  return last;
}

#ifdef E3_HAS_CUDA
// The flash kernels' index: each block's context range, and for each of the
// backward's key tiles the run of blocks [first, end) that holds every
// block whose context meets it (blocks of a sample are consecutive, so the
// run is short).
void PlanFlash(const DFlashAttentionBlocks& b, const at::Device& device, DFlashAttentionPlan* plan) {
  constexpr int64_t kTile = kernels::kDFlashBackwardKeyTile;
  const int64_t nb = b.num_blocks();
  int64_t max_end = 0;
  for (int64_t i = 0; i < nb; ++i) {
    if (b.context_end[i] > b.context_begin[i]) max_end = std::max(max_end, b.context_end[i]);
  }
  if (max_end > std::numeric_limits<int32_t>::max() || nb > std::numeric_limits<int32_t>::max()) return;
  const int64_t tiles = (max_end + kTile - 1) / kTile;
  std::vector<int32_t> index(2 * nb + 2 * tiles, 0);
  int32_t* first = index.data() + 2 * nb;
  int32_t* end = first + tiles;
  std::fill(first, first + tiles, std::numeric_limits<int32_t>::max());
  for (int64_t i = 0; i < nb; ++i) {
    index[i] = static_cast<int32_t>(b.context_begin[i]);
    index[nb + i] = static_cast<int32_t>(b.context_end[i]);
    if (b.context_end[i] <= b.context_begin[i]) continue;
    for (int64_t t = b.context_begin[i] / kTile; t <= (b.context_end[i] - 1) / kTile; ++t) {
      first[t] = std::min(first[t], static_cast<int32_t>(i));
      end[t] = std::max(end[t], static_cast<int32_t>(i + 1));
    }
  }
  for (int64_t t = 0; t < tiles; ++t) first[t] = std::min(first[t], end[t]);
  plan->flash = true;
  plan->key_tiles = tiles;
  plan->max_context_end = max_end;
  plan->flash_index = torch::tensor(index, torch::kInt).to(device);
}
#endif

}  // namespace

std::shared_ptr<const DFlashAttentionPlan> PlanDFlashAttention(
    const DFlashAttentionBlocks& blocks, int64_t num_heads, const at::Device& device,
    const DFlashAttentionOptions& options) {
  TORCH_CHECK(blocks.context_begin.size() == blocks.context_end.size() && blocks.block_size > 0,
              "DFlash attention: one context range per block, and a positive block size");
  auto plan = std::make_shared<DFlashAttentionPlan>();
  plan->block_size = blocks.block_size;
  plan->num_blocks = blocks.num_blocks();
  plan->num_heads = num_heads;
  const int64_t B = blocks.block_size;
  for (int64_t first = 0; first < blocks.num_blocks();) {
    const int64_t last = ChunkEnd(blocks, first, num_heads, options.chunk_scores);
    DFlashAttentionChunk c;
    c.first_block = first;
    c.num_blocks = last - first;
    c.ctx_begin = blocks.context_begin[first];
    std::vector<int64_t> limit;  // each query row's keys: [0, limit)
    for (int64_t i = first; i < last; ++i) {
      const int64_t keys = std::max<int64_t>(0, blocks.context_end[i] - c.ctx_begin);
      c.keys = std::max(c.keys, keys);
      limit.insert(limit.end(), B, keys);
    }
    if (c.keys > 0) {
      if (blocks.context_rows > c.ctx_begin) {
        c.keys = std::min((c.keys + kKeyAlign - 1) / kKeyAlign * kKeyAlign, blocks.context_rows - c.ctx_begin);
      }
      c.limit = torch::tensor(limit, torch::kLong).to(device);
      plan->chunks.push_back(std::move(c));
    }
    first = last;
  }
#ifdef E3_HAS_CUDA
  if (options.flash && device.is_cuda()) PlanFlash(blocks, device, plan.get());
#endif
  return plan;
}

at::Tensor DFlashBlockAttention(const at::Tensor& q, const at::Tensor& k_ctx,
                                const at::Tensor& v_ctx, const at::Tensor& k_blk,
                                const at::Tensor& v_blk,
                                const std::shared_ptr<const DFlashAttentionPlan>& plan,
                                double scale) {
  TORCH_CHECK(q.dim() == 3 && k_ctx.dim() == 3 && k_blk.dim() == 3,
              "DFlash attention: q, k, v are [rows, heads, D]");
  TORCH_CHECK(q.size(0) == plan->num_blocks * plan->block_size && q.size(1) == plan->num_heads,
              "DFlash attention: q is ", q.sizes(), ", the plan is for ", plan->num_blocks,
              " blocks of ", plan->block_size, " rows and ", plan->num_heads, " heads");
  TORCH_CHECK(q.size(1) % k_ctx.size(1) == 0 && k_blk.size(0) == q.size(0) &&
                  v_blk.sizes() == k_blk.sizes() && v_ctx.sizes() == k_ctx.sizes(),
              "DFlash attention: key/value shapes ", k_ctx.sizes(), " and ", k_blk.sizes(),
              " do not fit q ", q.sizes());
  // The capsule holds a copy of the shared pointer for as long as the graph needs the plan.
  auto keep = std::const_pointer_cast<DFlashAttentionPlan>(plan);
  return DFlashAttentionFunction::apply(q, k_ctx, v_ctx, k_blk, v_blk, ToCapsule(std::move(keep)),
                                        scale)[0];
}

}  // namespace e3::ops
