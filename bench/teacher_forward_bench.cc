// Teacher forward throughput (tokens/s) and MFU of the backends on a
// model dir, at a few packed batch shapes, all measured in the same run.
// The first backend of --backends is the one measured; the others are its
// baselines, and the ratio against each is printed (default: sgl against
// hf, and hf-eager: the hf backend with transformers' eager attention,
// matmul + fp32 softmax). HF transformers itself, in Python, is the
// external baseline of bench/run_gpu_benches.sh teacher.
//
// Each row also prints the host's share of the wall time (the time until
// Forward returns, before the device is synchronised, over the total):
// when it is well below 1 the GPU always has queued work, so launch
// overhead is hidden. The sgl backend makes the same measurement at a
// budget's second forward to decide whether a CUDA graph pays
// (models/forward_graphs.h); `sgl-no-graphs` is the ablation, and
// --rounds interleaves the backends to compare them under one clock state.
//
// With --tp_size=N the model is sharded over N processes (tensor
// parallelism, as teacher_server --tp_size runs it): start one process per
// rank with --tp_rank and the same --master_port; rank r uses cuda:r and
// rank 0 prints. Its figures are to be set against the --tp_size=1 run of
// the same model and shape (bench/run_gpu_benches.sh tp).
//
//   ./build/bench/teacher_forward_bench --model_dir=examples/tiny-code-llama
//   ./build/bench/teacher_forward_bench --model_dir=M --device=cuda --dtype=bfloat16
//       --shapes=8x1024,200/2048/512/1400/320/900/1750/640 --logits   (one line)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/backend_spec.h"
#include "bench/kineto_profile.h"
#include "bench/random_samples.h"
#include "common/base/status_macros.h"
#include "common/model/model_dir.h"
#include "common/torch/tensor_convert.h"
#include "common/torch/torch_core.h"
#include "teacher_server/models/causal_lm.h"
#include "teacher_server/runtime/tp_control.h"

ABSL_FLAG(std::string, model_dir, "examples/tiny-code-llama", "Hugging Face model directory");
ABSL_FLAG(std::string, dtype, "float32", "compute dtype");
ABSL_FLAG(std::string, backends, "sgl,hf,hf-eager",
          "backends timed in this run; the first is measured against the others: hf, sgl, hf-eager (hf with "
          "eager attention), or sgl-no-<technique> (fusion, kernels, varlen, lt, residual-gemm, argmax-gemm, "
          "fp8-argmax, graphs, tp-overlap, grouped-experts, gemm-tuning) for ablations");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda[:N]");
ABSL_FLAG(std::string, shapes, "1x128,4x256,8x512,ragged",
          "batches: BxS (B samples of S tokens), 'ragged' (chat-like lengths 37..700) or explicit sample "
          "lengths L1/L2/... (e.g. 200/2048/512)");
ABSL_FLAG(int, repeats, 3, "timed repetitions per shape (median reported)");
ABSL_FLAG(int, rounds, 1,
          "measure the backends in turn this many times per shape (interleaved, so that the GPU's clock drift "
          "falls on all of them); each backend's median over every round's repetitions is reported");
ABSL_FLAG(bool, logits, false, "also compute the argmax over the lm_head (as the teacher serves)");
ABSL_FLAG(int, profile, 0,
          "CUDA builds: also profile this many forwards of the first backend on the first shape and print the "
          "GPU kernels by time");
ABSL_FLAG(int64_t, gemm_tuning_rows, 0,
          "backends on the tuned GEMM path (sgl on a GPU): tune for forwards of this many tokens before timing "
          "(teacher_server tunes at --tokens_per_batch); 0: the largest shape's tokens, -1: no tuning");
ABSL_FLAG(std::string, gemm_tuning_cache, "",
          "GEMM tuning cache file (teacher_server's flag): reuse a matching tuning instead of timing again");
ABSL_FLAG(double, peak_tflops, 989.0,
          "the device's dense peak for --dtype, for MFU (989: H100/H200 SXM bf16; 0 leaves MFU out)");

ABSL_FLAG(int, tp_size, 1, "tensor-parallel ranks (one process each)");
ABSL_FLAG(int, ep_size, 1, "expert-parallel groups (MoE models)");
ABSL_FLAG(int, tp_rank, 0, "this process's rank (uses cuda:<rank> when --tp_size > 1)");
ABSL_FLAG(int, master_port, 29720, "c10d store port of rank 0");
ABSL_FLAG(int64_t, tp_overlap_min_tokens, e3::ModelOptions().tp_overlap_min_tokens,
          "sgl under TP: smallest micro-batch half worth splitting a batch for (teacher_server's flag)");

namespace e3 {
namespace {

std::vector<int64_t> ShapeLengths(const std::string& shape) {
  if (shape == "ragged") return {std::begin(bench::kChatLikeLengths), std::end(bench::kChatLikeLengths)};
  std::vector<int64_t> lengths;
  if (shape.find('/') != std::string::npos) {
    for (const std::string& n : std::vector<std::string>(absl::StrSplit(shape, '/'))) lengths.push_back(std::stoll(n));
    return lengths;
  }
  std::vector<std::string> bs = absl::StrSplit(shape, 'x');
  lengths.assign(std::stoll(bs.at(0)), std::stoll(bs.at(1)));
  return lengths;
}

// Model FLOPs of one forward over samples of these lengths (the usual MFU
// count: 2 per multiply-add of every matmul, causal attention's half of
// QK^T and PV, the routed experts a token actually runs).
double ForwardFlops(const ModelConfig& c, const std::vector<int64_t>& lengths, bool lm_head) {
  const double H = static_cast<double>(c.hidden_size), D = static_cast<double>(c.head_dim);
  const double q = c.num_attention_heads * D, kv = c.num_key_value_heads * D;
  double tokens = 0, attn_pairs = 0;
  for (int64_t n : lengths) {
    tokens += static_cast<double>(n);
    attn_pairs += static_cast<double>(n) * static_cast<double>(n + 1) / 2.0;
  }
  double flops = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const double proj = H * (q + 2 * kv) + q * H;
    const double mlp = c.IsMoeLayer(i) ? H * static_cast<double>(c.moe.num_experts) +
                                             3.0 * H * static_cast<double>(c.moe.intermediate_size * c.moe.top_k)
                                       : 3.0 * H * static_cast<double>(c.intermediate_size);
    flops += 2.0 * tokens * (proj + mlp) + 4.0 * attn_pairs * q;
  }
  if (lm_head) flops += 2.0 * tokens * H * static_cast<double>(c.vocab_size);
  return flops;
}

struct Timing {
  double seconds = 0;      // median wall time per forward
  double issue_share = 0;  // host time until Forward returned, over the wall time (same repetition)
};

// (wall seconds, host share) of `repeats` synchronised forwards, after
// three warm-up calls.
std::vector<std::pair<double, double>> Measure(CausalLM& model, const PackedBatch& batch, const ForwardOptions& fwd,
                                               int repeats) {
  const bool cuda = model.options().device.is_cuda();
  auto run = [&] {
    auto t0 = std::chrono::steady_clock::now();
    auto out = model.Forward(batch, fwd);
    if (!out.ok()) {
      std::fprintf(stderr, "forward failed: %s\n", std::string(out.status().message()).c_str());
      std::exit(1);
    }
    auto t1 = std::chrono::steady_clock::now();
    if (cuda) torch::cuda::synchronize(model.options().device.index());
    auto t2 = std::chrono::steady_clock::now();
    const double wall = std::chrono::duration<double>(t2 - t0).count();
    return std::make_pair(wall, std::chrono::duration<double>(t1 - t0).count() / wall);
  };
  // Three warm-up calls: the sgl backend decides at a budget's second
  // forward whether a CUDA graph pays, and captures it at the third.
  for (int i = 0; i < 3; ++i) run();
  std::vector<std::pair<double, double>> times;
  for (int i = 0; i < repeats; ++i) times.push_back(run());
  return times;
}

Timing Median(std::vector<std::pair<double, double>> times) {
  std::sort(times.begin(), times.end());
  const auto& median = times[times.size() / 2];
  return {median.first, median.second};
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
  return 1;
}

int Main() {
  auto dir = ModelDir::Open(absl::GetFlag(FLAGS_model_dir));
  if (!dir.ok()) return Fail(dir.status());
  auto dtype = ParseComputeScalarType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return Fail(dtype.status());
  ModelOptions options;
  options.dtype = *dtype;
  options.device = at::Device(absl::GetFlag(FLAGS_device));
  options.tp_overlap_min_tokens = absl::GetFlag(FLAGS_tp_overlap_min_tokens);
  const int tp_size = absl::GetFlag(FLAGS_tp_size), tp_rank = absl::GetFlag(FLAGS_tp_rank);
  std::vector<std::string> backends = absl::StrSplit(absl::GetFlag(FLAGS_backends), ',');
  if (tp_size > 1) {
    backends.resize(1);  // one sharded model per process group
    ProcessGroupOptions po;
    po.rank = tp_rank;
    po.world_size = tp_size;
    po.master_port = absl::GetFlag(FLAGS_master_port);
    po.cuda = options.device.is_cuda();
    if (po.cuda) options.device = at::Device(at::kCUDA, tp_rank);
    auto group = ProcessGroup::Create(po);
    if (!group.ok()) return Fail(group.status());
    options.tp = std::make_shared<TpGroup>(std::move(group).value(), absl::GetFlag(FLAGS_ep_size));
  }
  // Models are loaded once, before the shapes (a sharded one on every rank).
  std::vector<std::unique_ptr<CausalLM>> models;
  for (const std::string& b : backends) {
    ModelOptions o = options;
    if (absl::Status st = bench::ApplyBackendSpec(b, &o); !st.ok()) return Fail(st);
    auto model = LoadCausalLM(**dir, o);
    if (!model.ok()) return Fail(model.status());
    models.push_back(std::move(model).value());
  }
  const std::vector<std::string> shapes = absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',');
  // Every rank tunes its own shard (the tuned choices are per process).
  if (const int64_t flag_rows = absl::GetFlag(FLAGS_gemm_tuning_rows); flag_rows >= 0) {
    int64_t rows = flag_rows;
    for (const std::string& shape : shapes) {
      int64_t tokens = 0;
      for (int64_t n : ShapeLengths(shape)) tokens += n;
      if (flag_rows == 0) rows = std::max(rows, tokens);
    }
    for (size_t i = 0; i < models.size(); ++i) {
      GemmTuningOptions o;
      o.rows = rows;
      o.cache_path = absl::GetFlag(FLAGS_gemm_tuning_cache);
      o.log = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
      const auto t0 = std::chrono::steady_clock::now();
      auto tuned = models[i]->TuneGemms(o);
      if (!tuned.ok()) return Fail(tuned.status());
      if (tuned->skipped.empty()) {
        std::printf("%s: %s (%.1f s)\n", backends[i].c_str(), tuned->Summary().c_str(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
  }
  if (tp_size > 1) {
    if (tp_rank != 0) {
      const absl::Status st = RunTpFollower(*models[0]);
      if (!st.ok()) std::fprintf(stderr, "rank %d: %s\n", tp_rank, std::string(st.message()).c_str());
      return st.ok() ? 0 : 1;
    }
    models[0] = std::make_unique<TpLeader>(std::move(models[0]));
  }
  for (size_t i = 0; i < backends.size(); ++i) {
    std::printf("%s: %s\n", backends[i].c_str(), models[i]->Techniques().c_str());
  }
  const ModelConfig& cfg = (*dir)->config();
  ForwardOptions fwd;
  fwd.aux_layer_ids = cfg.DefaultAuxLayerIds();
  fwd.return_argmax = absl::GetFlag(FLAGS_logits);
  const double peak = absl::GetFlag(FLAGS_peak_tflops) * 1e12;

  std::printf("model %s: L=%ld H=%ld heads=%ld/%ld vocab=%ld, dtype %s, device %s, tp %d, lm_head %s, "
              "torch threads %d\n",
              (*dir)->path().c_str(), static_cast<long>(cfg.num_hidden_layers), static_cast<long>(cfg.hidden_size),
              static_cast<long>(cfg.num_attention_heads), static_cast<long>(cfg.num_key_value_heads),
              static_cast<long>(cfg.vocab_size), absl::GetFlag(FLAGS_dtype).c_str(),
              absl::GetFlag(FLAGS_device).c_str(), tp_size, fwd.return_argmax ? "argmax" : "off", at::get_num_threads());
  std::printf("%-14s %7s  %-10s %12s %7s %7s %s\n", "shape", "tokens", "backend", "tok/s", "MFU", "host", "ratio");
  for (const std::string& shape : shapes) {
    const std::vector<int64_t> lengths = ShapeLengths(shape);
    auto batch = PackSamples(bench::RandomSamples(lengths, cfg.vocab_size, 88172645463325252ull), cfg.vocab_size,
                             options.device);
    if (!batch.ok()) return Fail(batch.status());
    const double tok = static_cast<double>(batch->num_tokens());
    // MFU of a sharded forward is per rank: the whole model's FLOPs over tp devices.
    const double flops = ForwardFlops(cfg, lengths, fwd.return_argmax) / tp_size;
    std::vector<std::vector<std::pair<double, double>>> runs(models.size());
    std::vector<double> round_ratios;  // the second backend's median time over the first's, per round
    for (int round = 0; round < std::max(1, absl::GetFlag(FLAGS_rounds)); ++round) {
      std::vector<double> medians;
      for (size_t k = 0; k < models.size(); ++k) {
        auto times = Measure(*models[k], *batch, fwd, absl::GetFlag(FLAGS_repeats));
        runs[k].insert(runs[k].end(), times.begin(), times.end());
        medians.push_back(Median(times).seconds);
      }
      if (medians.size() > 1) round_ratios.push_back(medians[1] / medians[0]);
    }
    std::vector<Timing> t;
    for (auto& r : runs) t.push_back(Median(r));
    if (&shape == &shapes.front()) {
      // Synchronised per call as Measure times it, so the profile's gaps
      // include each call's start (host work before its first kernel).
      auto forward = [&](bool) {
        (void)models[0]->Forward(*batch, fwd);
        if (options.device.is_cuda()) torch::cuda::synchronize(options.device.index());
      };
      bench::ProfileSteps(forward, absl::GetFlag(FLAGS_profile));
    }
    const std::string label = shape.size() > 14 ? absl::StrCat(lengths.size(), " ragged") : shape;
    for (size_t k = 0; k < models.size(); ++k) {
      const double rate = tok / t[k].seconds;
      const double mfu = peak > 0 ? flops / t[k].seconds / peak : 0.0;
      std::string ratios;
      if (k == 0) {
        for (size_t b = 1; b < models.size(); ++b) {
          absl::StrAppend(&ratios, b > 1 ? ", " : "", absl::StrFormat("%.2fx %s", t[b].seconds / t[0].seconds,
                                                                      backends[b]));
        }
      }
      if (k == 0 && round_ratios.size() > 1) {
        absl::StrAppend(&ratios, " (rounds: ", absl::StrJoin(round_ratios, " ", [](std::string* out, double r) {
                          absl::StrAppend(out, absl::StrFormat("%.3f", r));
                        }), ")");
      }
      std::printf("%-14s %7.0f  %-10s %12.0f %6.1f%% %6.0f%% %s\n", k == 0 ? label.c_str() : "", tok,
                  backends[k].c_str(), rate, 100 * mfu, 100 * t[k].issue_share, ratios.c_str());
      std::printf("{\"bench\":\"teacher_forward\",\"backend\":\"%s\",\"shape\":\"%s\",\"tokens\":%.0f,"
                  "\"tok_per_s\":%.1f,\"mfu\":%.4f,\"host_issue_share\":%.3f,\"lm_head\":%s,\"baseline\":\"%s\","
                  "\"baseline_tok_per_s\":%.1f,\"ratio\":%.3f,\"device\":\"%s\",\"dtype\":\"%s\",\"tp_size\":%d}\n",
                  backends[k].c_str(), shape.c_str(), tok, rate, mfu, t[k].issue_share,
                  fwd.return_argmax ? "true" : "false", models.size() > 1 && k == 0 ? backends[1].c_str() : "",
                  models.size() > 1 && k == 0 ? tok / t[1].seconds : 0.0,
                  models.size() > 1 && k == 0 ? t[1].seconds / t[0].seconds : 0.0,
                  absl::GetFlag(FLAGS_device).c_str(), absl::GetFlag(FLAGS_dtype).c_str(), tp_size);
    }
  }
  return 0;
}

}  // namespace
}  // namespace e3

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return e3::Main();
}
