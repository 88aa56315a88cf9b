// teacher_server: serves a Hugging Face model's hidden states to EAGLE-3
// student trainers over gRPC (see README.md and DESIGN.md).
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/chat_template.h"
#include "common/dataset.h"
#include "common/dtype.h"
#include "common/torch/tensor_convert.h"
#include "common/file_util.h"
#include "common/shm_segment.h"
#include "common/metrics_server.h"
#include "common/model_dir.h"
#include "common/tokenizer.h"
#include "common/vocab_map.h"
#include "teacher_server/causal_lm.h"
#include "teacher_server/engine.h"
#include "teacher_server/parallel/tp_control.h"
#include "teacher_server/teacher_metrics.h"
#include "teacher_server/eval_set.h"
#include "teacher_server/regenerate.h"
#include "teacher_server/serialized_model.h"
#include "teacher_server/teacher_service.h"

ABSL_FLAG(std::string, model_dir, "", "Hugging Face model directory (config.json, safetensors, tokenizer.json)");
ABSL_FLAG(std::string, data, "", "training data, jsonl (conversations or input_ids/loss_mask)");
ABSL_FLAG(std::string, chat_template, "",
          "a .jinja file to render conversations with instead of model_dir's template (chat_template.jinja, "
          "else tokenizer_config.json's chat_template)");
ABSL_FLAG(std::string, chat_template_name, "default",
          "which of tokenizer_config.json's named chat templates to use, when it has a list");
ABSL_FLAG(std::string, chat_template_kwargs, "",
          "template variables, as a JSON object or key=value,... (e.g. enable_thinking=false)");
ABSL_FLAG(bool, train_reasoning, true,
          "train on assistant turns' reasoning (thinking) as well as their answers");
ABSL_FLAG(std::string, aux_layer_ids, "", "comma-separated decoder layers to capture; empty: [1, L/2-1, L-4]");
ABSL_FLAG(int64_t, tokens_per_batch, 4096, "token budget of one rank's batch");
ABSL_FLAG(int64_t, max_seq_len, 2048, "samples are cut to this many tokens");
ABSL_FLAG(uint64_t, seed, 42, "seed of the sample order");
ABSL_FLAG(int64_t, epochs, 1, "passes over the data");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address (port 0 picks one)");
ABSL_FLAG(std::string, port_file, "", "write the bound gRPC port here once serving");
ABSL_FLAG(int, metrics_port, 0, "port of /metrics (0 picks one, -1 disables)");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1", "address /metrics binds");
ABSL_FLAG(std::string, backend, "auto",
          "forward backend: auto (sgl on a GPU, hf on the CPU), hf (the reference: transformers' op order) or sgl "
          "(SGLang-style: fused QKV and gate-up "
          "weights, fused add+RMSNorm/SiLU-mul/rope/argmax CUDA kernels, varlen flash attention, cuBLASLt GEMMs with "
          "the residual add in their epilogue, the target argmax through an FP8 candidate search, the forward as a CUDA "
          "graph per token budget; same outputs within bf16 rounding)");
ABSL_FLAG(int, max_cuda_graphs, e3::ModelOptions().max_cuda_graphs,
          "sgl on a GPU: most token budgets whose whole forward is kept as a CUDA graph (captured the third time a "
          "budget is seen, where its timed second forward spent --graph_min_host_share of its time issuing "
          "kernels); 0 runs every forward eagerly");
ABSL_FLAG(double, graph_min_host_share, e3::ModelOptions().graph_min_host_share,
          "sgl with CUDA graphs: capture a budget only if the host's issuing took at least this share of its timed "
          "eager forward (0: capture every budget)");
ABSL_FLAG(int64_t, graph_token_step, e3::ModelOptions().graph_token_step,
          "sgl with CUDA graphs: ragged batches are padded to a multiple of this");
ABSL_FLAG(int64_t, tp_overlap_min_tokens, e3::ModelOptions().tp_overlap_min_tokens,
          "sgl under --tp_size > 1: split a batch at a sample boundary into two micro-batches whose all-reduces run "
          "while the other computes, where each half holds at least this many tokens (0: never split)");
ABSL_FLAG(bool, gemm_tuning, true,
          "sgl on a GPU: pick the projections' cuBLASLt algorithms at startup by timing the forward's whole GEMM "
          "sequence at --tokens_per_batch rows (about a minute for an 8B model, then cached; outputs unchanged)");
ABSL_FLAG(std::string, gemm_tuning_cache, "default",
          "JSON file of earlier GEMM tunings, reused when device, cuBLASLt, rows and shapes match; 'default': "
          "$XDG_CACHE_HOME/e3/gemm_tuning.json (else ~/.cache/e3/...); empty: tune at every start");
ABSL_FLAG(std::string, dtype, "", "compute dtype; default float32 on CPU, bfloat16 on GPU");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda:N");
ABSL_FLAG(int64_t, draft_vocab_size, 32000, "draft vocabulary size (capped at the model's vocab)");
ABSL_FLAG(std::string, vocab_map, "", "load d2t/t2d from this file instead of calibrating on the data");
ABSL_FLAG(std::string, vocab_map_out, "", "save the calibrated d2t/t2d here");
ABSL_FLAG(std::string, transports, "",
          "transports offered (default: nccl,cuda_ipc,shm,inline on a GPU, shm,inline on the CPU)");
ABSL_FLAG(int, max_credit_window, 16, "most batches in flight per subscriber");
ABSL_FLAG(double, subscriber_timeout_s, 60, "buffers of a vanished subscriber are reclaimed after this");
ABSL_FLAG(std::string, ledger, "", "append the delivery/commit ledger (JSON lines) here");
ABSL_FLAG(bool, skip_malformed, true, "skip and count malformed data lines (false: fail on the first)");
ABSL_FLAG(bool, train_on_all_tokens, false, "loss on every token, not only assistant turns");
ABSL_FLAG(int64_t, max_samples, 0, "use at most this many samples (0: all)");
ABSL_FLAG(bool, exit_when_done, false, "exit once every rank has committed every epoch");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads (0: default)");
ABSL_FLAG(int, num_data_shards, 1,
          "split the data over this many teachers; each serves the samples whose index mod N is its shard");
ABSL_FLAG(int, tp_size, 1, "tensor-parallel ranks of this teacher (one process each; rank 0 serves gRPC)");
ABSL_FLAG(int, ep_size, 1, "expert-parallel groups of a MoE model's experts; divides --tp_size");
ABSL_FLAG(int, tp_rank, -1, "this process's tensor-parallel rank (-1: $RANK, else 0)");
ABSL_FLAG(std::string, tp_master_addr, "", "rank 0's address for the group rendezvous (empty: $MASTER_ADDR, else 127.0.0.1)");
ABSL_FLAG(int, tp_master_port, -1, "rendezvous port (-1: $MASTER_PORT, else 29600)");
ABSL_FLAG(std::string, eval_prompts, "",
          "acceptance eval set, jsonl in a training data format: each line's conversation up to its last user turn "
          "is a prompt; the teacher generates its greedy continuation (KV cache, in the background) and serves "
          "prompt + continuation with aux states to students (student --eval_every)");
ABSL_FLAG(int64_t, eval_max_new_tokens, 256, "tokens the teacher generates per eval prompt (stops at EOS)");
ABSL_FLAG(int64_t, eval_samples, 0, "use at most this many eval prompts (0: all)");
ABSL_FLAG(bool, regenerate, false,
          "replace each assistant turn of --data with the teacher's own continuation of the conversation so far "
          "(KV cache, batched) before training; the result is cached (--regen_cache) and reused on restart");
ABSL_FLAG(double, regen_temperature, 0.0, "--regenerate: sampling temperature (0: greedy); draws are seeded by --seed");
ABSL_FLAG(int64_t, regen_max_new_tokens, 1024, "--regenerate: most tokens per assistant turn (stops at EOS)");
ABSL_FLAG(int64_t, regen_batch_sequences, 0,
          "--regenerate: conversations decoded together, grouped by prompt length (see --regen_kv_cache_gib); 0: 256 on "
          "a GPU, where a decode step costs about the same for 32 or 256 sequences, 32 on the CPU, where it grows with "
          "them");
ABSL_FLAG(double, regen_kv_cache_gib, 8.0,
          "--regenerate: most GiB of KV cache a group of --regen_batch_sequences may take (each sequence sized for the "
          "group's longest prompt plus --regen_max_new_tokens)");
ABSL_FLAG(std::string, regen_cache, "",
          "--regenerate: the regenerated data (jsonl), with <path>.fingerprint beside it; default "
          "regenerated-<fingerprint>.jsonl in the working directory");
ABSL_FLAG(int, data_shard, 0, "this teacher's shard in [0, num_data_shards)");

namespace e3 {
namespace {

std::atomic<int> g_signal{0};

// Rank 0 of a tensor-parallel teacher once it exists: a startup error must
// still release the followers, which otherwise wait out the group timeout.
TpLeader* g_tp_leader = nullptr;

[[noreturn]] void Fail(const absl::Status& s) {
  std::fprintf(stderr, "teacher_server: error: %s\n", std::string(s.message()).c_str());
  if (g_tp_leader != nullptr) g_tp_leader->Shutdown();
  std::exit(1);
}

std::string HostName() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// Segments named /e3-<pid>-... whose teacher died without unlinking them
// (SIGKILL, OOM) would stay in /dev/shm until reboot: remove them.
void RemoveStaleShm(const std::string& prefix) {
  auto names = ListDir("/dev/shm");
  if (!names.ok()) return;
  const std::string head = prefix.substr(1) + "-";
  int removed = 0;
  for (const std::string& n : *names) {
    if (n.rfind(head, 0) != 0) continue;
    long pid = std::strtol(n.c_str() + head.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ShmSegment::Unlink("/" + n);
      ++removed;
    }
  }
  if (removed > 0) std::printf("teacher: removed %d shm segments of dead teachers\n", removed);
}

// torchrun's variable when the flag is left at its default.
std::string FlagOrEnv(const std::string& flag, const char* env, const std::string& fallback) {
  if (!flag.empty()) return flag;
  const char* v = std::getenv(env);
  return v != nullptr && *v != '\0' ? v : fallback;
}

std::shared_ptr<TpGroup> JoinTensorParallelGroup(int tp_size, int ep_size, bool cuda) {
  ProcessGroupOptions o;
  o.world_size = tp_size;
  const int rank_flag = absl::GetFlag(FLAGS_tp_rank), port_flag = absl::GetFlag(FLAGS_tp_master_port);
  const std::string rank = FlagOrEnv(rank_flag >= 0 ? std::to_string(rank_flag) : "", "RANK", "0");
  const std::string port = FlagOrEnv(port_flag >= 0 ? std::to_string(port_flag) : "", "MASTER_PORT", "29600");
  o.master_addr = FlagOrEnv(absl::GetFlag(FLAGS_tp_master_addr), "MASTER_ADDR", "127.0.0.1");
  if (!absl::SimpleAtoi(rank, &o.rank) || !absl::SimpleAtoi(port, &o.master_port)) {
    Fail(absl::InvalidArgumentError(absl::StrCat("tensor parallel: rank \"", rank, "\" or port \"", port,
                                                 "\" is not an integer")));
  }
  o.cuda = cuda;
  // Ranks load their shards at different speeds (rank 0 also reads the
  // data): the first collective may wait long for the slowest.
  o.timeout = absl::Minutes(30);
  std::printf("teacher: joining tensor-parallel group as rank %d of %d (ep %d) at %s:%d\n", o.rank, tp_size, ep_size,
              o.master_addr.c_str(), o.master_port);
  std::fflush(stdout);
  auto group = ProcessGroup::Create(o);
  if (!group.ok()) Fail(group.status());
  return std::make_shared<TpGroup>(std::move(group).value(), ep_size);
}

// --backend, with auto resolved for the device: sgl on a GPU, where it is
// 1.2-3x faster than hf and trains drafts to the same acc_j (within 0.05
// points; bench/README.md section 8); hf on the CPU, where sgl's kernels
// do not run and its fused projections were not measured to pay.
std::string BackendName(const at::Device& device) {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "auto") return backend;
  return device.is_cuda() ? "sgl" : "hf";
}

ModelOptions ModelOptionsFromFlags() {
  ModelOptions mopts;
  try {
    mopts.device = at::Device(absl::GetFlag(FLAGS_device));
  } catch (const c10::Error& e) {
    Fail(absl::InvalidArgumentError(absl::StrCat("--device=", absl::GetFlag(FLAGS_device), ": ", e.what_without_backtrace())));
  }
  if (!SetBackend(BackendName(mopts.device), &mopts).ok()) {
    Fail(absl::InvalidArgumentError(
        absl::StrCat("--backend=", absl::GetFlag(FLAGS_backend), ": expected auto, hf or sgl")));
  }
  std::string dtype_name = absl::GetFlag(FLAGS_dtype);
  if (dtype_name.empty()) dtype_name = mopts.device.is_cuda() ? "bfloat16" : "float32";
  auto dtype = ParseComputeScalarType(dtype_name);
  if (!dtype.ok()) Fail(dtype.status());
  mopts.dtype = *dtype;
  if (!absl::GetFlag(FLAGS_gemm_tuning) && mopts.gemm == GemmPath::kCublasLtTuned) mopts.gemm = GemmPath::kCublasLt;
  mopts.max_cuda_graphs = absl::GetFlag(FLAGS_max_cuda_graphs);
  mopts.graph_token_step = absl::GetFlag(FLAGS_graph_token_step);
  mopts.graph_min_host_share = absl::GetFlag(FLAGS_graph_min_host_share);
  mopts.tp_overlap_min_tokens = absl::GetFlag(FLAGS_tp_overlap_min_tokens);
  if (mopts.tp_overlap_min_tokens < 0) {
    Fail(absl::InvalidArgumentError(
        absl::StrCat("--tp_overlap_min_tokens=", mopts.tp_overlap_min_tokens, ": expected >= 0")));
  }
  if (mopts.graph_token_step < 1) {
    Fail(absl::InvalidArgumentError(absl::StrCat("--graph_token_step=", mopts.graph_token_step, ": expected >= 1")));
  }
  const int tp_size = absl::GetFlag(FLAGS_tp_size), ep_size = absl::GetFlag(FLAGS_ep_size);
  if (tp_size > 1) mopts.tp = JoinTensorParallelGroup(tp_size, ep_size, mopts.device.is_cuda());
  else if (ep_size != 1) Fail(absl::InvalidArgumentError("--ep_size needs --tp_size > 1 (experts split over its ranks)"));
  return mopts;
}

std::string GemmTuningCachePath() {
  const std::string flag = absl::GetFlag(FLAGS_gemm_tuning_cache);
  if (flag != "default") return flag;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg != nullptr && *xdg != '\0') return JoinPath(xdg, "e3/gemm_tuning.json");
  if (home != nullptr && *home != '\0') return JoinPath(home, ".cache/e3/gemm_tuning.json");
  return "";
}

// The sgl backend's startup GEMM tuning (layers/gemm_tuning.h) for this
// rank's shard at the token budget. A failure is logged, not fatal: the
// forward then keeps cuBLASLt's heuristic choices, which compute the same.
// --regenerate: the path of the regenerated data (made now, or reused from
// its cache). Anything that fails ends the process, naming it.
std::string RegenerateOrDie(CausalLM* model, const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                            const std::string& model_path, bool sharded) {
  if (sharded) {
    Fail(absl::UnimplementedError("--regenerate: generation with a KV cache runs in one process; use --tp_size=1"));
  }
  RegenerateOptions o;
  o.generation.max_new_tokens = absl::GetFlag(FLAGS_regen_max_new_tokens);
  const int64_t sequences = absl::GetFlag(FLAGS_regen_batch_sequences);
  o.generation.max_sequences = sequences > 0 ? sequences : (model->options().device.is_cuda() ? 256 : 32);
  o.generation.kv_cache_bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_regen_kv_cache_gib) * (int64_t{1} << 30));
  o.generation.temperature = absl::GetFlag(FLAGS_regen_temperature);
  o.generation.seed = absl::GetFlag(FLAGS_seed);
  for (int64_t id : model->config().eos_token_ids) o.generation.stop_ids.push_back(static_cast<int32_t>(id));
  o.skip_malformed = absl::GetFlag(FLAGS_skip_malformed);
  o.max_lines = absl::GetFlag(FLAGS_max_samples);
  auto config = ReadFileToString(model_path + "/config.json");
  if (!config.ok()) Fail(config.status());
  auto fingerprint =
      RegenerationFingerprint(absl::GetFlag(FLAGS_data), *config, tmpl.fingerprint(), o.generation, o.max_lines);
  if (!fingerprint.ok()) Fail(fingerprint.status());
  o.cache_path = absl::GetFlag(FLAGS_regen_cache);
  if (o.cache_path.empty()) o.cache_path = absl::StrCat("regenerated-", *fingerprint, ".jsonl");
  auto report = RegenerateData(*model, tokenizer, tmpl, absl::GetFlag(FLAGS_data), *fingerprint, o);
  if (!report.ok()) Fail(report.status());
  if (report->reused) {
    std::printf("teacher: --regenerate: reusing %s (fingerprint %s)\n", o.cache_path.c_str(), fingerprint->c_str());
  } else {
    std::printf("teacher: --regenerate: %ld assistant turns of %ld conversations in %.1f s, %ld tokens (%.0f tok/s); "
                "%ld turns kept (no room within the model's positions), %ld pre-tokenized lines copied, %ld "
                "malformed skipped; wrote %s\n",
                static_cast<long>(report->turns), static_cast<long>(report->conversations), report->seconds,
                static_cast<long>(report->tokens), report->tokens / std::max(report->seconds, 1e-9),
                static_cast<long>(report->kept_turns), static_cast<long>(report->pretokenized),
                static_cast<long>(report->malformed), o.cache_path.c_str());
  }
  std::fflush(stdout);
  return o.cache_path;
}

// The eval set of --eval_prompts (null without it), generating in the
// background from now on. Bad flags or an unreadable file end the process.
std::unique_ptr<EvalSet> StartEvalSet(CausalLM* model, const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                                      const EngineOptions& eopts, bool sharded) {
  const std::string path = absl::GetFlag(FLAGS_eval_prompts);
  if (path.empty()) return nullptr;
  if (sharded) {
    Fail(absl::UnimplementedError("--eval_prompts: generation with a KV cache runs in one process; "
                                  "start the eval teacher with --tp_size=1"));
  }
  DatasetOptions d;
  d.path = path;
  d.prompts_only = true;
  d.drop_empty_loss_mask = false;
  d.min_length = 1;
  d.skip_malformed = absl::GetFlag(FLAGS_skip_malformed);
  d.max_samples = absl::GetFlag(FLAGS_eval_samples);
  d.vocab_size = model->config().vocab_size;
  auto prompts = Dataset::Load(d, tokenizer, tmpl);
  if (!prompts.ok()) Fail(prompts.status());
  std::printf("teacher: eval prompts %s\n", (*prompts)->Summary().c_str());
  EvalSetOptions o;
  o.max_new_tokens = absl::GetFlag(FLAGS_eval_max_new_tokens);
  for (int64_t id : model->config().eos_token_ids) o.stop_ids.push_back(static_cast<int32_t>(id));
  o.aux_layer_ids = eopts.aux_layer_ids;
  o.tokens_per_batch = eopts.tokens_per_batch;
  std::vector<std::vector<int32_t>> ids;
  for (const Sample& s : (*prompts)->samples()) ids.push_back(s.input_ids);
  return EvalSet::Start(model, std::move(ids), o);
}

void TuneGemmsOrWarn(CausalLM& model) {
  if (model.options().gemm != GemmPath::kCublasLtTuned || !model.options().device.is_cuda()) return;
  GemmTuningOptions o;
  o.rows = absl::GetFlag(FLAGS_tokens_per_batch);
  o.cache_path = GemmTuningCachePath();
  o.log = [](const std::string& line) {
    std::printf("teacher: %s\n", line.c_str());
    std::fflush(stdout);
  };
  const auto start = std::chrono::steady_clock::now();
  auto tuned = model.TuneGemms(o);
  if (!tuned.ok()) {
    std::fprintf(stderr, "teacher: %s; keeping cuBLASLt's heuristic algorithms\n",
                 std::string(tuned.status().message()).c_str());
    return;
  }
  std::printf("teacher: %s (%.1f s)\n", tuned->Summary().c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  std::fflush(stdout);
}

// Loads this rank's model, or exits naming what failed. On a terminal the
// progress rewrites one line; into a log file (Slurm, Kubernetes, the
// launcher) it would pile up carriage returns, so only the closing line is
// written there. The expected count is approximate (a tied lm_head or an
// expert-parallel shard loads fewer tensors), so the closing line, not the
// counter, ends the progress.
std::unique_ptr<CausalLM> LoadModelOrDie(const ModelDir& dir, ModelOptions mopts) {
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  // Shared: the model keeps its options, and with them this callback.
  auto loaded = std::make_shared<int64_t>(0);
  mopts.on_progress = [tty, loaded](int64_t done, int64_t total) {
    *loaded = done;
    if (tty && done % 16 == 0) {
      std::printf("\rteacher: loading weights %ld/~%ld", static_cast<long>(done), static_cast<long>(total));
      std::fflush(stdout);
    }
  };
  const auto start = std::chrono::steady_clock::now();
  auto model = LoadCausalLM(dir, mopts);
  if (!model.ok()) {
    if (tty) std::printf("\n");
    Fail(model.status());
  }
  std::printf("%steacher: loaded %ld weight tensors in %.1f s\n", tty ? "\r\033[K" : "", static_cast<long>(*loaded),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  std::fflush(stdout);
  TuneGemmsOrWarn(**model);
  return std::move(model).value();
}

// Ranks 1..N-1 of a tensor-parallel teacher: load the shard, then compute
// whatever rank 0 broadcasts until it shuts down.
int RunFollower(const ModelDir& dir, const ModelOptions& mopts) {
  std::unique_ptr<CausalLM> model = LoadModelOrDie(dir, mopts);
  std::printf("teacher rank %d: shard loaded; following rank 0\n", mopts.tp->rank());
  std::fflush(stdout);
  absl::Status st = RunTpFollower(*model);
  if (!st.ok()) Fail(st);
  return 0;
}

int Main() {
  const std::string model_path = absl::GetFlag(FLAGS_model_dir);
  if (model_path.empty()) Fail(absl::InvalidArgumentError("--model_dir is required"));
  if (absl::GetFlag(FLAGS_data).empty()) Fail(absl::InvalidArgumentError("--data is required"));
  if (absl::GetFlag(FLAGS_threads) > 0) at::set_num_threads(absl::GetFlag(FLAGS_threads));

  auto dir = ModelDir::Open(model_path);
  if (!dir.ok()) Fail(dir.status());
  const ModelConfig& cfg = (*dir)->config();
  std::printf("teacher: model %s (%s, L=%ld, H=%ld, vocab=%ld)\n", model_path.c_str(), cfg.architecture_name.c_str(),
              static_cast<long>(cfg.num_hidden_layers), static_cast<long>(cfg.hidden_size),
              static_cast<long>(cfg.vocab_size));

  ModelOptions mopts = ModelOptionsFromFlags();
  std::printf("teacher: backend %s on %s\n", BackendName(mopts.device).c_str(), mopts.device.str().c_str());
  if (mopts.tp && mopts.tp->rank() != 0) return RunFollower(**dir, mopts);
  // The model first: under tensor parallelism the followers are waiting in
  // the group, and the leader's heartbeats (from TpLeader) must start
  // before the data is read, which can take minutes.
  absl::StatusOr<std::unique_ptr<CausalLM>> model = LoadModelOrDie(**dir, mopts);
  std::printf("teacher: forward: %s\n", (*model)->Techniques().c_str());
  if (mopts.tp) {
    auto leader = std::make_unique<TpLeader>(std::move(model).value());
    g_tp_leader = leader.get();
    *model = std::move(leader);
  }

  auto tokenizer = Tokenizer::FromFile(model_path + "/tokenizer.json");
  if (!tokenizer.ok()) Fail(tokenizer.status());
  ChatTemplateOptions topts;
  topts.file = absl::GetFlag(FLAGS_chat_template);
  topts.name = absl::GetFlag(FLAGS_chat_template_name);
  topts.train_reasoning = absl::GetFlag(FLAGS_train_reasoning);
  auto kwargs = ParseTemplateKwargs(absl::GetFlag(FLAGS_chat_template_kwargs));
  if (!kwargs.ok()) Fail(kwargs.status());
  topts.kwargs = *std::move(kwargs);
  auto tmpl = ChatTemplate::Load(model_path, topts);
  if (!tmpl.ok()) Fail(tmpl.status());
  DatasetOptions dopts;
  dopts.path = absl::GetFlag(FLAGS_data);
  if (absl::GetFlag(FLAGS_regenerate)) dopts.path = RegenerateOrDie(model->get(), **tokenizer, *tmpl, model_path, mopts.tp != nullptr);
  dopts.skip_malformed = absl::GetFlag(FLAGS_skip_malformed);
  dopts.max_length = absl::GetFlag(FLAGS_max_seq_len);
  dopts.train_on_all_tokens = absl::GetFlag(FLAGS_train_on_all_tokens);
  dopts.max_samples = absl::GetFlag(FLAGS_max_samples);
  dopts.vocab_size = cfg.vocab_size;
  auto dataset = Dataset::Load(dopts, **tokenizer, *tmpl);
  if (!dataset.ok()) Fail(dataset.status());
  std::printf("teacher: data %s (template %s)\n", (*dataset)->Summary().c_str(), tmpl->origin().c_str());
  for (const auto& e : (*dataset)->stats().first_errors) std::printf("teacher:   skipped: %s\n", e.c_str());

  VocabMap vocab;
  if (!absl::GetFlag(FLAGS_vocab_map).empty()) {
    auto loaded = LoadVocabMap(absl::GetFlag(FLAGS_vocab_map));
    if (!loaded.ok()) Fail(loaded.status());
    vocab = std::move(loaded).value();
    if (vocab.target_vocab_size != cfg.vocab_size) {
      Fail(absl::InvalidArgumentError(absl::StrCat(absl::GetFlag(FLAGS_vocab_map), ": target vocab ",
                                                   vocab.target_vocab_size, " but the model has ", cfg.vocab_size)));
    }
  } else {
    auto built = CalibrateVocabMap((*dataset)->samples(), cfg.vocab_size,
                                   std::min(absl::GetFlag(FLAGS_draft_vocab_size), cfg.vocab_size));
    if (!built.ok()) Fail(built.status());
    vocab = std::move(built).value();
  }
  auto coverage = ComputeCoverage(vocab, (*dataset)->samples());
  // Sharding comes after calibration, so every teacher of a sharded set
  // serves the same draft vocab (students check that they agree).
  const int num_shards = absl::GetFlag(FLAGS_num_data_shards), shard = absl::GetFlag(FLAGS_data_shard);
  if (num_shards < 1 || shard < 0 || shard >= num_shards) {
    Fail(absl::InvalidArgumentError(absl::StrCat("--data_shard=", shard, " is outside [0, --num_data_shards=",
                                                 num_shards, ")")));
  }
  if (num_shards > 1) {
    std::vector<Sample> mine;
    for (const Sample& smp : (*dataset)->samples()) {
      if (smp.id % num_shards == shard) mine.push_back(smp);
    }
    *dataset = Dataset::FromSamples(std::move(mine), absl::StrCat((*dataset)->source(), " shard ", shard, "/", num_shards));
    std::printf("teacher: serving data shard %d of %d: %ld samples\n", shard, num_shards,
                static_cast<long>((*dataset)->size()));
  }
  std::printf("teacher: draft vocab %ld of %ld, covers %.1f%% of trained tokens\n",
              static_cast<long>(vocab.draft_vocab_size()), static_cast<long>(cfg.vocab_size),
              coverage.ok() ? 100.0 * coverage->fraction() : 0.0);
  if (!absl::GetFlag(FLAGS_vocab_map_out).empty()) {
    auto s = SaveVocabMap(vocab, absl::GetFlag(FLAGS_vocab_map_out));
    if (!s.ok()) Fail(s);
  }


  EngineOptions eopts;
  eopts.tokens_per_batch = absl::GetFlag(FLAGS_tokens_per_batch);
  eopts.epochs = absl::GetFlag(FLAGS_epochs);
  eopts.seed = absl::GetFlag(FLAGS_seed);
  eopts.max_credit_window = absl::GetFlag(FLAGS_max_credit_window);
  eopts.subscriber_timeout = absl::Seconds(absl::GetFlag(FLAGS_subscriber_timeout_s));
  eopts.ledger_path = absl::GetFlag(FLAGS_ledger);
  if (absl::GetFlag(FLAGS_transports).empty()) {
    eopts.transports = DefaultTransports(mopts.device.is_cuda());
  } else {
    auto transports = ParseTransportList(absl::GetFlag(FLAGS_transports));
    if (!transports.ok()) Fail(transports.status());
    eopts.transports = *transports;
  }
  if (absl::GetFlag(FLAGS_aux_layer_ids).empty()) {
    eopts.aux_layer_ids = cfg.DefaultAuxLayerIds();
  } else {
    for (const auto& piece : std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_aux_layer_ids), ','))) {
      int32_t id;
      if (!absl::SimpleAtoi(piece, &id)) {
        Fail(absl::InvalidArgumentError(absl::StrCat("--aux_layer_ids: \"", piece, "\" is not an integer")));
      }
      eopts.aux_layer_ids.push_back(id);
    }
  }
  RemoveStaleShm(eopts.shm_prefix);
  // One forward at a time, in arrival order: the engine, the eval set's
  // generation and Generate calls share the model (serialized_model.h).
  SerializedCausalLM serialized(model->get());
  auto engine = Engine::Create(&serialized, dataset->get(), eopts);
  if (!engine.ok()) Fail(engine.status());
  std::unique_ptr<EvalSet> eval_set = StartEvalSet(&serialized, **tokenizer, *tmpl, eopts, mopts.tp != nullptr);

  TeacherMetrics metrics;
  ServiceOptions sopts;
  sopts.backend = BackendName(model->get()->options().device);
  sopts.hostname = HostName();
  auto service = TeacherServiceImpl::Create(engine->get(), &serialized, &vocab, dataset->get(), &metrics, sopts);
  if (!service.ok()) Fail(service.status());
  (*service)->SetEvalSet(eval_set.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &bound_port);
  builder.RegisterService(service->get());
  builder.SetMaxSendMessageSize(512 << 20);
  builder.SetMaxReceiveMessageSize(64 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    Fail(absl::UnavailableError(absl::StrCat("cannot listen on ", absl::GetFlag(FLAGS_listen), " (in use?)")));
  }
  server->GetHealthCheckService()->SetServingStatus(true);

  std::unique_ptr<MetricsServer> metrics_server;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    auto ms = MetricsServer::Start(metrics.registry(), absl::GetFlag(FLAGS_metrics_host), absl::GetFlag(FLAGS_metrics_port));
    if (!ms.ok()) Fail(ms.status());
    metrics_server = std::move(ms).value();
  }
  std::string host = absl::GetFlag(FLAGS_listen);
  host = host.substr(0, host.rfind(':'));
  std::printf("teacher: serving on %s:%d (metrics on :%d), %ld batches/epoch for one rank\n", host.c_str(), bound_port,
              metrics_server ? metrics_server->port() : -1, static_cast<long>((*engine)->batches_per_epoch(1)));
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    std::string tmp = absl::GetFlag(FLAGS_port_file) + ".tmp";
    std::ofstream(tmp) << bound_port << "\n";
    std::rename(tmp.c_str(), absl::GetFlag(FLAGS_port_file).c_str());
  }

  auto last_print = std::chrono::steady_clock::now();
  int64_t last_tokens = 0;
  while (g_signal == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EngineStats st = (*engine)->stats();
    metrics.Update(st);
    auto now = std::chrono::steady_clock::now();
    double dt = std::chrono::duration<double>(now - last_print).count();
    if (dt >= 10) {
      std::printf("teacher: %ld batches, %ld tokens (%.0f tok/s), %ld buffered, %d streams\n",
                  static_cast<long>(st.batches_computed), static_cast<long>(st.tokens_computed),
                  (st.tokens_computed - last_tokens) / dt, static_cast<long>(st.buffered_batches),
                  (*service)->open_streams());
      std::fflush(stdout);
      last_print = now;
      last_tokens = st.tokens_computed;
    }
    if (absl::GetFlag(FLAGS_exit_when_done) && (*engine)->ledger_report().epochs >= eopts.epochs) {
      std::printf("teacher: every rank committed every epoch; exiting\n");
      break;
    }
  }
  if (g_signal != 0) std::printf("teacher: signal %d: draining\n", g_signal.load());
  server->GetHealthCheckService()->SetServingStatus(false);
  (*engine)->Drain();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  LedgerReport report = (*engine)->ledger_report();
  std::printf("teacher: ledger %s\n", report.ToJson().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace e3

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Serves a base model's hidden states to EAGLE-3 student trainers.");
  absl::ParseCommandLine(argc, argv);
  struct sigaction sa {};
  sa.sa_handler = [](int sig) { e3::g_signal = sig; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  return e3::Main();
}
