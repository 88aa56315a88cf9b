// Student training step throughput: one EAGLE-3 TTT step (forward over
// `ttt_length` steps, backward, gradient clipping, AdamW on fp32 master
// weights) of the draft for a target shape, on a packed batch of random
// teacher states. Prints ms/step and tokens/s, and a JSON line. The named
// baseline (a PyTorch eager implementation of the same step, SpecForge
// v0.2's algorithm) runs in bench/student_step_baseline.py in the same
// session; bench/run_gpu_benches.sh prints the ratio.
//
// With --world_size=N the step runs data-parallel (DDP as the trainer runs
// it: bucketed fp32 all-reduce overlapped with backward, on c10d): start
// one process per rank with --rank and the same --master_port; rank r uses
// cuda:r and its own batch of --tokens. Rank 0 prints the aggregate
// throughput, to be set against the --world_size=1 run.
//
//   ./build/bench/student_step_bench --shape=llama-8b --device=cuda:0
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>


#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/device_memory.h"
#include "bench/kineto_profile.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_convert.h"
#include "common/torch/torch_core.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "student_trainer/ops/ttt_attention.h"
#include "student_trainer/optim/draft_optimizer.h"
#include "student_trainer/step/ttt_step.h"

ABSL_FLAG(std::string, shape, "llama-8b", "target shape: llama-1b (Llama-3.2-1B), llama-8b (Llama-3.1-8B), tiny");
ABSL_FLAG(int64_t, tokens, 2048, "tokens in the packed batch");
ABSL_FLAG(int64_t, samples, 1, "samples the tokens are split into");
ABSL_FLAG(int, ttt_length, 7, "TTT steps");
ABSL_FLAG(int64_t, draft_vocab, 32000, "draft vocabulary");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda:N");
ABSL_FLAG(std::string, dtype, "bfloat16", "compute dtype (below float32: fp32 master weights)");
ABSL_FLAG(int, warmup, 3, "untimed steps");
ABSL_FLAG(int, profile_steps, 0,
          "CUDA builds: also profile this many steps with Kineto and print the GPU kernels by total time");
ABSL_FLAG(int, world_size, 1, "data-parallel ranks (one process each)");
ABSL_FLAG(int, rank, 0, "this process's rank (uses cuda:<rank> when --world_size > 1)");
ABSL_FLAG(int, master_port, 29710, "c10d store port of rank 0");
ABSL_FLAG(int, steps, 10, "timed steps (median reported)");
ABSL_FLAG(std::string, student_kernels, "fast", "fast or reference (as the trainer's flag)");
ABSL_FLAG(bool, eagle31, false, "EAGLE-3.1's draft (fc_norm, norm_output) instead of EAGLE-3's");
ABSL_FLAG(bool, cudnn_attention, true,
          "fast path: one sequence of 4096+ tokens runs its causal attention in cuDNN (false: varlen flash)");
ABSL_FLAG(bool, skip_untrained_rows, true,
          "fast path: from TTT step 1 on, run the midlayer only over rows a later step still trains");
ABSL_FLAG(int64_t, head_chunk_rows, 0,
          "fast path: rows of the draft head's logits computed at once (0: the step's default)");
ABSL_FLAG(std::string, loss_mask, "all",
          "all: every position trained; chat: each sample's first 40% is a prompt (loss mask 0), as in chat data");

namespace e3 {
namespace {

struct Shape {
  int64_t hidden, intermediate, heads, kv_heads, head_dim, vocab, layers;
  double rope_theta;
};

Shape ShapeNamed(const std::string& name) {
  if (name == "llama-1b") return {2048, 8192, 32, 8, 64, 128256, 16, 500000.0};
  if (name == "llama-8b") return {4096, 14336, 32, 8, 128, 128256, 32, 500000.0};
  if (name == "tiny") return {256, 704, 4, 2, 64, 8192, 8, 10000.0};
  std::fprintf(stderr, "unknown --shape %s\n", name.c_str());
  std::exit(2);
}

// H200 SXM dense bf16 tensor-core peak (NVIDIA's datasheet), the MFU base.
constexpr double kBf16PeakFlops = 989e12;

// Model FLOPs of one step, as the reference formulation computes them
// (forward + backward = 3x forward for every trained matmul): fc (forward
// and weight gradient; its input needs none), the target logits (forward
// only), and per TTT step the midlayer's projections, the causal
// attention over each sample (half of n^2 per head) and the head.
double StepFlops(const Shape& s, int64_t draft_vocab, const std::vector<int64_t>& cu, int ttt_length) {
  const double T = static_cast<double>(cu.back()), H = static_cast<double>(s.hidden);
  const double qkv_out = static_cast<double>((s.heads + 2 * s.kv_heads) * s.head_dim);
  const double mid_params = 2 * H * qkv_out + s.heads * s.head_dim * H + 3 * H * s.intermediate;
  double attn_pairs = 0;  // sum over samples of n^2 / 2: the causal (query, key) pairs
  for (size_t i = 0; i + 1 < cu.size(); ++i) attn_pairs += 0.5 * static_cast<double>(cu[i + 1] - cu[i]) * (cu[i + 1] - cu[i]);
  const double attn_fwd = 2 * 2 * attn_pairs * s.heads * s.head_dim;  // QK^T and PV
  const double per_step = 6 * T * mid_params + 3 * attn_fwd + 6 * T * H * draft_vocab;
  return 4 * T * 3 * H * H + 2 * T * H * draft_vocab + ttt_length * per_step;
}

int Main() {
  const Shape s = ShapeNamed(absl::GetFlag(FLAGS_shape));
  const int world = absl::GetFlag(FLAGS_world_size), rank = absl::GetFlag(FLAGS_rank);
  const at::Device device = world > 1 ? at::Device(at::kCUDA, rank) : at::Device(absl::GetFlag(FLAGS_device));
  std::unique_ptr<ProcessGroup> group;
  if (world > 1) {
    ProcessGroupOptions po;
    po.rank = rank;
    po.world_size = world;
    po.master_port = absl::GetFlag(FLAGS_master_port);
    po.cuda = true;
    auto g = ProcessGroup::Create(po);
    if (!g.ok()) {
      std::fprintf(stderr, "%s\n", std::string(g.status().message()).c_str());
      return 1;
    }
    group = std::move(g).value();
  }
  const std::string dtype_name = absl::GetFlag(FLAGS_dtype);
  const auto parsed = ParseComputeScalarType(dtype_name);
  if (!parsed.ok()) {
    std::fprintf(stderr, "--dtype: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  const at::ScalarType dtype = *parsed;
  const int64_t T = absl::GetFlag(FLAGS_tokens);
  const int64_t N = std::min(absl::GetFlag(FLAGS_draft_vocab), s.vocab / 2);  // draft ids map to even target ids

  Eagle3DraftConfig c;
  c.hidden_size = c.target_hidden_size = s.hidden;
  c.num_aux = 3;
  c.intermediate_size = s.intermediate;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.rms_norm_eps = 1e-5;
  c.rope.theta = s.rope_theta;
  c.max_position_embeddings = 131072;
  c.vocab_size = s.vocab;
  c.draft_vocab_size = N;
  c.aux_layer_ids = {1, static_cast<int32_t>(s.layers / 2 - 1), static_cast<int32_t>(s.layers - 4)};

  torch::manual_seed(0);  // the same weights on every rank
  auto on = torch::TensorOptions().device(device);
  Eagle3FrozenTensors frozen;
  frozen.embed_tokens = torch::randn({s.vocab, s.hidden}, on.dtype(dtype)) * 0.02;
  // The draft vocab: every other target id (any N distinct ids will do).
  frozen.vocab.target_vocab_size = s.vocab;
  frozen.vocab.t2d.assign(static_cast<size_t>(s.vocab), 0);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = (2 * i) % s.vocab;
    frozen.vocab.d2t.push_back(t - i);
    frozen.vocab.t2d[static_cast<size_t>(t)] = 1;
  }
  // bf16 values in fp32, as a bf16 checkpoint's head arrives from the teacher.
  frozen.target_lm_head = (torch::randn({N, s.hidden}, on.dtype(at::kFloat)) * 0.02).to(at::kBFloat16).to(at::kFloat);

  c.fc_norm = c.norm_output = absl::GetFlag(FLAGS_eagle31);
  Eagle3DraftOptions opts;
  opts.config = c;
  opts.device = device;
  opts.dtype = dtype;
  auto draft = CreateEagle3Draft(opts, frozen);
  if (!draft.ok()) {
    std::fprintf(stderr, "%s\n", std::string(draft.status().message()).c_str());
    return 1;
  }
  std::optional<Eagle3Draft> master;
  if (dtype != at::kFloat) {
    Eagle3DraftOptions mopts = opts;
    mopts.dtype = at::kFloat;
    auto m = CreateEagle3Draft(mopts, frozen);
    if (!m.ok()) return 1;
    master = *m;
  }
  auto kernels = ParseTttKernels(absl::GetFlag(FLAGS_student_kernels));
  if (!kernels.ok()) {
    std::fprintf(stderr, "%s\n", std::string(kernels.status().message()).c_str());
    return 2;
  }
  const bool fast = *kernels == TttKernels::kFast;
  ops::SetTttCudnnAttention(absl::GetFlag(FLAGS_cudnn_attention));
  // The trainer's optimizer settings (student_trainer_main.cc defaults).
  DraftOptimizerOptions adam;
  adam.beta1 = 0.9;
  adam.beta2 = 0.999;
  adam.weight_decay = 0.0;
  adam.grad_clip = 0.5;
  auto created = CreateDraftOptimizer(fast ? DraftOptimizerKind::kFused : DraftOptimizerKind::kReference, **draft,
                                      master ? &**master : nullptr, group.get(), adam);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", std::string(created.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<DraftOptimizer> optimizer = std::move(created).value();
  Eagle3DraftImpl& trained = master ? **master : **draft;

  TeacherBatch batch;
  const int64_t samples = std::max<int64_t>(1, absl::GetFlag(FLAGS_samples));
  std::vector<int64_t> cu = {0};
  for (int64_t i = 1; i <= samples; ++i) cu.push_back(T * i / samples);
  batch.input_ids = torch::randint(0, s.vocab, {T}, on.dtype(at::kInt));
  batch.cu_seqlens = torch::tensor(cu, torch::kInt);
  batch.loss_mask = torch::ones({T}, torch::kByte);
  if (absl::GetFlag(FLAGS_loss_mask) == "chat") {
    for (size_t i = 0; i + 1 < cu.size(); ++i) batch.loss_mask.narrow(0, cu[i], (cu[i + 1] - cu[i]) * 2 / 5).zero_();
  }
  batch.loss_mask = batch.loss_mask.to(device);
  batch.aux_hidden = torch::randn({T, 3 * s.hidden}, on.dtype(dtype));
  batch.last_hidden = torch::randn({T, s.hidden}, on.dtype(dtype));
  batch.target_argmax = (torch::randint(0, N, {T}, on.dtype(at::kInt)) * 2) % s.vocab;
  TttOptions ttt;
  ttt.length = absl::GetFlag(FLAGS_ttt_length);
  ttt.kernels = *kernels;
  ttt.defer_metrics = true;
  ttt.skip_untrained_rows = absl::GetFlag(FLAGS_skip_untrained_rows);
  ttt.head_chunk_rows = absl::GetFlag(FLAGS_head_chunk_rows);
  int64_t midlayer_rows = 0;

  // With `phases`, each phase is synchronised and timed on its own
  // (forward, backward, optimizer incl. master-weight copies and clipping).
  double phase_ms[3] = {0, 0, 0};
  auto step = [&](bool phases) {
    auto sync = [&] {
      if (device.is_cuda()) torch::cuda::synchronize(device.index());
    };
    auto t0 = std::chrono::steady_clock::now();
    auto lap = [&](int k) {
      if (!phases) return;
      sync();
      auto t1 = std::chrono::steady_clock::now();
      phase_ms[k] += 1e3 * std::chrono::duration<double>(t1 - t0).count();
      t0 = t1;
    };
    optimizer->BeginStep();
    auto out = RunTtt(**draft, batch, ttt);
    if (!out.ok()) {
      std::fprintf(stderr, "%s\n", std::string(out.status().message()).c_str());
      std::exit(1);
    }
    midlayer_rows = out->midlayer_rows;
    lap(0);
    out->loss.backward();
    lap(1);
    const absl::Status st = optimizer->FinishStep(1e-4);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
    ResolveTttMetrics(&*out);
    lap(2);
    sync();
  };
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) step(false);
  // Memory: what the step adds to what is resident between steps
  // (weights, optimizer state, frozen tensors, the batch).
  const bench::MemoryStats before = bench::DeviceMemory(device, /*reset_peak=*/true);
  step(false);
  const bench::MemoryStats during = bench::DeviceMemory(device, /*reset_peak=*/false);
  constexpr int kPhaseSteps = 3;
  for (int i = 0; i < kPhaseSteps; ++i) step(true);
  std::vector<double> ms;
  for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step(false);
    ms.push_back(1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  bench::ProfileSteps(step, absl::GetFlag(FLAGS_profile_steps));
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  if (rank != 0) return 0;
  int64_t params = 0;
  for (const auto& p : trained.parameters()) params += p.numel();
  std::printf("student step %s: H=%ld draft vocab %ld, %ld tokens in %ld samples, TTT %d, %s on %s, %.1fM params\n",
              absl::GetFlag(FLAGS_shape).c_str(), static_cast<long>(s.hidden), static_cast<long>(N),
              static_cast<long>(T), static_cast<long>(samples), static_cast<int>(ttt.length), dtype_name.c_str(), device.str().c_str(),
              params / 1e6);
  std::printf("%d rank(s): median %.2f ms/step (min %.2f, max %.2f), %.0f tok/s in all; phases (synchronised): forward %.1f ms, "
              "backward %.1f ms, optimizer %.1f ms\n",
              world, med, ms.front(), ms.back(), world * T / med * 1e3, phase_ms[0] / kPhaseSteps, phase_ms[1] / kPhaseSteps,
              phase_ms[2] / kPhaseSteps);
  const double flops = StepFlops(s, N, cu, ttt.length);
  const double mfu = flops / (med * 1e-3) / kBf16PeakFlops;
  const double act_per_token = static_cast<double>(during.peak - before.allocated) / static_cast<double>(T);
  std::printf("%s kernels: %.1f TFLOP per step (model FLOPs), MFU %.1f%% of %.0f TFLOP/s; peak memory %.2f GB "
              "(%.2f GB resident between steps, %.0f KB per token for the step)\n",
              absl::GetFlag(FLAGS_student_kernels).c_str(), flops / 1e12, 100 * mfu, kBf16PeakFlops / 1e12,
              during.peak / 1e9, before.allocated / 1e9, act_per_token / 1024);
  std::printf("{\"bench\":\"student_step\",\"kernels\":\"%s\",\"shape\":\"%s\",\"tokens\":%ld,\"samples\":%ld,"
              "\"loss_mask\":\"%s\",\"ttt_length\":%d,\"draft_vocab\":%ld,\"world_size\":%d,\"ms_per_step\":%.3f,"
              "\"tok_per_s\":%.1f,\"forward_ms\":%.2f,\"backward_ms\":%.2f,\"optimizer_ms\":%.2f,\"tflop\":%.3f,"
              "\"mfu\":%.4f,\"peak_gb\":%.3f,\"resident_gb\":%.3f,\"step_kb_per_token\":%.1f,\"device\":\"%s\","
              "\"dtype\":\"%s\",\"cudnn_attention\":%s,\"midlayer_row_fraction\":%.4f,\"algorithm\":\"%s\"}\n",
              absl::GetFlag(FLAGS_student_kernels).c_str(), absl::GetFlag(FLAGS_shape).c_str(), static_cast<long>(T),
              static_cast<long>(samples), absl::GetFlag(FLAGS_loss_mask).c_str(), static_cast<int>(ttt.length),
              static_cast<long>(N), world, med, world * T / med * 1e3, phase_ms[0] / kPhaseSteps,
              phase_ms[1] / kPhaseSteps, phase_ms[2] / kPhaseSteps, flops / 1e12, mfu, during.peak / 1e9,
              before.allocated / 1e9, act_per_token / 1024, device.str().c_str(), dtype_name.c_str(),
              absl::GetFlag(FLAGS_cudnn_attention) ? "true" : "false",
              static_cast<double>(midlayer_rows) / static_cast<double>(T * ttt.length),
              absl::GetFlag(FLAGS_eagle31) ? "eagle3.1" : "eagle3");
  return 0;
}

}  // namespace
}  // namespace e3

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return e3::Main();
}
