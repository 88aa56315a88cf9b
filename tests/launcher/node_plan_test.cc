#include "common/config/config_file.h"
#include "launcher/node_plan.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_join.h"
#include "launcher/memory_estimate.h"

namespace e3 {
namespace {

const std::string kSrc = E3_SOURCE_DIR;

RunConfig Config(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"model.dir=" + kSrc + "/examples/tiny-code-llama",
                                  "data.train=train.jsonl", "run.out=/tmp/run"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  auto c = ParseRunConfig("", "run.yaml", all);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.value_or(RunConfig());
}

bool HasArg(const PlannedProcess& p, const std::string& arg) {
  for (const std::string& a : p.args) {
    if (a == arg) return true;
  }
  return false;
}

TEST(NodePlanTest, TeachersAreCutIntoTpGroupsAndStudentsAreRanks) {
  auto plan = PlanNode(Config({"teachers.devices=0,1,2,3", "teachers.tp=2", "teachers.ep=2",
                               "students.devices=4,5,6", "run.master_port=29500"}),
                       "/b", "ab12");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->teachers, 2);
  std::vector<std::string> names;
  for (const PlannedProcess& p : plan->processes) names.push_back(p.name + "@" + p.device);
  // Each group's follower before its rank 0: the group's store waits for rank 0.
  EXPECT_EQ(absl::StrJoin(names, " "),
            "teacher-0-rank1@cuda:1 teacher-0@cuda:0 teacher-1-rank1@cuda:3 teacher-1@cuda:2 "
            "student-0@cuda:4 student-1@cuda:5 student-2@cuda:6");
  const PlannedProcess& t1 = plan->processes[3];
  EXPECT_EQ(t1.binary, "/b/teacher_server/teacher_server");
  for (const char* arg : {"--config=/tmp/run/run.yaml", "--num_data_shards=2", "--data_shard=1",
                          "--tp_size=2", "--ep_size=2", "--tp_rank=0", "--master_addr=127.0.0.1",
                          "--rendezvous_file=/tmp/run/rendezvous/teacher-1.ab12",
                          "--auth_token_file=/tmp/run/auth_token", "--metrics_port=0",
                          "--port_file=/tmp/run/teacher-1.port", "--exit_when_done"}) {
    EXPECT_TRUE(HasArg(t1, arg)) << arg << " not in " << absl::StrJoin(t1.args, " ");
  }
  // Followers serve no /metrics.
  EXPECT_EQ(plan->processes[2].metrics_port, -1);
  EXPECT_FALSE(HasArg(plan->processes[2], "--metrics_port=0"));
  const PlannedProcess& s2 = plan->processes[6];
  EXPECT_EQ(s2.binary, "/b/student_trainer/student_trainer");
  for (const char* arg :
       {"--step_log=/tmp/run/steps.jsonl", "--summary_json=/tmp/run/summary-2.json",
        "--rendezvous_file=/tmp/run/rendezvous/students.ab12",
        "--auth_token_file=/tmp/run/auth_token"}) {
    EXPECT_TRUE(HasArg(s2, arg)) << arg << " not in " << absl::StrJoin(s2.args, " ");
  }
  // No c10d store port: the group meets through its file.
  std::vector<std::string> env;
  for (const auto& [k, v] : s2.env) env.push_back(k + "=" + v);
  EXPECT_EQ(absl::StrJoin(env, " "), "RANK=2 WORLD_SIZE=3 LOCAL_RANK=2 MASTER_ADDR=127.0.0.1");
  for (const PlannedProcess& p : plan->processes) {
    for (const std::string& a : p.args)
      EXPECT_EQ(a.rfind("--master_port", 0), std::string::npos) << p.name;
  }
  EXPECT_EQ(plan->port_files,
            (std::vector<std::string>{"/tmp/run/teacher-0.port", "/tmp/run/teacher-1.port"}));
}

TEST(NodePlanTest, WhatTheLauncherNeedsIsNamed) {
  auto no_devices = PlanNode(Config({"teachers.devices=cpu"}), "/b", "ab12");
  ASSERT_FALSE(no_devices.ok());
  EXPECT_EQ(no_devices.status().message(), "run.yaml: students.devices: required to launch a run");
  auto bad_device =
      PlanNode(Config({"teachers.devices=gpu0", "students.devices=cpu"}), "/b", "ab12");
  ASSERT_FALSE(bad_device.ok());
  EXPECT_EQ(bad_device.status().message(),
            "run.yaml: teachers.devices: expected a GPU index, cuda:N or cpu, got \"gpu0\"");
  auto no_model = ParseRunConfig("", "run.yaml", {"teachers.devices=cpu", "students.devices=cpu"});
  ASSERT_TRUE(no_model.ok());
  EXPECT_EQ(PlanNode(*no_model, "/b", "ab12").status().message(),
            "run.yaml: model.dir: required to launch a run");
}

TEST(NodePlanTest, ThePlanShowsLayoutPortsAndMemory) {
  auto plan = PlanNode(Config({"teachers.devices=cpu", "students.devices=cpu,cpu",
                               "schedule.tokens_per_batch=1024"}),
                       "/b", "ab12");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->model.has_value()) << plan->model_error;
  const std::string text = DescribePlan(*plan);
  for (const char* needle :
       {"LlamaForCausalLM, L=8, H=256, vocab 8192", "1 x TP=1 EP=1",
        "2 data-parallel rank(s); batch 1024 tokens per rank, 2048 per step",
        "teacher-0        cpu      gRPC port picked at start -> /tmp/run/teacher-0.port; metrics "
        "port picked at start;",
        "student-1        cpu      RANK=1 WORLD_SIZE=2; metrics port picked at start; c10d "
        "rendezvous through /tmp/run/rendezvous/students.ab12 (nothing listens); log "
        "/tmp/run/student-1.log",
        "a fresh shared token per launch in /tmp/run/auth_token (mode 0600)", "memory per device",
        "cpu      student-1        ~"}) {
    EXPECT_NE(text.find(needle), std::string::npos) << needle << "\nin:\n" << text;
  }
}

TEST(NodePlanTest, WithoutAReadableModelThePlanSaysWhy) {
  RunConfig c =
      Config({"model.dir=/nonexistent/model", "teachers.devices=0", "students.devices=1"});
  auto plan = PlanNode(c, "/b", "ab12");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->model.has_value());
  EXPECT_NE(DescribePlan(*plan).find("(no estimate: "), std::string::npos);
}

TEST(NodePlanTest, FlagsTheLauncherSetsAreRefusedInArgsAllAtOnce) {
  auto plan = PlanNode(
      Config({"teachers.devices=cpu", "students.devices=cpu",
              "teachers.args=--tp_master_port=29600 --max_credit_window=8 --noexit_when_done "
              "--backend=hf",
              "students.args=--lr=1e-3 --metrics_port=9500 --subscriber_id=me"}),
      "/b", "ab12");
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(),
            "run.yaml: teachers.args: --tp_master_port (an old spelling of --master_port) is "
            "set by e3_launch; its c10d groups meet through a fresh file under run.out/rendezvous "
            "(nothing listens)\n"
            "run.yaml: teachers.args: --noexit_when_done is set by e3_launch; its teachers exit "
            "once every student rank has committed its data\n"
            "run.yaml: students.args: --metrics_port is set by e3_launch; use "
            "students.metrics_port\n"
            "run.yaml: students.args: --subscriber_id is set by e3_launch; rank r subscribes as "
            "rank-<r>, the id its checkpoints resume under");
}

TEST(NodePlanTest, FixedMetricsPortsFollowTheGroupAndTheRank) {
  auto plan = PlanNode(Config({"teachers.devices=cpu,cpu", "teachers.metrics_port=9400",
                               "students.devices=cpu,cpu,cpu", "students.metrics_port=9500"}),
                       "/b", "ab12");
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> ports;
  for (const PlannedProcess& p : plan->processes)
    ports.push_back(p.name + ":" + std::to_string(p.metrics_port));
  EXPECT_EQ(absl::StrJoin(ports, " "),
            "teacher-0:9400 teacher-1:9401 student-0:9500 student-1:9501 student-2:9502");
  EXPECT_TRUE(HasArg(plan->processes[1], "--metrics_port=9401"));
  EXPECT_TRUE(HasArg(plan->processes[4], "--metrics_port=9502"));
  const std::string text = DescribePlan(*plan);
  EXPECT_NE(text.find("-> /tmp/run/teacher-1.port; metrics :9401; log"), std::string::npos) << text;
  EXPECT_NE(text.find("RANK=2 WORLD_SIZE=3; metrics :9502;"), std::string::npos) << text;

  auto none = PlanNode(Config({"teachers.devices=cpu", "teachers.metrics_port=-1",
                               "students.devices=cpu", "students.metrics_port=-1"}),
                       "/b", "ab12");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(HasArg(none->processes[1], "--metrics_port=-1"));
  EXPECT_NE(DescribePlan(*none).find("RANK=0 WORLD_SIZE=1; no metrics; log"), std::string::npos);
}

TEST(NodePlanTest, AMasterPortIsNotedAsUnused) {
  auto plan =
      PlanNode(Config({"teachers.devices=cpu", "students.devices=cpu", "run.master_port=29500"}),
               "/b", "ab12");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(DescribePlan(*plan).find("  notes\n    run.yaml: run.master_port is unused: the c10d "
                                     "groups meet through files under /tmp/run/rendezvous"),
            std::string::npos)
      << DescribePlan(*plan);
}

// Llama-3.1-8B's dimensions.
ModelConfig Llama8B() {
  auto m = ParseModelConfig(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072, "tie_word_embeddings": false})",
                            "llama-8b/config.json");
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

TEST(MemoryEstimateTest, CountsTheModelAsItsCheckpointHasIt) {
  const ModelConfig m = Llama8B();
  // 8.03 B: the published count of Llama-3.1-8B.
  EXPECT_NEAR(TargetParameters(m) / 1e9, 8.03, 0.01);
  RunConfig run;
  run.schedule.tokens_per_batch = 8192;
  run.teachers.tp = 2;
  const MemoryEstimate t = TeacherRankMemory(m, run, /*gpu=*/true, /*students=*/4);
  EXPECT_NEAR(t.weights / 1e9, 8.03, 0.02);  // bf16 halves, TP=2 halves again
  EXPECT_GT(t.buffers, 0);
  const MemoryEstimate s = StudentRankMemory(m, run, /*gpu=*/true);
  // The draft: fc 50.3M (3H x H), q/k/v over 2H 50.3M, o 16.8M, the MLP
  // 176.2M and the head over 32000 draft tokens 131.1M.
  EXPECT_NEAR(DraftParameters(m, run) / 1e6, 424.67, 0.01);
  // bf16 working weights + fp32 masters + two fp32 moments + bf16 grads.
  EXPECT_NEAR(s.optimizer / DraftParameters(m, run), 14.0, 1e-9);
  EXPECT_GT(s.activations, 5e9);  // 7 TTT steps of 8192 tokens
  // EAGLE-3.1 adds one norm per captured layer.
  run.draft.algorithm = "eagle3.1";
  EXPECT_NEAR(DraftParameters(m, run) - 424.67e6, 3 * 4096, 0.01e6);
  EXPECT_EQ(FormatBytes(12.34e9), "12.3 GB");
  EXPECT_EQ(FormatBytes(850e6), "850 MB");
}

TEST(MemoryEstimateTest, ADFlashDraftIsCountedAsItsExportHoldsIt) {
  const ModelConfig m = Llama8B();
  RunConfig run;
  run.draft.algorithm = "dflash";
  run.schedule.tokens_per_batch = 4096;
  // 5 layers of q/o 33.55M, k/v 8.39M, MLP 176.16M (+ norms), fc over 5
  // captured layers 83.89M: 1174.4M, no head of its own.
  EXPECT_NEAR(DraftParameters(m, run) / 1e6, 1174.4, 0.1);
  const MemoryEstimate s = StudentRankMemory(m, run, /*gpu=*/true);
  // The target's whole head beside its embedding, both bf16.
  EXPECT_NEAR(s.weights - DraftParameters(m, run) * 2, 2 * 128256.0 * 4096 * 2, 1e6);
  // 512 blocks of 16 through 5 layers dominate.
  EXPECT_GT(s.activations, 5.0 * 8192 * (12 * 4096 + 3 * 14336) * 2);
  EXPECT_LT(s.activations, 20e9);
}

}  // namespace
}  // namespace e3
