// Teacher forward throughput (tokens/s) of the hf backend on a model dir,
// at a few packed batch shapes. Baseline, measured in the same run: the
// same forward with transformers' eager attention kernel (matmul + fp32
// softmax), against which the SDPA kernel's ratio is printed. Each shape
// also prints a JSON line for collection.
//
// With --tp_size=N the model is sharded over N processes (tensor
// parallelism, as teacher_server --tp_size runs it): start one process per
// rank with --tp_rank and the same --master_port; rank r uses cuda:r and
// rank 0 prints. Its figures are to be set against the --tp_size=1 run of
// the same model and shape (bench/run_gpu_benches.sh tp).
//
//   ./build/bench/teacher_forward_bench --model_dir=examples/tiny-code-llama
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/random_samples.h"
#include "common/model_dir.h"
#include "common/torch/tensor_convert.h"
#include "teacher_server/causal_lm.h"
#include "teacher_server/parallel/tp_control.h"

ABSL_FLAG(std::string, model_dir, "examples/tiny-code-llama", "Hugging Face model directory");
ABSL_FLAG(std::string, dtype, "float32", "compute dtype");
ABSL_FLAG(std::string, backend, "hf", "hf (reference) or sgl (QKV and gate-up fused at load)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda[:N]");
ABSL_FLAG(std::string, shapes, "1x128,4x256,8x512,ragged",
          "batches: BxS (B samples of S tokens) or 'ragged' (chat-like lengths 37..700)");
ABSL_FLAG(int, repeats, 3, "timed repetitions per shape (median reported)");
ABSL_FLAG(bool, logits, false, "also compute the argmax over the lm_head (as the teacher serves)");
ABSL_FLAG(bool, eager_baseline, true,
          "also time the eager-attention forward as the baseline (off when an external baseline, e.g. "
          "bench/hf_teacher_baseline.py, is compared instead)");

ABSL_FLAG(int, tp_size, 1, "tensor-parallel ranks (one process each)");
ABSL_FLAG(int, ep_size, 1, "expert-parallel groups (MoE models)");
ABSL_FLAG(int, tp_rank, 0, "this process's rank (uses cuda:<rank> when --tp_size > 1)");
ABSL_FLAG(int, master_port, 29720, "c10d store port of rank 0");

namespace e3 {
namespace {

std::vector<std::vector<int32_t>> MakeBatch(const std::string& shape, int64_t vocab) {
  std::vector<int64_t> lengths;
  if (shape == "ragged") {
    lengths.assign(std::begin(bench::kChatLikeLengths), std::end(bench::kChatLikeLengths));
  } else {
    std::vector<std::string> bs = absl::StrSplit(shape, 'x');
    int64_t b = std::stoll(bs.at(0)), s = std::stoll(bs.at(1));
    lengths.assign(b, s);
  }
  return bench::RandomSamples(lengths, vocab, 88172645463325252ull);
}

double MedianSeconds(CausalLM& model, const PackedBatch& batch, const ForwardOptions& fwd, int repeats) {
  auto run = [&] {
    auto out = model.Forward(batch, fwd);
    if (!out.ok()) {
      std::fprintf(stderr, "forward failed: %s\n", std::string(out.status().message()).c_str());
      std::exit(1);
    }
    if (model.options().device.is_cuda()) torch::cuda::synchronize(model.options().device.index());
  };
  run();  // warm-up
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int Main() {
  auto dir = ModelDir::Open(absl::GetFlag(FLAGS_model_dir));
  if (!dir.ok()) {
    std::fprintf(stderr, "%s\n", std::string(dir.status().message()).c_str());
    return 1;
  }
  auto dtype = ParseComputeScalarType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) {
    std::fprintf(stderr, "%s\n", std::string(dtype.status().message()).c_str());
    return 1;
  }
  ModelOptions options;
  options.dtype = *dtype;
  options.device = at::Device(absl::GetFlag(FLAGS_device));
  options.fuse_projections = absl::GetFlag(FLAGS_backend) == "sgl";
  const int tp_size = absl::GetFlag(FLAGS_tp_size), tp_rank = absl::GetFlag(FLAGS_tp_rank);
  if (tp_size > 1) {
    ProcessGroupOptions po;
    po.rank = tp_rank;
    po.world_size = tp_size;
    po.master_port = absl::GetFlag(FLAGS_master_port);
    po.cuda = options.device.is_cuda();
    if (po.cuda) options.device = at::Device(at::kCUDA, tp_rank);
    auto group = ProcessGroup::Create(po);
    if (!group.ok()) {
      std::fprintf(stderr, "%s\n", std::string(group.status().message()).c_str());
      return 1;
    }
    options.tp = std::make_shared<TpGroup>(std::move(group).value(), absl::GetFlag(FLAGS_ep_size));
  }
  // Models are loaded once, before the shapes (a sharded one on every rank).
  const int kernels = absl::GetFlag(FLAGS_eager_baseline) && tp_size == 1 ? 2 : 1;
  std::vector<std::unique_ptr<CausalLM>> models;
  for (int k = 0; k < kernels; ++k) {
    options.attention = k == 0 ? AttentionKernel::kSdpa : AttentionKernel::kEager;
    auto model = LoadCausalLM(**dir, options);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
      return 1;
    }
    models.push_back(std::move(model).value());
  }
  if (tp_size > 1) {
    if (tp_rank != 0) {
      const absl::Status st = RunTpFollower(*models[0]);
      if (!st.ok()) std::fprintf(stderr, "rank %d: %s\n", tp_rank, std::string(st.message()).c_str());
      return st.ok() ? 0 : 1;
    }
    models[0] = std::make_unique<TpLeader>(std::move(models[0]));
  }
  const ModelConfig& cfg = (*dir)->config();
  ForwardOptions fwd;
  fwd.aux_layer_ids = cfg.DefaultAuxLayerIds();
  fwd.return_argmax = absl::GetFlag(FLAGS_logits);

  std::printf("model %s: L=%ld H=%ld heads=%ld/%ld vocab=%ld, dtype %s, device %s, tp %d, torch threads %d\n",
              (*dir)->path().c_str(), static_cast<long>(cfg.num_hidden_layers), static_cast<long>(cfg.hidden_size),
              static_cast<long>(cfg.num_attention_heads), static_cast<long>(cfg.num_key_value_heads),
              static_cast<long>(cfg.vocab_size), absl::GetFlag(FLAGS_dtype).c_str(),
              absl::GetFlag(FLAGS_device).c_str(), tp_size, at::get_num_threads());
  std::printf("%-10s %8s %14s %16s %8s\n", "shape", "tokens", "sdpa tok/s", "eager tok/s (base)", "ratio");
  for (const std::string& shape : std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_shapes), ','))) {
    auto samples = MakeBatch(shape, cfg.vocab_size);
    auto batch = PackSamples(samples, cfg.vocab_size, options.device);
    double tok = static_cast<double>(batch->num_tokens());
    double rates[2] = {0, 0};
    for (int k = 0; k < kernels; ++k) {
      rates[k] = tok / MedianSeconds(*models[k], *batch, fwd, absl::GetFlag(FLAGS_repeats));
    }
    const double ratio = kernels == 2 ? rates[0] / rates[1] : 0.0;
    std::printf("%-10s %8.0f %14.0f %16.0f %8.2f\n", shape.c_str(), tok, rates[0], rates[1], ratio);
    std::printf("{\"bench\":\"teacher_forward\",\"backend\":\"%s\",\"shape\":\"%s\",\"tokens\":%.0f,"
                "\"tok_per_s\":%.1f,\"lm_head\":%s,\"baseline\":\"hf_eager_attention\",\"baseline_tok_per_s\":%.1f,"
                "\"ratio\":%.3f,\"device\":\"%s\",\"dtype\":\"%s\",\"tp_size\":%d}\n",
                absl::GetFlag(FLAGS_backend).c_str(), shape.c_str(), tok, rates[0],
                absl::GetFlag(FLAGS_logits) ? "true" : "false", rates[1], ratio,
                absl::GetFlag(FLAGS_device).c_str(), absl::GetFlag(FLAGS_dtype).c_str(), tp_size);
  }
  return 0;
}

}  // namespace
}  // namespace e3

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return e3::Main();
}
