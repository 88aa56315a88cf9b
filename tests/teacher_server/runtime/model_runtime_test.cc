#include "teacher_server/runtime/model_runtime.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace e3 {
namespace {

const std::string kTinyModel = std::string(E3_SOURCE_DIR) + "/examples/tiny-code-llama";

TEST(ModelRuntimeTest, AutoPicksSglOnAGpuAndHfOnTheCpu) {
  EXPECT_EQ(ResolveBackend("auto", /*cuda=*/true), "sgl");
  EXPECT_EQ(ResolveBackend("auto", /*cuda=*/false), "hf");
  EXPECT_EQ(ResolveBackend("sgl", /*cuda=*/false), "sgl");
}

TEST(ModelRuntimeTest, TheTuningCacheFollowsXdgThenHome) {
  std::map<std::string, std::string> vars = {{"XDG_CACHE_HOME", "/xdg"}, {"HOME", "/home/u"}};
  auto env = [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  EXPECT_EQ(DefaultGemmTuningCachePath(env), "/xdg/e3/gemm_tuning.json");
  vars.erase("XDG_CACHE_HOME");
  EXPECT_EQ(DefaultGemmTuningCachePath(env), "/home/u/.cache/e3/gemm_tuning.json");
  vars.clear();
  EXPECT_EQ(DefaultGemmTuningCachePath(env), "");
}

TEST(ModelRuntimeTest, OptionsFollowTheDeviceAndRefuseBadValuesByFlag) {
  ModelRuntimeOptions o;
  auto cpu = MakeModelOptions(o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->dtype, at::kFloat);
  EXPECT_FALSE(cpu->fuse_projections);  // hf
  o.backend = "sgl";
  o.dtype = "bfloat16";
  auto sgl = MakeModelOptions(o);
  ASSERT_TRUE(sgl.ok()) << sgl.status();
  EXPECT_TRUE(sgl->fuse_projections);
  EXPECT_EQ(sgl->dtype, at::kBFloat16);

  struct Case {
    void (*set)(ModelRuntimeOptions*);
    std::string error;
  };
  const Case cases[] = {
      {[](ModelRuntimeOptions* r) { r->device = "tpu:0"; }, "--device=tpu:0: "},
      {[](ModelRuntimeOptions* r) { r->backend = "vllm"; },
       "--backend=vllm: expected auto, hf or sgl"},
      {[](ModelRuntimeOptions* r) { r->dtype = "int8"; }, "unsupported compute dtype \"int8\""},
      {[](ModelRuntimeOptions* r) { r->graph_token_step = 0; },
       "--graph_token_step=0: expected >= 1"},
      {[](ModelRuntimeOptions* r) { r->tp_overlap_min_tokens = -1; },
       "--tp_overlap_min_tokens=-1: expected >= 0"},
      {[](ModelRuntimeOptions* r) { r->ep_size = 2; }, "--ep_size needs --tp_size > 1"},
      {[](ModelRuntimeOptions* r) {
         r->launch.world_size = 4;
         r->ep_size = 3;
       },
       "--ep_size=3: expected a divisor of --tp_size=4"},
  };
  for (const Case& c : cases) {
    ModelRuntimeOptions bad;
    c.set(&bad);
    auto m = MakeModelOptions(bad);
    ASSERT_FALSE(m.ok()) << c.error;
    EXPECT_NE(std::string(m.status().message()).find(c.error), std::string::npos) << m.status();
  }
}

TEST(ModelRuntimeTest, LoadsTheBundledModel) {
  auto dir = ModelDir::Open(kTinyModel);
  ASSERT_TRUE(dir.ok()) << dir.status();
  ModelRuntimeOptions o;
  auto mopts = MakeModelOptions(o);
  ASSERT_TRUE(mopts.ok()) << mopts.status();
  auto model = LoadTeacherModel(**dir, *mopts, o);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().hidden_size, 256);
  EXPECT_EQ((*model)->embed_tokens().size(0), 8192);
}

}  // namespace
}  // namespace e3
