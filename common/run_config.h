// A whole training job in one YAML file: the model, the data and its chat
// template, the draft, the schedule, and where the teachers (devices, TP,
// EP) and the students (devices) run. The launcher (launcher/e3_launch)
// starts a node from it, and both services read the same file
// (--config), so the teacher's and the student's settings cannot
// disagree. examples/configs/ holds complete files.
//
// Each key maps to at most one flag of each service (RunConfigKeys()); a
// key the file leaves out leaves that service at its own default. Values
// are checked against the key's kind as the file is read, and an error
// names the file and the key path, e.g.
//   run.yaml: teachers.tp: expected a positive integer, got "x"
#ifndef E3_COMMON_RUN_CONFIG_H_
#define E3_COMMON_RUN_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace e3 {

struct RunConfig {
  std::string source;  // the file (or "<overrides>"), for messages

  struct Model {
    std::string dir;  // a Hugging Face model directory
  } model;
  struct Data {
    std::string train;  // chat jsonl (teacher --data)
    std::string eval_prompts;
    int64_t eval_samples = 0;
    int64_t eval_max_new_tokens = 256;
    int64_t max_seq_len = 2048;
    int64_t max_samples = 0;
    int64_t max_line_bytes = int64_t{8} << 20;
    int64_t epochs = 1;
    uint64_t seed = 42;  // the sample order (teacher --data_seed)
    bool train_on_all_tokens = false;
    bool skip_malformed = true;
    bool regenerate = false;
  } data;
  struct Template {
    std::string file;  // empty: the model directory's template
    std::string name = "default";
    std::string kwargs;
    bool train_reasoning = true;
  } chat_template;  // key `template`
  struct Draft {
    int64_t vocab_size = 32000;
    std::string vocab_map;
    std::string init_from;  // a draft export to warm-start from
    std::vector<int64_t> aux_layer_ids;  // empty: [1, L/2-1, L-4]
    int64_t ttt_length = 7;
    std::string ttt_positions = "advancing";
    std::string ttt_loss = "soft_ce";  // or lk_alpha, lk_lambda (student_trainer/ttt.h)
    double kl_scale = 1.0, kl_decay = 1.0;
    int64_t intermediate_size = 0;  // 0: the target's
    uint64_t init_seed = 0;
    std::string kernels = "fast";
    std::string dtype;  // empty: bfloat16 on a GPU, float32 on the CPU
    std::string export_dtype = "bfloat16";
  } draft;
  struct Schedule {
    int64_t tokens_per_batch = 4096;  // one student rank's batch
    double lr = 1e-4;
    double min_lr_ratio = 0.5;
    double warmup_ratio = 0.02;
    int64_t warmup_steps = -1;
    double weight_decay = 0.0;
    double adam_beta1 = 0.9;
    double adam_beta2 = 0.999;
    double grad_clip = 0.5;
    int64_t max_steps = 0;
    int64_t checkpoint_every = 100;
    int64_t keep_checkpoints = 2;
    std::string on_checkpoint_save_error = "stop";     // or continue
    std::string on_checkpoint_load_error = "stop";     // or start_fresh
    int64_t log_every = 10;
    int64_t eval_every = 0;
    int64_t eval_chain = 7;
    int64_t early_stop_patience = 0;
    int64_t credit_window = 4;
  } schedule;
  struct Teachers {
    std::vector<std::string> devices;  // GPU indices or `cpu`
    int64_t tp = 1;
    int64_t ep = 1;
    std::string backend = "auto";
    std::string dtype;  // empty: bfloat16 on a GPU, float32 on the CPU
    int64_t threads = 0;
    std::vector<std::string> args;  // further teacher_server flags
    // The launcher's: teacher group i's rank 0 serves /metrics on this + i
    // (0: a free port, -1: none).
    int64_t metrics_port = 0;
  } teachers;
  struct Students {
    std::vector<std::string> devices;
    int64_t threads = 0;
    std::vector<std::string> args;  // further student_trainer flags
    int64_t metrics_port = 0;       // the launcher's: rank r on this + r (0: free, -1: none)
  } students;
  struct Run {
    std::string out = "run";  // logs, checkpoints, the draft, the plot
    // Unused: the launcher's c10d groups meet through files under `out`
    // (nothing listens). Still read, so that older configs load.
    int64_t master_port = 29500;
  } run;

  // The keys the file and the overrides set, by dotted path, with their
  // values as flag text (lists joined by commas). Only these reach the
  // services.
  std::map<std::string, std::string> given;
};

enum class ServiceRole { kTeacher, kStudent };

struct RunConfigKey {
  std::string path;          // e.g. "schedule.lr"
  std::string expected;      // e.g. "a positive integer"
  std::string teacher_flag;  // empty: not a teacher_server flag
  std::string student_flag;  // empty: not a student_trainer flag
};

// Every key the file may hold, in the order the sections are documented.
const std::vector<RunConfigKey>& RunConfigKeys();

// Reads `path`, then applies `overrides` ("schedule.lr=2e-4", the value
// read as YAML: `teachers.devices=[0,1]` or `teachers.devices=0,1`).
absl::StatusOr<RunConfig> LoadRunConfig(const std::string& path,
                                        const std::vector<std::string>& overrides = {});
// The same from text; `source` names it in errors.
absl::StatusOr<RunConfig> ParseRunConfig(const std::string& yaml, const std::string& source,
                                         const std::vector<std::string>& overrides = {});

// One flag setting a service takes from the config.
struct ServiceFlag {
  std::string key;    // the key path it comes from, for messages
  std::string flag;   // the flag's name, without dashes
  std::string value;  // as flag text
};

// The flags `role` takes from `config`: its given keys in key order, then
// its section's `args` ("--name=value", "--name" or "--noname").
absl::StatusOr<std::vector<ServiceFlag>> ServiceFlags(const RunConfig& config, ServiceRole role);

// The given keys as YAML (what a resolved config file holds): reading it
// back gives the same `given`.
std::string RunConfigToYaml(const RunConfig& config);

}  // namespace e3

#endif  // E3_COMMON_RUN_CONFIG_H_
