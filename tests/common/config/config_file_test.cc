// The run config as YAML: every section read into its struct, dotted
// overrides, errors that name the file, line, key and what was expected,
// and the resolved file every process of a launch reads back as the same.
#include "common/config/config_file.h"

#include <gtest/gtest.h>

#include <string>

#include "common/base/file_util.h"
#include "tests/source_path.h"

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

TEST(ConfigFileTest, ReadsEverySectionIntoItsStruct) {
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
  EXPECT_EQ(c->teachers.args, (std::vector<std::string>{"--backend=sgl", "--gemm_tuning"}));
  EXPECT_EQ(c->students.devices, (std::vector<std::string>{"4", "5", "6", "7"}));
  // Keys the file leaves out keep their defaults and are not "given".
  EXPECT_EQ(c->draft.ttt_length, 7);
  EXPECT_EQ(c->given.count("draft.ttt_length"), 0u);
  EXPECT_EQ(c->given.at("schedule.lr"), "0.0002");
}

TEST(ConfigFileTest, ErrorsNameTheFileTheKeyAndWhatWasExpected) {
  struct Case {
    std::string yaml, error;
  };
  const Case cases[] = {
      {"teachers:\n  tp: x\n", "run.yaml: teachers.tp: expected an integer in [1, 1024], got \"x\""},
      {"schedule:\n  lr: fast\n", "run.yaml: schedule.lr: expected a non-negative number, got \"fast\""},
      {"schedule:\n  min_lr_ratio: 1.5\n", "run.yaml: schedule.min_lr_ratio: expected a number in [0, 1]"},
      {"schedule:\n  adam_beta2: 1\n", "run.yaml: schedule.adam_beta2: expected a number in [0, 1)"},
      {"schedule:\n  lrr: 1\n", "run.yaml: schedule.lrr: unknown key (schedule has: tokens_per_batch, lr,"},
      {"optimizer:\n  lr: 1\n", "run.yaml: optimizer: unknown section (sections: model, data, template,"},
      {"draft:\n  kernels: turbo\n", "run.yaml: draft.kernels: expected fast or reference, got \"turbo\""},
      {"draft:\n  ttt_loss: mse\n", "run.yaml: draft.ttt_loss: expected soft_ce, lk_alpha or lk_lambda"},
      {"draft:\n  dtype: int8\n", "run.yaml: draft.dtype: expected float32, bfloat16 or float16"},
      {"data:\n  regenerate: maybe\n", "run.yaml: data.regenerate: expected true or false, got \"maybe\""},
      {"draft:\n  aux_layer_ids: [1, -2]\n", "run.yaml: draft.aux_layer_ids: expected a list of non-negative"},
      {"schedule:\n  lr: [1, 2]\n", "run.yaml: schedule.lr: expected a non-negative number, got [1, 2]"},
      {"teachers:\n  listen: \"127.0.0.1:99999\"\n", "run.yaml: teachers.listen: expected host:port"},
      {"students:\n  metrics_port: 70000\n",
       "run.yaml: students.metrics_port: expected a port in [-1, 65535] (-1: none, 0: a free one)"},
      {"model: /models/x\n", "run.yaml: model: expected a map (keys: dir)"},
      {"teachers:\n  tp: 4\n  ep: 3\n", "run.yaml: teachers.ep: 3 does not divide teachers.tp (4)"},
      {"teachers:\n  devices: [0, 1, 2]\n  tp: 2\n", "run.yaml: teachers.devices: 3 devices do not divide"},
      {"teachers:\n  devices: [0, 1]\n  metrics_port: 65535\n",
       "run.yaml: teachers.metrics_port: 65535 + 2 teacher group(s) - 1 = 65536 is past the last port (65535)"},
      {"model:\n  dir: [unclosed\n", "run.yaml:"},
      {"schedule:\n  lr: 1e-3\n  max_steps: 5\n  lr: 2e-3\n",
       "run.yaml:4: schedule.lr: given twice (first on line 2)"},
      {"schedule:\n  lr: 1e-3\ndata:\n  epochs: 2\nschedule:\n  max_steps: 5\n",
       "run.yaml:5: schedule: given twice (first on line 1)"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseRunConfig(c.yaml, "run.yaml");
    ASSERT_FALSE(parsed.ok()) << c.yaml;
    EXPECT_EQ(Message(parsed.status()).find(c.error), 0u) << Message(parsed.status()) << "\nexpected: " << c.error;
  }
}

TEST(ConfigFileTest, DottedOverridesReplaceOrAddKeys) {
  auto c = ParseRunConfig(kRun, "run.yaml",
                          {"schedule.lr=3e-4", "teachers.devices=[0,1]", "students.devices=2,3",
                           "draft.dtype=float32", "template.kwargs=\"a=1,b=2\""});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->schedule.lr, 3e-4);
  EXPECT_EQ(c->teachers.devices, (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(c->students.devices, (std::vector<std::string>{"2", "3"}));
  EXPECT_EQ(c->draft.dtype, "float32");
  EXPECT_EQ(c->chat_template.kwargs, "a=1,b=2");
  auto bad = ParseRunConfig("", "run.yaml", {"schedule.lr"});
  EXPECT_NE(Message(bad.status()).find("override 'schedule.lr': expected section.key=value"), std::string::npos);
  bad = ParseRunConfig("", "run.yaml", {"schedule.nope=1"});
  EXPECT_NE(Message(bad.status()).find("override 'schedule.nope=1': schedule.nope: unknown key"), std::string::npos);
}

TEST(ConfigFileTest, TheResolvedYamlReadsBackAsTheSameConfig) {
  auto c = ParseRunConfig(kRun, "run.yaml", {"schedule.max_steps=12"});
  ASSERT_TRUE(c.ok()) << c.status();
  auto back = ParseRunConfig(RunConfigToYaml(*c), "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << RunConfigToYaml(*c);
  for (const Setting& s : AllSettings()) {
    EXPECT_EQ(ValueText(s, s.get(*back)), ValueText(s, s.get(*c))) << s.path;
  }
}

TEST(ConfigFileTest, TheShippedExamplesAreValid) {
  for (const char* name : {"demo.yaml", "llama-3.1-8b-1node.yaml", "qwen3-30b-a3b-ep.yaml"}) {
    auto c = LoadRunConfig(testing::SourcePath(std::string("examples/configs/") + name));
    EXPECT_TRUE(c.ok()) << name << ": " << c.status();
  }
}

}  // namespace
}  // namespace e3
