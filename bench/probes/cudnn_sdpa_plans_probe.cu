// Does cuDNN have a faster plan for the TTT step's causal attention block
// than the one ATen runs (GPU machine)?
//
// ATen builds cuDNN's SDPA forward and backward with heuristics mode A and
// runs the first plan, and gives a caller no way to pick another. This
// probe builds the same two graphs through the cuDNN frontend (header-only
// C++, github.com/NVIDIA/cudnn-frontend) over the step's memory layout at
// 16k tokens: Q from the step's fused q/k/v rows [T, 32 + 8 + 8, 128], K
// and V from step 0's, O, dO, dQ [T, 32, 128], dK, dV [T, 8, 128], bf16,
// causal, fp32 log-sum-exp. It then lists every plan that heuristics modes
// A, B and FALLBACK offer, adds knob variants of the engines they name
// (one knob set at a time, the rest left to the engine; engines in id
// order, up to max_variants in all, so a small cap reaches only the first
// engines), builds them all, checks each plan's outputs against the first
// plan's and times them in alternated rounds. cuDNN's default backward is
// not deterministic, so its plans differ from the first by rounding even
// where the configuration is the same.
//
// Result (nvidia-h100-x1, cuDNN 9.19, 2026-12-07, `16384 3 8` and
// `16384 3 64`, the second reaching every variant cuDNN accepts): no plan
// beats the first beyond the spread of one configuration timed again
// (0.92-1.07x); the other engines are at least twice as slow
// (bench/README.md, rejected table).
//
//   nvcc -O2 -std=c++17 -arch=sm_90a -I. -I<cudnn-frontend>/include -I<cudnn>/include \
//        -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING bench/probes/cudnn_sdpa_plans_probe.cu \
//        -ldl -o /tmp/cudnn_plans
//   LD_LIBRARY_PATH=<cudnn>/lib:$LD_LIBRARY_PATH /tmp/cudnn_plans [tokens=16384] [rounds=3] [max_variants=24]
//
// With NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING the program opens
// libcudnn.so.9 when it starts, so it builds where cuDNN's headers are
// but its library is not (it then runs against the GPU machine's).
#include <cudnn_frontend.h>
#ifdef NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <dlfcn.h>
void* cudnn_frontend::cudnn_dlhandle = nullptr;
#endif

#include <cmath>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/probes/cuda_probe_util.cuh"

namespace fe = cudnn_frontend;

namespace {

constexpr int64_t kHeads = 32, kKvHeads = 8, kDim = 128;
constexpr int64_t kFusedHeads = kHeads + 2 * kKvHeads;  // q/k/v rows as the step lays them out

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDo, kDq, kDk, kDv };

#define CHECK_FE(x)                                                        \
  do {                                                                     \
    auto st_ = (x);                                                        \
    if (st_.is_bad()) {                                                    \
      std::printf("%s: %s\n", #x, st_.get_message().c_str());              \
      std::exit(1);                                                        \
    }                                                                      \
  } while (0)

// The step's buffers.
struct Buffers {
  __nv_bfloat16 *qkv_step, *qkv0, *o, *d_o, *dq, *dk, *dv;
  float* stats;
};

__nv_bfloat16* AllocBf16(size_t n, unsigned seed, float scale) {
  __nv_bfloat16* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, n * sizeof(__nv_bfloat16)));
  FillRandom<<<1024, 256>>>(p, n, seed, scale);
  return p;
}

Buffers MakeBuffers(int64_t t) {
  Buffers b;
  b.qkv_step = AllocBf16(t * kFusedHeads * kDim, 1, 1.f);
  b.qkv0 = AllocBf16(t * kFusedHeads * kDim, 2, 1.f);
  b.o = AllocBf16(t * kHeads * kDim, 3, 1.f);
  b.d_o = AllocBf16(t * kHeads * kDim, 4, 0.01f);
  b.dq = AllocBf16(t * kHeads * kDim, 5, 0.f);
  b.dk = AllocBf16(t * kKvHeads * kDim, 6, 0.f);
  b.dv = AllocBf16(t * kKvHeads * kDim, 7, 0.f);
  CHECK_CUDA(cudaMalloc(&b.stats, t * kHeads * sizeof(float)));
  CHECK_CUDA(cudaDeviceSynchronize());
  return b;
}

// [1, heads, T, D] over rows of `row_elems` elements.
std::shared_ptr<fe::graph::Tensor_attributes> Bshd(fe::graph::Graph& g, Uid uid, const char* name,
                                                   int64_t heads, int64_t t, int64_t row_elems) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, heads, t, kDim})
                      .set_stride({t * row_elems, kDim, row_elems, 1}));
}

void SetOutput(const std::shared_ptr<fe::graph::Tensor_attributes>& x, Uid uid, int64_t heads, int64_t t) {
  x->set_output(true).set_uid(uid).set_dim({1, heads, t, kDim}).set_stride({t * heads * kDim, kDim, heads * kDim, 1});
}

// A graph and its Q, K and V, read from the step's fused q/k/v rows.
struct GraphWithQkv {
  std::unique_ptr<fe::graph::Graph> g;
  std::shared_ptr<fe::graph::Tensor_attributes> q, k, v;
};

GraphWithQkv NewGraph(int64_t t) {
  GraphWithQkv r{std::make_unique<fe::graph::Graph>()};
  r.g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  r.q = Bshd(*r.g, kQ, "Q", kHeads, t, kFusedHeads * kDim);
  r.k = Bshd(*r.g, kK, "K", kKvHeads, t, kFusedHeads * kDim);
  r.v = Bshd(*r.g, kV, "V", kKvHeads, t, kFusedHeads * kDim);
  return r;
}

// The fp32 log-sum-exp [1, heads, T, 1].
void SetStatsLayout(fe::graph::Tensor_attributes& x, int64_t t) {
  x.set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({1, kHeads, t, 1}).set_stride({kHeads * t, t, 1, 1});
}

std::unique_ptr<fe::graph::Graph> ForwardGraph(int64_t t, float scale) {
  GraphWithQkv r = NewGraph(t);
  auto opts = fe::graph::SDPA_attributes().set_name("fwd").set_generate_stats(true).set_attn_scale(scale)
                  .set_causal_mask(true);
  auto [o, stats] = r.g->sdpa(r.q, r.k, r.v, opts);
  SetOutput(o, kO, kHeads, t);
  stats->set_output(true);
  SetStatsLayout(*stats, t);
  return std::move(r.g);
}

std::unique_ptr<fe::graph::Graph> BackwardGraph(int64_t t, float scale) {
  GraphWithQkv r = NewGraph(t);
  auto o = Bshd(*r.g, kO, "O", kHeads, t, kHeads * kDim);
  auto d_o = Bshd(*r.g, kDo, "dO", kHeads, t, kHeads * kDim);
  fe::graph::Tensor_attributes stats_attrs;
  stats_attrs.set_name("Stats");
  SetStatsLayout(stats_attrs, t);
  auto stats = r.g->tensor(stats_attrs);
  auto opts = fe::graph::SDPA_backward_attributes().set_name("bwd").set_attn_scale(scale).set_causal_mask(true);
  auto [dq, dk, dv] = r.g->sdpa_backward(r.q, r.k, r.v, o, d_o, stats, opts);
  SetOutput(dq, kDq, kHeads, t);
  SetOutput(dk, kDk, kKvHeads, t);
  SetOutput(dv, kDv, kKvHeads, t);
  return std::move(r.g);
}

std::unordered_map<int64_t, void*> VariantPack(const Buffers& b) {
  const int64_t k_off = kHeads * kDim, v_off = (kHeads + kKvHeads) * kDim;
  return {{kQ, b.qkv_step}, {kK, b.qkv0 + k_off}, {kV, b.qkv0 + v_off}, {kO, b.o},   {kStats, b.stats},
          {kDo, b.d_o},     {kDq, b.dq},          {kDk, b.dk},          {kDv, b.dv}};
}

// Mode A's plans first (ATen runs A's first), then B's and FALLBACK's where
// the backend offers them for this graph.
void AddHeuristicsPlans(fe::graph::Graph& g) {
  CHECK_FE(g.create_execution_plans({fe::HeurMode_t::A}));
  const int64_t from_a = g.get_execution_plan_count();
  for (fe::HeurMode_t mode : {fe::HeurMode_t::B, fe::HeurMode_t::FALLBACK}) {
    auto st = g.create_execution_plans({mode});
    if (st.is_bad()) std::printf("  heuristics mode %d: %s\n", int(mode), st.get_message().substr(0, 120).c_str());
  }
  std::printf("  heuristics: %lld plans from mode A, %lld from B and FALLBACK\n", (long long)from_a,
              (long long)(g.get_execution_plan_count() - from_a));
}

int64_t EngineOf(const std::string& tag) {
  const size_t at = tag.find("eng");
  return at == std::string::npos ? -1 : std::atoll(tag.c_str() + at + 3);
}

// Adds one-knob variants of the engines the heuristics named, in engine id
// order, up to `max_variants` in all; cuDNN refuses many at creation.
void AddKnobVariants(fe::graph::Graph& g, int max_variants) {
  std::set<int64_t> engines;
  for (int64_t i = 0; i < g.get_execution_plan_count(); ++i) {
    std::string tag;
    (void)g.get_plan_name_at_index(i, tag);
    engines.insert(EngineOf(tag));
  }
  int added = 0;
  for (int64_t engine : engines) {
    if (engine < 0) continue;
    std::vector<fe::Knob> knobs;
    if (g.get_knobs_for_engine(engine, knobs).is_bad()) continue;
    for (const fe::Knob& k : knobs) {
      std::printf("  engine %lld knob %d: %lld..%lld step %lld\n", (long long)engine, int(k.type),
                  (long long)k.minValue, (long long)k.maxValue, (long long)k.stride);
      const int64_t step = std::max<int64_t>(k.stride, 1);
      for (int64_t v = k.minValue; v <= k.maxValue && added < max_variants; v += step) {
        if (g.create_execution_plan(engine, {{k.type, v}}).is_good()) ++added;
      }
    }
  }
  std::printf("  %d knob variants added\n", added);
}

__global__ void MaxAbs(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n, float* out) {
  float diff = 0.f, ref = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    diff = fmaxf(diff, fabsf(__bfloat162float(a[i]) - __bfloat162float(b[i])));
    ref = fmaxf(ref, fabsf(__bfloat162float(b[i])));
  }
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(diff));  // non-negative floats order as ints
  atomicMax(reinterpret_cast<int*>(out) + 1, __float_as_int(ref));
}

// A plan's outputs: where each lies and its element count.
using Outputs = std::vector<std::pair<__nv_bfloat16*, size_t>>;

// The worst over the outputs of max |output - ref| / max |ref|.
float RelativeError(const Outputs& outputs, const std::vector<__nv_bfloat16*>& refs) {
  float worst = 0.f, *d = nullptr, h[2];
  CHECK_CUDA(cudaMalloc(&d, 2 * sizeof(float)));
  for (size_t i = 0; i < outputs.size(); ++i) {
    CHECK_CUDA(cudaMemset(d, 0, 2 * sizeof(float)));
    MaxAbs<<<1024, 256>>>(outputs[i].first, refs[i], outputs[i].second, d);
    CHECK_CUDA(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    worst = std::max(worst, h[0] / std::max(h[1], 1e-30f));
  }
  cudaFree(d);
  return worst;
}

struct Plan {
  int64_t index;
  std::string tag;
  void* workspace;
  float err;
  std::vector<float> ms;
};

// The graph's operation graph and candidate plans: the heuristics' and
// `max_variants` knob variants.
void AddCandidatePlans(fe::graph::Graph& g, cudnnHandle_t handle, int max_variants) {
  CHECK_FE(g.validate());
  CHECK_FE(g.build_operation_graph(handle));
  AddHeuristicsPlans(g);
  AddKnobVariants(g, max_variants);
  CHECK_FE(g.check_support(handle));
}

// Builds every plan of `g`, checks each against the first that runs and
// times them all in `rounds` alternated rounds; returns the plans that ran.
std::vector<Plan> ProbeAll(const char* what, fe::graph::Graph& g, cudnnHandle_t handle, const Buffers& b,
                           double flop, int rounds, const Outputs& outputs) {
  auto pack = VariantPack(b);
  std::vector<Plan> plans;
  std::vector<__nv_bfloat16*> refs;
  std::printf("%s: %lld candidate plans\n", what, (long long)g.get_execution_plan_count());
  for (int64_t i = 0; i < g.get_execution_plan_count(); ++i) {
    std::string tag;
    (void)g.get_plan_name_at_index(i, tag);
    auto built = g.build_plan_at_index(i);
    if (built.is_bad()) {
      std::printf("  plan %lld %s: not built (%s)\n", (long long)i, tag.c_str(), built.get_message().substr(0, 120).c_str());
      continue;
    }
    int64_t ws_bytes = 0;
    CHECK_FE(g.get_workspace_size_plan_at_index(i, ws_bytes));
    void* ws = nullptr;
    if (ws_bytes > 0) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    auto ran = g.execute_plan_at_index(handle, pack, ws, i);
    if (ran.is_bad() || cudaDeviceSynchronize() != cudaSuccess) {
      std::printf("  plan %lld %s: failed to run (%s)\n", (long long)i, tag.c_str(), ran.get_message().substr(0, 120).c_str());
      cudaFree(ws);
      continue;
    }
    float err = 0.f;
    if (refs.empty()) {
      for (const auto& [p, n] : outputs) {
        __nv_bfloat16* r = nullptr;
        CHECK_CUDA(cudaMalloc(&r, n * sizeof(__nv_bfloat16)));
        CHECK_CUDA(cudaMemcpy(r, p, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice));
        refs.push_back(r);
      }
    } else {
      err = RelativeError(outputs, refs);
    }
    plans.push_back({i, tag, ws, err, {}});
  }
  for (int r = 0; r < rounds; ++r) {
    for (Plan& p : plans) {
      p.ms.push_back(TimeMs([&] { (void)g.execute_plan_at_index(handle, pack, p.workspace, p.index); }, 5));
    }
  }
  for (const Plan& p : plans) {
    const float ms = Median(p.ms);
    std::printf("  plan %2lld: %7.3f ms %4.0f TFLOP/s, %.2fx the first, max rel diff %.1e  %s\n", (long long)p.index,
                ms, flop / ms / 1e9, Median(plans.front().ms) / ms, p.err, p.tag.c_str());
  }
  return plans;
}

void Probe(int64_t t, int rounds, int max_variants) {
  const float scale = 1.f / std::sqrt(float(kDim));
  const double fwd_flop = 4.0 * kHeads * kDim * double(t) * double(t) / 2;
  Buffers b = MakeBuffers(t);
  cudnnHandle_t handle;
  if (fe::detail::create_handle(&handle) != CUDNN_STATUS_SUCCESS) { std::printf("cudnnCreate failed\n"); std::exit(1); }

  auto fwd = ForwardGraph(t, scale);
  AddCandidatePlans(*fwd, handle, max_variants);
  const std::vector<Plan> fwd_plans =
      ProbeAll("forward", *fwd, handle, b, fwd_flop, rounds, {{b.o, size_t(t * kHeads * kDim)}});
  if (fwd_plans.empty()) { std::printf("no forward plan ran\n"); std::exit(1); }
  // The backward reads the first forward plan's output and log-sum-exp.
  auto pack = VariantPack(b);
  CHECK_FE(fwd->execute_plan_at_index(handle, pack, fwd_plans.front().workspace, fwd_plans.front().index));
  CHECK_CUDA(cudaDeviceSynchronize());

  auto bwd = BackwardGraph(t, scale);
  AddCandidatePlans(*bwd, handle, max_variants);
  ProbeAll("backward", *bwd, handle, b, 2.5 * fwd_flop, rounds,
           {{b.dq, size_t(t * kHeads * kDim)}, {b.dk, size_t(t * kKvHeads * kDim)}, {b.dv, size_t(t * kKvHeads * kDim)}});
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run cut short keeps what it printed
#ifdef NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
  cudnn_frontend::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
  if (cudnn_frontend::cudnn_dlhandle == nullptr) {
    std::printf("cannot open libcudnn.so.9: %s\n", dlerror());
    return 1;
  }
#endif
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const int max_variants = argc > 3 ? std::atoi(argv[3]) : 24;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, cuDNN %zu, frontend %d.%d.%d, %lld tokens, %lld/%lld heads, head dim %lld, bf16, causal\n",
              prop.name, fe::detail::get_backend_version(), CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION,
              CUDNN_FRONTEND_PATCH_VERSION, (long long)tokens, (long long)kHeads, (long long)kKvHeads, (long long)kDim);
  Probe(tokens, rounds, max_variants);
  return 0;
}
