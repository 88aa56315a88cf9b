// teacher_server: serves a Hugging Face model's hidden states to EAGLE-3
// student trainers over gRPC (see README.md and DESIGN.md).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/draft_aux_layers.h"
#include "common/file_util.h"
#include "common/launch_env.h"
#include "common/model_dir.h"
#include "common/rpc/listen_address.h"
#include "common/run_config.h"
#include "common/service_flags.h"
#include "common/shm_segment.h"
#include "common/status_macros.h"
#include "common/transport.h"
#include "teacher_server/causal_lm.h"
#include "teacher_server/data_setup.h"
#include "teacher_server/engine.h"
#include "teacher_server/model_runtime.h"
#include "teacher_server/parallel/tp_control.h"
#include "teacher_server/serialized_model.h"
#include "teacher_server/serve.h"
#include "teacher_server/stream_fingerprint.h"
#include "teacher_server/teacher_metrics.h"
#include "teacher_server/teacher_service.h"

ABSL_FLAG(std::string, config, "",
          "run config (YAML, examples/configs/): sets the flags its keys map to; flags given explicitly on the "
          "command line override the file");
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
ABSL_FLAG(int64_t, tokens_per_batch, e3::RunConfig().schedule.tokens_per_batch, "token budget of one rank's batch");
ABSL_FLAG(int64_t, max_seq_len, 2048, "samples are cut to this many tokens");
ABSL_FLAG(uint64_t, data_seed, e3::RunConfig().data.seed,
          "seed of the sample order (and of --regenerate's sampled draws)");
ABSL_FLAG(uint64_t, seed, 42, "deprecated: use --data_seed");
ABSL_FLAG(int64_t, epochs, 1, "passes over the data");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address (port 0 picks one)");
ABSL_FLAG(std::string, port_file, "", "write the bound gRPC port here once serving");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve gRPC over TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA: mutual TLS, students must present a certificate this CA signed (needs --tls_cert)");
ABSL_FLAG(std::string, auth_token_file, "",
          "a file whose first line is a shared token every call must carry (students: the same flag); calls "
          "without it are refused UNAUTHENTICATED");
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
ABSL_FLAG(int64_t, draft_vocab_size, e3::RunConfig().draft.vocab_size,
          "draft vocabulary size (capped at the model's vocab)");
ABSL_FLAG(std::string, vocab_map, "", "load d2t/t2d from this file instead of calibrating on the data");
ABSL_FLAG(std::string, init_from, "",
          "a student's warm start (student_trainer --init_from): serve the draft vocab of this draft export (its "
          "model.safetensors) and, unless --aux_layer_ids is given, capture the layers it was trained on");
ABSL_FLAG(std::string, vocab_map_out, "", "save the calibrated d2t/t2d here");
ABSL_FLAG(std::string, transports, "",
          "transports offered (default: nccl,cuda_ipc,shm,inline on a GPU, shm,inline on the CPU)");
ABSL_FLAG(int, credit_window, 16,
          "most batches in flight per subscriber (a student asking for more gets this many)");
ABSL_FLAG(int, max_credit_window, 16, "deprecated: use --credit_window");
ABSL_FLAG(double, subscriber_timeout_s, 60, "buffers of a vanished subscriber are reclaimed after this");
ABSL_FLAG(std::string, ledger, "",
          "append the delivery/commit ledger (JSON lines) here; the file is locked while this teacher runs");
ABSL_FLAG(int, student_world_size, 0,
          "the students' data-parallel world size: subscriptions claiming another are refused (0: the first "
          "subscription fixes it; e3_launch passes its student count)");
ABSL_FLAG(bool, skip_malformed, true, "skip and count malformed data lines (false: fail on the first)");
ABSL_FLAG(bool, train_on_all_tokens, false, "loss on every token, not only assistant turns");
ABSL_FLAG(int64_t, max_samples, 0, "use at most this many samples (0: all)");
ABSL_FLAG(int64_t, max_line_bytes, e3::kDefaultMaxLineBytes,
          "data lines longer than this many bytes are counted malformed without being read (parsing and "
          "tokenizing a line costs tens of times its size); 0: no bound");
ABSL_FLAG(bool, exit_when_done, false, "exit once every rank has committed every epoch");
ABSL_FLAG(double, exit_grace_s, 60,
          "with --exit_when_done: once every epoch is committed, how long to wait for ranks not yet handed the "
          "end of their data (the students of a teacher restarted after their last commit) before exiting");
ABSL_FLAG(double, drain_timeout_s, 20,
          "on SIGTERM, how long to keep taking the final commits of students stopped by the same signal "
          "(keep it below the scheduler's grace before SIGKILL: Slurm's KillWait)");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads (0: default)");
ABSL_FLAG(int, num_data_shards, 1,
          "split the data over this many teachers; each serves the samples whose index mod N is its shard");
ABSL_FLAG(int, tp_size, 1, "tensor-parallel ranks of this teacher (one process each; rank 0 serves gRPC)");
ABSL_FLAG(int, ep_size, 1, "expert-parallel groups of a MoE model's experts; divides --tp_size");
ABSL_FLAG(int, tp_rank, -1, "this process's tensor-parallel rank (-1: $RANK, else 0)");
ABSL_FLAG(std::string, master_addr, "",
          "tensor parallelism: rank 0's address for the c10d rendezvous (empty: $MASTER_ADDR, else 127.0.0.1)");
ABSL_FLAG(int, master_port, -1, "tensor parallelism: rank 0's c10d store port (-1: $MASTER_PORT, else 29600)");
ABSL_FLAG(std::string, rendezvous_file, "",
          "tensor parallelism: meet through a c10d FileStore at this path (a new file per launch; every rank on this "
          "machine or a filesystem they share) instead of a TCPStore at --master_addr:--master_port; nothing "
          "listens for it");
ABSL_FLAG(std::string, tp_master_addr, "", "deprecated: use --master_addr");
ABSL_FLAG(int, tp_master_port, -1, "deprecated: use --master_port");
ABSL_FLAG(std::string, eval_prompts, "",
          "acceptance eval set, jsonl in a training data format: each line's conversation up to its last user turn "
          "is a prompt; the teacher generates its greedy continuation (KV cache, in the background) and serves "
          "prompt + continuation with aux states to students (student --eval_every)");
ABSL_FLAG(int64_t, eval_max_new_tokens, 256, "tokens the teacher generates per eval prompt (stops at EOS)");
ABSL_FLAG(int64_t, eval_samples, 0, "use at most this many eval prompts (0: all)");
ABSL_FLAG(bool, regenerate, false,
          "replace each assistant turn of --data with the teacher's own continuation of the conversation so far "
          "(KV cache, batched) before training; the result is cached (--regen_cache) and reused on restart");
ABSL_FLAG(double, regen_temperature, 0.0, "--regenerate: sampling temperature (0: greedy); draws are seeded by --data_seed");
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
ABSL_FLAG(int64_t, max_receive_message_bytes, e3::MessageLimits().max_receive_bytes,
          "largest request the server accepts (students send ids and cursors)");
ABSL_FLAG(int64_t, max_send_message_bytes, e3::MessageLimits().max_send_bytes,
          "largest message the server sends (an inline batch carries its hidden states)");
ABSL_FLAG(int64_t, max_generate_new_tokens, e3::ServiceOptions().max_generate_tokens,
          "most tokens one Generate call may ask for");
ABSL_FLAG(int64_t, max_generate_prompt_tokens, e3::ServiceOptions().max_generate_prompt_tokens,
          "longest prompt one Generate call may send");

namespace e3 {
namespace {

std::atomic<int> g_signal{0};

// Everything the flags say, read once.
struct TeacherServerOptions {
  ModelRuntimeOptions runtime;
  TeacherDataOptions data;
  EngineOptions engine;  // aux_layer_ids empty: the model's default
  ServeOptions serve;
  int64_t max_generate_new_tokens = ServiceOptions().max_generate_tokens;
  int64_t max_generate_prompt_tokens = ServiceOptions().max_generate_prompt_tokens;
  int threads = 0;
};

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

absl::StatusOr<ModelRuntimeOptions> RuntimeOptionsFromFlags() {
  ModelRuntimeOptions r;
  r.device = absl::GetFlag(FLAGS_device);
  r.backend = absl::GetFlag(FLAGS_backend);
  r.dtype = absl::GetFlag(FLAGS_dtype);
  r.gemm_tuning = absl::GetFlag(FLAGS_gemm_tuning);
  r.gemm_tuning_cache = absl::GetFlag(FLAGS_gemm_tuning_cache);
  if (r.gemm_tuning_cache == "default") r.gemm_tuning_cache = DefaultGemmTuningCachePath(ProcessEnv());
  r.gemm_tuning_rows = absl::GetFlag(FLAGS_tokens_per_batch);
  r.max_cuda_graphs = absl::GetFlag(FLAGS_max_cuda_graphs);
  r.graph_min_host_share = absl::GetFlag(FLAGS_graph_min_host_share);
  r.graph_token_step = absl::GetFlag(FLAGS_graph_token_step);
  r.tp_overlap_min_tokens = absl::GetFlag(FLAGS_tp_overlap_min_tokens);
  r.ep_size = absl::GetFlag(FLAGS_ep_size);
  LaunchFlags launch;
  launch.world_size = std::max(1, absl::GetFlag(FLAGS_tp_size));
  launch.rank = absl::GetFlag(FLAGS_tp_rank);
  launch.rank_flag = "tp_rank";
  launch.master_addr = absl::GetFlag(FLAGS_master_addr);
  launch.master_port = absl::GetFlag(FLAGS_master_port);
  launch.default_master_port = 29600;
  launch.rendezvous_file = absl::GetFlag(FLAGS_rendezvous_file);
  // One process is no group: torchrun's variables, if any, are another's.
  if (launch.world_size == 1) return r;
  E3_ASSIGN_OR_RETURN(r.launch, ResolveLaunchEnv(launch, ProcessEnv()));
  return r;
}

absl::StatusOr<TeacherDataOptions> DataOptionsFromFlags() {
  TeacherDataOptions d;
  d.model_dir = absl::GetFlag(FLAGS_model_dir);
  d.data = absl::GetFlag(FLAGS_data);
  d.chat_template.file = absl::GetFlag(FLAGS_chat_template);
  d.chat_template.name = absl::GetFlag(FLAGS_chat_template_name);
  d.chat_template.train_reasoning = absl::GetFlag(FLAGS_train_reasoning);
  E3_ASSIGN_OR_RETURN(d.chat_template.kwargs, ParseTemplateKwargs(absl::GetFlag(FLAGS_chat_template_kwargs)));
  d.skip_malformed = absl::GetFlag(FLAGS_skip_malformed);
  d.max_seq_len = absl::GetFlag(FLAGS_max_seq_len);
  d.train_on_all_tokens = absl::GetFlag(FLAGS_train_on_all_tokens);
  d.max_samples = absl::GetFlag(FLAGS_max_samples);
  d.max_line_bytes = absl::GetFlag(FLAGS_max_line_bytes);
  d.regenerate = absl::GetFlag(FLAGS_regenerate);
  d.regen.generation.max_new_tokens = absl::GetFlag(FLAGS_regen_max_new_tokens);
  d.regen.generation.max_sequences = absl::GetFlag(FLAGS_regen_batch_sequences);
  d.regen.generation.kv_cache_bytes =
      static_cast<int64_t>(absl::GetFlag(FLAGS_regen_kv_cache_gib) * static_cast<double>(int64_t{1} << 30));
  d.regen.generation.temperature = absl::GetFlag(FLAGS_regen_temperature);
  d.regen.generation.seed = absl::GetFlag(FLAGS_data_seed);
  d.regen.cache_path = absl::GetFlag(FLAGS_regen_cache);
  d.draft_vocab_size = absl::GetFlag(FLAGS_draft_vocab_size);
  d.vocab_map = absl::GetFlag(FLAGS_vocab_map);
  const std::string init_from = absl::GetFlag(FLAGS_init_from);
  if (!init_from.empty()) {
    if (!d.vocab_map.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--init_from=", init_from, " and --vocab_map=", d.vocab_map,
          " both name the draft vocab; a warm start serves its draft's own, so give one"));
    }
    d.vocab_map = JoinPath(init_from, "model.safetensors");
  }
  d.vocab_map_out = absl::GetFlag(FLAGS_vocab_map_out);
  d.num_data_shards = absl::GetFlag(FLAGS_num_data_shards);
  d.data_shard = absl::GetFlag(FLAGS_data_shard);
  d.eval_prompts = absl::GetFlag(FLAGS_eval_prompts);
  d.eval_max_new_tokens = absl::GetFlag(FLAGS_eval_max_new_tokens);
  d.eval_samples = absl::GetFlag(FLAGS_eval_samples);
  return d;
}

absl::StatusOr<EngineOptions> EngineOptionsFromFlags(bool cuda) {
  EngineOptions e;
  e.tokens_per_batch = absl::GetFlag(FLAGS_tokens_per_batch);
  e.epochs = absl::GetFlag(FLAGS_epochs);
  e.seed = absl::GetFlag(FLAGS_data_seed);
  e.max_credit_window = absl::GetFlag(FLAGS_credit_window);
  e.subscriber_timeout = absl::Seconds(absl::GetFlag(FLAGS_subscriber_timeout_s));
  e.ledger_path = absl::GetFlag(FLAGS_ledger);
  e.student_world_size = absl::GetFlag(FLAGS_student_world_size);
  if (absl::GetFlag(FLAGS_transports).empty()) {
    e.transports = DefaultTransports(cuda);
  } else {
    E3_ASSIGN_OR_RETURN(e.transports, ParseTransportList(absl::GetFlag(FLAGS_transports)));
  }
  for (const auto& piece : std::vector<std::string>(
           absl::StrSplit(absl::GetFlag(FLAGS_aux_layer_ids), ',', absl::SkipWhitespace()))) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--aux_layer_ids: \"", piece, "\" is not an integer"));
    }
    e.aux_layer_ids.push_back(id);
  }
  const std::string init_from = absl::GetFlag(FLAGS_init_from);
  if (e.aux_layer_ids.empty() && !init_from.empty()) {
    E3_ASSIGN_OR_RETURN(e.aux_layer_ids, ReadDraftAuxLayerIds(JoinPath(init_from, "config.json")));
  }
  return e;
}

absl::StatusOr<TeacherServerOptions> OptionsFromFlags() {
  TeacherServerOptions o;
  E3_ASSIGN_OR_RETURN(o.runtime, RuntimeOptionsFromFlags());
  E3_ASSIGN_OR_RETURN(o.data, DataOptionsFromFlags());
  E3_RETURN_IF_ERROR(ValidateTeacherDataOptions(o.data, o.runtime.launch.world_size > 1));
  E3_ASSIGN_OR_RETURN(o.engine, EngineOptionsFromFlags(absl::StartsWith(o.runtime.device, "cuda")));
  o.serve.listen = absl::GetFlag(FLAGS_listen);
  E3_RETURN_IF_ERROR(CheckListenAddress(o.serve.listen, "--listen"));
  E3_RETURN_IF_ERROR(CheckPortFlag(absl::GetFlag(FLAGS_metrics_port), -1, "--metrics_port"));
  o.serve.port_file = absl::GetFlag(FLAGS_port_file);
  o.serve.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  o.serve.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.serve.exit_when_done = absl::GetFlag(FLAGS_exit_when_done);
  o.serve.drain_timeout_s = absl::GetFlag(FLAGS_drain_timeout_s);
  o.serve.exit_grace_s = absl::GetFlag(FLAGS_exit_grace_s);
  o.serve.epochs = o.engine.epochs;
  o.serve.messages.max_receive_bytes = absl::GetFlag(FLAGS_max_receive_message_bytes);
  o.serve.messages.max_send_bytes = absl::GetFlag(FLAGS_max_send_message_bytes);
  o.max_generate_new_tokens = absl::GetFlag(FLAGS_max_generate_new_tokens);
  o.max_generate_prompt_tokens = absl::GetFlag(FLAGS_max_generate_prompt_tokens);
  PeerAuthOptions auth;
  auth.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  auth.tls_key = absl::GetFlag(FLAGS_tls_key);
  auth.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  auth.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  E3_ASSIGN_OR_RETURN(PeerAuth peer_auth, PeerAuth::ForServer(auth));
  o.serve.auth = std::make_shared<const PeerAuth>(std::move(peer_auth));
  o.threads = absl::GetFlag(FLAGS_threads);
  return o;
}

// Rank 0's work once its model is loaded: the data, the engine (which the
// eval set's generation shares through SerializedCausalLM: one forward at
// a time, in arrival order), the service, then serving until done.
absl::Status ServeModel(const TeacherServerOptions& o, CausalLM* model) {
  E3_ASSIGN_OR_RETURN(TeacherData data, SetUpTeacherData(o.data, model));
  EngineOptions eopts = o.engine;
  if (eopts.aux_layer_ids.empty()) eopts.aux_layer_ids = model->config().DefaultAuxLayerIds();
  E3_ASSIGN_OR_RETURN(eopts.fingerprint, StreamFingerprint(o.data, data, eopts));
  std::printf("teacher: data stream fingerprint: data %s, template %s, samples %s, draft vocab %s\n",
              eopts.fingerprint.dataset.c_str(), eopts.fingerprint.chat_template.c_str(),
              eopts.fingerprint.samples.c_str(), eopts.fingerprint.draft_vocab.c_str());
  RemoveStaleShm(eopts.shm_prefix);
  SerializedCausalLM serialized(model);
  E3_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(&serialized, data.dataset.get(), eopts));
  E3_ASSIGN_OR_RETURN(std::unique_ptr<EvalSet> eval_set,
                      StartEvalSet(o.data, &serialized, data, eopts.aux_layer_ids, eopts.tokens_per_batch));
  TeacherMetrics metrics;
  ServiceOptions sopts;
  sopts.backend = ResolveBackend(o.runtime.backend, model->options().device.is_cuda());
  sopts.hostname = HostName();
  sopts.model_dir = o.data.model_dir;
  sopts.auth = o.serve.auth;
  sopts.messages = o.serve.messages;
  sopts.max_generate_tokens = o.max_generate_new_tokens;
  sopts.max_generate_prompt_tokens = o.max_generate_prompt_tokens;
  E3_ASSIGN_OR_RETURN(std::unique_ptr<TeacherServiceImpl> service,
                      TeacherServiceImpl::Create(engine.get(), &serialized, &data.vocab, data.dataset.get(),
                                                 &metrics, sopts));
  service->SetEvalSet(eval_set.get());
  return Serve(o.serve, engine.get(), service.get(), &metrics, g_signal);
}

absl::Status RunTeacher(const TeacherServerOptions& o) {
  if (o.threads > 0) at::set_num_threads(o.threads);
  E3_ASSIGN_OR_RETURN(std::unique_ptr<ModelDir> dir, ModelDir::Open(o.data.model_dir));
  const ModelConfig& cfg = dir->config();
  std::printf("teacher: model %s (%s, L=%ld, H=%ld, vocab=%ld)\n", o.data.model_dir.c_str(),
              cfg.architecture_name.c_str(), static_cast<long>(cfg.num_hidden_layers),
              static_cast<long>(cfg.hidden_size), static_cast<long>(cfg.vocab_size));
  E3_ASSIGN_OR_RETURN(ModelOptions mopts, MakeModelOptions(o.runtime));
  std::printf("teacher: backend %s on %s\n", ResolveBackend(o.runtime.backend, mopts.device.is_cuda()).c_str(),
              mopts.device.str().c_str());
  if (o.runtime.launch.world_size > 1) {
    E3_ASSIGN_OR_RETURN(mopts.tp, JoinTensorParallelGroup(o.runtime, mopts.device.is_cuda()));
    if (mopts.tp->rank() != 0) return RunFollower(*dir, mopts, o.runtime);
  }
  // The model first: under tensor parallelism the followers are waiting in
  // the group, and the leader's heartbeats (from TpLeader) must start
  // before the data is read, which can take minutes.
  E3_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model, LoadTeacherModel(*dir, mopts, o.runtime));
  std::printf("teacher: forward: %s\n", model->Techniques().c_str());
  // A leader that returns (an error included) releases its followers as
  // it is destroyed, so they do not wait out the group timeout.
  if (mopts.tp) model = std::make_unique<TpLeader>(std::move(model));
  return ServeModel(o, model.get());
}

int Main() {
  absl::StatusOr<SettledFlags> settled =
      SettleServiceFlags(absl::GetFlag(FLAGS_config), ServiceRole::kTeacher,
                         DeprecatedFlags(ServiceRole::kTeacher));
  if (!settled.ok()) {
    std::fprintf(stderr, "teacher_server: error: %s\n", std::string(settled.status().message()).c_str());
    return 2;
  }
  for (const std::string& w : settled->warnings) std::fprintf(stderr, "teacher_server: warning: %s\n", w.c_str());
  if (!absl::GetFlag(FLAGS_config).empty()) {
    std::printf("teacher: config %s: %d settings (%d overridden on the command line)\n",
                absl::GetFlag(FLAGS_config).c_str(), settled->from_config + settled->overridden,
                settled->overridden);
  }
  absl::StatusOr<TeacherServerOptions> options = OptionsFromFlags();
  absl::Status status = options.ok() ? RunTeacher(*options) : options.status();
  if (!status.ok()) {
    std::fprintf(stderr, "teacher_server: error: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace e3

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves a base model's hidden states to EAGLE-3 student trainers.\n"
      "--config=run.yaml reads the run config; flags given on the command line override it.");
  absl::ParseCommandLine(argc, argv);
  // Line by line into a log file too, so a launcher or `tail -f` sees
  // progress as it happens.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  struct sigaction sa {};
  sa.sa_handler = [](int sig) { e3::g_signal = sig; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // Past a file size limit (ulimit -f) write() then fails with EFBIG, which
  // the ledger and the caches report as they would a full disk, instead of
  // the signal killing the process without a word.
  signal(SIGXFSZ, SIG_IGN);
  return e3::Main();
}
