#include "common/model/model_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

namespace fs = std::filesystem;

std::string Src(const std::string& rel) { return std::string(E3_SOURCE_DIR) + "/" + rel; }

// A scratch copy of a model dir that a test may damage.
std::string CopyModel(const std::string& rel, const std::string& tag) {
  fs::path dst = testing::ScratchPath("model_" + tag);
  fs::remove_all(dst);
  fs::copy(Src(rel), dst, fs::copy_options::recursive);
  for (auto& e : fs::recursive_directory_iterator(dst)) {
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  }
  return dst.string();
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

TEST(ModelDirTest, OpensShardedBundledModel) {
  auto dir = ModelDir::Open(Src("examples/tiny-code-llama"));
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ((*dir)->TensorNames().size(), 74u);  // 8 layers x 9 + embed + norm; the head is tied
  auto embed = (*dir)->Get("model.embed_tokens.weight", {8192, 256});
  ASSERT_TRUE(embed.ok()) << embed.status();
  EXPECT_EQ(embed->dtype, DType::kBF16);
  EXPECT_NE(embed->file.find("model-00001-of-00002.safetensors"), std::string::npos);
  auto late = (*dir)->Get("model.layers.7.mlp.down_proj.weight", {256, 768});
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_NE(late->file.find("model-00002-of-00002.safetensors"), std::string::npos);
  EXPECT_EQ((*dir)->total_bytes(), 16785920);  // the index's metadata.total_size
}

TEST(ModelDirTest, OpensSingleFileModel) {
  auto dir = ModelDir::Open(Src("tests/fixtures/golden/rand_yarn_mqa"));
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE((*dir)->Contains("lm_head.weight"));
}

TEST(ModelDirTest, MissingAndMisshapenTensorsNameFileAndTensor) {
  auto dir = ModelDir::Open(Src("examples/tiny-code-llama"));
  ASSERT_TRUE(dir.ok());
  auto missing = (*dir)->Get("lm_head.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("lm_head.weight"), std::string::npos);
  EXPECT_NE(missing.status().message().find("tiny-code-llama"), std::string::npos);
  auto shape = (*dir)->Get("model.norm.weight", {512});
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("[256]"), std::string::npos) << shape.status();
  EXPECT_NE(shape.status().message().find("expected [512]"), std::string::npos);
  EXPECT_NE(shape.status().message().find(".safetensors"), std::string::npos);
}

TEST(ModelDirTest, BrokenDirectoriesAreErrors) {
  // No weights at all.
  std::string empty = CopyModel("examples/tiny-code-llama", "noweights");
  for (auto& e : fs::directory_iterator(empty)) {
    if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json") {
      fs::remove(e.path());
    }
  }
  auto none = ModelDir::Open(empty);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no model.safetensors"), std::string::npos);

  // The index names a shard that is gone.
  std::string gone = CopyModel("examples/tiny-code-llama", "goneshard");
  fs::remove(fs::path(gone) / "model-00002-of-00002.safetensors");
  auto g = ModelDir::Open(gone);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("model-00002-of-00002.safetensors"), std::string::npos);

  // The index maps a tensor to a shard that does not hold it.
  std::string lie = CopyModel("examples/tiny-code-llama", "indexlie");
  Write(lie + "/model.safetensors.index.json",
        R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
                           "model.embed_tokens.weight": "model-00001-of-00002.safetensors"}})");
  auto l = ModelDir::Open(lie);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("\"model.norm.weight\""), std::string::npos) << l.status();

  // A truncated shard.
  std::string cut = CopyModel("examples/tiny-code-llama", "truncated");
  fs::resize_file(fs::path(cut) / "model-00002-of-00002.safetensors", 100000);
  auto t = ModelDir::Open(cut);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("model-00002-of-00002.safetensors"), std::string::npos) << t.status();

  // Missing config and an unknown architecture.
  std::string nocfg = CopyModel("examples/tiny-code-llama", "nocfg");
  fs::remove(fs::path(nocfg) / "config.json");
  EXPECT_EQ(ModelDir::Open(nocfg).status().code(), absl::StatusCode::kNotFound);
  std::string arch = CopyModel("examples/tiny-code-llama", "arch");
  Write(arch + "/config.json", R"({"architectures": ["MambaForCausalLM"]})");
  auto a = ModelDir::Open(arch);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("unknown architecture \"MambaForCausalLM\""), std::string::npos);
}

}  // namespace
}  // namespace e3
