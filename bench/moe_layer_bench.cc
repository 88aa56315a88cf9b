// One MoE layer's routed experts (GroupedMoe) as an expert-parallel rank
// runs them: experts [0, E / ep) of E, every token routed over all E, for
// each --ep_sizes value. Measured: gathering and activating only this
// rank's (token, expert) pairs, whose count stays on the device (the
// default), against the baseline of the same run that gathers and
// activates every pair and lets the grouped GEMMs skip the others' rows
// (MoeRouting::rank_rows_only = false, the eleventh session's GroupedMoe).
// Interleaved rounds, medians. Defaults: one layer of Qwen3-30B-A3B (128
// experts of 768, 8 per token, hidden 2048), 8192 tokens, bf16.
//
//   ./build/bench/moe_layer_bench --device=cuda:0
//   ./build/bench/moe_layer_bench --device=cpu --dtype=float32 --tokens=256 --experts=16 --intermediate=64

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "common/torch/tensor_convert.h"
#include "common/torch/torch_core.h"
#include "teacher_server/layers/moe.h"
#include "tests/teacher_server/random_experts.h"

ABSL_FLAG(std::string, device, "cuda:0", "cpu or cuda[:N]");
ABSL_FLAG(std::string, dtype, "bfloat16", "compute dtype");
ABSL_FLAG(int64_t, tokens, 8192, "tokens in the batch");
ABSL_FLAG(int64_t, experts, 128, "routed experts in the layer");
ABSL_FLAG(int64_t, top_k, 8, "experts per token");
ABSL_FLAG(int64_t, hidden, 2048, "hidden size");
ABSL_FLAG(int64_t, intermediate, 768, "each expert's intermediate size");
ABSL_FLAG(std::string, ep_sizes, "1,2,4,8", "expert-parallel sizes; rank 0's share is timed");
ABSL_FLAG(int, repeats, 20, "timed layer calls per round");
ABSL_FLAG(int, rounds, 3, "interleaved rounds (median reported)");

namespace e3 {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Sync(const at::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

// Milliseconds per call of the layer, over `repeats` calls.
double TimeLayer(const at::Tensor& x, const MoeWeights& w, const MoeRouting& routing, int repeats) {
  GroupedMoe(x, w, routing, /*fused_activation=*/true);  // warm-up (allocator, cuBLAS handles)
  Sync(x.device());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) GroupedMoe(x, w, routing, /*fused_activation=*/true);
  Sync(x.device());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / repeats;
}

int Main() {
  const at::Device device(absl::GetFlag(FLAGS_device));
  auto dtype = ParseComputeScalarType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) {
    std::fprintf(stderr, "--dtype: %s\n", std::string(dtype.status().message()).c_str());
    return 2;
  }
  const int64_t T = absl::GetFlag(FLAGS_tokens), E = absl::GetFlag(FLAGS_experts), k = absl::GetFlag(FLAGS_top_k);
  const int64_t H = absl::GetFlag(FLAGS_hidden), I = absl::GetFlag(FLAGS_intermediate);
  c10::InferenceMode inference;
  std::printf("MoE layer: %ld tokens, %ld experts of %ld, top %ld, hidden %ld, %s on %s\n", static_cast<long>(T),
              static_cast<long>(E), static_cast<long>(I), static_cast<long>(k), static_cast<long>(H),
              c10::toString(*dtype), device.str().c_str());
  std::printf("%4s %8s %14s %14s %7s\n", "ep", "experts", "rank rows ms", "all rows ms", "ratio");
  const std::vector<std::string> ep_sizes = absl::StrSplit(absl::GetFlag(FLAGS_ep_sizes), ',');
  for (const std::string& ep_text : ep_sizes) {
    const int64_t ep = std::stoll(ep_text);
    if (ep < 1 || E % ep != 0) {
      std::fprintf(stderr, "--ep_sizes: %s does not divide %ld experts\n", ep_text.c_str(), static_cast<long>(E));
      return 2;
    }
    torch::manual_seed(0);
    // HF's init scale (0.02), so routing and activations look like a real layer's.
    MoeWeights w = testing::RandomExperts(E, 0, E / ep, H, I, *dtype, 0.02, device);
    w.router = w.router * 0.02;
    StackExperts(&w);
    const at::Tensor x = torch::randn({T, H}).to(device, *dtype);
    MoeRouting mine{k, true}, all{k, true};
    all.rank_rows_only = false;
    std::vector<double> ms_mine, ms_all;
    for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
      ms_mine.push_back(TimeLayer(x, w, mine, absl::GetFlag(FLAGS_repeats)));
      ms_all.push_back(TimeLayer(x, w, all, absl::GetFlag(FLAGS_repeats)));
    }
    const double a = Median(ms_mine), b = Median(ms_all);
    std::printf("%4ld %8ld %14.3f %14.3f %6.2fx\n", static_cast<long>(ep), static_cast<long>(E / ep), a, b, b / a);
    std::printf("{\"bench\": \"moe_layer\", \"ep\": %ld, \"tokens\": %ld, \"rank_rows_ms\": %.4f, "
                "\"all_rows_ms\": %.4f, \"speedup\": %.4f}\n",
                static_cast<long>(ep), static_cast<long>(T), a, b, b / a);
  }
  return 0;
}

}  // namespace
}  // namespace e3

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return e3::Main();
}
