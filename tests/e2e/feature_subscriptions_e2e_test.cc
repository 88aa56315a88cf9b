// One teacher, two drafts at once, on loopback with the real binaries: a
// teacher_server serving the bundled tiny-code-llama to its default
// student group (an EAGLE-3 draft, layers [1, 3, 4]) and to the student
// group "dflash" (a two-layer DFlash draft, layers [1, 5]) captures the
// union [1, 3, 4, 5]. Each student asks for its own layers and tensors,
// receives only those (the student refuses a batch of another width),
// trains until the data ends with its loss falling, and exports its own
// layers; each group is a data stream of its own, every sample committed
// once in each group's ledger, and each checkpoint's cursor carries its
// student's plan. A student asking for a layer the teacher does not
// capture, or for a group it does not serve, stops before it subscribes,
// naming what is missing.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/base/file_util.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"
#include "tests/e2e/training_run.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;

const std::string kTiny = std::string(E3_SOURCE_DIR) + "/examples/tiny-code-llama";

// A student of the training runs, its files under `dir`, with `extra`.
std::vector<std::string> GroupStudent(const std::string& dir, const std::string& port,
                                      const std::vector<std::string>& extra) {
  EXPECT_TRUE(MakeDirs(dir).ok());
  std::vector<std::string> argv = testing::TrainingStudentArgv(dir, port);
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

const std::vector<std::string> kDFlashStudent = {"--student_group=dflash", "--draft_algorithm=dflash",
                                                 "--dflash_layers=2", "--dflash_block_size=4",
                                                 "--dflash_num_anchors=64"};

int ExitCodeOf(Subprocess& p, std::chrono::seconds bound) {
  auto st = p.Wait(bound);
  EXPECT_TRUE(st.has_value()) << "did not exit within " << bound.count() << " s\n" << p.Log();
  if (!st.has_value()) return -1;
  return WIFEXITED(*st) ? WEXITSTATUS(*st) : 128 + WTERMSIG(*st);
}

// The first and last loss windows of a student's summary; the loss fell.
void ExpectLossFell(const std::string& dir, const char* what) {
  auto summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  const double first = summary["first"]["loss"], last = summary["last"]["loss"];
  std::printf("%s: %ld steps, loss %.3f -> %.3f\n", what, static_cast<long>(summary["steps"].get<int64_t>()), first,
              last);
  if (!testing::kUnderThreadSanitizer) EXPECT_LT(last, first) << what;
}

// The data-stream fingerprint the newest checkpoint keeps with its cursor.
nlohmann::json CheckpointFingerprint(const std::string& ckpt) {
  std::string latest = ReadFile(ckpt + "/latest");
  while (!latest.empty() && latest.back() == '\n') latest.pop_back();
  const auto state = nlohmann::json::parse(ReadFile(ckpt + "/" + latest + "/trainer_state.json"));
  return state["cursors"][0]["fingerprint"];
}

TEST(FeatureSubscriptionsE2eTest, OneTeacherTrainsAnEagleAndADFlashDraftAtOnce) {
  const std::string dir = testing::ScratchDir("feature_subscriptions_e2e");
  std::vector<std::string> teacher_argv = testing::TrainingTeacherArgv(dir, kTiny, testing::TrainingSamples(40));
  for (const char* flag : {"--serve_algorithms=dflash", "--dflash_layers=2", "--student_groups=dflash"}) {
    teacher_argv.push_back(flag);
  }
  Subprocess teacher(teacher_argv, dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 120s)) << teacher.Log();
  const std::string port = testing::ReadPortFile(dir + "/port");
  Subprocess eagle(GroupStudent(dir + "/eagle", port, {}), dir + "/eagle.log");
  Subprocess dflash(GroupStudent(dir + "/dflash", port, kDFlashStudent), dir + "/dflash.log");
  const auto bound = std::chrono::seconds(300 * testing::kRunTimeScale);
  ASSERT_EQ(ExitCodeOf(eagle, bound), 0) << eagle.Log() << teacher.Log();
  ASSERT_EQ(ExitCodeOf(dflash, bound), 0) << dflash.Log() << teacher.Log();
  // Done once both groups committed everything.
  ASSERT_EQ(ExitCodeOf(teacher, 30s), 0) << teacher.Log();

  EXPECT_NE(teacher.Log().find("captures aux layers [1, 3, 4, 5]"), std::string::npos) << teacher.Log();
  EXPECT_NE(eagle.Log().find("reads aux layers [1, 3, 4] and aux_hidden,last_hidden,target_argmax of every batch"),
            std::string::npos)
      << eagle.Log();
  EXPECT_NE(dflash.Log().find("reads aux layers [1, 5] and aux_hidden,target_argmax of every batch (student group "
                              "dflash)"),
            std::string::npos)
      << dflash.Log();
  ExpectLossFell(dir + "/eagle", "eagle3 (default group)");
  ExpectLossFell(dir + "/dflash", "dflash (group dflash)");

  // Each export reads its own layers: fc takes 3 and 2 states of 256.
  auto eagle_cfg = nlohmann::json::parse(ReadFile(dir + "/eagle/export/config.json"));
  EXPECT_EQ(eagle_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"].get<std::vector<int32_t>>(),
            (std::vector<int32_t>{1, 3, 4}));
  auto dflash_cfg = nlohmann::json::parse(ReadFile(dir + "/dflash/export/config.json"));
  EXPECT_EQ(dflash_cfg["dflash_config"]["target_layer_ids"].get<std::vector<int32_t>>(),
            (std::vector<int32_t>{1, 5}));
  auto eagle_weights = SafetensorsFile::Open(dir + "/eagle/export/model.safetensors");
  auto dflash_weights = SafetensorsFile::Open(dir + "/dflash/export/model.safetensors");
  ASSERT_TRUE(eagle_weights.ok() && dflash_weights.ok());
  EXPECT_EQ((*eagle_weights)->Get("fc.weight")->shape, (std::vector<int64_t>{256, 3 * 256}));
  EXPECT_EQ((*dflash_weights)->Get("fc.weight")->shape, (std::vector<int64_t>{256, 2 * 256}));

  // Each cursor carries its student's plan.
  const nlohmann::json eagle_plan = CheckpointFingerprint(dir + "/eagle/ckpt");
  EXPECT_EQ(eagle_plan["aux_layers"], "1,3,4");
  EXPECT_EQ(eagle_plan["features"], "aux_hidden,last_hidden,target_argmax");
  const nlohmann::json dflash_plan = CheckpointFingerprint(dir + "/dflash/ckpt");
  EXPECT_EQ(dflash_plan["aux_layers"], "1,5");
  EXPECT_EQ(dflash_plan["features"], "aux_hidden,target_argmax");
  EXPECT_EQ(dflash_plan["samples"], eagle_plan["samples"]);

  // Two streams, two ledgers, each sample committed once in each.
  EXPECT_TRUE(IsRegularFile(dir + "/ledger.jsonl"));
  EXPECT_TRUE(IsRegularFile(dir + "/ledger.dflash.jsonl"));
  const std::string log = teacher.Log();
  const size_t group_line = log.find("teacher: ledger of student group dflash {");
  ASSERT_NE(group_line, std::string::npos) << log;
  testing::ExpectEverySampleCommittedOnce(log.substr(0, group_line));
  testing::ExpectEverySampleCommittedOnce(log.substr(group_line));
}

TEST(FeatureSubscriptionsE2eTest, AStudentAskingForWhatTheTeacherDoesNotServeStopsNamingIt) {
  const std::string dir = testing::ScratchDir("feature_subscriptions_refused_e2e");
  Subprocess teacher(testing::TinyTeacherArgv(dir, {"--max_samples=20", "--student_groups=dflash"}),
                     dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 120s)) << teacher.Log();
  const std::string port = testing::ReadPortFile(dir + "/port");
  // The teacher captures EAGLE-3's [1, 3, 4]; this DFlash draft reads [1, 5].
  Subprocess dflash(GroupStudent(dir + "/dflash", port, kDFlashStudent), dir + "/dflash.log");
  EXPECT_NE(ExitCodeOf(dflash, 120s), 0) << dflash.Log();
  EXPECT_NE(dflash.Log().find("the draft reads aux layers [1, 5], but the teacher does not capture [5]: it captures "
                              "[1, 3, 4]"),
            std::string::npos)
      << dflash.Log();
  Subprocess lost(GroupStudent(dir + "/lost", port, {"--student_group=medusa"}), dir + "/lost.log");
  EXPECT_NE(ExitCodeOf(lost, 120s), 0) << lost.Log();
  EXPECT_NE(lost.Log().find("serves no student group \"medusa\""), std::string::npos) << lost.Log();
  EXPECT_TRUE(teacher.running()) << teacher.Log();
  teacher.Signal(SIGTERM);
  EXPECT_EQ(ExitCodeOf(teacher, 60s), 0) << teacher.Log();
}

}  // namespace
}  // namespace e3
