// tokenizer.json's post_processor on small hand-made files: each type HF
// `tokenizers` has for BPE models (TemplateProcessing, BertProcessing,
// RobertaProcessing, ByteLevel, Sequence), with and without special
// tokens, single and pair, and the load errors. Parity with HF on the
// family files is in tokenizer_families_test.
#include "common/text/post_processor.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/text/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/text/byte_char.h"
#include "tests/common/text/temp_file.h"

namespace e3 {
namespace {

using Json = nlohmann::json;
using Offsets = std::vector<std::pair<size_t, size_t>>;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int32_t kBos = 300, kEos = 301;
constexpr int32_t kGh = 256, kGhi = 257;  // "Ġh", "Ġhi"
const EncodeOptions kSpecial{/*add_special_tokens=*/true};
const EncodeOptions kPlain{/*add_special_tokens=*/false};

using testing::ByteChar;

// Byte-level BPE: byte b has id b, "Ġh" 256, "Ġhi" 257; <s> 300, </s> 301.
Json TinyFile(const Json& post_processor) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  const std::string space = ByteChar(' ');
  vocab[space + "h"] = kGh;
  vocab[space + "hi"] = kGhi;
  Json added = Json::array();
  for (const auto& [id, content] : {std::pair<int, const char*>{kBos, "<s>"}, {kEos, "</s>"}}) {
    added.push_back(
        Json{{"id", id}, {"content", content}, {"special", true}, {"normalized", false}});
  }
  return Json{{"added_tokens", added},
              {"pre_tokenizer",
               Json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
              {"decoder", Json{{"type", "ByteLevel"}}},
              {"post_processor", post_processor},
              {"model", Json{{"type", "BPE"},
                             {"vocab", vocab},
                             {"merges", Json::array({Json::array({space, "h"}),
                                                     Json::array({space + "h", "i"})})}}}};
}

using testing::TempFile;

std::unique_ptr<Tokenizer> LoadWithPostProcessor(const Json& post_processor) {
  TempFile file(TinyFile(post_processor).dump());
  auto tok = Tokenizer::FromFile(file.path());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

// The load error for `post_processor`, and the file's path.
std::string PostProcessorLoadError(const Json& post_processor, std::string* path) {
  TempFile file(TinyFile(post_processor).dump());
  *path = file.path();
  auto tok = Tokenizer::FromFile(file.path());
  return tok.ok() ? "" : std::string(tok.status().message());
}

Json Special(const std::string& id, int type_id = 0) {
  return Json{{"SpecialToken", Json{{"id", id}, {"type_id", type_id}}}};
}
Json Seq(const std::string& id, int type_id = 0) {
  return Json{{"Sequence", Json{{"id", id}, {"type_id", type_id}}}};
}
Json SpecialTokens(const std::string& name, std::vector<int32_t> ids,
                   std::vector<std::string> tokens) {
  return Json{{"id", name}, {"ids", ids}, {"tokens", tokens}};
}
Json Template(const Json& single, const Json& pair, const Json& specials) {
  return Json{{"type", "TemplateProcessing"},
              {"single", single},
              {"pair", pair},
              {"special_tokens", specials}};
}
Json LlamaTemplate() {
  return Template(Json::array({Special("<s>"), Seq("A")}),
                  Json::array({Special("<s>"), Seq("A"), Special("<s>", 1), Seq("B", 1)}),
                  Json{{"<s>", SpecialTokens("<s>", {kBos}, {"<s>"})}});
}
Json ByteLevelPp(bool trim, bool add_prefix_space) {
  return Json{{"type", "ByteLevel"},
              {"trim_offsets", trim},
              {"add_prefix_space", add_prefix_space},
              {"use_regex", true}};
}

TEST(PostProcessorTest, NoneAddsNothing) {
  for (const Json& pp : {Json(nullptr), ByteLevelPp(false, true)}) {
    auto tok = LoadWithPostProcessor(pp);
    ASSERT_NE(tok, nullptr);
    const Encoding plain = tok->Encode("a hi");
    EXPECT_THAT(plain.ids, ElementsAre('a', kGhi));
    for (const EncodeOptions& o : {kSpecial, kPlain}) {
      const Encoding e = tok->Encode("a hi", o);
      EXPECT_EQ(e.ids, plain.ids);
      EXPECT_EQ(e.offsets, plain.offsets);
    }
    auto pair = tok->EncodePair("a", " hi", kSpecial);
    ASSERT_TRUE(pair.ok()) << pair.status();
    EXPECT_THAT(pair->ids, ElementsAre('a', kGhi));
    EXPECT_EQ(pair->offsets, (Offsets{{0, 1}, {0, 3}}));  // each in its own text
  }
}

TEST(PostProcessorTest, TemplateAddsBos) {
  auto tok = LoadWithPostProcessor(LlamaTemplate());
  ASSERT_NE(tok, nullptr);
  const Encoding e = tok->Encode("a hi", kSpecial);
  EXPECT_THAT(e.ids, ElementsAre(kBos, 'a', kGhi));
  EXPECT_EQ(e.offsets, (Offsets{{0, 0}, {0, 1}, {1, 4}}));
  // Without special tokens: Encode(text), which stays unchanged.
  EXPECT_THAT(tok->Encode("a hi", kPlain).ids, ElementsAre('a', kGhi));
  EXPECT_THAT(tok->Encode("a hi").ids, ElementsAre('a', kGhi));
  EXPECT_THAT(tok->Encode("", kSpecial).ids, ElementsAre(kBos));
  auto pair = tok->EncodePair("a", "b", kSpecial);
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_THAT(pair->ids, ElementsAre(kBos, 'a', kBos, 'b'));
  EXPECT_EQ(pair->offsets, (Offsets{{0, 0}, {0, 1}, {0, 0}, {0, 1}}));
}

TEST(PostProcessorTest, TemplateMultiIdTokensAndOrder) {
  // "[X]" stands for two ids; the pair template puts B first, which HF
  // keeps without special tokens too.
  auto tok = LoadWithPostProcessor(Template(Json::array({Special("[X]"), Seq("A"), Special("</s>")}),
                           Json::array({Seq("B", 1), Special("</s>"), Seq("A")}),
                           Json{{"[X]", SpecialTokens("[X]", {kBos, kEos}, {"<s>", "</s>"})},
                                {"</s>", SpecialTokens("</s>", {kEos}, {"</s>"})}}));
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("a", kSpecial).ids, ElementsAre(kBos, kEos, 'a', kEos));
  auto pair = tok->EncodePair("a", "b", kSpecial);
  ASSERT_TRUE(pair.ok());
  EXPECT_THAT(pair->ids, ElementsAre('b', kEos, 'a'));
  pair = tok->EncodePair("a", "b", kPlain);
  ASSERT_TRUE(pair.ok());
  EXPECT_THAT(pair->ids, ElementsAre('b', 'a'));
}

TEST(PostProcessorTest, TemplateWithoutPairRefusesPairs) {
  Json pp = LlamaTemplate();
  pp.erase("pair");
  auto tok = LoadWithPostProcessor(pp);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("a", kSpecial).ids, ElementsAre(kBos, 'a'));
  auto pair = tok->EncodePair("a", "b", kSpecial);
  EXPECT_FALSE(pair.ok());
  EXPECT_THAT(std::string(pair.status().message()), HasSubstr("without a pair template"));
}

TEST(PostProcessorTest, Bert) {
  auto tok = LoadWithPostProcessor(Json{{"type", "BertProcessing"},
                       {"sep", Json::array({"</s>", kEos})},
                       {"cls", Json::array({"<s>", kBos})}});
  ASSERT_NE(tok, nullptr);
  const Encoding e = tok->Encode("a hi", kSpecial);
  EXPECT_THAT(e.ids, ElementsAre(kBos, 'a', kGhi, kEos));
  EXPECT_EQ(e.offsets, (Offsets{{0, 0}, {0, 1}, {1, 4}, {0, 0}}));  // Bert trims nothing
  auto pair = tok->EncodePair("a", "b", kSpecial);
  ASSERT_TRUE(pair.ok());
  EXPECT_THAT(pair->ids, ElementsAre(kBos, 'a', kEos, 'b', kEos));
  EXPECT_THAT(tok->Encode("a hi", kPlain).ids, ElementsAre('a', kGhi));
}

TEST(PostProcessorTest, RobertaAddsAndTrims) {
  auto tok = LoadWithPostProcessor(Json{{"type", "RobertaProcessing"},
                       {"sep", Json::array({"</s>", kEos})},
                       {"cls", Json::array({"<s>", kBos})},
                       {"trim_offsets", true},
                       {"add_prefix_space", true}});
  ASSERT_NE(tok, nullptr);
  const Encoding e = tok->Encode("a hi", kSpecial);
  EXPECT_THAT(e.ids, ElementsAre(kBos, 'a', kGhi, kEos));
  // "Ġhi" loses its space: [2, 4), not [1, 4).
  EXPECT_EQ(e.offsets, (Offsets{{0, 0}, {0, 1}, {2, 4}, {0, 0}}));
  // Trimmed without special tokens too, as HF does; Encode(text) is not.
  EXPECT_EQ(tok->Encode("a hi", kPlain).offsets, (Offsets{{0, 1}, {2, 4}}));
  EXPECT_EQ(tok->Encode("a hi").offsets, (Offsets{{0, 1}, {1, 4}}));
  auto pair = tok->EncodePair("a", "b", kSpecial);
  ASSERT_TRUE(pair.ok());
  EXPECT_THAT(pair->ids, ElementsAre(kBos, 'a', kEos, kEos, 'b', kEos));
}

TEST(PostProcessorTest, ByteLevelTrimsOffsets) {
  {
    // GPT-2's: add_prefix_space false trims the first token's space too.
    auto tok = LoadWithPostProcessor(ByteLevelPp(true, false));
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->Encode(" hi", kSpecial).offsets, (Offsets{{1, 3}}));
    // A token of spaces only ends empty at its end.
    const Encoding e = tok->Encode("a  ", kPlain);
    EXPECT_THAT(e.ids, ElementsAre('a', ' ', ' '));
    EXPECT_EQ(e.offsets, (Offsets{{0, 1}, {2, 2}, {3, 3}}));
  }
  {
    // With add_prefix_space, the first token keeps one leading space (the
    // pre-tokenizer's) but not two.
    auto tok = LoadWithPostProcessor(ByteLevelPp(true, true));
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->Encode(" hi", kSpecial).offsets, (Offsets{{0, 3}}));
    EXPECT_EQ(tok->Encode("a hi", kSpecial).offsets, (Offsets{{0, 1}, {2, 4}}));
  }
}

TEST(PostProcessorTest, SequenceAppliesInOrder) {
  // Llama 3's: ByteLevel without trimming, then the BOS template.
  auto llama3 =
      LoadWithPostProcessor(Json{{"type", "Sequence"},
                {"processors", Json::array({ByteLevelPp(false, true), LlamaTemplate()})}});
  ASSERT_NE(llama3, nullptr);
  const Encoding e = llama3->Encode("a hi", kSpecial);
  EXPECT_THAT(e.ids, ElementsAre(kBos, 'a', kGhi));
  EXPECT_EQ(e.offsets, (Offsets{{0, 0}, {0, 1}, {1, 4}}));
  // A trim after the template trims the sequence's tokens, and the
  // specials keep (0, 0).
  auto trim_last =
      LoadWithPostProcessor(Json{{"type", "Sequence"},
                {"processors", Json::array({LlamaTemplate(), ByteLevelPp(true, false)})}});
  ASSERT_NE(trim_last, nullptr);
  const Encoding t = trim_last->Encode("a hi", kSpecial);
  EXPECT_THAT(t.ids, ElementsAre(kBos, 'a', kGhi));
  EXPECT_EQ(t.offsets, (Offsets{{0, 0}, {0, 1}, {2, 4}}));
}

TEST(PostProcessorErrorsTest, UnknownTypeNamesFileAndComponent) {
  std::string path;
  {
    const std::string error = PostProcessorLoadError(Json{{"type", "Lowercase"}}, &path);
    EXPECT_THAT(
        error,
        HasSubstr(path +
                  ": post_processor is {\"type\":\"Lowercase\"}; supported post-processors: "
                  "TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel and Sequence"));
  }
  {
    const std::string error = PostProcessorLoadError(
        Json{{"type", "Sequence"},
             {"processors", Json::array({ByteLevelPp(false, true), Json{{"type", "Nope"}}})}},
        &path);
    EXPECT_THAT(
        error,
        HasSubstr(
            path +
            ": post_processor.processors[1] is {\"type\":\"Nope\"}; supported post-processors"));
  }
  {
    const std::string error = PostProcessorLoadError(Json{{"not_a_type", 1}}, &path);
    EXPECT_THAT(error, HasSubstr(path + ": post_processor is {\"not_a_type\":1}"));
  }
}

TEST(PostProcessorErrorsTest, MalformedComponents) {
  std::string path;
  // A template naming a special token it does not define.
  {
    const std::string error = PostProcessorLoadError(
        Template(Json::array({Special("<bos>"), Seq("A")}), nullptr, Json::object()), &path);
    EXPECT_THAT(
        error,
        HasSubstr(path + ": post_processor.single[0] names special token \"<bos>\", missing from "
                         "post_processor.special_tokens"));
  }
  {
    const std::string error =
        PostProcessorLoadError(Template(Json::array({Seq("B")}), nullptr, Json::object()), &path);
    EXPECT_THAT(error, HasSubstr("post_processor.single uses sequence B"));
  }
  {
    const std::string error = PostProcessorLoadError(
        Template(Json::array({Seq("A")}), Json::array({Seq("A")}), Json::object()), &path);
    EXPECT_THAT(error, HasSubstr("post_processor.pair must use both sequences"));
  }
  {
    const std::string error =
        PostProcessorLoadError(Template(Json::array({"$A"}), nullptr, Json::object()), &path);
    EXPECT_THAT(error, HasSubstr("post_processor.single[0] is \"$A\"; expected {\"Sequence\""));
  }
  {
    const std::string error = PostProcessorLoadError(Json{{"type", "BertProcessing"},
                                             {"sep", Json::array({"</s>"})},
                                             {"cls", Json::array({"<s>", 1})}},
                                        &path);
    EXPECT_THAT(error,
                HasSubstr(path + ": post_processor.sep is [\"</s>\"]; expected [token, id]"));
  }
  {
    const std::string error =
        PostProcessorLoadError(Json{{"type", "ByteLevel"}, {"trim_offsets", "yes"}}, &path);
    EXPECT_THAT(error, HasSubstr("post_processor.trim_offsets is \"yes\"; expected a boolean"));
  }
}

}  // namespace
}  // namespace e3
