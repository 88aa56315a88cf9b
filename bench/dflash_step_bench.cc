// DFlash student training step throughput: the trainer's own DFlash step
// (student_trainer/algorithm/dflash_algorithm.h: anchors drawn on the
// supervised rows, the blocks through every draft layer, the frozen
// target head and block loss in row chunks, backward, gradient clipping,
// AdamW on fp32 master weights) on a packed batch of random teacher
// states for a target shape. Prints ms/step, tokens/s and peak memory, and
// a JSON line. The named baseline, SpecForge HEAD's own DFlash step
// (bench/specforge_dflash_step.py), runs in the same session;
// bench/run_gpu_benches.sh prints the ratio.
//
//   ./build/bench/dflash_step_bench --shape=qwen3-8b --tokens=4096 --device=cuda:0
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/device_memory.h"
#include "bench/kineto_profile.h"
#include "common/torch/tensor_convert.h"
#include "common/torch/torch_core.h"
#include "student_trainer/algorithm/dflash_algorithm.h"

ABSL_FLAG(std::string, shape, "qwen3-8b", "target shape: qwen3-8b (Qwen3-8B, SpecForge's DFlash recipe), tiny");
ABSL_FLAG(int64_t, tokens, 4096, "tokens in the packed batch");
ABSL_FLAG(int64_t, samples, 1, "samples the tokens are split into");
ABSL_FLAG(int64_t, anchors, 512, "blocks per batch (draft.dflash_num_anchors)");
ABSL_FLAG(int64_t, block_size, 16, "B (draft.dflash_block_size)");
ABSL_FLAG(int64_t, layers, 5, "draft layers (draft.dflash_layers)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda:N");
ABSL_FLAG(std::string, dtype, "bfloat16", "compute dtype (below float32: fp32 master weights)");
ABSL_FLAG(std::string, student_kernels, "fast",
          "fast (block attention in chunks, no dense mask) or reference (the dense mask), as the trainer's flag");
ABSL_FLAG(int, warmup, 3, "untimed steps");
ABSL_FLAG(int, steps, 10, "timed steps (median reported)");
ABSL_FLAG(int, profile_steps, 0,
          "CUDA builds: also profile this many steps with Kineto and print the GPU kernels by total time");

namespace e3 {
namespace {

ModelConfig ShapeNamed(const std::string& name) {
  ModelConfig c;
  c.rms_norm_eps = 1e-6;
  if (name == "qwen3-8b") {
    c.hidden_size = 4096, c.intermediate_size = 12288, c.num_hidden_layers = 36;
    c.num_attention_heads = 32, c.num_key_value_heads = 8, c.head_dim = 128;
    c.vocab_size = 151936, c.max_position_embeddings = 40960;
    c.rope.theta = 1e6;
  } else if (name == "tiny") {
    c.hidden_size = 256, c.intermediate_size = 704, c.num_hidden_layers = 8;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 64;
    c.vocab_size = 8192, c.max_position_embeddings = 32768;
    c.rope.theta = 1e4;
  } else {
    std::fprintf(stderr, "unknown --shape %s\n", name.c_str());
    std::exit(2);
  }
  return c;
}

// SpecForge's recipe spreads 5 captured layers over 1..L-3
// (configs/qwen3-8b-dflash.json: 1, 9, 17, 25, 33 of 36).
std::vector<int32_t> SpreadLayers(int64_t k, int64_t L) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < k; ++i) ids.push_back(static_cast<int32_t>(1 + i * (L - 4) / std::max<int64_t>(1, k - 1)));
  return ids;
}

template <typename T>
T OrExit(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s\n", std::string(v.status().message()).c_str());
    std::exit(1);
  }
  return std::move(v).value();
}

// A packed batch of random teacher states, every row supervised.
TeacherBatch RandomBatch(const ModelConfig& m, int64_t k, const at::Device& device, at::ScalarType dtype) {
  const int64_t T = absl::GetFlag(FLAGS_tokens), samples = std::max<int64_t>(1, absl::GetFlag(FLAGS_samples));
  std::vector<int64_t> cu = {0};
  for (int64_t i = 1; i <= samples; ++i) cu.push_back(T * i / samples);
  const auto on = torch::TensorOptions().device(device);
  TeacherBatch b;
  b.input_ids = torch::randint(0, m.vocab_size, {T}, on.dtype(at::kInt));
  b.cu_seqlens = torch::tensor(cu, torch::kInt);
  b.loss_mask = torch::ones({T}, on.dtype(at::kByte));
  b.aux_hidden = torch::randn({T, k * m.hidden_size}, on.dtype(dtype));
  b.last_hidden = torch::randn({T, m.hidden_size}, on.dtype(dtype));
  b.target_argmax = torch::randint(0, m.vocab_size, {T}, on.dtype(at::kInt));
  return b;
}

int Main() {
  const ModelConfig m = ShapeNamed(absl::GetFlag(FLAGS_shape));
  const at::Device device(absl::GetFlag(FLAGS_device));
  DraftSettings draft;
  draft.algorithm = "dflash";
  draft.dflash_layers = absl::GetFlag(FLAGS_layers);
  draft.dflash_block_size = absl::GetFlag(FLAGS_block_size);
  draft.dflash_num_anchors = absl::GetFlag(FLAGS_anchors);
  draft.kernels = absl::GetFlag(FLAGS_student_kernels);
  draft.dtype = absl::GetFlag(FLAGS_dtype);
  ScheduleSettings schedule;
  auto algorithm = OrExit(DFlashAlgorithm::Create(draft, schedule, device));
  const at::ScalarType dtype = OrExit(ParseComputeScalarType(algorithm->compute_dtype()));

  TeacherInfo info;
  info.config = m;
  info.aux_layer_ids = SpreadLayers(draft.dflash_layers, m.num_hidden_layers);
  FrozenWeights frozen;  // the target's embedding and full head, random
  torch::manual_seed(0);
  const auto on = torch::TensorOptions().device(device);
  frozen.embed_tokens = torch::randn({m.vocab_size, m.hidden_size}, on.dtype(dtype)) * 0.02;
  frozen.target_head = torch::randn({m.vocab_size, m.hidden_size}, on.dtype(dtype)) * 0.02;
  frozen.vocab.target_vocab_size = m.vocab_size;
  frozen.vocab.d2t.assign(static_cast<size_t>(m.vocab_size), 0);
  frozen.vocab.t2d.assign(static_cast<size_t>(m.vocab_size), 1);
  if (absl::Status built = algorithm->Build(info, frozen, /*group=*/nullptr); !built.ok()) {
    std::fprintf(stderr, "%s\n", std::string(built.message()).c_str());
    return 1;
  }
  frozen = FrozenWeights();  // the draft keeps its own copies
  const TeacherBatch batch = RandomBatch(m, static_cast<int64_t>(info.aux_layer_ids.size()), device, dtype);

  int64_t step_index = 0;
  auto step = [&] {
    OrExit(algorithm->Step(&batch, 6e-4, step_index++));
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) step();
  // Memory: what the step adds to what is resident between steps
  // (weights, optimizer state, frozen tensors, the batch).
  const bench::MemoryStats before = bench::DeviceMemory(device, /*reset_peak=*/true);
  step();
  const bench::MemoryStats during = bench::DeviceMemory(device, /*reset_peak=*/false);
  std::vector<double> ms;
  for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  auto profiled_step = [&](bool) { step(); };
  bench::ProfileSteps(profiled_step, absl::GetFlag(FLAGS_profile_steps));
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const int64_t T = absl::GetFlag(FLAGS_tokens);
  std::printf("%s\n", algorithm->Describe().c_str());
  std::printf("DFlash step %s: %ld tokens in %ld samples, %ld anchors, median %.2f ms/step (min %.2f, max %.2f), "
              "%.0f tok/s; peak memory %.2f GB (%.2f GB resident between steps)\n",
              absl::GetFlag(FLAGS_shape).c_str(), static_cast<long>(T), static_cast<long>(absl::GetFlag(FLAGS_samples)),
              static_cast<long>(draft.dflash_num_anchors), med, ms.front(), ms.back(), T / med * 1e3, during.peak / 1e9,
              before.allocated / 1e9);
  std::printf("{\"bench\":\"dflash_step\",\"kernels\":\"%s\",\"shape\":\"%s\",\"tokens\":%ld,\"samples\":%ld,"
              "\"anchors\":%ld,\"block_size\":%ld,\"layers\":%ld,\"ms_per_step\":%.3f,\"tok_per_s\":%.1f,"
              "\"peak_gb\":%.3f,\"resident_gb\":%.3f,\"device\":\"%s\",\"dtype\":\"%s\"}\n",
              draft.kernels.c_str(), absl::GetFlag(FLAGS_shape).c_str(), static_cast<long>(T),
              static_cast<long>(absl::GetFlag(FLAGS_samples)), static_cast<long>(draft.dflash_num_anchors),
              static_cast<long>(draft.dflash_block_size), static_cast<long>(draft.dflash_layers), med, T / med * 1e3,
              during.peak / 1e9, before.allocated / 1e9, device.str().c_str(), algorithm->compute_dtype().c_str());
  return 0;
}

}  // namespace
}  // namespace e3

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return e3::Main();
}
