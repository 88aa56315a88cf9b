#include "common/base/launch_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace e3 {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  auto table = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [table](const char* name) -> const char* {
    auto it = table->find(name);
    return it == table->end() ? nullptr : it->second.c_str();
  };
}

TEST(LaunchEnvTest, TorchrunVariablesFillWhatTheFlagsLeaveOpen) {
  auto env = ResolveLaunchEnv(LaunchFlags(), Env({{"RANK", "3"},
                                                  {"WORLD_SIZE", "8"},
                                                  {"LOCAL_RANK", "3"},
                                                  {"MASTER_ADDR", "node0"},
                                                  {"MASTER_PORT", "29700"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 3);
  EXPECT_EQ(env->master_addr, "node0");
  EXPECT_EQ(env->master_port, 29700);
}

TEST(LaunchEnvTest, ExplicitFlagsTakePrecedence) {
  LaunchFlags f;
  f.rank = 1;
  f.world_size = 2;
  f.master_addr = "10.0.0.1";
  f.master_port = 29900;
  f.rendezvous_file = "/run/e3/rendezvous/students.1a2b";
  auto env = ResolveLaunchEnv(f, Env({{"RANK", "3"},
                                      {"WORLD_SIZE", "8"},
                                      {"MASTER_ADDR", "node0"},
                                      {"MASTER_PORT", "29700"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world_size, 2);
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  EXPECT_EQ(env->master_port, 29900);
  EXPECT_EQ(env->rendezvous_file, "/run/e3/rendezvous/students.1a2b");
}

TEST(LaunchEnvTest, DefaultsWithoutEitherDependOnTheGroup) {
  LaunchFlags teacher;
  teacher.default_master_port = 29600;
  auto env = ResolveLaunchEnv(teacher, Env({}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 0);
  EXPECT_EQ(env->world_size, 1);
  EXPECT_EQ(env->local_rank, -1);
  EXPECT_EQ(env->master_addr, "127.0.0.1");
  EXPECT_EQ(env->master_port, 29600);
}

TEST(LaunchEnvTest, BadValuesAreNamed) {
  auto bad_rank = ResolveLaunchEnv(LaunchFlags(), Env({{"RANK", "two"}}));
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_EQ(bad_rank.status().message(),
            "$RANK=\"two\": expected a non-negative integer (or give --rank)");
  LaunchFlags teacher;
  teacher.rank_flag = "tp_rank";
  auto bad_port = ResolveLaunchEnv(teacher, Env({{"MASTER_PORT", "-5"}}));
  ASSERT_FALSE(bad_port.ok());
  EXPECT_NE(bad_port.status().message().find("$MASTER_PORT=\"-5\""), std::string::npos);
  auto outside = ResolveLaunchEnv(LaunchFlags(), Env({{"RANK", "2"}, {"WORLD_SIZE", "2"}}));
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().message(), "rank 2 is outside world size 2");
}

}  // namespace
}  // namespace e3
