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

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "common/base/launch_env.h"
#include "common/base/status_macros.h"
#include "common/config/command_line.h"
#include "common/model/draft_aux_layers.h"
#include "common/model/model_dir.h"
#include "common/transport/shm_segment.h"
#include "common/transport/transport.h"
#include "teacher_server/data/data_setup.h"
#include "teacher_server/engine/engine.h"
#include "teacher_server/engine/stream_fingerprint.h"
#include "teacher_server/models/causal_lm.h"
#include "teacher_server/runtime/model_runtime.h"
#include "teacher_server/runtime/serialized_model.h"
#include "teacher_server/runtime/tp_control.h"
#include "teacher_server/service/serve.h"
#include "teacher_server/service/teacher_metrics.h"
#include "teacher_server/service/teacher_service.h"

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

absl::StatusOr<ModelRuntimeOptions> RuntimeOptionsFromConfig(const RunConfig& c) {
  ModelRuntimeOptions r;
  r.device = c.teachers.device;
  r.backend = c.teachers.backend;
  r.dtype = c.teachers.dtype;
  r.gemm_tuning = c.teachers.gemm_tuning;
  r.gemm_tuning_cache = c.teachers.gemm_tuning_cache;
  if (r.gemm_tuning_cache == "default") r.gemm_tuning_cache = DefaultGemmTuningCachePath(ProcessEnv());
  r.gemm_tuning_rows = c.schedule.tokens_per_batch;
  r.max_cuda_graphs = static_cast<int>(c.teachers.max_cuda_graphs);
  r.graph_min_host_share = c.teachers.graph_min_host_share;
  r.graph_token_step = c.teachers.graph_token_step;
  r.tp_overlap_min_tokens = c.teachers.tp_overlap_min_tokens;
  r.ep_size = static_cast<int>(c.teachers.ep);
  LaunchFlags launch;
  launch.world_size = std::max(1, static_cast<int>(c.teachers.tp));
  launch.rank = static_cast<int>(c.teachers.tp_rank);
  launch.rank_flag = "tp_rank";
  launch.master_addr = c.teachers.master_addr;
  launch.master_port = static_cast<int>(c.teachers.master_port);
  launch.default_master_port = 29600;
  launch.rendezvous_file = c.teachers.rendezvous_file;
  // One process is no group: torchrun's variables, if any, are another's.
  if (launch.world_size == 1) return r;
  E3_ASSIGN_OR_RETURN(r.launch, ResolveLaunchEnv(launch, ProcessEnv()));
  return r;
}

absl::StatusOr<TeacherDataOptions> DataOptionsFromConfig(const RunConfig& c) {
  TeacherDataOptions d;
  d.model_dir = c.model.dir;
  d.data = c.data.train;
  d.chat_template.file = c.chat_template.file;
  d.chat_template.name = c.chat_template.name;
  d.chat_template.train_reasoning = c.chat_template.train_reasoning;
  E3_ASSIGN_OR_RETURN(d.chat_template.kwargs, ParseTemplateKwargs(c.chat_template.kwargs));
  d.skip_malformed = c.data.skip_malformed;
  d.max_seq_len = c.data.max_seq_len;
  d.train_on_all_tokens = c.data.train_on_all_tokens;
  d.max_samples = c.data.max_samples;
  d.max_line_bytes = c.data.max_line_bytes;
  d.regenerate = c.data.regenerate;
  d.regen.generation.max_new_tokens = c.data.regen_max_new_tokens;
  d.regen.generation.max_sequences = c.data.regen_batch_sequences;
  d.regen.generation.kv_cache_bytes =
      static_cast<int64_t>(c.data.regen_kv_cache_gib * static_cast<double>(int64_t{1} << 30));
  d.regen.generation.temperature = c.data.regen_temperature;
  d.regen.generation.seed = c.data.seed;
  d.regen.cache_path = c.data.regen_cache;
  d.draft_vocab_size = c.draft.vocab_size;
  d.vocab_map = c.draft.vocab_map;
  const std::string init_from = c.draft.init_from;
  if (!init_from.empty()) {
    if (!d.vocab_map.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--init_from=", init_from, " and --vocab_map=", d.vocab_map,
          " both name the draft vocab; a warm start serves its draft's own, so give one"));
    }
    d.vocab_map = JoinPath(init_from, "model.safetensors");
  }
  d.vocab_map_out = c.draft.vocab_map_out;
  d.num_data_shards = static_cast<int>(c.teachers.num_data_shards);
  d.data_shard = static_cast<int>(c.teachers.data_shard);
  d.eval_prompts = c.data.eval_prompts;
  d.eval_max_new_tokens = c.data.eval_max_new_tokens;
  d.eval_samples = c.data.eval_samples;
  return d;
}

absl::StatusOr<EngineOptions> EngineOptionsFromConfig(const RunConfig& c, bool cuda) {
  EngineOptions e;
  e.tokens_per_batch = c.schedule.tokens_per_batch;
  e.epochs = c.data.epochs;
  e.seed = c.data.seed;
  e.max_credit_window = static_cast<int>(c.teachers.credit_window);
  e.subscriber_timeout = absl::Seconds(c.teachers.subscriber_timeout_s);
  e.ledger_path = c.teachers.ledger;
  e.student_world_size = static_cast<int>(c.teachers.student_world_size);
  if (c.teachers.transports.empty()) {
    e.transports = DefaultTransports(cuda);
  } else {
    E3_ASSIGN_OR_RETURN(e.transports, ParseTransportList(c.teachers.transports));
  }
  for (int64_t id : c.draft.aux_layer_ids) e.aux_layer_ids.push_back(static_cast<int32_t>(id));
  const std::string init_from = c.draft.init_from;
  if (e.aux_layer_ids.empty() && !init_from.empty()) {
    E3_ASSIGN_OR_RETURN(e.aux_layer_ids, ReadDraftAuxLayerIds(JoinPath(init_from, "config.json")));
  }
  return e;
}

absl::StatusOr<TeacherServerOptions> OptionsFromConfig(const RunConfig& c) {
  TeacherServerOptions o;
  E3_ASSIGN_OR_RETURN(o.runtime, RuntimeOptionsFromConfig(c));
  E3_ASSIGN_OR_RETURN(o.data, DataOptionsFromConfig(c));
  E3_RETURN_IF_ERROR(ValidateTeacherDataOptions(o.data, o.runtime.launch.world_size > 1));
  E3_ASSIGN_OR_RETURN(o.engine, EngineOptionsFromConfig(c, absl::StartsWith(o.runtime.device, "cuda")));
  o.serve.listen = c.teachers.listen;
  o.serve.port_file = c.teachers.port_file;
  o.serve.metrics_host = c.teachers.metrics_host;
  o.serve.metrics_port = static_cast<int>(c.teachers.metrics_port);
  o.serve.exit_when_done = c.teachers.exit_when_done;
  o.serve.drain_timeout_s = c.teachers.drain_timeout_s;
  o.serve.exit_grace_s = c.teachers.exit_grace_s;
  o.serve.epochs = o.engine.epochs;
  o.serve.messages.max_receive_bytes = c.teachers.max_receive_message_bytes;
  o.serve.messages.max_send_bytes = c.teachers.max_send_message_bytes;
  o.max_generate_new_tokens = c.teachers.max_generate_new_tokens;
  o.max_generate_prompt_tokens = c.teachers.max_generate_prompt_tokens;
  PeerAuthOptions auth;
  auth.tls_cert = c.teachers.tls_cert;
  auth.tls_key = c.teachers.tls_key;
  auth.tls_ca = c.teachers.tls_ca;
  auth.auth_token_file = c.teachers.auth_token_file;
  E3_ASSIGN_OR_RETURN(PeerAuth peer_auth, PeerAuth::ForServer(auth));
  o.serve.auth = std::make_shared<const PeerAuth>(std::move(peer_auth));
  o.threads = static_cast<int>(c.teachers.threads);
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

constexpr char kSummary[] =
    "Serves a base model's hidden states to draft student trainers.\n"
    "  teacher_server [--config=run.yaml] [--flag=value ...]: flags override the run config's keys";

int Main(int argc, char** argv) {
  absl::StatusOr<CommandLine> command_line = ReadCommandLine(argc, argv, kTeacher);
  if (!command_line.ok()) {
    std::fprintf(stderr, "teacher_server: error: %s\n", std::string(command_line.status().message()).c_str());
    return 2;
  }
  if (command_line->help) {
    std::printf("%s", Usage(kTeacher, kSummary).c_str());
    return 0;
  }
  for (const std::string& w : command_line->warnings) std::fprintf(stderr, "teacher_server: warning: %s\n", w.c_str());
  if (!command_line->config_path.empty()) {
    std::printf("teacher: config %s: %d settings (%d overridden on the command line)\n",
                command_line->config_path.c_str(), command_line->from_file, command_line->overridden);
  }
  absl::StatusOr<TeacherServerOptions> options = OptionsFromConfig(command_line->config);
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
  return e3::Main(argc, argv);
}
