// The settings' registry: every row has a flag unique in each process that
// reads it, a default that reads back as itself, and words for what it
// expects.
#include "common/config/setting.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace e3 {
namespace {

TEST(SettingsTest, EveryFlagIsUniqueInEachProcessThatReadsIt) {
  for (unsigned role : {kTeacher, kStudent, kLauncher}) {
    std::map<std::string, std::string> seen;
    for (const Setting& s : AllSettings()) {
      if (!s.ReadBy(role) || s.flag.empty()) continue;
      if (role == kLauncher && s.section != "launcher") continue;  // set by the config, not a flag
      auto [it, inserted] = seen.emplace(s.flag, s.path);
      EXPECT_TRUE(inserted) << "--" << s.flag << " names " << it->second << " and " << s.path << " in role " << role;
    }
  }
}

TEST(SettingsTest, EveryDefaultReadsBackAsItself) {
  for (const Setting& s : AllSettings()) {
    RunConfig c;
    const RawValue before = s.get(c);
    std::string text;
    EXPECT_TRUE(s.set(before, c, &text)) << s.path << " refuses its own default " << before.Describe();
    EXPECT_EQ(ValueText(s, s.get(c)), s.default_text) << s.path;
    EXPECT_FALSE(s.expected.empty()) << s.path;
    EXPECT_FALSE(s.help.empty()) << s.path;
    EXPECT_NE(s.roles, 0u) << s.path;
  }
}

TEST(SettingsTest, OldSpellingsNameSettingsOfTheirProcesses) {
  for (const DeprecatedFlag& d : DeprecatedFlags()) {
    const Setting* s = FindSetting(d.path);
    ASSERT_NE(s, nullptr) << d.path;
    EXPECT_TRUE(s->ReadBy(d.roles)) << d.old_flag;
    bool old = false;
    EXPECT_EQ(SettingOfFlag(d.old_flag, d.roles, &old), s);
    EXPECT_TRUE(old);
  }
}

}  // namespace
}  // namespace e3
