// Command lines read against the settings: precedence (default < config
// file < the config's args < the command line), old spellings, errors
// that name the flag, --help from the declarations; and every declared
// setting given by flag, by YAML and through a resolved run.yaml, read back
// identically by each process that reads it.
#include "common/config/command_line.h"

#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/config/config_file.h"
#include "common/config/reference.h"
#include "tests/scratch_dir.h"
#include "tests/source_path.h"

namespace e3 {
namespace {

using Kind = Check::Kind;

std::string WriteConfig(const std::string& name, const std::string& yaml) {
  const std::string path = testing::ScratchPath(name, ".yaml");
  std::ofstream(path) << yaml;
  return path;
}

absl::StatusOr<CommandLine> Read(std::vector<std::string> args, unsigned role) {
  args.insert(args.begin(), "program");
  return ReadCommandLine(std::vector<std::string>(args.begin() + 1, args.end()), role);
}

TEST(CommandLineTest, CommandLineOverConfigArgsOverConfigOverDefault) {
  const std::string config = WriteConfig(
      "precedence", "schedule:\n  lr: 2e-4\n  max_steps: 10\nstudents:\n  args: [\"--max_steps=20\", \"--log_every=3\"]\n");
  auto c = Read({"--config=" + config, "--log_every", "5", "--noeval_untrained"}, kStudent);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->config.schedule.lr, 2e-4);      // the file
  EXPECT_EQ(c->config.schedule.max_steps, 20);        // the file's args
  EXPECT_EQ(c->config.schedule.log_every, 5);         // the command line
  EXPECT_FALSE(c->config.schedule.eval_untrained);    // --noflag
  EXPECT_EQ(c->config.schedule.warmup_ratio, 0.02);   // the default
  EXPECT_EQ(c->from_file, 3);
}

TEST(CommandLineTest, OldSpellingsWarnAndTheTwoTogetherAreRefused) {
  auto c = Read({"--seed=9", "--max_credit_window=8"}, kTeacher);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config.data.seed, 9u);
  EXPECT_EQ(c->config.teachers.credit_window, 8);
  ASSERT_EQ(c->warnings.size(), 2u);
  EXPECT_EQ(c->warnings[0], "--seed is deprecated; use --data_seed");
  auto both = Read({"--max_credit_window=4", "--credit_window=8"}, kTeacher);
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(std::string(both.status().message()),
            "--max_credit_window and --credit_window are the same flag; give only --credit_window");
  auto student = Read({"--seed=4"}, kStudent);
  ASSERT_TRUE(student.ok());
  EXPECT_EQ(student->config.draft.init_seed, 4u);
}

TEST(CommandLineTest, ErrorsNameTheFlagAndWhoReadsIt) {
  auto unknown = Read({"--bogus=1"}, kTeacher);
  EXPECT_EQ(std::string(unknown.status().message()), "unknown flag --bogus (teacher_server --help lists its flags)");
  auto other = Read({"--lr=1"}, kTeacher);
  EXPECT_EQ(std::string(other.status().message()),
            "--lr (schedule.lr) is not a setting of teacher_server: student_trainer and e3_launch read it");
  auto bad = Read({"--listen=127.0.0.1:99999"}, kTeacher);
  EXPECT_NE(std::string(bad.status().message()).find("--listen: teachers.listen: expected host:port"),
            std::string::npos)
      << bad.status();
  auto missing = Read({"--lr"}, kStudent);
  EXPECT_NE(std::string(missing.status().message()).find("--lr needs a value"), std::string::npos);
  auto dotted = Read({"--schedule.lr=0.5"}, kStudent);
  ASSERT_TRUE(dotted.ok()) << dotted.status();
  EXPECT_DOUBLE_EQ(dotted->config.schedule.lr, 0.5);
  const std::string config = WriteConfig("bad_args", "teachers:\n  args: [\"model_dir\"]\n");
  auto bad_args = Read({"--config=" + config}, kTeacher);
  EXPECT_NE(std::string(bad_args.status().message()).find("teachers.args: expected flags (--name=value), got \"model_dir\""),
            std::string::npos)
      << bad_args.status();
}

TEST(CommandLineTest, TheLauncherTakesItsFlagsAndOverrides) {
  const std::string config = WriteConfig("launcher", "schedule:\n  lr: 1e-3\n");
  auto c = Read({"--config=" + config, "--plan", "schedule.lr=3e-3", "teachers.devices=0,1"}, kLauncher);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->config.launcher.plan);
  EXPECT_DOUBLE_EQ(c->config.schedule.lr, 3e-3);
  EXPECT_EQ(c->config.teachers.devices.size(), 2u);
  // A service's flag is no launcher flag: the run config sets it.
  EXPECT_FALSE(Read({"--lr=1"}, kLauncher).ok());
}

TEST(CommandLineTest, HelpListsEverySettingOfTheProcessWithItsDefault) {
  auto c = Read({"--help"}, kStudent);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->help);
  for (unsigned role : {kTeacher, kStudent, kLauncher}) {
    const std::string usage = Usage(role, "summary");
    for (const Setting& s : AllSettings()) {
      if (role != kLauncher && !s.ReadBy(role)) continue;
      EXPECT_NE(usage.find(absl::StrCat("(", s.path, "; default ")), std::string::npos) << s.path << " in " << role;
    }
  }
}

// --preview_data is teacher_server's action, like --help: read from its
// command line only, never a setting of a run config or of another process.
TEST(CommandLineTest, PreviewDataIsATeacherCommandLineAction) {
  auto c = Read({"--preview_data=3", "--data=x.jsonl"}, kTeacher);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->preview_data, 3);
  EXPECT_EQ(c->config.data.train, "x.jsonl");
  auto spaced = Read({"--preview_data", "2"}, kTeacher);
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  EXPECT_EQ(spaced->preview_data, 2);
  EXPECT_EQ(Read({"--data=x.jsonl"}, kTeacher)->preview_data, 0);
  for (const std::string bad : {"--preview_data=0", "--preview_data=two", "--preview_data"}) {
    auto refused = Read({bad}, kTeacher);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("expected a number of lines, at least 1"), absl::string_view::npos)
        << refused.status();
  }
  auto student = Read({"--preview_data=3"}, kStudent);
  ASSERT_FALSE(student.ok());
  EXPECT_NE(student.status().message().find("unknown flag --preview_data"), absl::string_view::npos);
  const std::string config = WriteConfig("preview_in_args", "teachers:\n  args: [\"--preview_data=3\"]\n");
  auto in_args = Read({"--config=" + config}, kTeacher);
  ASSERT_FALSE(in_args.ok());
  EXPECT_NE(in_args.status().message().find("teachers.args: --preview_data is an action of teacher_server's command "
                                            "line, not a setting"),
            absl::string_view::npos)
      << in_args.status();
  EXPECT_NE(Usage(kTeacher, "summary").find("--preview_data=N"), std::string::npos);
  EXPECT_EQ(Usage(kStudent, "summary").find("--preview_data"), std::string::npos);
}

// Whether the check admits one value only (a choice of one, as
// draft.algorithm while one algorithm is built).
bool OnlyItsDefault(const Setting& s) { return s.check.kind == Kind::kChoice && s.check.choices.size() == 1; }

// A value for `s` that is not its default and that its check accepts
// (its default where that is the only one).
std::string OtherValue(const Setting& s) {
  const Check& c = s.check;
  if (s.is_bool) return s.default_text == "true" ? "false" : "true";
  if (s.is_list) return s.check.kind == Kind::kWords ? "--a=1 --b=2" : (s.type == "list" && c.lo >= 0 ? "2,3" : "x,y");
  switch (c.kind) {
    case Kind::kChoice:
      if (OnlyItsDefault(s)) return s.default_text;
      return c.choices[0] == s.default_text ? c.choices[1] : c.choices[0];
    case Kind::kDtype:
      return "float16";
    case Kind::kPort:
      return "12345";
    case Kind::kListenAddress:
      return "127.0.0.1:7777";
    case Kind::kRange:
      if (s.type == "integer") return absl::StrCat(static_cast<int64_t>(c.lo) + 1 == std::stoll(s.default_text)
                                                       ? static_cast<int64_t>(c.lo)
                                                       : static_cast<int64_t>(c.lo) + 1);
      return c.lo == 0.375 ? "0.5" : (c.lo > 0.375 ? absl::StrCat(c.lo + 0.5) : "0.375");
    default:
      return s.type == "integer" ? absl::StrCat(std::stoull(s.default_text) + 7) : absl::StrCat("value-of-", s.key);
  }
}

TEST(CommandLineTest, EverySettingReadsBackTheSameByFlagYamlAndTheResolvedFile) {
  for (const Setting& s : AllSettings()) {
    SCOPED_TRACE(s.path);
    const std::string value = OtherValue(s);
    std::string yaml = absl::StrCat(s.section, ":\n  ", s.key, ": \"", value, "\"\n");
    // ep must divide tp, which the check between keys holds it to.
    if (s.path == "teachers.ep") absl::StrAppend(&yaml, "  tp: ", value, "\n");
    auto by_yaml = ParseRunConfig(yaml, "one.yaml");
    ASSERT_TRUE(by_yaml.ok()) << by_yaml.status() << " for " << value;
    const std::string want = ValueText(s, s.get(*by_yaml));
    if (!OnlyItsDefault(s)) EXPECT_NE(want, s.default_text);
    const std::string resolved = WriteConfig("resolved", RunConfigToYaml(*by_yaml));
    for (unsigned role : {kTeacher, kStudent, kLauncher}) {
      if (!s.ReadBy(role)) continue;
      auto from_file = Read({"--config=" + resolved}, role);
      ASSERT_TRUE(from_file.ok()) << from_file.status();
      EXPECT_EQ(ValueText(s, s.get(from_file->config)), want) << "role " << role;
      if (s.flag.empty() || (role == kLauncher && s.section != "launcher")) continue;
      std::vector<std::string> args = {absl::StrCat("--", s.flag, "=", value)};
      if (s.path == "teachers.ep") args.push_back(absl::StrCat("--tp_size=", value));
      auto by_flag = Read(args, role);
      ASSERT_TRUE(by_flag.ok()) << by_flag.status();
      EXPECT_EQ(ValueText(s, s.get(by_flag->config)), want) << "role " << role;
    }
  }
}

// docs/config.md is the declarations' reference, regenerated with
// `e3_launch --config_reference > docs/config.md`.
TEST(CommandLineTest, TheConfigReferenceIsUpToDate) {
  absl::StatusOr<std::string> committed = ReadFileToString(testing::SourcePath("docs/config.md"));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*committed, ConfigReferenceMarkdown())
      << "docs/config.md is stale: run build/launcher/e3_launch --config_reference > docs/config.md";
}

TEST(CommandLineTest, AnAlgorithmThatIsNotBuiltIsRefusedNamingTheChoices) {
  auto by_flag = Read({"--draft_algorithm=dspark"}, kStudent);
  ASSERT_FALSE(by_flag.ok());
  EXPECT_NE(by_flag.status().message().find("draft.algorithm: expected eagle3, eagle3.1 or dflash, got \"dspark\""),
            std::string::npos)
      << by_flag.status();
}

TEST(CommandLineTest, AServiceMainGetsItsConfigOrItsExitCode) {
  auto run = [](std::vector<std::string> args) {
    args.insert(args.begin(), "student_trainer");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return ReadServiceCommandLine(static_cast<int>(argv.size()), argv.data(), kStudent, "student_trainer",
                                  "summary");
  };
  const ServiceCommandLine help = run({"--help"});
  EXPECT_FALSE(help.command_line.has_value());
  EXPECT_EQ(help.exit_code, 0);
  const ServiceCommandLine bad = run({"--no_such_flag=1"});
  EXPECT_FALSE(bad.command_line.has_value());
  EXPECT_EQ(bad.exit_code, 2);
  const ServiceCommandLine ok = run({"--lr=3e-4"});
  ASSERT_TRUE(ok.command_line.has_value());
  EXPECT_EQ(ok.command_line->config.schedule.lr, 3e-4);
}

}  // namespace
}  // namespace e3
