// Precedence of a service's flag values: command line, its deprecated
// spelling, the run config, the default. The flags are this test's own,
// named as the student's so that the config's student keys reach them.
#include "common/service_flags.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "tests/scratch_dir.h"

ABSL_FLAG(double, lr, 1e-4, "");
ABSL_FLAG(uint64_t, init_seed, 0, "");
ABSL_FLAG(uint64_t, seed, 0, "deprecated: use --init_seed");
ABSL_FLAG(int, ttt_length, 7, "");
ABSL_FLAG(int, credit_window, 4, "");
ABSL_FLAG(int64_t, max_steps, 0, "");
ABSL_FLAG(bool, eval_untrained, true, "");

namespace e3 {
namespace {

const std::vector<DeprecatedFlag> kDeprecated = {{"seed", "init_seed"}};

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = testing::ScratchPath(name, ".yaml");
  std::ofstream(path) << text;
  return path;
}

// The command line every test shares (absl parses it once per process).
void ParseOnce() {
  static bool parsed = false;
  if (parsed) return;
  parsed = true;
  std::vector<std::string> args = {"service_flags_test", "--lr=0.5", "--seed=9", "--max_steps=3"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(argv.size()), argv.data());
}

TEST(ServiceFlagsTest, CommandLineThenDeprecatedSpellingThenConfigThenDefault) {
  const std::string config = WriteFile("student", R"(
schedule:
  lr: 2e-4
  credit_window: 6
draft:
  init_seed: 4
  ttt_length: 5
students:
  args: [--noeval_untrained]
)");
  ParseOnce();
  auto settled = SettleServiceFlags(config, ServiceRole::kStudent, kDeprecated);
  ASSERT_TRUE(settled.ok()) << settled.status();
  EXPECT_DOUBLE_EQ(absl::GetFlag(FLAGS_lr), 0.5);  // command line over the config
  EXPECT_EQ(absl::GetFlag(FLAGS_init_seed), 9u);   // deprecated spelling over the config
  EXPECT_EQ(absl::GetFlag(FLAGS_ttt_length), 5);   // config over the default
  EXPECT_EQ(absl::GetFlag(FLAGS_credit_window), 6);
  EXPECT_FALSE(absl::GetFlag(FLAGS_eval_untrained));  // --noname in args
  EXPECT_EQ(absl::GetFlag(FLAGS_max_steps), 3);       // command line, not in the config
  EXPECT_EQ(settled->overridden, 2);                  // lr and init_seed
  EXPECT_EQ(settled->from_config, 3);                 // ttt_length, credit_window, eval_untrained
  ASSERT_EQ(settled->warnings.size(), 1u);
  EXPECT_EQ(settled->warnings[0], "--seed is deprecated; use --init_seed");
  EXPECT_TRUE(FlagGiven("init_seed", kDeprecated));
  EXPECT_FALSE(FlagGiven("ttt_length", kDeprecated));
}

TEST(ServiceFlagsTest, ConfigErrorsNameTheFileAndKey) {
  ParseOnce();
  const std::string teacher_key = WriteFile("teacher_key", "model:\n  dir: /models/x\n");
  auto foreign = SettleServiceFlags(teacher_key, ServiceRole::kTeacher, {});
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().message(),
            teacher_key + ": model.dir: --model_dir is not a flag of this program");

  const std::string bad_arg = WriteFile("bad_arg", "students:\n  args: [--max_steps=many]\n");
  auto unparsable = SettleServiceFlags(bad_arg, ServiceRole::kStudent, {});
  // max_steps was given on the command line, so the config's value is not
  // even read; a flag the command line left alone is.
  ASSERT_TRUE(unparsable.ok()) << unparsable.status();
  const std::string bad_window =
      WriteFile("bad_window", "students:\n  args: [--credit_window=wide]\n");
  auto refused = SettleServiceFlags(bad_window, ServiceRole::kStudent, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(bad_window + ": students.args: --credit_window=wide: "),
            std::string::npos)
      << refused.status();

  auto missing = SettleServiceFlags("/nonexistent/run.yaml", ServiceRole::kStudent, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/run.yaml"), std::string::npos);
}

TEST(ServiceFlagsTest, AFlagAndItsOldSpellingTogetherAreRefused) {
  ParseOnce();
  // lr and max_steps are both on the command line: as old and new
  // spellings of one flag they would disagree.
  auto both = SettleServiceFlags("", ServiceRole::kStudent, {{"max_steps", "lr"}});
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().message(), "--max_steps and --lr are the same flag; give only --lr");
}

}  // namespace
}  // namespace e3
