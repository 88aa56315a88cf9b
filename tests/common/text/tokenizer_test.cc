// The tokenizer against HF `tokenizers`: full parity on the bundled
// tiny-code-llama over every training conversation (fixtures made by
// tests/golden/make_tokenizer_fixture.py with transformers 5.17 /
// tokenizers 0.23.2), plus the regex splitting rules, the other
// pre-tokenizer paths and the errors, on small tokenizer.json files.
#include "common/text/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/base/fnv1a.h"
#include "common/text/chat_template.h"
#include "common/text/pretokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/text/byte_char.h"
#include "tests/common/text/char_offsets.h"
#include "tests/common/text/temp_file.h"
#include "tests/source_path.h"

namespace e3 {
namespace {

using Json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::SourcePath;

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<ChatMessage> ParseConversation(const std::string& line) {
  const Json j = Json::parse(line, nullptr, false);
  std::vector<ChatMessage> messages;
  if (j.is_discarded()) return messages;
  for (const Json& m : j["conversations"]) {
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return messages;
}

// FNV-1a-64 of the ids as little-endian int32 bytes, as the fixture hashes.
uint64_t Fnv1a64(const std::vector<int32_t>& ids) {
  std::string bytes;
  for (int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>((u >> (8 * b)) & 0xFF));
  }
  return e3::Fnv1a(bytes);
}

// A scratch file that removes itself.
using testing::TempFile;

class TinyCodeLlamaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = Tokenizer::FromFile(SourcePath("examples/tiny-code-llama/tokenizer.json"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  static Tokenizer* tokenizer_;
};
Tokenizer* TinyCodeLlamaTest::tokenizer_ = nullptr;

TEST_F(TinyCodeLlamaTest, VocabSizeAndTokenLookup) {
  EXPECT_EQ(tokenizer_->vocab_size(), 8192);
  EXPECT_EQ(tokenizer_->TokenToId("<|eot_id|>"), 4);
  EXPECT_EQ(tokenizer_->IdToToken(0), "<|begin_of_text|>");
  EXPECT_EQ(tokenizer_->TokenToId("no such token"), std::nullopt);
  EXPECT_EQ(tokenizer_->IdToToken(1 << 20), std::nullopt);
}

// Every training conversation: token count and hash of the ids.
TEST_F(TinyCodeLlamaTest, ParityWithHfOnAllTrainConversations) {
  auto chat = ChatTemplate::Load(SourcePath("examples/tiny-code-llama"), {});
  ASSERT_TRUE(chat.ok()) << chat.status();
  const std::vector<std::string> convs =
      ReadLines(SourcePath("examples/data/train_conversations.jsonl"));
  const std::vector<std::string> expected =
      ReadLines(SourcePath("tests/fixtures/tokenizer_parity.tsv"));
  ASSERT_EQ(convs.size(), 2999u);

  std::vector<std::string> texts;
  size_t bytes = 0;
  for (const std::string& line : convs) {
    auto rendered = chat->Render(ParseConversation(line), /*add_generation_prompt=*/false);
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    bytes += rendered->text.size();
    texts.push_back(std::move(rendered->text));
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& text : texts) ids.push_back(tokenizer_->Encode(text).ids);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  int matched = 0, compared = 0;
  for (const std::string& row : expected) {
    if (row.empty() || row[0] == '#') continue;
    size_t index, count;
    char hash[32];
    ASSERT_EQ(std::sscanf(row.c_str(), "%zu\t%zu\t%31s", &index, &count, hash), 3) << row;
    ASSERT_LT(index, ids.size());
    ++compared;
    char got[32];
    std::snprintf(got, sizeof(got), "%016llx",
                  static_cast<unsigned long long>(Fnv1a64(ids[index])));
    if (ids[index].size() == count && std::string(got) == hash) {
      ++matched;
    } else {
      ADD_FAILURE() << "conversation " << index << ": " << ids[index].size() << " tokens, hash "
                    << got << "; HF: " << count << " tokens, hash " << hash;
    }
  }
  std::cout << "[parity] " << matched << " of " << compared << " conversations match HF; encoded "
            << bytes / 1e6 << " MB in " << seconds << " s\n";
  EXPECT_EQ(compared, 2999);
  EXPECT_EQ(matched, compared);
}

// Full ids for the first conversations and eval prompts, for readable diffs.
TEST_F(TinyCodeLlamaTest, HeadFixtureIdsMatchHf) {
  auto chat = ChatTemplate::Load(SourcePath("examples/tiny-code-llama"), {});
  ASSERT_TRUE(chat.ok()) << chat.status();
  const std::vector<std::string> train =
      ReadLines(SourcePath("examples/data/train_conversations.jsonl"));
  const std::vector<std::string> eval = ReadLines(SourcePath("examples/data/eval_prompts.jsonl"));
  int checked = 0;
  for (const std::string& line : ReadLines(SourcePath("tests/fixtures/tokenizer_head.jsonl"))) {
    const Json row = Json::parse(line);
    const auto index = row["index"].get<size_t>();
    const std::vector<std::string>& source = row["source"] == "train" ? train : eval;
    ASSERT_LT(index, source.size());
    auto rendered =
        chat->Render(ParseConversation(source[index]), row["generation_prompt"].get<bool>());
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(tokenizer_->Encode(rendered->text).ids, row["ids"].get<std::vector<int32_t>>())
        << row["source"] << " " << index;
    ++checked;
  }
  EXPECT_EQ(checked, 60);
}

TEST_F(TinyCodeLlamaTest, PlainTextMatchesHfAndRoundTrips) {
  int checked = 0;
  for (const std::string& line : ReadLines(SourcePath("tests/fixtures/tokenizer_plain.jsonl"))) {
    const Json row = Json::parse(line);
    const auto text = row["text"].get<std::string>();
    const Encoding enc = tokenizer_->Encode(text);
    EXPECT_EQ(enc.ids, row["ids"].get<std::vector<int32_t>>()) << text;
    EXPECT_EQ(tokenizer_->Decode(enc.ids), row["decoded"].get<std::string>()) << text;
    // Offsets tile the text: no prefix space or normalizer here.
    ASSERT_EQ(enc.offsets.size(), enc.ids.size());
    size_t pos = 0;
    for (const auto& [begin, end] : enc.offsets) {
      EXPECT_EQ(begin, pos) << text;
      EXPECT_GT(end, begin) << text;
      pos = end;
    }
    EXPECT_EQ(pos, text.size()) << text;
    ++checked;
  }
  EXPECT_EQ(checked, 11);
}

TEST_F(TinyCodeLlamaTest, DecodeSkipsSpecialTokensOnRequest) {
  const std::string text = "<|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>";
  const Encoding enc = tokenizer_->Encode(text);
  EXPECT_EQ(enc.ids.front(), 2);
  EXPECT_EQ(enc.ids.back(), 4);
  EXPECT_EQ(enc.offsets.back(), std::make_pair(text.size() - 10, text.size()));
  EXPECT_EQ(tokenizer_->Decode(enc.ids), text);
  EXPECT_EQ(tokenizer_->Decode(enc.ids, /*skip_special_tokens=*/true), "user\n\nhi there");
}

TEST_F(TinyCodeLlamaTest, DecodeRoundTripsArbitraryBytes) {
  std::string all_valid;
  for (char32_t cp : {U'a', U'\u00e9', U'\u4e2d', U'\U0001F600', U'\u3000', U' ', U'\n'}) {
    std::string s;
    // A tiny UTF-8 encoder, independent of the one under test.
    if (cp < 0x80) {
      s = std::string(1, static_cast<char>(cp));
    } else if (cp < 0x800) {
      s = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    } else if (cp < 0x10000) {
      s = {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
           static_cast<char>(0x80 | (cp & 0x3F))};
    } else {
      s = {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
           static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    all_valid += s + s + " x" + s;
  }
  EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(all_valid).ids), all_valid);
  // Invalid UTF-8 still encodes, byte by byte; decoding replaces it with
  // U+FFFD as HF's from_utf8_lossy does.
  const std::string invalid = "ok\xff\xfe done \xe4\xb8";
  const Encoding enc = tokenizer_->Encode(invalid);
  EXPECT_FALSE(enc.ids.empty());
  EXPECT_EQ(tokenizer_->Decode(enc.ids), "ok\xef\xbf\xbd\xef\xbf\xbd done \xef\xbf\xbd");
}

// The word cache is shared across threads; results must not depend on who
// filled it.
TEST_F(TinyCodeLlamaTest, ConcurrentEncodesAgree) {
  const std::vector<std::string> lines = ReadLines(SourcePath("examples/data/eval_prompts.jsonl"));
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& line : lines) expected.push_back(tokenizer_->Encode(line).ids);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < lines.size(); ++i) {
        const size_t k = (i + t * 7) % lines.size();
        if (tokenizer_->Encode(lines[k]).ids != expected[k]) ++mismatches;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Random text, valid UTF-8 or not, never breaks encoding: offsets stay in
// range and in order, and valid text decodes back to itself.
TEST_F(TinyCodeLlamaTest, RandomTextRoundTrips) {
  std::mt19937 rng(1234);
  const std::vector<std::string> alphabet = {
      "a",          "Z",  "7",      " ",      "  ",     "\n",         "\t",
      "'",          "'s", "\u00e9", "\u3000", "\u4e2d", "\U0001F600", "e\u0301",
      "<|eot_id|>", "<|", "_",      "!?",     "\r\n",   "\u00a0"};
  for (int round = 0; round < 2000; ++round) {
    std::string text;
    const int n = static_cast<int>(rng() % 24);
    const bool corrupt = round % 3 == 0;
    for (int i = 0; i < n; ++i) {
      if (corrupt && rng() % 5 == 0) {
        text.push_back(static_cast<char>(0x80 + rng() % 128));
      } else {
        text += alphabet[rng() % alphabet.size()];
      }
    }
    const Encoding enc = tokenizer_->Encode(text);
    ASSERT_EQ(enc.ids.size(), enc.offsets.size());
    size_t last = 0;
    for (const auto& [b, e] : enc.offsets) {
      ASSERT_LE(last, b) << text;
      ASSERT_LT(b, e) << text;
      ASSERT_LE(e, text.size()) << text;
      last = e;
    }
    if (!corrupt) {
      ASSERT_EQ(tokenizer_->Decode(enc.ids), text);
    }
  }
}

// --- Regex splitting --------------------------------------------------------

std::vector<std::string> Split(SplitPattern pattern, const std::string& text) {
  std::vector<std::pair<size_t, size_t>> ranges;
  SplitByPattern(pattern, text, &ranges);
  std::vector<std::string> pieces;
  for (const auto& [b, e] : ranges) pieces.push_back(text.substr(b, e - b));
  return pieces;
}

TEST(SplitPatternTest, RecognisesKnownPatternsOnly) {
  EXPECT_EQ(SplitPatternFromRegex(kGpt2Regex), SplitPattern::kGpt2);
  EXPECT_EQ(SplitPatternFromRegex(kLlama3Regex), SplitPattern::kLlama3);
  EXPECT_EQ(SplitPatternFromRegex(kQwen2Regex), SplitPattern::kQwen2);
  EXPECT_EQ(SplitPatternFromRegex("\\s+"), std::nullopt);
}

TEST(SplitPatternTest, Gpt2) {
  const auto p = SplitPattern::kGpt2;
  EXPECT_THAT(Split(p, "Hello world"), ElementsAre("Hello", " world"));
  // \s+(?!\S) backtracks one space so that the last joins the word.
  EXPECT_THAT(Split(p, "a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Split(p, "a   "), ElementsAre("a", "   "));
  // Only a plain space joins what follows; a lone tab before a word is \s+.
  EXPECT_THAT(Split(p, "\tb\t\tc"), ElementsAre("\t", "b", "\t", "\t", "c"));
  EXPECT_THAT(Split(p, "x\n\ny"), ElementsAre("x", "\n", "\n", "y"));
  EXPECT_THAT(Split(p, "don't DON'T we've"),
              ElementsAre("don", "'t", " DON", "'", "T", " we", "'ve"));
  EXPECT_THAT(Split(p, " 123abc 3.14"), ElementsAre(" 123", "abc", " 3", ".", "14"));
  EXPECT_THAT(Split(p, "f(x)**2 ->"), ElementsAre("f", "(", "x", ")**", "2", " ->"));
  // U+3000 IDEOGRAPHIC SPACE is \s; U+00E9 a letter; U+00B2 a number.
  EXPECT_THAT(Split(p, "  \u3000x caf\u00e9 x\u00b2"),
              ElementsAre("  ", "\u3000", "x", " caf\u00e9", " x", "\u00b2"));
  // Invalid bytes are "other" characters, one per byte.
  EXPECT_THAT(Split(p, "a\xff\xfe b"), ElementsAre("a", "\xff\xfe", " b"));
  EXPECT_THAT(Split(p, ""), ElementsAre());
}

TEST(SplitPatternTest, Llama3) {
  const auto p = SplitPattern::kLlama3;
  EXPECT_THAT(Split(p, "Hello world"), ElementsAre("Hello", " world"));
  // Contractions ignore case (U+017F LONG S folds to s).
  EXPECT_THAT(Split(p, "I'M he'S it'\u017f"),
              ElementsAre("I", "'M", " he", "'S", " it", "'\u017f"));
  // One non-letter, non-digit, non-newline character may lead a word.
  EXPECT_THAT(Split(p, "$hello \tword _x"), ElementsAre("$hello", " ", "\tword", " _", "x"));
  EXPECT_THAT(Split(p, "\nword"), ElementsAre("\n", "word"));
  EXPECT_THAT(Split(p, "12345 6"), ElementsAre("123", "45", " ", "6"));
  // Punctuation keeps trailing newlines; \s*[\r\n]+ stops after the last
  // newline of a space run.
  EXPECT_THAT(Split(p, "foo.\n\nbar"), ElementsAre("foo", ".\n\n", "bar"));
  EXPECT_THAT(Split(p, "a \n  b"), ElementsAre("a", " \n", " ", " b"));
  EXPECT_THAT(Split(p, "x\r\n\r\n  "), ElementsAre("x", "\r\n\r\n", "  "));
  EXPECT_THAT(Split(p, " !!) x"), ElementsAre(" !!)", " x"));
  EXPECT_THAT(Split(p, "a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Split(p, "'hello'"), ElementsAre("'hello", "'"));
  EXPECT_THAT(Split(p, "a\xff\xfe b"), ElementsAre("a", "\xff\xfe", " b"));
}

TEST(SplitPatternTest, Qwen2SplitsDigitsOneByOne) {
  EXPECT_THAT(Split(SplitPattern::kQwen2, "x12345"), ElementsAre("x", "1", "2", "3", "4", "5"));
  EXPECT_THAT(Split(SplitPattern::kQwen2, "I'LL go"), ElementsAre("I", "'LL", " go"));
}

// --- Small synthetic tokenizers ---------------------------------------------

using testing::ByteChar;

// Vocab: the 256 byte tokens with id = byte value, then the merges' results
// from id 256 on, in merge order; then the added token "<|eot_id|>", whose
// id is the vocab size (HF numbers added tokens past the vocab).
Json TinyTokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(static_cast<uint8_t>(b))] = b;
  Json merge_list = Json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    merge_list.push_back(Json::array({a, b}));
  }
  return Json{{"version", "1.0"},
              {"added_tokens", Json::array({Json{{"id", next},
                                                 {"content", "<|eot_id|>"},
                                                 {"single_word", false},
                                                 {"lstrip", false},
                                                 {"rstrip", false},
                                                 {"normalized", false},
                                                 {"special", true}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               Json{{"type", "Sequence"},
                    {"pretokenizers",
                     Json::array({Json{{"type", "Split"},
                                       {"pattern", Json{{"Regex", std::string(kLlama3Regex)}}},
                                       {"behavior", "Isolated"},
                                       {"invert", false}},
                                  Json{{"type", "ByteLevel"},
                                       {"add_prefix_space", false},
                                       {"trim_offsets", true},
                                       {"use_regex", false}}})}}},
              {"decoder", Json{{"type", "ByteLevel"},
                               {"add_prefix_space", true},
                               {"trim_offsets", true},
                               {"use_regex", true}}},
              {"model", Json{{"type", "BPE"},
                             {"dropout", nullptr},
                             {"unk_token", nullptr},
                             {"continuing_subword_prefix", nullptr},
                             {"end_of_word_suffix", nullptr},
                             {"fuse_unk", false},
                             {"byte_fallback", false},
                             {"ignore_merges", false},
                             {"vocab", vocab},
                             {"merges", merge_list}}}};
}

std::unique_ptr<Tokenizer> Load(const Json& j) {
  TempFile file(j.dump());
  auto tok = Tokenizer::FromFile(file.path());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

const std::string kSpace = ByteChar(' ');  // "Ġ"

TEST(SyntheticTokenizerTest, Llama3SplitBoundsMerges) {
  // "3 4" ranks first, but Llama 3's \p{N}{1,3} puts 3 and 4 in different
  // pieces, so it never applies to "12345".
  const Json j = TinyTokenizer({{"3", "4"},
                                {"1", "2"},
                                {"12", "3"},
                                {"h", "e"},
                                {"l", "l"},
                                {"he", "ll"},
                                {"hell", "o"},
                                {kSpace, "w"}});
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  // Merge results get ids from 256 in merge order: "34" 256, "12" 257, ...
  const int32_t id_123 = 258, id_hello = 262, id_space_w = 263, id_eot = 264;
  EXPECT_EQ(tok->TokenToId("123"), id_123);
  // Pieces "123" "45" " hello" " world"; "Ġ h" has no merge, "Ġ w" has.
  const Encoding enc = tok->Encode("12345 hello world<|eot_id|>");
  EXPECT_THAT(enc.ids,
              ElementsAre(id_123, '4', '5', ' ', id_hello, id_space_w, 'o', 'r', 'l', 'd', id_eot));
  ASSERT_EQ(enc.offsets.size(), enc.ids.size());
  EXPECT_EQ(enc.offsets[0], std::make_pair(size_t{0}, size_t{3}));
  EXPECT_EQ(enc.offsets[5], std::make_pair(size_t{11}, size_t{13}));  // " w"
  EXPECT_EQ(enc.offsets.back(), std::make_pair(size_t{17}, size_t{27}));
  EXPECT_EQ(tok->Decode(enc.ids), "12345 hello world<|eot_id|>");
  EXPECT_EQ(tok->Decode(enc.ids, /*skip_special_tokens=*/true), "12345 hello world");
  EXPECT_EQ(tok->vocab_size(), 265);
}

TEST(SyntheticTokenizerTest, IgnoreMergesEmitsWholeVocabWords) {
  Json j = TinyTokenizer({{"a", "b"}});
  // "abc" is in the vocab but no merge builds it.
  j["model"]["vocab"]["abc"] = 300;
  auto merged = Load(j);
  ASSERT_NE(merged, nullptr);
  EXPECT_THAT(merged->Encode("abc").ids, ElementsAre(256, 'c'));
  j["model"]["ignore_merges"] = true;
  auto whole = Load(j);
  ASSERT_NE(whole, nullptr);
  EXPECT_THAT(whole->Encode("abc").ids, ElementsAre(300));
  EXPECT_THAT(whole->Encode("abcd").ids, ElementsAre(256, 'c', 'd'));
}

TEST(SyntheticTokenizerTest, PrefixSpaceIsAddedToEachPiece) {
  Json j = TinyTokenizer({});
  j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  // Llama 3 pieces "a" and ".b"; ByteLevel gives each a leading space.
  const Encoding enc = tok->Encode("a.b");
  EXPECT_THAT(enc.ids, ElementsAre(' ', 'a', ' ', '.', 'b'));
  // The added space takes the offsets of the character it precedes.
  EXPECT_EQ(enc.offsets[0], std::make_pair(size_t{0}, size_t{1}));
  EXPECT_EQ(enc.offsets[2], std::make_pair(size_t{1}, size_t{2}));
  // A piece that already starts with a space gets none.
  EXPECT_THAT(tok->Encode(" x").ids, ElementsAre(' ', 'x'));
}

TEST(SyntheticTokenizerTest, ByteLevelRegexWithPrefixSpace) {
  Json j = TinyTokenizer({{kSpace, "h"}, {kSpace + "h", "i"}});
  j["pre_tokenizer"] = Json{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("hi hi").ids, ElementsAre(257, 257));
  EXPECT_EQ(tok->Decode(tok->Encode("hi hi").ids), " hi hi");
}

TEST(SyntheticTokenizerTest, NfcNormalizer) {
  Json j = TinyTokenizer({});
  const std::string decomposed = "e\u0301";  // e + COMBINING ACUTE ACCENT
  auto plain = Load(j);
  ASSERT_NE(plain, nullptr);
  EXPECT_THAT(plain->Encode(decomposed).ids, ElementsAre('e', 0xCC, 0x81));
  j["normalizer"] = Json{{"type", "NFC"}};
  auto nfc = Load(j);
  ASSERT_NE(nfc, nullptr);
  const Encoding enc = nfc->Encode("x" + decomposed + "y");
  // "x\u00e9y": one Llama 3 piece, bytes x C3 A9 y. As in HF, the composed
  // character maps back to its first part, the "e".
  EXPECT_THAT(enc.ids, ElementsAre('x', 0xC3, 0xA9, 'y'));
  EXPECT_EQ(enc.offsets[1], std::make_pair(size_t{1}, size_t{2}));
  EXPECT_EQ(enc.offsets[2], std::make_pair(size_t{1}, size_t{2}));
  EXPECT_EQ(enc.offsets[3], std::make_pair(size_t{4}, size_t{5}));
}

TEST(SyntheticTokenizerTest, AddedTokenMatchingRules) {
  Json j = TinyTokenizer({});  // 256 byte tokens; "<|eot_id|>" is 256
  j["added_tokens"].push_back(
      Json{{"id", 257}, {"content", "<|eot_id|>x"}, {"special", false}, {"normalized", false}});
  j["added_tokens"].push_back(Json{{"id", 258},
                                   {"content", "[M]"},
                                   {"special", true},
                                   {"lstrip", true},
                                   {"rstrip", true},
                                   {"normalized", false}});
  j["added_tokens"].push_back(Json{{"id", 259},
                                   {"content", "go"},
                                   {"special", false},
                                   {"single_word", true},
                                   {"normalized", true}});
  // Already in the vocab: keeps its vocab id whatever the file says.
  j["added_tokens"].push_back(
      Json{{"id", 999}, {"content", "q"}, {"special", true}, {"normalized", false}});
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->TokenToId("q"), 'q');
  EXPECT_EQ(tok->vocab_size(), 260);
  // Longest match first: "<|eot_id|>x" is a longer added token.
  EXPECT_THAT(tok->Encode("<|eot_id|>x<|eot_id|>").ids, ElementsAre(257, 256));
  // lstrip/rstrip swallow the spaces around the token.
  const Encoding stripped = tok->Encode("a  [M]  b");
  EXPECT_THAT(stripped.ids, ElementsAre('a', 258, 'b'));
  EXPECT_EQ(stripped.offsets[1], std::make_pair(size_t{1}, size_t{8}));
  // single_word: only where not inside a word ('_' counts as a word char).
  EXPECT_THAT(tok->Encode("go ago go_").ids,
              ElementsAre(259, ' ', 'a', 'g', 'o', ' ', 'g', 'o', '_'));
  // Special tokens go when skipped, with the spaces they swallowed.
  EXPECT_EQ(tok->Decode(tok->Encode("a  [M]  b").ids, /*skip_special_tokens=*/true), "ab");
}

// The paths the bundled model does not take, against HF `tokenizers` 0.23.2:
// its vocab and merges under other pre-tokenizers, normalizers and added
// tokens (tests/golden/make_tokenizer_variants.py).
TEST(VariantsTest, MatchHf) {
  std::ifstream in(SourcePath("examples/tiny-code-llama/tokenizer.json"));
  const Json base = Json::parse(in);
  std::unique_ptr<Tokenizer> tok;
  std::string variant;
  int texts = 0, variants = 0;
  for (const std::string& line : ReadLines(SourcePath("tests/fixtures/tokenizer_variants.jsonl"))) {
    const Json row = Json::parse(line);
    if (row.contains("overrides")) {
      const Json& o = row["overrides"];
      Json j = base;
      if (o.contains("pre_tokenizer")) j["pre_tokenizer"] = o["pre_tokenizer"];
      if (o.contains("normalizer")) j["normalizer"] = o["normalizer"];
      if (o.contains("ignore_merges")) j["model"]["ignore_merges"] = o["ignore_merges"];
      if (o.contains("extra_added_tokens")) {
        for (const Json& t : o["extra_added_tokens"]) j["added_tokens"].push_back(t);
      }
      variant = row["variant"].get<std::string>();
      tok = Load(j);
      ASSERT_NE(tok, nullptr) << variant;
      ++variants;
      continue;
    }
    const auto text = row["text"].get<std::string>();
    const Encoding enc = tok->Encode(text);
    EXPECT_EQ(enc.ids, row["ids"].get<std::vector<int32_t>>()) << variant << ": " << text;
    EXPECT_EQ(tok->Decode(enc.ids), row["decoded"].get<std::string>()) << variant << ": " << text;
    EXPECT_EQ(tok->Decode(enc.ids, true), row["decoded_skip"].get<std::string>())
        << variant << ": " << text;
    // Widened to whole characters, our byte offsets must agree with HF's.
    EXPECT_EQ(testing::CharOffsets(text, enc), (row["offsets"].get<std::vector<std::pair<size_t, size_t>>>()))
        << variant << ": " << text;
    ++texts;
  }
  EXPECT_EQ(variants, 7);
  EXPECT_EQ(texts, 7 * 20);
}

// --- Errors -----------------------------------------------------------------

std::string LoadError(const Json& j, std::string* path) {
  TempFile file(j.dump());
  *path = file.path();
  auto tok = Tokenizer::FromFile(file.path());
  return tok.ok() ? "" : std::string(tok.status().message());
}

TEST(TokenizerErrorsTest, WrongModelType) {
  Json j = TinyTokenizer({});
  j["model"]["type"] = "WordPiece";
  std::string path;
  const std::string error = LoadError(j, &path);
  EXPECT_THAT(error, HasSubstr(path + ": model.type is \"WordPiece\"; expected \"BPE\""));
}

TEST(TokenizerErrorsTest, BadSplitRegexNamesFileAndPattern) {
  Json j = TinyTokenizer({});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{L}+|(\\s+";
  std::string path;
  const std::string error = LoadError(j, &path);
  EXPECT_THAT(error, HasSubstr(path));
  EXPECT_THAT(error, HasSubstr("pre_tokenizer.pretokenizers[0].pattern the regex does not compile"));
}

TEST(TokenizerErrorsTest, UnsupportedComponents) {
  std::string path;
  {
    Json j = TinyTokenizer({});
    j["normalizer"] = Json{{"type", "Lowercase"}};
    EXPECT_THAT(LoadError(j, &path),
                HasSubstr("normalizer is {\"type\":\"Lowercase\"}; supported normalizers: NFC, Prepend, Replace"));
  }
  {
    // A byte-level model needs the ByteLevel decoder.
    Json j = TinyTokenizer({});
    j["decoder"] = Json{{"type", "Metaspace"}};
    EXPECT_THAT(LoadError(j, &path), HasSubstr("decoder is {\"type\":\"Metaspace\"}; expected {\"type\": \"ByteLevel\"}"));
  }
  {
    Json j = TinyTokenizer({});
    j["pre_tokenizer"] = Json{{"type", "Whitespace"}};
    EXPECT_THAT(LoadError(j, &path), HasSubstr("pre_tokenizer is {\"type\":\"Whitespace\"}; supported pre-tokenizers"));
  }
  {
    Json j = TinyTokenizer({});
    j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
    EXPECT_THAT(LoadError(j, &path), HasSubstr("behavior is \"Sideways\"; expected Removed, Isolated"));
  }
  {
    Json j = TinyTokenizer({});
    j["decoder"] = Json{{"type", "WordPiece"}};
    j["pre_tokenizer"] = Json{{"type", "Metaspace"}};
    EXPECT_THAT(LoadError(j, &path), HasSubstr("decoder is {\"type\":\"WordPiece\"}; supported decoders"));
  }
  {
    Json j = TinyTokenizer({});
    j["model"]["merges"] = Json::array({"a b c"});
    EXPECT_THAT(LoadError(j, &path), HasSubstr("model.merges[0]"));
  }
  {
    Json j = TinyTokenizer({});
    j["model"]["merges"] = Json::array({"x yz"});
    EXPECT_THAT(LoadError(j, &path), HasSubstr("missing from model.vocab"));
  }
}

TEST(TokenizerErrorsTest, MissingOrMalformedFile) {
  auto missing = Tokenizer::FromFile("/nonexistent/tokenizer.json");
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/tokenizer.json"));
  TempFile bad("{\"model\": ");
  auto malformed = Tokenizer::FromFile(bad.path());
  EXPECT_FALSE(malformed.ok());
  EXPECT_THAT(std::string(malformed.status().message()),
              HasSubstr(bad.path() + ": not valid JSON"));
}

// String merges ("a b") and pair merges ([a, b]) load the same.
TEST(SyntheticTokenizerTest, StringMerges) {
  Json j = TinyTokenizer({{"a", "b"}});
  j["model"]["merges"] = Json::array({"a b"});
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("abab").ids, ElementsAre(256, 256));
}

}  // namespace
}  // namespace e3
