// teacher_server: serves a Hugging Face model's hidden states to EAGLE-3
// student trainers over gRPC (see README.md and DESIGN.md).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/config/command_line.h"
#include "common/model/model_dir.h"
#include "teacher_server/data/data_setup.h"
#include "teacher_server/engine/captured_layers.h"
#include "teacher_server/engine/engine.h"
#include "teacher_server/engine/student_groups.h"
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
  EngineOptions engine;  // aux_layer_ids: CapturedLayers, once the model is known
  ServeOptions serve;
  int64_t max_generate_new_tokens = ServiceOptions().max_generate_tokens;
  int64_t max_generate_prompt_tokens = ServiceOptions().max_generate_prompt_tokens;
  int threads = 0;
  RunConfig config;  // what CapturedLayers reads: the drafts this teacher serves
  std::vector<std::string> student_groups;
};

std::string HostName() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

absl::StatusOr<TeacherServerOptions> OptionsFromConfig(const RunConfig& c) {
  TeacherServerOptions o;
  E3_ASSIGN_OR_RETURN(o.runtime, ModelRuntimeOptions::From(c, ProcessEnv()));
  E3_ASSIGN_OR_RETURN(o.data, TeacherDataOptions::From(c));
  E3_RETURN_IF_ERROR(ValidateTeacherDataOptions(o.data, o.runtime.launch.world_size > 1));
  E3_ASSIGN_OR_RETURN(o.engine, EngineOptions::From(c, absl::StartsWith(o.runtime.device, "cuda")));
  E3_ASSIGN_OR_RETURN(o.serve, ServeOptions::From(c));
  o.max_generate_new_tokens = c.teachers.max_generate_new_tokens;
  o.max_generate_prompt_tokens = c.teachers.max_generate_prompt_tokens;
  o.threads = static_cast<int>(c.teachers.threads);
  o.config = c;
  o.student_groups = c.teachers.student_groups;
  return o;
}

// Rank 0's work once its model is loaded: the data, the engine (which the
// eval set's generation shares through SerializedCausalLM: one forward at
// a time, in arrival order), the service, then serving until done.
absl::Status ServeModel(const TeacherServerOptions& o, CausalLM* model) {
  E3_ASSIGN_OR_RETURN(TeacherData data, SetUpTeacherData(o.data, model));
  EngineOptions eopts = o.engine;
  E3_ASSIGN_OR_RETURN(eopts.aux_layer_ids, CapturedLayers(o.config, model->config()));
  std::printf("teacher: captures aux layers [%s], last hidden state and argmax; each student receives what its "
              "draft reads\n",
              absl::StrJoin(eopts.aux_layer_ids, ", ").c_str());
  E3_ASSIGN_OR_RETURN(eopts.fingerprint, StreamFingerprint(o.data, data, eopts));
  std::printf("teacher: data stream fingerprint: data %s, template %s, samples %s, draft vocab %s\n",
              eopts.fingerprint.dataset.c_str(), eopts.fingerprint.chat_template.c_str(),
              eopts.fingerprint.samples.c_str(), eopts.fingerprint.draft_vocab.c_str());
  SerializedCausalLM serialized(model);
  E3_ASSIGN_OR_RETURN(std::unique_ptr<StudentGroups> groups,
                      StudentGroups::Create(&serialized, data.dataset.get(), eopts, o.student_groups));
  if (!o.student_groups.empty()) {
    std::printf("teacher: serves the default student group and %s, each a data stream of its own\n",
                absl::StrJoin(o.student_groups, ", ").c_str());
  }
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
                      TeacherServiceImpl::Create(groups.get(), &serialized, &data.vocab, data.dataset.get(),
                                                 &metrics, sopts));
  service->SetEvalSet(eval_set.get());
  return Serve(o.serve, groups.get(), service.get(), &metrics, g_signal);
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

// --preview_data=N: the training data's first N lines as the teacher would
// train on them, from the model directory's tokenizer and template alone;
// exits 1 when a line is malformed, naming it.
int PreviewData(const RunConfig& config, int64_t lines) {
  absl::StatusOr<TeacherDataOptions> o = TeacherDataOptions::From(config);
  const absl::Status valid = o.ok() ? ValidateTeacherDataOptions(*o, /*sharded=*/false) : o.status();
  // Colours on a terminal (unless NO_COLOR is set); brackets elsewhere.
  const bool color = ::isatty(STDOUT_FILENO) == 1 && std::getenv("NO_COLOR") == nullptr;
  const absl::StatusOr<PreviewTotals> totals =
      valid.ok() ? PreviewTeacherData(*o, lines, color ? ColorMarkers() : BracketMarkers(), stdout) : valid;
  if (!totals.ok()) {
    std::fprintf(stderr, "teacher_server: error: %s\n", std::string(totals.status().message()).c_str());
    return 1;
  }
  if (totals->malformed > 0) {
    std::fprintf(stderr,
                 "teacher_server: error: %ld of the %ld line(s) previewed are malformed (\"malformed\" above "
                 "says where and what was expected); training %s\n",
                 static_cast<long>(totals->malformed), static_cast<long>(totals->lines),
                 o->skip_malformed ? "skips them (data.skip_malformed)"
                                   : "stops at the first (data.skip_malformed is false)");
    return 1;
  }
  return 0;
}

constexpr char kSummary[] =
    "Serves a base model's hidden states to draft student trainers.\n"
    "  teacher_server [--config=run.yaml] [--flag=value ...]: flags override the run config's keys\n"
    "  teacher_server [--config=run.yaml] [--flag=value ...] --preview_data=N: the first N lines of the\n"
    "      training data as the teacher trains on them, trained tokens marked; serves nothing";

int Main(int argc, char** argv) {
  const ServiceCommandLine read = ReadServiceCommandLine(argc, argv, kTeacher, "teacher_server", kSummary);
  if (!read.command_line.has_value()) return read.exit_code;
  const CommandLine* command_line = &*read.command_line;
  if (command_line->preview_data > 0) return PreviewData(command_line->config, command_line->preview_data);
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
