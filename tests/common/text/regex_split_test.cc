// Split behaviours and Oniguruma matching as HF tokenizers defines them,
// and the normalizers' text and alignment.
#include "common/text/regex_split.h"

#include <chrono>
#include <cstdio>

#include "common/base/line_reader.h"
#include "common/text/normalizer.h"
#include "common/text/pretokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace e3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Pieces(const std::string& pattern, bool regex, SplitBehavior b, bool invert,
                                const std::string& text) {
  auto s = RegexSplitter::Create(pattern, regex, b, invert);
  EXPECT_TRUE(s.ok()) << s.status();
  std::vector<std::pair<size_t, size_t>> ranges;
  (*s)->Split(text, &ranges);
  std::vector<std::string> out;
  for (const auto& [begin, end] : ranges) out.push_back(text.substr(begin, end - begin));
  return out;
}

TEST(RegexSplitTest, EveryBehaviour) {
  const std::string t = "a-b--c";
  EXPECT_THAT(Pieces("-", false, SplitBehavior::kRemoved, false, t), ElementsAre("a", "b", "c"));
  EXPECT_THAT(Pieces("-", false, SplitBehavior::kIsolated, false, t), ElementsAre("a", "-", "b", "-", "-", "c"));
  EXPECT_THAT(Pieces("-", false, SplitBehavior::kMergedWithPrevious, false, t), ElementsAre("a-", "b-", "-", "c"));
  EXPECT_THAT(Pieces("-", false, SplitBehavior::kMergedWithNext, false, t), ElementsAre("a", "-b", "-", "-c"));
  EXPECT_THAT(Pieces("-", false, SplitBehavior::kContiguous, false, t), ElementsAre("a", "-", "b", "--", "c"));
  // invert: the pattern marks what is kept apart.
  EXPECT_THAT(Pieces("-", false, SplitBehavior::kRemoved, true, t), ElementsAre("-", "-", "-"));
}

TEST(RegexSplitTest, UnicodeClassesAndEmptyMatches) {
  EXPECT_THAT(Pieces("\\p{N}{1,3}", true, SplitBehavior::kIsolated, false, "12345ab\xd9\xa3"),
              ElementsAre("123", "45", "ab", "\xd9\xa3"));
  // An empty match right after the previous match moves on one character.
  auto s = RegexSplitter::Create("x*", true, SplitBehavior::kIsolated, false);
  ASSERT_TRUE(s.ok());
  std::vector<std::pair<size_t, size_t>> matches;
  (*s)->FindMatches("abx", &matches);
  EXPECT_THAT(matches, ElementsAre(std::make_pair(0u, 0u), std::make_pair(1u, 1u), std::make_pair(2u, 3u)));
  EXPECT_THAT(Pieces("x*", true, SplitBehavior::kIsolated, false, "abx"), ElementsAre("a", "b", "x"));
  // Not UTF-8: one piece, never a crash.
  EXPECT_THAT(Pieces("\\s+", true, SplitBehavior::kIsolated, false, "a \xff b"), ElementsAre("a \xff b"));
}

TEST(RegexSplitTest, BadRegexAndBehaviour) {
  auto s = RegexSplitter::Create("(a", true, SplitBehavior::kIsolated, false);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("the regex does not compile"));
  EXPECT_FALSE(SplitBehaviorFromName("Sideways").ok());
  EXPECT_EQ(*SplitBehaviorFromName("MergedWithNext"), SplitBehavior::kMergedWithNext);
}

// The three patterns the tokenizer splits with hand-written matchers give
// Oniguruma's pieces on the million-character corpus of the tokenizer
// fixtures; the matchers stay because they are faster (printed).
TEST(RegexSplitTest, KnownPatternMatchersEqualOniguruma) {
  auto reader = LineReader::Open(std::string(E3_SOURCE_DIR) + "/tests/fixtures/tokenizers/corpus.jsonl.gz");
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> lines;
  for (std::string line; (*reader)->Next(&line);) lines.push_back(nlohmann::json::parse(line).get<std::string>());
  ASSERT_GT(lines.size(), 3000u);
  const std::pair<SplitPattern, std::string_view> patterns[] = {
      {SplitPattern::kGpt2, kGpt2Regex}, {SplitPattern::kLlama3, kLlama3Regex}, {SplitPattern::kQwen2, kQwen2Regex}};
  for (const auto& [known, regex] : patterns) {
    auto onig = RegexSplitter::Create(std::string(regex), true, SplitBehavior::kIsolated, false);
    ASSERT_TRUE(onig.ok()) << onig.status();
    std::vector<std::pair<size_t, size_t>> a, b;
    size_t differ = 0;
    double known_s = 0, onig_s = 0;
    for (const std::string& line : lines) {
      a.clear();
      b.clear();
      auto t0 = std::chrono::steady_clock::now();
      SplitByPattern(known, line, &a);
      auto t1 = std::chrono::steady_clock::now();
      (*onig)->Split(line, &b);
      auto t2 = std::chrono::steady_clock::now();
      known_s += std::chrono::duration<double>(t1 - t0).count();
      onig_s += std::chrono::duration<double>(t2 - t1).count();
      if (a != b && ++differ <= 3) ADD_FAILURE() << std::string(regex).substr(0, 30) << "... differs on: " << line;
    }
    EXPECT_EQ(differ, 0u);
    std::printf("pattern %.30s...: hand-written %.3f s, Oniguruma %.3f s over %zu lines\n", std::string(regex).c_str(),
                known_s, onig_s, lines.size());
  }
}

std::unique_ptr<Normalizer> MakeNormalizer(const char* json) {
  auto n = Normalizer::FromJson("tokenizer.json", "normalizer", nlohmann::json::parse(json));
  EXPECT_TRUE(n.ok()) << n.status();
  return n.ok() ? std::move(n).value() : nullptr;
}

TEST(NormalizerTest, Llama2PrependAndReplaceKeepAlignment) {
  auto n = MakeNormalizer(R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})");
  NormalizedText t("a b");
  n->Apply(&t);
  EXPECT_EQ(t.text, "\xe2\x96\x81" "a" "\xe2\x96\x81" "b");
  ASSERT_EQ(t.align.size(), 8u);
  EXPECT_EQ(t.Of(0), std::make_pair(0u, 1u));  // the prepended piece comes from "a"
  EXPECT_EQ(t.Of(3), std::make_pair(0u, 1u));
  EXPECT_EQ(t.Of(5), std::make_pair(1u, 2u));  // the space's replacement
  EXPECT_EQ(t.Of(7), std::make_pair(2u, 3u));
}

TEST(NormalizerTest, NfcRegexReplaceAndStrip) {
  auto nfc = MakeNormalizer(R"({"type": "NFC"})");
  NormalizedText e("e\xcc\x81!");  // e + combining acute
  nfc->Apply(&e);
  EXPECT_EQ(e.text, "\xc3\xa9!");
  EXPECT_EQ(e.Of(0), std::make_pair(0u, 1u));  // a composed character maps to its first part, as HF's
  EXPECT_EQ(e.Of(2), std::make_pair(3u, 4u));
  auto regex = MakeNormalizer(R"({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "})");
  NormalizedText r("a   b");
  regex->Apply(&r);
  EXPECT_EQ(r.text, "a b");
  EXPECT_EQ(r.Of(1), std::make_pair(1u, 4u));
  auto strip = MakeNormalizer(R"({"type": "Strip", "strip_left": true, "strip_right": false})");
  NormalizedText s("  x ");
  strip->Apply(&s);
  EXPECT_EQ(s.text, "x ");
  EXPECT_EQ(s.Of(0), std::make_pair(2u, 3u));
  NormalizedText same("plain");
  nfc->Apply(&same);
  EXPECT_TRUE(same.identity);
}

TEST(NormalizerTest, UnsupportedNamesTheComponent) {
  auto n = Normalizer::FromJson("/m/tokenizer.json", "normalizer.normalizers[1]",
                                nlohmann::json::parse(R"({"type": "BertNormalizer"})"));
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(std::string(n.status().message()),
              HasSubstr("/m/tokenizer.json: normalizer.normalizers[1] is {\"type\":\"BertNormalizer\"}"));
  auto null = Normalizer::FromJson("t", "normalizer", nlohmann::json());
  ASSERT_TRUE(null.ok());
  EXPECT_EQ(*null, nullptr);
}

}  // namespace
}  // namespace e3
