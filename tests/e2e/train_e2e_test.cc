// End to end on loopback: a real teacher_server process serves the bundled
// tiny-code-llama; a real student_trainer process trains a draft until the
// teacher's data ends. The loss falls, acc_0 rises, /metrics answers while
// training, the export reloads, and the teacher's ledger shows every sample
// committed exactly once. A second run does the same against a small random
// DeepSeek-V3 teacher (MLA, DeepSeekMoE).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <ostream>
#include <regex>

#include <random>

#include "common/base/file_util.h"
#include "common/model/dtype.h"
#include "common/model/safetensors.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "student_trainer/draft/draft_export.h"
#include "tests/e2e/subprocess.h"
#include "tests/e2e/training_run.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;

const std::string kSrc = E3_SOURCE_DIR;
constexpr int kMaxSamples = 80;

TEST(TrainE2eTest, StudentLearnsFromALiveTeacherAndExports) {
  const std::string dir = testing::ScratchDir("train_e2e");
  const int samples = testing::TrainingSamples(kMaxSamples);
  Subprocess teacher(testing::TrainingTeacherArgv(dir, kSrc + "/examples/tiny-code-llama", samples),
                     dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 60s)) << teacher.Log();
  Subprocess student(testing::TrainingStudentArgv(dir, testing::ReadPortFile(dir + "/port")), dir + "/student.log");

  // Scrape the student's /metrics while it trains.
  std::smatch m;
  std::string log;
  for (int i = 0; i < 600 && !std::regex_search(log, m, std::regex("metrics on :(\\d+)")); ++i) {
    std::this_thread::sleep_for(100ms);
    log = student.Log();
  }
  ASSERT_TRUE(m.size() == 2) << log;
  const int metrics_port = std::stoi(m[1]);
  bool scraped = false;
  for (int i = 0; i < 600 && !scraped; ++i) {
    httplib::Client c("127.0.0.1", metrics_port);
    c.set_connection_timeout(2);
    c.set_read_timeout(2);
    auto res = c.Get("/metrics");
    if (res && res->status == 200 && res->body.find("e3_student_steps_total{rank=\"0\"} ") != std::string::npos &&
        res->body.find("e3_student_steps_total{rank=\"0\"} 0") == std::string::npos) {
      EXPECT_NE(res->body.find("e3_student_acc{rank=\"0\",step=\"6\"}"), std::string::npos);
      EXPECT_NE(res->body.find("e3_student_data_wait_seconds_total"), std::string::npos);
      scraped = true;
    }
    if (!scraped) std::this_thread::sleep_for(200ms);
  }
  EXPECT_TRUE(scraped) << "no step counted on /metrics";
  ASSERT_NO_FATAL_FAILURE(testing::ExpectTrainingRunEnds(student, teacher, 240s));

  auto summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  const int64_t steps = summary["steps"].get<int64_t>();
  const double first_loss = summary["first"]["loss"], last_loss = summary["last"]["loss"];
  const double first_acc0 = summary["first"]["acc"][0], last_acc0 = summary["last"]["acc"][0];
  std::printf("e2e: %ld steps, loss %.3f -> %.3f, acc_0 %.3f -> %.3f, tau %.3f -> %.3f\n", static_cast<long>(steps),
              first_loss, last_loss, first_acc0, last_acc0, summary["first"]["simulated_tau"].get<double>(),
              summary["last"]["simulated_tau"].get<double>());
  EXPECT_GE(steps, samples * 3 / 8);  // seen: 40 steps from 80 samples
  if (!testing::kUnderThreadSanitizer) {
    EXPECT_LT(last_loss, first_loss);
    EXPECT_GT(last_acc0, first_acc0);
  }

  // The export reloads with the names, shapes and dtypes serving engines read.
  auto cfg = ReadDraftConfig(dir + "/export/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->draft_vocab_size, 512);
  EXPECT_EQ(cfg->aux_layer_ids, (std::vector<int32_t>{1, 3, 4}));
  auto weights = SafetensorsFile::Open(dir + "/export/model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ((*weights)->Get("fc.weight")->shape, (std::vector<int64_t>{256, 768}));
  EXPECT_EQ((*weights)->Get("midlayer.self_attn.q_proj.weight")->shape, (std::vector<int64_t>{256, 512}));
  EXPECT_EQ((*weights)->Get("lm_head.weight")->dtype, DType::kBF16);
  EXPECT_EQ((*weights)->Get("d2t")->dtype, DType::kI64);
  EXPECT_EQ((*weights)->Get("t2d")->shape, (std::vector<int64_t>{8192}));
  EXPECT_FALSE((*weights)->Contains("embed_tokens.weight"));

  // Every sample of the epoch was committed exactly once.
  testing::ExpectEverySampleCommittedOnce(teacher.Log());
  EXPECT_NE(teacher.Log().find("\"epochs\":1"), std::string::npos) << teacher.Log();
}

// n values drawn from N(0, std^2), as the bytes of a bf16 or fp32 tensor.
std::vector<uint8_t> RandomBytes(DType dtype, int64_t n, float std, std::mt19937& rng) {
  EXPECT_TRUE(dtype == DType::kBF16 || dtype == DType::kF32);
  std::normal_distribution<float> normal(0.0f, std);
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const float x = normal(rng);
    uint8_t bytes[4];
    if (dtype == DType::kBF16) {
      const uint16_t bits = FloatToBf16(x);
      std::memcpy(bytes, &bits, 2);
    } else {
      std::memcpy(bytes, &x, 4);
    }
    out.insert(out.end(), bytes, bytes + (dtype == DType::kBF16 ? 2 : 4));
  }
  return out;
}

// A model directory a teacher can serve on chat data, from a golden random
// model (tests/fixtures/golden/<fixture>: 4 layers, its own dtypes, FP8 and
// MXFP4 included) with tiny-code-llama's tokenizer and chat template and
// its vocabulary grown to that tokenizer's 8192: new embedding rows
// N(0, 0.08) as the rest, and a new lm_head N(0, 1). The fixture's head
// (N(0, 0.08) over hidden 64-96) gives logits of std ~0.7, nearly flat
// distributions whose soft CE is their entropy, which varies more between
// batches than training moves it; a sharper head gives the draft a target
// it visibly learns.
std::string GoldenTeacherDir(const std::string& fixture, const std::string& out) {
  const std::string golden = kSrc + "/tests/fixtures/golden/" + fixture;
  const std::string tiny = kSrc + "/examples/tiny-code-llama";
  const std::string dir = JoinPath(out, fixture);
  EXPECT_TRUE(MakeDirs(dir).ok());
  constexpr int64_t kVocab = 8192;
  nlohmann::json config = nlohmann::json::parse(ReadFile(JoinPath(golden, "config.json")));
  const nlohmann::json tiny_config = nlohmann::json::parse(ReadFile(JoinPath(tiny, "config.json")));
  config["vocab_size"] = kVocab;
  config["bos_token_id"] = tiny_config.at("bos_token_id");
  config["eos_token_id"] = tiny_config.at("eos_token_id");
  std::ofstream(JoinPath(dir, "config.json")) << config.dump(2) << "\n";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    std::ofstream(JoinPath(dir, f), std::ios::binary) << ReadFile(JoinPath(tiny, f));
  }
  auto file = SafetensorsFile::Open(JoinPath(golden, "model.safetensors"));
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return dir;
  std::mt19937 rng(11);
  std::vector<TensorToWrite> tensors;
  for (const std::string& name : (*file)->Names()) {
    const TensorView view = *(*file)->Get(name);
    TensorToWrite t{name, view.dtype, view.shape, {view.data, view.data + view.nbytes}};
    if (name == "model.embed_tokens.weight") {
      const std::vector<uint8_t> grown = RandomBytes(view.dtype, (kVocab - view.shape[0]) * view.shape[1], 0.08f, rng);
      t.data.insert(t.data.end(), grown.begin(), grown.end());
      t.shape[0] = kVocab;
    } else if (name == "lm_head.weight") {
      t.data = RandomBytes(view.dtype, kVocab * view.shape[1], 1.0f, rng);
      t.shape[0] = kVocab;
    }
    tensors.push_back(std::move(t));
  }
  const absl::Status st = WriteSafetensors(JoinPath(dir, "model.safetensors"), tensors, {{"format", "pt"}});
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

struct RandomTeacher {
  std::string fixture, architecture;
  int64_t hidden_size;
};
void PrintTo(const RandomTeacher& t, std::ostream* os) { *os << t.fixture; }

class RandomTeacherTrainE2eTest : public ::testing::TestWithParam<RandomTeacher> {};

// A draft trains against a small random model of each new architecture
// (DeepSeek-V3 with group-limited sigmoid routing, V2-Lite, V3 from FP8
// block-scaled weights, GPT-OSS from MXFP4 experts with its sinks, biases
// and a window of 8 under 256-token samples), served by a real teacher on
// loopback; aux ids given out of the default's order, so the export's ids
// are the ones the draft asked for and not a formula's.
TEST_P(RandomTeacherTrainE2eTest, StudentLearnsAndExportsTheTargetsShape) {
  const RandomTeacher& p = GetParam();
  const std::string dir = testing::ScratchDir("train_e2e_" + p.fixture);
  const std::string model_dir = GoldenTeacherDir(p.fixture, dir);
  // Three times the Llama run's samples: a random teacher's distributions
  // are flat and a short run's 5-step windows are noisy.
  const int samples = testing::TrainingSamples(3 * kMaxSamples);
  std::vector<std::string> teacher_argv = testing::TrainingTeacherArgv(dir, model_dir, samples);
  teacher_argv.push_back("--aux_layer_ids=2,0,1");
  Subprocess teacher(teacher_argv, dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 60s)) << teacher.Log();
  std::vector<std::string> student_argv = testing::TrainingStudentArgv(dir, testing::ReadPortFile(dir + "/port"));
  student_argv.push_back("--aux_layer_ids=2,0,1");  // the draft asks for them
  Subprocess student(student_argv, dir + "/student.log");
  ASSERT_NO_FATAL_FAILURE(testing::ExpectTrainingRunEnds(student, teacher, 240s));
  EXPECT_NE(teacher.Log().find(p.architecture), std::string::npos) << teacher.Log();

  auto summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  const double first_loss = summary["first"]["loss"], last_loss = summary["last"]["loss"];
  std::printf("%s e2e: %ld steps, loss %.3f -> %.3f, acc_0 %.3f -> %.3f\n", p.fixture.c_str(),
              static_cast<long>(summary["steps"].get<int64_t>()), first_loss, last_loss,
              summary["first"]["acc"][0].get<double>(), summary["last"]["acc"][0].get<double>());
  EXPECT_GE(summary["steps"].get<int64_t>(), samples * 5 / 12);  // seen: 120 steps from 240 samples
  if (!testing::kUnderThreadSanitizer) {
    EXPECT_LT(last_loss, 0.6 * first_loss);  // seen: 0.13-0.38 of the first window's
  }

  auto cfg = ReadDraftConfig(dir + "/export/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->target_hidden_size, p.hidden_size);
  EXPECT_EQ(cfg->aux_layer_ids, (std::vector<int32_t>{2, 0, 1}));
  auto weights = SafetensorsFile::Open(dir + "/export/model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ((*weights)->Get("fc.weight")->shape, (std::vector<int64_t>{p.hidden_size, 3 * p.hidden_size}));
  EXPECT_EQ((*weights)->Get("t2d")->shape, (std::vector<int64_t>{8192}));
  testing::ExpectEverySampleCommittedOnce(teacher.Log());
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, RandomTeacherTrainE2eTest,
    ::testing::Values(RandomTeacher{"rand_deepseek_v3", "DeepseekV3ForCausalLM", 64},
                      RandomTeacher{"rand_deepseek_v2_lite", "DeepseekV2ForCausalLM", 64},
                      RandomTeacher{"rand_deepseek_v3_fp8", "DeepseekV3ForCausalLM", 64},
                      RandomTeacher{"rand_gpt_oss_mxfp4", "GptOssForCausalLM", 96}),
    [](const ::testing::TestParamInfo<RandomTeacher>& info) { return info.param.fixture; });

}  // namespace
}  // namespace e3
