// Tokenizer families beyond byte-level BPE with known splits, against HF
// tokenizers: SentencePiece-style BPE (Llama 2's normalizer pipeline,
// Metaspace "first" and "always"+split, Gemma's), and byte-level BPE
// behind DeepSeek-V3's, o200k's, cl100k's (possessive quantifiers) and
// Tekken's Split regexes (Oniguruma). The tokenizer.json files and the
// expected encodings of a million-character corpus come from
// tests/golden/make_tokenizer_families.py, run with `tokenizers` on the GPU
// machine. E3_TOKENIZER_FAMILIES_DIR points the test at a larger corpus
// made by the same script (--chars, --out), which is not committed.
//
// Post-processors: each family's file carries its published
// post_processor, and the expectations hold HF's
// encode(text, add_special_tokens=True) (first lines and pairs in full,
// every line by hashes); "variants" put the other post-processor types on
// a family's file. Made by the same script (--post_processors_only); a
// fixture without these records skips those tests, saying so.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/base/fnv1a.h"
#include "common/base/line_reader.h"
#include "common/text/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/text/char_offsets.h"

namespace e3 {
namespace {

using Json = nlohmann::json;

std::string FixtureDir() {
  const char* dir = std::getenv("E3_TOKENIZER_FAMILIES_DIR");
  if (dir != nullptr && *dir != '\0') return std::string(dir) + "/";
  return std::string(E3_SOURCE_DIR) + "/tests/fixtures/tokenizers/";
}
const std::string kFamilyDir = FixtureDir();

std::vector<std::string> ReadGzipLines(const std::string& path) {
  auto reader = LineReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> out;
  if (!reader.ok()) return out;
  std::string line;
  while ((*reader)->Next(&line)) out.push_back(line);
  EXPECT_TRUE((*reader)->status().ok()) << (*reader)->status();
  return out;
}

std::string Hex(uint64_t h) {
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string FamilyJson(const std::string& name) {
  std::string text;
  for (const std::string& line : ReadGzipLines(kFamilyDir + name + ".json.gz")) text += line + "\n";
  return text;
}

// A tokenizer.json text, written to a temporary file for FromFile.
std::unique_ptr<Tokenizer> LoadText(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/e3_" + name + "_tokenizer.json";
  std::ofstream(path, std::ios::binary) << text;
  auto tok = Tokenizer::FromFile(path);
  std::remove(path.c_str());
  EXPECT_TRUE(tok.ok()) << name << ": " << tok.status();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

// The family's tokenizer.json, unpacked to a temporary file for FromFile.
std::unique_ptr<Tokenizer> LoadFamily(const std::string& name) { return LoadText(name, FamilyJson(name)); }

std::vector<std::vector<size_t>> OffsetRows(const Encoding& enc) {
  std::vector<std::vector<size_t>> rows;
  for (const auto& [b, e] : enc.offsets) rows.push_back({b, e});
  return rows;
}

// enc's offsets widened to whole characters of `text` (HF counts
// characters: a byte-fallback token covers its whole character there);
// the post-processor's (0, 0) stay.
Encoding Widened(const std::string& text, Encoding enc) {
  const auto wide = testing::CharOffsets(text, enc);
  for (size_t k = 0; k < enc.offsets.size(); ++k) {
    if (enc.offsets[k] != std::make_pair<size_t, size_t>(0, 0)) enc.offsets[k] = wide[k];
  }
  return enc;
}

// The same for a pair: each sequence's run of tokens (found as the run
// that equals that text encoded alone) widened within its own text.
Encoding WidenedPair(const Tokenizer& tok, const std::string& a, const std::string& b, Encoding enc) {
  for (const std::string* text : {&a, &b}) {
    const Encoding alone = tok.Encode(*text, EncodeOptions{/*add_special_tokens=*/false});
    const Encoding wide = Widened(*text, alone);
    const size_t n = alone.ids.size();
    for (size_t at = 0; n > 0 && at + n <= enc.ids.size(); ++at) {
      if (std::equal(alone.ids.begin(), alone.ids.end(), enc.ids.begin() + at) &&
          std::equal(alone.offsets.begin(), alone.offsets.end(), enc.offsets.begin() + at)) {
        std::copy(wide.offsets.begin(), wide.offsets.end(), enc.offsets.begin() + at);
        break;
      }
    }
  }
  return enc;
}

// HF's encode(text, add_special_tokens=...) as `record` ("special" or
// "plain": first lines in full, byte offsets; every line by hashes per
// `chunk` lines) and its pairs, against Encode(text, options)/EncodePair.
void CheckPostProcessed(const std::string& name, const Tokenizer& tok, const Json& record,
                        const std::vector<std::string>& lines, size_t chunk) {
  for (const char* key : {"special", "plain"}) {
    if (!record.contains(key)) continue;
    const EncodeOptions options{/*add_special_tokens=*/std::string(key) == "special"};
    const Json& want = record[key];
    for (size_t i = 0; i < want["full"].size(); ++i) {
      const Encoding enc = Widened(lines[i], tok.Encode(lines[i], options));
      EXPECT_EQ(enc.ids, want["full"][i]["ids"].get<std::vector<int32_t>>()) << name << " " << key << " line " << i;
      EXPECT_EQ(OffsetRows(enc), want["full"][i]["offsets"].get<std::vector<std::vector<size_t>>>())
          << name << " " << key << " line " << i;
    }
    const Json& chunks = want["chunks"];
    ASSERT_EQ(chunks.size(), (lines.size() + chunk - 1) / chunk) << name;
    int bad = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      uint64_t h_ids = kFnv1aOffset, h_off = h_ids;
      int64_t n = 0;
      for (size_t i = c * chunk; i < std::min(lines.size(), (c + 1) * chunk); ++i) {
        const Encoding enc = Widened(lines[i], tok.Encode(lines[i], options));
        n += static_cast<int64_t>(enc.ids.size());
        std::string ids, offs;
        for (size_t k = 0; k < enc.ids.size(); ++k) {
          ids += (k ? "," : "") + std::to_string(enc.ids[k]);
          offs += (k ? "," : "") + std::to_string(enc.offsets[k].first) + "-" + std::to_string(enc.offsets[k].second);
        }
        h_ids = Fnv1a(ids + ";", h_ids);
        h_off = Fnv1a(offs + ";", h_off);
      }
      if ((n != chunks[c][0].get<int64_t>() || Hex(h_ids) != chunks[c][1] || Hex(h_off) != chunks[c][2]) && ++bad <= 3) {
        ADD_FAILURE() << name << " " << key << ": lines " << c * chunk << ".." << (c + 1) * chunk - 1
                      << " differ from HF (tokens " << n << " vs " << chunks[c][0] << ", ids "
                      << (Hex(h_ids) == chunks[c][1] ? "same" : "differ") << ", offsets "
                      << (Hex(h_off) == chunks[c][2] ? "same" : "differ") << ")";
      }
    }
    EXPECT_EQ(bad, 0) << name << " " << key;
  }
  for (const Json& pair : record["pairs"]) {
    const size_t a = pair["a"].get<size_t>(), b = pair["b"].get<size_t>();
    auto enc = tok.EncodePair(lines[a], lines[b], EncodeOptions{/*add_special_tokens=*/true});
    ASSERT_TRUE(enc.ok()) << name << ": " << enc.status();
    EXPECT_EQ(enc->ids, pair["ids"].get<std::vector<int32_t>>()) << name << " pair " << a << "," << b;
    // Null where HF gave an offset past its token's own text (the
    // generator says which): those pairs compare their ids only.
    if (pair["offsets"].is_null()) continue;
    EXPECT_EQ(OffsetRows(WidenedPair(tok, lines[a], lines[b], *enc)),
              pair["offsets"].get<std::vector<std::vector<size_t>>>())
        << name << " pair " << a << "," << b;
  }
}

constexpr char kNoPostProcessorRecords[] =
    "expected.json.gz has no post-processor records; make them with "
    "tests/golden/make_tokenizer_families.py --post_processors_only on the GPU machine";

class TokenizerFamiliesTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    std::string text;
    for (const std::string& line : ReadGzipLines(kFamilyDir + "expected.json.gz")) text += line + "\n";
    expected_ = new Json(Json::parse(text));
    corpus_ = new std::vector<std::string>();
    for (const std::string& line : ReadGzipLines(kFamilyDir + "corpus.jsonl.gz")) {
      corpus_->push_back(Json::parse(line).get<std::string>());
    }
  }
  static Json* expected_;
  static std::vector<std::string>* corpus_;
};
Json* TokenizerFamiliesTest::expected_ = nullptr;
std::vector<std::string>* TokenizerFamiliesTest::corpus_ = nullptr;

TEST_P(TokenizerFamiliesTest, CorpusMatchesHfTokenizers) {
  const std::string name = GetParam();
  ASSERT_TRUE(expected_->at("families").contains(name)) << name;
  const Json& want = (*expected_)["families"][name];
  std::unique_ptr<Tokenizer> tok = LoadFamily(name);
  ASSERT_NE(tok, nullptr);
  const std::vector<std::string>& lines = *corpus_;
  ASSERT_EQ(static_cast<int64_t>(lines.size()), expected_->at("lines").get<int64_t>());

  // Whole first lines, for a readable diff.
  const Json& full = want["full"];
  for (size_t i = 0; i < full.size(); ++i) {
    const Encoding enc = tok->Encode(lines[i]);
    EXPECT_EQ(enc.ids, full[i]["ids"].get<std::vector<int32_t>>()) << name << " line " << i << ": " << lines[i];
    std::vector<std::vector<size_t>> offsets;
    for (const auto& [b, e] : testing::CharOffsets(lines[i], enc)) offsets.push_back({b, e});
    EXPECT_EQ(offsets, full[i]["offsets"].get<std::vector<std::vector<size_t>>>()) << name << " line " << i;
    EXPECT_EQ(tok->Decode(enc.ids), full[i]["decoded"].get<std::string>()) << name << " line " << i;
    EXPECT_EQ(tok->Decode(enc.ids, /*skip_special_tokens=*/true), full[i]["decoded_skip"].get<std::string>())
        << name << " line " << i;
  }

  // Every line, by hashes per chunk; encoding timed alone.
  std::vector<Encoding> encodings;
  double seconds = 1e30;
  for (int round = 0; round < 3; ++round) {  // best of three, as the HF timing
    encodings.clear();
    encodings.reserve(lines.size());
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& line : lines) encodings.push_back(tok->Encode(line));
    seconds = std::min(seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const size_t chunk = expected_->at("chunk").get<size_t>();
  const Json& chunks = want["chunks"];
  ASSERT_EQ(chunks.size(), (lines.size() + chunk - 1) / chunk);
  int bad_chunks = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    uint64_t h_ids = kFnv1aOffset, h_off = h_ids, h_dec = h_ids;
    int64_t n = 0;
    for (size_t i = c * chunk; i < std::min(lines.size(), (c + 1) * chunk); ++i) {
      const Encoding& enc = encodings[i];
      const auto offsets = testing::CharOffsets(lines[i], enc);
      n += static_cast<int64_t>(enc.ids.size());
      std::string ids, offs;
      for (size_t k = 0; k < enc.ids.size(); ++k) {
        ids += (k ? "," : "") + std::to_string(enc.ids[k]);
        offs += (k ? "," : "") + std::to_string(offsets[k].first) + "-" + std::to_string(offsets[k].second);
      }
      h_ids = Fnv1a(ids + ";", h_ids);
      h_off = Fnv1a(offs + ";", h_off);
      h_dec = Fnv1a(tok->Decode(enc.ids) + ";", h_dec);
    }
    const bool same = n == chunks[c][0].get<int64_t>() && Hex(h_ids) == chunks[c][1] && Hex(h_off) == chunks[c][2] &&
                      Hex(h_dec) == chunks[c][3];
    if (!same && ++bad_chunks <= 3) {
      ADD_FAILURE() << name << ": lines " << c * chunk << ".." << (c + 1) * chunk - 1 << " differ from HF (tokens "
                    << n << " vs " << chunks[c][0] << ", ids " << (Hex(h_ids) == chunks[c][1] ? "same" : "differ")
                    << ", offsets " << (Hex(h_off) == chunks[c][2] ? "same" : "differ") << ", decoded "
                    << (Hex(h_dec) == chunks[c][3] ? "same" : "differ") << ")";
    }
  }
  EXPECT_EQ(bad_chunks, 0) << name;
  const double chars = expected_->at("chars").get<double>();
  std::printf("{\"bench\": \"tokenizer_encode\", \"family\": \"%s\", \"impl\": \"e3\", \"lines\": %zu, "
              "\"chars\": %.0f, \"tokens\": %ld, \"seconds\": %.4f, \"m_chars_per_s\": %.3f}\n",
              name.c_str(), lines.size(), chars, static_cast<long>(want["tokens"].get<int64_t>()), seconds,
              chars / seconds / 1e6);
}

TEST_P(TokenizerFamiliesTest, PostProcessorMatchesHfTokenizers) {
  const std::string name = GetParam();
  const Json& want = (*expected_)["families"][name];
  if (!want.contains("special")) GTEST_SKIP() << kNoPostProcessorRecords;
  std::unique_ptr<Tokenizer> tok = LoadFamily(name);
  ASSERT_NE(tok, nullptr);
  CheckPostProcessed(name, *tok, want, *corpus_, expected_->at("special_chunk").get<size_t>());
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerFamiliesTest,
                         ::testing::Values("llama2", "metaspace_first", "metaspace_split", "gemma", "deepseek_v3",
                                           "gpt_oss", "cl100k", "tekken"));

// The other post-processor types, each on a family's file: the family's
// tokenizer.json with the variant's post_processor and added tokens.
class PostProcessorVariantsTest : public TokenizerFamiliesTest {};

TEST_P(PostProcessorVariantsTest, MatchesHfTokenizers) {
  const std::string name = GetParam();
  if (!expected_->contains("variants")) GTEST_SKIP() << kNoPostProcessorRecords;
  ASSERT_TRUE((*expected_)["variants"].contains(name)) << name;
  const Json& want = (*expected_)["variants"][name];
  Json spec = Json::parse(FamilyJson(want["family"].get<std::string>()));
  spec["post_processor"] = want["post_processor"];
  spec["added_tokens"] = want["added_tokens"];
  std::unique_ptr<Tokenizer> tok = LoadText(name, spec.dump());
  ASSERT_NE(tok, nullptr);
  CheckPostProcessed(name, *tok, want, *corpus_, expected_->at("special_chunk").get<size_t>());
}

INSTANTIATE_TEST_SUITE_P(Variants, PostProcessorVariantsTest,
                         ::testing::Values("gpt2_trim", "trim_prefix", "roberta", "bert", "template_multi",
                                           "sequence_trim_last"));

}  // namespace
}  // namespace e3
