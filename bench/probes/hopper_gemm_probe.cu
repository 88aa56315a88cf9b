// Measures the Hopper GEMM with fused epilogues (teacher_server/kernels/
// hopper_gemm.cuh) against what the sgl teacher runs today on the same
// shapes (GPU machine, sm_90):
//   - kStore against cuBLASLt's heuristic first choice (plain, and with
//     the residual as C), per shape and per tile-order group;
//   - kSwiGlu against cuBLASLt gate_up + the SiLU-mul kernel;
//   - kArgmax against cuBLASLt lm_head logits + the row-argmax kernel;
//   - each model's layer GEMMs and lm_head in sequence: all in the Hopper
//     GEMM, the teacher as it runs now (argmax fused), and candidate
//     steps: gate_up + SiLU-mul in the Hopper GEMM (either schedule), or
//     the MLP in L2-sized row chunks.
// Both schedules (cooperative, ping-pong) are checked on ragged shapes and
// timed on the SwiGLU and plain-store epilogues.
// Outputs are compared first: the share of elements that differ from the
// baseline and by how much (the fp32 K-sums run in another order, so a
// rounding may land on the neighbouring bf16), and for argmax the rows
// that disagree and whether their two logits tie within that rounding.
// Timings alternate the two sides for several rounds (a GPU's clock moves
// with temperature) and print medians.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I. bench/probes/hopper_gemm_probe.cu \
//        teacher_server/kernels/fused_kernels.cu -lcublasLt -o /tmp/hopper_gemm_probe
//   /tmp/hopper_gemm_probe
// PROBE_QUICK=1: only the gate_up shapes, no sequences. PROBE_RAGGED_ONLY=1:
// only the ragged checks (e.g. under compute-sanitizer). PROBE_NO_PINGPONG=1:
// the cooperative schedule only. PROBE_SEQUENCE_ONLY=1: only the
// sequences; PROBE_ROUNDS=N rounds per sequence variant (default 3).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "bench/probes/cuda_probe_util.cuh"
#include "teacher_server/kernels/fused_kernels.h"
#include "teacher_server/kernels/hopper_gemm_kernel.cuh"

namespace hg = e3::kernels::hopper;
using bf16 = __nv_bfloat16;

namespace {

// Gate rows [0, I) and up rows [I, 2I) of a gate_up weight, reordered into
// 256-row blocks of 128 gate rows followed by the same features' up rows.
__global__ void InterleaveGateUp(const bf16* w, bf16* out, int inter, int k) {
  const int r = blockIdx.x;
  const int block = r / 256, within = r % 256;
  const int src = within < 128 ? block * 128 + within : inter + block * 128 + within - 128;
  for (int c = threadIdx.x; c < k; c += blockDim.x) out[size_t(r) * k + c] = w[size_t(src) * k + c];
}

std::vector<float> ToHost(const bf16* p, size_t n) {
  std::vector<bf16> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

void CompareBf16(const char* what, const bf16* test, const bf16* ref, size_t n) {
  const std::vector<float> a = ToHost(test, n), b = ToHost(ref, n);
  size_t differ = 0, beyond_ulp = 0;
  double max_abs = 0, max_ref = 0;
  for (size_t i = 0; i < n; ++i) {
    max_ref = std::max(max_ref, double(std::fabs(b[i])));
    if (a[i] != b[i] || std::isnan(a[i]) != std::isnan(b[i])) {
      ++differ;
      const double diff = std::fabs(double(a[i]) - b[i]);
      max_abs = std::max(max_abs, diff);
      // One bf16 ulp of the larger magnitude: 2^(exponent - 7).
      const double mag = std::max(std::fabs(a[i]), std::fabs(b[i]));
      if (!(diff <= std::ldexp(1.0, std::ilogb(mag) - 7) * 1.0001)) ++beyond_ulp;
    }
  }
  std::printf("  check %-22s differ %.4f%% of %zu, beyond 1 ulp %zu, max |diff| %.4g (max |ref| %.4g)\n", what,
              100.0 * differ / n, n, beyond_ulp, max_abs, max_ref);
}

// One problem's operands: x [m, k], w [n, k], two outputs and a residual
// [m, n], random (w scaled by w_scale / sqrt(k), as a trained layer's).
struct Operands {
  bf16 *x, *w, *y, *y2, *c;
  Operands(const Shape& s, unsigned seed, float w_scale = 1.f) {
    CHECK_CUDA(cudaMalloc(&x, size_t(s.m) * s.k * 2));
    CHECK_CUDA(cudaMalloc(&w, size_t(s.n) * s.k * 2));
    CHECK_CUDA(cudaMalloc(&y, size_t(s.m) * s.n * 2));
    CHECK_CUDA(cudaMalloc(&y2, size_t(s.m) * s.n * 2));
    CHECK_CUDA(cudaMalloc(&c, size_t(s.m) * s.n * 2));
    FillRandom<<<1024, 256>>>(x, size_t(s.m) * s.k, seed);
    FillRandom<<<1024, 256>>>(w, size_t(s.n) * s.k, seed + 1, w_scale / std::sqrt(float(s.k)));
    FillRandom<<<1024, 256>>>(c, size_t(s.m) * s.n, seed + 2);
  }
  ~Operands() { cudaFree(x); cudaFree(w); cudaFree(y); cudaFree(y2); cudaFree(c); }
};

// Alternates baseline and candidate for `rounds` rounds; returns medians.
std::pair<float, float> Interleaved(const std::function<void()>& base, const std::function<void()>& cand,
                                    int rounds = 5, int iters = 10) {
  std::vector<float> tb, tc;
  for (int r = 0; r < rounds; ++r) {
    tb.push_back(TimeMs(base, iters));
    tc.push_back(TimeMs(cand, iters));
  }
  return {Median(tb), Median(tc)};
}

int g_sms = 132;

// The schedule Hopper() launches (see hopper_gemm_kernel.cuh).
hg::Schedule g_schedule = hg::Schedule::kCooperative;
const char* ScheduleName() { return g_schedule == hg::Schedule::kCooperative ? "cooperative" : "ping-pong"; }

template <hg::Epilogue kEp>
void Hopper(const bf16* x, const bf16* w, int m, int n, int k, const hg::EpilogueArgs& ep, int group_m = 8) {
  const bool launched = g_schedule == hg::Schedule::kCooperative
                            ? hg::Launch<kEp, hg::Schedule::kCooperative>(x, k, w, k, m, n, k, ep, group_m, 0)
                            : hg::Launch<kEp, hg::Schedule::kPingPong>(x, k, w, k, m, n, k, ep, group_m, 0);
  if (!launched) {
    std::printf("hopper launch refused m=%d n=%d k=%d\n", m, n, k);
    std::exit(1);
  }
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  std::printf("device %s, %d SMs, cluster %d, resident clusters %d\n", prop.name, g_sms, hg::kCluster,
              hg::ResidentClusters<hg::Epilogue::kStore>(0));
  const bool quick = std::getenv("PROBE_QUICK") != nullptr;
  const bool pingpong = std::getenv("PROBE_NO_PINGPONG") == nullptr;
  // Only the forward-sequence section (no checks, no per-shape timings).
  const bool sequence_only = std::getenv("PROBE_SEQUENCE_ONLY") != nullptr;
  const std::vector<hg::Schedule> schedules =
      pingpong ? std::vector<hg::Schedule>{hg::Schedule::kCooperative, hg::Schedule::kPingPong}
               : std::vector<hg::Schedule>{hg::Schedule::kCooperative};
  const int tokens = kProbeTokens;
  const Shape* shapes = kTeacherShapes;
  Lt lt;
  // Ragged shapes first: partial row and column tiles, an odd number of
  // row tiles (the last cluster's second CTA has no rows), K not a
  // multiple of 64.
  for (hg::Schedule schedule : schedules) {
    if (sequence_only) break;
    g_schedule = schedule;
    std::printf("ragged shapes, %s\n", ScheduleName());
    // The last two: K of 2 and 3 stages (one ring pass spans several
    // tiles, of both ping-pong consumers) and 2-3 work units per cluster.
    const Shape ragged[] = {{"ragged store", 1000, 3000, 1000}, {"ragged swiglu", 333, 2 * 1280, 520},
                            {"ragged argmax", 777, 50000, 264}, {"small-K store", 2000, 3000, 128},
                            {"small-K swiglu", 2000, 2 * 1280, 192}};
    for (int i = 0; i < 5; ++i) {
      const Shape& s = ragged[i];
      const int kind = i < 3 ? i : i - 3;  // 0 store, 1 swiglu, 2 argmax
      // Gate values up to about +-15 in the SwiGLU case: large |g| too.
      Operands o(s, 31, kind == 1 ? 15.f : 1.f);
      bf16 *x = o.x, *w = o.w, *y = o.y, *y2 = o.y2, *c = o.c;
      CHECK_CUDA(cudaMemset(y2, 0xff, size_t(s.m) * s.n * 2));  // NaN where nothing is written
      const LtPlan plan = MakePlan(lt.handle, s, lt.workspace_bytes);
      if (kind == 0) {
        hg::EpilogueArgs ep;
        ep.out = y2; ep.out_stride = s.n; ep.residual = c; ep.residual_stride = s.n;
        lt.Run(plan, x, w, c, y);
        Hopper<hg::Epilogue::kStore>(x, w, s.m, s.n, s.k, ep);
        CHECK_CUDA(cudaDeviceSynchronize());
        CompareBf16(s.name, y2, y, size_t(s.m) * s.n);
      } else if (kind == 1) {
        const int inter = s.n / 2;
        bf16* w_il;
        CHECK_CUDA(cudaMalloc(&w_il, size_t(s.n) * s.k * 2));
        InterleaveGateUp<<<s.n, 256>>>(w, w_il, inter, s.k);
        hg::EpilogueArgs ep;
        ep.out = y2; ep.out_stride = inter;
        lt.Run(plan, x, w, nullptr, y);
        e3::kernels::SiluMul(e3::kernels::Dtype::kBFloat16, y, c, s.m, inter, nullptr, nullptr);
        Hopper<hg::Epilogue::kSwiGlu>(x, w_il, s.m, s.n, s.k, ep);
        CHECK_CUDA(cudaDeviceSynchronize());
        CompareBf16(s.name, y2, c, size_t(s.m) * inter);
        cudaFree(w_il);
      } else {
        int32_t *idx, *idx2;
        unsigned long long* keys;
        CHECK_CUDA(cudaMalloc(&idx, s.m * 4));
        CHECK_CUDA(cudaMalloc(&idx2, s.m * 4));
        CHECK_CUDA(cudaMalloc(&keys, s.m * 8));
        CHECK_CUDA(cudaMemset(keys, 0, s.m * 8));
        hg::EpilogueArgs ep;
        ep.argmax_keys = keys;
        lt.Run(plan, x, w, nullptr, y);
        e3::kernels::RowArgmax(e3::kernels::Dtype::kBFloat16, y, s.m, s.n, s.n, idx, nullptr);
        Hopper<hg::Epilogue::kArgmax>(x, w, s.m, s.n, s.k, ep);
        hg::KeysToIndex(keys, idx2, s.m, 0);
        CHECK_CUDA(cudaDeviceSynchronize());
        std::vector<int32_t> a(s.m), b(s.m);
        CHECK_CUDA(cudaMemcpy(a.data(), idx2, s.m * 4, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(b.data(), idx, s.m * 4, cudaMemcpyDeviceToHost));
        int differ = 0;
        for (int r = 0; r < s.m; ++r) differ += a[r] != b[r];
        std::printf("  check %-22s rows differ %d of %d\n", s.name, differ, s.m);
        cudaFree(idx); cudaFree(idx2); cudaFree(keys);
      }
      DestroyPlan(const_cast<LtPlan&>(plan));
    }
  }
  if (std::getenv("PROBE_RAGGED_ONLY") != nullptr) return 0;
  int best_group[10];
  for (int si = 0; si < 10; ++si) {
    const Shape& s = shapes[si];
    best_group[si] = 4;
    g_schedule = hg::Schedule::kCooperative;
    if ((quick && si != 2 && si != 7) || sequence_only) continue;
    const bool residual = si % 5 == 1 || si % 5 == 3;
    const bool gate_up = si % 5 == 2, lm_head = si % 5 == 4;
    Operands o(s, 1);
    bf16 *x = o.x, *w = o.w, *y = o.y, *y2 = o.y2, *c = o.c;
    const LtPlan plan = MakePlan(lt.handle, s, lt.workspace_bytes);
    const double tflop = 2.0 * s.m * s.n * s.k / 1e12;
    std::printf("%-11s m=%d n=%d k=%d\n", s.name, s.m, s.n, s.k);

    // Plain store (with the residual where the teacher adds one).
    hg::EpilogueArgs ep;
    ep.out = y2;
    ep.out_stride = s.n;
    ep.residual = residual ? c : nullptr;
    ep.residual_stride = s.n;
    lt.Run(plan, x, w, residual ? c : nullptr, y);
    Hopper<hg::Epilogue::kStore>(x, w, s.m, s.n, s.k, ep);
    CHECK_CUDA(cudaDeviceSynchronize());
    CompareBf16(residual ? "store+residual" : "store", y2, y, size_t(s.m) * s.n);
    float best = 1e30f;
    for (int group : {4, 8}) {
      auto [tb, tc] = Interleaved([&] { lt.Run(plan, x, w, residual ? c : nullptr, y); },
                                  [&] { Hopper<hg::Epilogue::kStore>(x, w, s.m, s.n, s.k, ep, group); });
      std::printf("  store group_m=%-2d cuBLASLt %.3f ms (%.0f TF)  hopper %.3f ms (%.0f TF)  ratio %.3f\n", group,
                  tb, tflop / tb * 1e3, tc, tflop / tc * 1e3, tb / tc);
      if (tc < best) { best = tc; best_group[si] = group; }
    }
    if (pingpong) {
      g_schedule = hg::Schedule::kPingPong;
      CHECK_CUDA(cudaMemset(y2, 0xff, size_t(s.m) * s.n * 2));  // NaN where nothing is written
      Hopper<hg::Epilogue::kStore>(x, w, s.m, s.n, s.k, ep);
      CHECK_CUDA(cudaDeviceSynchronize());
      CompareBf16(residual ? "ping-pong store+res" : "ping-pong store", y2, y, size_t(s.m) * s.n);
      auto [tb, tc] = Interleaved([&] { lt.Run(plan, x, w, residual ? c : nullptr, y); },
                                  [&] { Hopper<hg::Epilogue::kStore>(x, w, s.m, s.n, s.k, ep, 4); });
      std::printf("  store ping-pong   cuBLASLt %.3f ms (%.0f TF)  hopper %.3f ms (%.0f TF)  ratio %.3f\n", tb,
                  tflop / tb * 1e3, tc, tflop / tc * 1e3, tb / tc);
      g_schedule = hg::Schedule::kCooperative;
    }

    if (gate_up) {
      const int inter = s.n / 2;
      bf16 *w_il, *act, *act2;
      CHECK_CUDA(cudaMalloc(&w_il, size_t(s.n) * s.k * 2));
      CHECK_CUDA(cudaMalloc(&act, size_t(s.m) * inter * 2));
      CHECK_CUDA(cudaMalloc(&act2, size_t(s.m) * inter * 2));
      InterleaveGateUp<<<s.n, 256>>>(w, w_il, inter, s.k);
      hg::EpilogueArgs sw;
      sw.out = act2;
      sw.out_stride = inter;
      auto base = [&] {
        lt.Run(plan, x, w, nullptr, y);
        e3::kernels::SiluMul(e3::kernels::Dtype::kBFloat16, y, act, s.m, inter, nullptr, nullptr);
      };
      auto cand = [&] { Hopper<hg::Epilogue::kSwiGlu>(x, w_il, s.m, s.n, s.k, sw, best_group[si]); };
      for (hg::Schedule schedule : schedules) {
        g_schedule = schedule;
        CHECK_CUDA(cudaMemset(act2, 0, size_t(s.m) * inter * 2));
        base();
        cand();
        CHECK_CUDA(cudaDeviceSynchronize());
        CompareBf16(schedule == hg::Schedule::kCooperative ? "swiglu" : "ping-pong swiglu", act2, act,
                    size_t(s.m) * inter);
        auto [tb, tc] = Interleaved(base, cand);
        std::printf("  swiglu %-11s: cuBLASLt + SiLU-mul %.3f ms  hopper fused %.3f ms  ratio %.3f\n", ScheduleName(),
                    tb, tc, tb / tc);
      }
      g_schedule = hg::Schedule::kCooperative;
      cudaFree(w_il); cudaFree(act); cudaFree(act2);
    }
    if (lm_head) {
      int32_t *idx, *idx2;
      unsigned long long* keys;
      CHECK_CUDA(cudaMalloc(&idx, s.m * 4));
      CHECK_CUDA(cudaMalloc(&idx2, s.m * 4));
      CHECK_CUDA(cudaMalloc(&keys, s.m * 8));
      hg::EpilogueArgs am;
      am.argmax_keys = keys;
      auto base = [&] {
        lt.Run(plan, x, w, nullptr, y);
        e3::kernels::RowArgmax(e3::kernels::Dtype::kBFloat16, y, s.m, s.n, s.n, idx, nullptr);
      };
      auto cand = [&] {
        CHECK_CUDA(cudaMemsetAsync(keys, 0, s.m * 8, 0));
        Hopper<hg::Epilogue::kArgmax>(x, w, s.m, s.n, s.k, am, best_group[si]);
        hg::KeysToIndex(keys, idx2, s.m, 0);
      };
      base();
      cand();
      CHECK_CUDA(cudaDeviceSynchronize());
      std::vector<int32_t> a(s.m), b(s.m);
      CHECK_CUDA(cudaMemcpy(a.data(), idx2, s.m * 4, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(b.data(), idx, s.m * 4, cudaMemcpyDeviceToHost));
      // Disagreements: do the two columns' logits (from the hopper store
      // of the same product) tie within one bf16 rounding?
      Hopper<hg::Epilogue::kStore>(x, w, s.m, s.n, s.k, ep);
      CHECK_CUDA(cudaDeviceSynchronize());
      int differ = 0, not_tied = 0, out_of_range = 0;
      for (int r = 0; r < s.m; ++r) {
        if (a[r] < 0 || a[r] >= s.n) { ++out_of_range; continue; }
        if (a[r] == b[r]) continue;
        ++differ;
        bf16 va, vb;
        CHECK_CUDA(cudaMemcpy(&va, y2 + size_t(r) * s.n + a[r], 2, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(&vb, y2 + size_t(r) * s.n + b[r], 2, cudaMemcpyDeviceToHost));
        const float fa = __bfloat162float(va), fb = __bfloat162float(vb);
        const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(fa), std::fabs(fb))) - 7);
        if (std::fabs(fa - fb) > ulp * 1.0001) ++not_tied;
      }
      std::printf("  check argmax                 rows differ %d of %d, not within one rounding %d, out of range %d\n",
                  differ, s.m, not_tied, out_of_range);
      auto [tb, tc] = Interleaved(base, cand);
      std::printf("  argmax: cuBLASLt + row argmax %.3f ms  hopper fused %.3f ms  ratio %.3f\n", tb, tc, tb / tc);
      cudaFree(idx); cudaFree(idx2); cudaFree(keys);
    }
    DestroyPlan(const_cast<LtPlan&>(plan));
  }

  // Each model's GEMM work in a forward's order: per layer qkv, o + residual,
  // gate_up (+ SiLU-mul), down + residual; then the lm_head's argmax.
  for (int model = 0; model < (quick ? 0 : 2); ++model) {
    const Shape* sh = &shapes[model * 5];
    const int* groups = &best_group[model * 5];
    const int layers = model == 0 ? 16 : 32;
    const int hidden = sh[1].n, inter = sh[2].n / 2;
    bf16 *h, *qkv, *attn, *gu, *act, *w[5], *w_il, *logits;
    int32_t* idx;
    unsigned long long* keys;
    CHECK_CUDA(cudaMalloc(&h, size_t(tokens) * hidden * 2));
    CHECK_CUDA(cudaMalloc(&qkv, size_t(tokens) * sh[0].n * 2));
    CHECK_CUDA(cudaMalloc(&attn, size_t(tokens) * hidden * 2));
    CHECK_CUDA(cudaMalloc(&gu, size_t(tokens) * sh[2].n * 2));
    CHECK_CUDA(cudaMalloc(&act, size_t(tokens) * inter * 2));
    CHECK_CUDA(cudaMalloc(&logits, size_t(tokens) * sh[4].n * 2));
    CHECK_CUDA(cudaMalloc(&idx, tokens * 4));
    CHECK_CUDA(cudaMalloc(&keys, tokens * 8));
    FillRandom<<<1024, 256>>>(h, size_t(tokens) * hidden, 11);
    FillRandom<<<1024, 256>>>(attn, size_t(tokens) * hidden, 12);
    FillRandom<<<1024, 256>>>(act, size_t(tokens) * inter, 13);
    LtPlan plans[5];
    for (int i = 0; i < 5; ++i) {
      CHECK_CUDA(cudaMalloc(&w[i], size_t(sh[i].n) * sh[i].k * 2));
      FillRandom<<<1024, 256>>>(w[i], size_t(sh[i].n) * sh[i].k, 20 + i, 1.f / std::sqrt(float(sh[i].k)));
      plans[i] = MakePlan(lt.handle, sh[i], lt.workspace_bytes);
    }
    CHECK_CUDA(cudaMalloc(&w_il, size_t(sh[2].n) * sh[2].k * 2));
    InterleaveGateUp<<<sh[2].n, 256>>>(w[2], w_il, inter, sh[2].k);
    hg::EpilogueArgs e_qkv, e_res, e_sw, e_am;
    e_qkv.out = qkv; e_qkv.out_stride = sh[0].n;
    e_res.out = h; e_res.out_stride = hidden; e_res.residual = h; e_res.residual_stride = hidden;
    e_sw.out = act; e_sw.out_stride = inter;
    e_am.argmax_keys = keys;
    // The layers through cuBLASLt, gate_up + SiLU-mul either as cuBLASLt
    // and the SiLU-mul kernel or (swiglu_in_gemm) the ping-pong Hopper GEMM.
    // The layers through cuBLASLt, with the MLP step given.
    auto layers_with = [&](const std::function<void()>& mlp) {
      for (int l = 0; l < layers; ++l) {
        lt.Run(plans[0], h, w[0], nullptr, qkv);
        lt.Run(plans[1], attn, w[1], h, h);
        mlp();
      }
    };
    // gate_up through cuBLASLt, the SiLU-mul kernel, down_proj + residual.
    auto lt_mlp = [&] {
      lt.Run(plans[2], h, w[2], nullptr, gu);
      e3::kernels::SiluMul(e3::kernels::Dtype::kBFloat16, gu, act, tokens, inter, nullptr, nullptr);
      lt.Run(plans[3], act, w[3], h, h);
    };
    // gate_up + SiLU-mul in the Hopper GEMM (`schedule`), down_proj as above.
    auto swiglu_mlp = [&](hg::Schedule schedule) {
      return [&, schedule] {
        g_schedule = schedule;
        Hopper<hg::Epilogue::kSwiGlu>(h, w_il, tokens, sh[2].n, sh[2].k, e_sw, groups[2]);
        lt.Run(plans[3], act, w[3], h, h);
      };
    };
    // The MLP in row chunks: gate_up, SiLU-mul and down_proj per chunk of
    // `rows` tokens through one reused [rows, 2I] and [rows, I] buffer, so
    // that the SiLU-mul's reads and the down_proj's A loads can hit L2
    // rather than HBM (1B: 1024 rows are 33.5 MB of gate_up output).
    std::deque<LtPlan> chunk_plans;  // stable addresses for the lambdas below
    auto chunked_mlp = [&](int rows) {
      const LtPlan* up = &chunk_plans.emplace_back(
          MakePlan(lt.handle, {"gate_up chunk", rows, sh[2].n, sh[2].k}, lt.workspace_bytes));
      const LtPlan* down = &chunk_plans.emplace_back(
          MakePlan(lt.handle, {"down chunk", rows, sh[3].n, sh[3].k}, lt.workspace_bytes));
      return [&, rows, up, down] {
        for (int r0 = 0; r0 < tokens; r0 += rows) {
          bf16* hr = h + size_t(r0) * hidden;
          lt.Run(*up, hr, w[2], nullptr, gu);
          e3::kernels::SiluMul(e3::kernels::Dtype::kBFloat16, gu, act, rows, inter, nullptr, nullptr);
          lt.Run(*down, act, w[3], hr, hr);
        }
      };
    };
    auto base = [&] {
      layers_with(lt_mlp);
      lt.Run(plans[4], h, w[4], nullptr, logits);
      e3::kernels::RowArgmax(e3::kernels::Dtype::kBFloat16, logits, tokens, sh[4].n, sh[4].n, idx, nullptr);
    };
    auto lm_head_argmax = [&] {
      g_schedule = hg::Schedule::kCooperative;
      CHECK_CUDA(cudaMemsetAsync(keys, 0, tokens * 8, 0));
      Hopper<hg::Epilogue::kArgmax>(h, w[4], tokens, sh[4].n, sh[4].k, e_am, groups[4]);
      hg::KeysToIndex(keys, idx, tokens, 0);
    };
    // What the sgl teacher runs since the sixth session (cuBLASLt and the
    // SiLU-mul kernel, the lm_head argmax in the Hopper GEMM), with the
    // MLP step given.
    auto teacher_with = [&](std::function<void()> mlp) {
      return [&, mlp] {
        layers_with(mlp);
        lm_head_argmax();
      };
    };
    // Every GEMM in the Hopper kernel (cooperative).
    auto all_hopper = [&] {
      g_schedule = hg::Schedule::kCooperative;
      for (int l = 0; l < layers; ++l) {
        Hopper<hg::Epilogue::kStore>(h, w[0], tokens, sh[0].n, sh[0].k, e_qkv, groups[0]);
        Hopper<hg::Epilogue::kStore>(attn, w[1], tokens, sh[1].n, sh[1].k, e_res, groups[1]);
        Hopper<hg::Epilogue::kSwiGlu>(h, w_il, tokens, sh[2].n, sh[2].k, e_sw, groups[2]);
        Hopper<hg::Epilogue::kStore>(act, w[3], tokens, sh[3].n, sh[3].k, e_res, groups[3]);
      }
      lm_head_argmax();
    };
    const char* name = model == 0 ? "1B" : "8B";
    std::printf("%s forward's GEMM work in sequence (%d layers + lm_head), against cuBLASLt + kernels:\n", name,
                layers);
    std::vector<std::pair<std::string, std::function<void()>>> variants = {
        {"all in the Hopper GEMM", all_hopper}, {"teacher now (argmax in the Hopper GEMM)", teacher_with(lt_mlp)}};
    if (pingpong) variants.push_back({"+ ping-pong SwiGLU gate_up", teacher_with(swiglu_mlp(hg::Schedule::kPingPong))});
    variants.push_back({"+ cooperative SwiGLU gate_up", teacher_with(swiglu_mlp(hg::Schedule::kCooperative))});
    // Chunks sized by their gate_up output, a multiple of 128 rows.
    for (int mib : {32, 48, 64, 96, 128}) {
      const int rows = std::max(128, int((size_t(mib) << 20) / (size_t(sh[2].n) * 2) / 128 * 128));
      variants.push_back({"MLP in chunks of " + std::to_string(rows) + " rows (" + std::to_string(mib) + " MiB)",
                          teacher_with(chunked_mlp(rows))});
    }
    const int rounds = std::getenv("PROBE_ROUNDS") ? std::atoi(std::getenv("PROBE_ROUNDS")) : 3;
    for (auto& [what, variant] : variants) {
      auto [tb, tc] = Interleaved(base, variant, rounds, 3);
      std::printf("  %-40s %.2f ms against %.2f ms, ratio %.3f\n", what.c_str(), tc, tb, tb / tc);
    }
    for (LtPlan& p : chunk_plans) DestroyPlan(p);
    for (int i = 0; i < 5; ++i) { DestroyPlan(plans[i]); cudaFree(w[i]); }
    cudaFree(h); cudaFree(qkv); cudaFree(attn); cudaFree(gu); cudaFree(act); cudaFree(w_il); cudaFree(logits);
    cudaFree(idx); cudaFree(keys);
  }
  CHECK_CUDA(cudaGetLastError());
  return 0;
}
