#include "common/run_config.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace e3 {
namespace {

const char kRun[] = R"(
model:
  dir: /models/Llama-3.1-8B-Instruct
data:
  train: train.jsonl
  max_seq_len: 4096
  seed: 7
template:
  kwargs: enable_thinking=false
draft:
  vocab_size: 32000
  aux_layer_ids: [1, 15, 28]
  init_seed: 3
schedule:
  tokens_per_batch: 8192
  lr: 2e-4
  credit_window: 6
teachers:
  devices: [0, 1, 2, 3]
  tp: 2
  args: ["--backend=sgl", "--gemm_tuning"]
students:
  devices: 4,5,6,7
)";

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// `yaml` read as run.yaml; a failure fails the test.
RunConfig Parsed(const std::string& yaml) {
  auto c = ParseRunConfig(yaml, "run.yaml");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.value_or(RunConfig());
}

TEST(RunConfigTest, ReadsEverySectionIntoTheStruct) {
  auto c = ParseRunConfig(kRun, "run.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.dir, "/models/Llama-3.1-8B-Instruct");
  EXPECT_EQ(c->data.train, "train.jsonl");
  EXPECT_EQ(c->data.max_seq_len, 4096);
  EXPECT_EQ(c->data.seed, 7u);
  EXPECT_EQ(c->chat_template.kwargs, "enable_thinking=false");
  EXPECT_EQ(c->draft.aux_layer_ids, (std::vector<int64_t>{1, 15, 28}));
  EXPECT_EQ(c->schedule.tokens_per_batch, 8192);
  EXPECT_DOUBLE_EQ(c->schedule.lr, 2e-4);
  EXPECT_EQ(c->teachers.devices, (std::vector<std::string>{"0", "1", "2", "3"}));
  EXPECT_EQ(c->teachers.tp, 2);
  EXPECT_EQ(c->students.devices, (std::vector<std::string>{"4", "5", "6", "7"}));
  // Keys the file leaves out keep their defaults and are not "given".
  EXPECT_EQ(c->draft.ttt_length, 7);
  EXPECT_EQ(c->given.count("draft.ttt_length"), 0u);
  EXPECT_EQ(c->given.at("schedule.lr"), "2e-4");
}

TEST(RunConfigTest, EachServiceGetsItsOwnFlagsFromTheSameKeys) {
  auto c = ParseRunConfig(kRun, "run.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  auto teacher = ServiceFlags(*c, ServiceRole::kTeacher);
  auto student = ServiceFlags(*c, ServiceRole::kStudent);
  ASSERT_TRUE(teacher.ok() && student.ok());
  auto find = [](const std::vector<ServiceFlag>& flags, const std::string& name) -> std::string {
    for (const ServiceFlag& f : flags) {
      if (f.flag == name) return f.value;
    }
    return "<absent>";
  };
  EXPECT_EQ(find(*teacher, "model_dir"), "/models/Llama-3.1-8B-Instruct");
  EXPECT_EQ(find(*teacher, "data_seed"), "7");
  EXPECT_EQ(find(*teacher, "aux_layer_ids"), "1,15,28");
  EXPECT_EQ(find(*teacher, "tokens_per_batch"), "8192");
  EXPECT_EQ(find(*teacher, "tp_size"), "2");
  EXPECT_EQ(find(*teacher, "backend"), "sgl");  // from teachers.args
  EXPECT_EQ(find(*teacher, "gemm_tuning"), "true");
  EXPECT_EQ(find(*teacher, "lr"), "<absent>");
  EXPECT_EQ(find(*student, "lr"), "2e-4");
  EXPECT_EQ(find(*student, "init_seed"), "3");
  EXPECT_EQ(find(*student, "model_dir"), "<absent>");
  // One key, one value, both services: the credit window cannot disagree.
  EXPECT_EQ(find(*teacher, "credit_window"), "6");
  EXPECT_EQ(find(*student, "credit_window"), "6");
}

TEST(RunConfigTest, ErrorsNameTheFileTheKeyAndWhatWasExpected) {
  struct Case {
    std::string yaml, error;
  };
  const Case cases[] = {
      {"teachers:\n  tp: x\n", "run.yaml: teachers.tp: expected a positive integer, got \"x\""},
      {"teachers:\n  tp: 0\n", "run.yaml: teachers.tp: expected a positive integer, got \"0\""},
      {"schedule:\n  lr: fast\n",
       "run.yaml: schedule.lr: expected a non-negative number, got \"fast\""},
      {"schedule:\n  min_lr_ratio: 1.5\n",
       "run.yaml: schedule.min_lr_ratio: expected a number in [0, 1]"},
      {"schedule:\n  lrr: 1\n",
       "run.yaml: schedule.lrr: unknown key (schedule has: tokens_per_batch, lr,"},
      {"optimizer:\n  lr: 1\n",
       "run.yaml: optimizer: unknown section (sections: model, data, template,"},
      {"draft:\n  kernels: turbo\n",
       "run.yaml: draft.kernels: expected fast or reference, got \"turbo\""},
      {"draft:\n  dtype: int8\n", "run.yaml: draft.dtype: expected float32, bfloat16 or float16"},
      {"data:\n  regenerate: maybe\n",
       "run.yaml: data.regenerate: expected true or false, got \"maybe\""},
      {"draft:\n  aux_layer_ids: [1, -2]\n",
       "run.yaml: draft.aux_layer_ids: expected a list of non-negative"},
      {"schedule:\n  lr: [1, 2]\n",
       "run.yaml: schedule.lr: expected a non-negative number, got [1, 2]"},
      {"model: /models/x\n", "run.yaml: model: expected a map (keys: dir)"},
      {"teachers:\n  tp: 4\n  ep: 3\n", "run.yaml: teachers.ep: 3 does not divide teachers.tp (4)"},
      {"teachers:\n  devices: [0, 1, 2]\n  tp: 2\n",
       "run.yaml: teachers.devices: 3 devices do not divide"},
      {"model:\n  dir: [unclosed\n", "run.yaml:"},
      {"schedule:\n  lr: 1e-3\n  max_steps: 5\n  lr: 2e-3\n",
       "run.yaml:4: schedule.lr: given twice (first on line 2)"},
      {"schedule:\n  lr: 1e-3\ndata:\n  epochs: 2\nschedule:\n  max_steps: 5\n",
       "run.yaml:5: schedule: given twice (first on line 1)"},
      {"teachers:\n  devices: [0, 1]\n  metrics_port: 65535\n",
       "run.yaml: teachers.metrics_port: 65535 + 2 teacher group(s) - 1 = 65536 is past the last "
       "port (65535)"},
      {"students:\n  devices: [cpu]\n  metrics_port: -2\n",
       "run.yaml: students.metrics_port: expected a port (student rank r serves /metrics on it + "
       "r;"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseRunConfig(c.yaml, "run.yaml");
    ASSERT_FALSE(parsed.ok()) << c.yaml;
    EXPECT_EQ(Message(parsed.status()).find(c.error), 0u)
        << Message(parsed.status()) << "\nexpected: " << c.error;
  }
}

TEST(RunConfigTest, DottedOverridesReplaceOrAddKeys) {
  auto c =
      ParseRunConfig(kRun, "run.yaml",
                     {"schedule.lr=5e-5", "teachers.devices=[0, 1]", "students.devices=cpu,cpu",
                      "schedule.max_steps=100", "template.kwargs=\"a=1,b=2\""});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->schedule.lr, 5e-5);
  EXPECT_EQ(c->teachers.devices, (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(c->students.devices, (std::vector<std::string>{"cpu", "cpu"}));
  EXPECT_EQ(c->schedule.max_steps, 100);
  EXPECT_EQ(c->chat_template.kwargs, "a=1,b=2");

  auto bad = ParseRunConfig(kRun, "run.yaml", {"schedule.lr=abc"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(Message(bad.status()),
            "override 'schedule.lr=abc': schedule.lr: expected a non-negative number, got \"abc\"");
  auto no_value = ParseRunConfig(kRun, "run.yaml", {"schedule.lr"});
  ASSERT_FALSE(no_value.ok());
  EXPECT_NE(Message(no_value.status()).find("expected section.key=value"), std::string::npos);
  // An override that breaks a rule between keys is caught like the file.
  auto uneven = ParseRunConfig(kRun, "run.yaml", {"teachers.devices=0,1,2"});
  ASSERT_FALSE(uneven.ok());
  EXPECT_NE(Message(uneven.status()).find("teachers.devices: 3 devices"), std::string::npos);
}

TEST(RunConfigTest, TheResolvedYamlReadsBackToTheSameKeys) {
  auto c = ParseRunConfig(kRun, "run.yaml", {"schedule.lr=5e-5"});
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string yaml = RunConfigToYaml(*c);
  auto back = ParseRunConfig(yaml, "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  EXPECT_EQ(back->given, c->given) << yaml;
  EXPECT_EQ(back->teachers.args, c->teachers.args);
}

TEST(RunConfigTest, TheShippedExamplesAreValid) {
  for (const char* name : {"demo.yaml", "llama-3.1-8b-1node.yaml", "qwen3-30b-a3b-ep.yaml"}) {
    auto c = LoadRunConfig(std::string(E3_SOURCE_DIR) + "/examples/configs/" + name);
    EXPECT_TRUE(c.ok()) << name << ": " << c.status();
  }
  auto missing = LoadRunConfig("/nonexistent/run.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(Message(missing.status()).find("/nonexistent/run.yaml"), std::string::npos);
}

// What a failed checkpoint does is set in the run file like any other
// schedule key, and reaches only the student.
TEST(RunConfigTest, CheckpointFailurePoliciesMapToTheStudentsFlags) {
  const RunConfig c = Parsed(
      "schedule:\n  keep_checkpoints: 3\n  on_checkpoint_save_error: continue\n"
      "  on_checkpoint_load_error: start_fresh\n");
  auto student = ServiceFlags(c, ServiceRole::kStudent);
  auto teacher = ServiceFlags(c, ServiceRole::kTeacher);
  ASSERT_TRUE(student.ok() && teacher.ok());
  std::map<std::string, std::string> flags;
  for (const ServiceFlag& f : *student) flags[f.flag] = f.value;
  EXPECT_EQ(flags["keep_checkpoints"], "3");
  EXPECT_EQ(flags["on_checkpoint_save_error"], "continue");
  EXPECT_EQ(flags["on_checkpoint_load_error"], "start_fresh");
  for (const ServiceFlag& f : *teacher) EXPECT_EQ(f.flag.find("checkpoint"), std::string::npos) << f.flag;

  auto bad = ParseRunConfig("schedule:\n  on_checkpoint_save_error: retry\n", "run.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(Message(bad.status()).find("run.yaml: schedule.on_checkpoint_save_error: expected stop or continue"),
            std::string::npos)
      << bad.status();
  auto one = ParseRunConfig("schedule:\n  keep_checkpoints: 1\n", "run.yaml");
  ASSERT_FALSE(one.ok());
  EXPECT_NE(Message(one.status()).find("schedule.keep_checkpoints: expected an integer >= 2"), std::string::npos)
      << one.status();
}

TEST(RunConfigTest, MetricsPortsAreTheLaunchersAlone) {
  const RunConfig c = Parsed(
      "teachers:\n  devices: [0, 1]\n  metrics_port: 9400\n"
      "students:\n  devices: [2, 3]\n  metrics_port: -1\n");
  EXPECT_EQ(c.teachers.metrics_port, 9400);
  EXPECT_EQ(c.students.metrics_port, -1);
  // A service reading the file alone does not take a base port for its
  // own: which offset is its own only the launcher knows.
  for (ServiceRole role : {ServiceRole::kTeacher, ServiceRole::kStudent}) {
    auto flags = ServiceFlags(c, role);
    ASSERT_TRUE(flags.ok()) << flags.status();
    for (const ServiceFlag& f : *flags) EXPECT_NE(f.flag, "metrics_port") << f.key;
  }
}

TEST(RunConfigTest, EveryKeyMapsToAFlagOrTheLauncher) {
  int teacher = 0, student = 0;
  for (const RunConfigKey& k : RunConfigKeys()) {
    EXPECT_FALSE(k.expected.empty()) << k.path;
    teacher += !k.teacher_flag.empty();
    student += !k.student_flag.empty();
  }
  EXPECT_GT(teacher, 15);
  EXPECT_GT(student, 15);
}

}  // namespace
}  // namespace e3
