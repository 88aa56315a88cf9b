#include "common/base/file_util.h"
#include "common/text/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <array>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <optional>
#include <queue>
#include <utility>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/text/normalizer.h"
#include "common/text/post_processor.h"
#include "common/text/pretokenizer.h"
#include "common/text/regex_split.h"
#include "common/text/tokenizer_json.h"
#include "common/text/unicode.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

using Json = nlohmann::json;

// Words longer than this are not cached: they are rare, and bounding the
// key length bounds the cache's memory.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kCacheShards = 16;
// Entries per shard; the whole cache holds at most 64k words.
constexpr size_t kCacheShardCapacity = 4096;

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
// other 68 bytes to U+0100 onwards, in byte order.
std::array<char32_t, 256> ByteToUnicode() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

// The inverse of ByteToUnicode applied to a token string, or nullopt when a
// character is outside the byte alphabet.
std::optional<std::string> ByteLevelToBytes(std::string_view token) {
  static const auto* const kUnicodeToByte = [] {
    auto* m = new absl::flat_hash_map<char32_t, uint8_t>();
    const std::array<char32_t, 256> table = ByteToUnicode();
    for (int b = 0; b < 256; ++b) (*m)[table[b]] = static_cast<uint8_t>(b);
    return m;
  }();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const unicode::DecodedChar c = unicode::DecodeUtf8(token, i);
    if (!c.valid) return std::nullopt;
    const auto it = kUnicodeToByte->find(c.cp);
    if (it == kUnicodeToByte->end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
    i += c.len;
  }
  return out;
}

// Debian's Abseil has its own string_view type; maps keyed by std::string
// look up heterogeneously through it.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

using tokenizer_json::FieldError;
using tokenizer_json::GetBool;
using tokenizer_json::Show;

// The "type" of a tokenizer.json component, or "" when absent.
std::string TypeOf(const Json& component) {
  const auto it = component.find("type");
  return it != component.end() && it->is_string() ? it->get<std::string>() : "";
}

// When Metaspace puts its replacement before a piece.
enum class MetaspacePrepend { kAlways, kFirst, kNever };

struct MetaspaceSettings {
  std::string replacement;
  MetaspacePrepend prepend = MetaspacePrepend::kAlways;
};

// Metaspace's settings, written alike by its pre-tokenizer and decoder:
// the replacement (default U+2581) and prepend_scheme, or add_prefix_space
// in files from before prepend_scheme.
absl::StatusOr<MetaspaceSettings> MetaspaceSettingsOf(const std::string& path, const std::string& field,
                                                      const Json& config) {
  MetaspaceSettings m;
  const auto replacement = config.find("replacement");
  m.replacement = replacement != config.end() && replacement->is_string() ? replacement->get<std::string>() : "\u2581";
  const auto scheme = config.find("prepend_scheme");
  if (scheme == config.end() || !scheme->is_string()) {
    E3_ASSIGN_OR_RETURN(const bool add, GetBool(path, config, field, "add_prefix_space", true));
    m.prepend = add ? MetaspacePrepend::kAlways : MetaspacePrepend::kNever;
    return m;
  }
  const std::string v = scheme->get<std::string>();
  if (v != "always" && v != "first" && v != "never") {
    return FieldError(path, field + ".prepend_scheme", absl::StrCat("is ", Show(*scheme), "; expected always, first or never"));
  }
  m.prepend = v == "always" ? MetaspacePrepend::kAlways : v == "first" ? MetaspacePrepend::kFirst : MetaspacePrepend::kNever;
  return m;
}

struct AddedToken {
  int32_t id;
  std::string content;
  // What the matcher looks for: the content, or for a normalized token the
  // content through the normalizer, as HF's AddedVocabulary builds its
  // normalized trie (Llama 2's Prepend makes "<think>" match "▁<think>").
  std::string pattern;
  bool special, lstrip, rstrip, normalized, single_word;
};

// One text or added-token piece found by AddedTokenMatcher.
struct AddedSplit {
  size_t begin, end;
  int32_t token;  // index into added tokens, or -1 for text
};

// Finds added tokens in text as HF's AddedVocabulary does: leftmost-longest
// literal matches, then single_word / lstrip / rstrip adjustments.
class AddedTokenMatcher {
 public:
  void Add(int32_t index, const AddedToken& token) {
    if (token.pattern.empty()) return;
    auto& list = by_first_byte_[static_cast<uint8_t>(token.pattern[0])];
    list.push_back(index);
    any_ = true;
  }
  void Finish(const std::vector<AddedToken>& tokens) {
    for (auto& list : by_first_byte_) {
      std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
        return tokens[a].pattern.size() > tokens[b].pattern.size();
      });
    }
  }
  bool empty() const { return !any_; }

  // Splits `text` into text pieces and added tokens; never yields empty
  // text pieces.
  void Split(std::string_view text, const std::vector<AddedToken>& tokens,
             std::vector<AddedSplit>* out) const {
    size_t done = 0;  // end of the last emitted piece
    size_t pos = 0;
    while (pos < text.size()) {
      const auto& list = by_first_byte_[static_cast<uint8_t>(text[pos])];
      int32_t found = -1;
      for (int32_t t : list) {
        if (text.substr(pos, tokens[t].pattern.size()) == tokens[t].pattern) {
          found = t;
          break;
        }
      }
      if (found < 0) {
        ++pos;
        continue;
      }
      const AddedToken& tok = tokens[found];
      size_t begin = pos, end = pos + tok.pattern.size();
      pos = end;
      if (begin < done) continue;  // inside the whitespace a previous rstrip took
      if (tok.single_word &&
          !(IsWordBoundary(text, begin, true) && IsWordBoundary(text, end, false))) {
        continue;
      }
      if (tok.lstrip) begin = std::max(done, SpaceRunStart(text, begin));
      if (tok.rstrip) end = SpaceRunEnd(text, end);
      if (done < begin) out->push_back({done, begin, -1});
      out->push_back({begin, end, found});
      done = end;
      pos = end;
    }
    if (done < text.size()) out->push_back({done, text.size(), -1});
  }

 private:
  static bool IsWordChar(char32_t cp) {
    const unicode::CharClass cls = unicode::ClassOf(cp);
    return cp == '_' || cls == unicode::CharClass::kLetter || cls == unicode::CharClass::kNumber;
  }
  // Whether the character before (`before`) or after `pos` is absent or not
  // a word character.
  static bool IsWordBoundary(std::string_view text, size_t pos, bool before) {
    if (before) {
      if (pos == 0) return true;
      size_t start = pos - 1;
      while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
      const unicode::DecodedChar c = unicode::DecodeUtf8(text, start);
      return !(c.valid && start + c.len == pos && IsWordChar(c.cp));
    }
    if (pos >= text.size()) return true;
    const unicode::DecodedChar c = unicode::DecodeUtf8(text, pos);
    return !(c.valid && IsWordChar(c.cp));
  }
  // Start of the run of whitespace that ends at `pos`.
  static size_t SpaceRunStart(std::string_view text, size_t pos) {
    while (pos > 0) {
      size_t start = pos - 1;
      while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
      const unicode::DecodedChar c = unicode::DecodeUtf8(text, start);
      if (!c.valid || start + c.len != pos || unicode::ClassOf(c.cp) != unicode::CharClass::kSpace)
        break;
      pos = start;
    }
    return pos;
  }
  // End of the run of whitespace that starts at `pos`.
  static size_t SpaceRunEnd(std::string_view text, size_t pos) {
    while (pos < text.size()) {
      const unicode::DecodedChar c = unicode::DecodeUtf8(text, pos);
      if (!c.valid || unicode::ClassOf(c.cp) != unicode::CharClass::kSpace) break;
      pos += c.len;
    }
    return pos;
  }

  std::array<std::vector<int32_t>, 256> by_first_byte_;
  bool any_ = false;
};

// Maps byte i of a (possibly normalized or prefixed) string to the byte
// range of the original text it came from: base + i, or through an
// alignment table when the string was rewritten.
struct OffsetMap {
  size_t base = 0;
  const Alignment* align = nullptr;
  size_t shift = 0;  // index of byte 0 in `align`

  size_t Begin(size_t i) const { return align ? base + (*align)[shift + i].first : base + i; }
  size_t End(size_t i) const { return align ? base + (*align)[shift + i].second : base + i + 1; }
  OffsetMap Sub(size_t i) const {
    return align ? OffsetMap{base, align, shift + i} : OffsetMap{base + i};
  }
};

// One BPE token of a word: its id and the word's bytes it covers.
struct WordToken {
  int32_t id;
  uint32_t begin, len;
};

// Bounded, thread-safe cache of BPE results per pre-token word. When a
// shard is full new words are not cached (as HF's cache does), so memory
// stays bounded without eviction bookkeeping.
class WordCache {
 public:
  bool Lookup(std::string_view word, std::vector<WordToken>* out) const {
    const Shard& shard = ShardOf(word);
    std::shared_lock<std::shared_mutex> lock(shard.mu);
    const auto it = shard.map.find(AbslView(word));
    if (it == shard.map.end()) return false;
    out->insert(out->end(), it->second.begin(), it->second.end());
    return true;
  }
  void Insert(std::string_view word, const WordToken* tokens, size_t n) {
    if (word.size() > kMaxCachedWordBytes) return;
    Shard& shard = ShardOf(word);
    std::unique_lock<std::shared_mutex> lock(shard.mu);
    if (shard.map.size() >= kCacheShardCapacity) return;
    shard.map.try_emplace(std::string(word), tokens, tokens + n);
  }

 private:
  struct Shard {
    mutable std::shared_mutex mu;
    absl::flat_hash_map<std::string, std::vector<WordToken>> map;
  };
  Shard& ShardOf(std::string_view word) const {
    return shards_[absl::Hash<std::string_view>{}(word) % kCacheShards];
  }
  mutable std::array<Shard, kCacheShards> shards_;
};

struct Merge {
  uint32_t rank;
  int32_t new_id;
};

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

class BpeTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path, const Json& root);

  Encoding Encode(std::string_view text) const override;
  Encoding Encode(std::string_view text, const EncodeOptions& options) const override;
  absl::StatusOr<Encoding> EncodePair(std::string_view a, std::string_view b,
                                      const EncodeOptions& options) const override;
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  std::optional<std::string> IdToToken(int32_t id) const override;
  int64_t vocab_size() const override { return vocab_size_; }

 private:
  absl::Status LoadModel(const std::string& path, const Json& model);
  absl::Status LoadAddedTokens(const std::string& path, const Json& added);
  absl::Status LoadPreTokenizer(const std::string& path, const Json& pre);
  absl::Status LoadPreTokenizerStep(const std::string& path, const std::string& field,
                                    const Json& step, bool last);
  absl::Status LoadDecoder(const std::string& path, const std::string& field, const Json& decoder);
  void BuildDecodingTables();
  // Encode(text) as the post-processor's input: tokens filled when it
  // trims offsets.
  PostEncoding ToPost(std::string_view text) const;

  // A pre-tokenizer stage: a Split (a known pattern's matcher, or any
  // pattern through Oniguruma) or Metaspace. ByteLevel, always last, is
  // add_prefix_space_ and byte_level_regex_.
  struct PreStep {
    enum class Kind { kKnownSplit, kRegexSplit, kMetaspace } kind;
    SplitPattern known = SplitPattern::kGpt2;
    std::unique_ptr<RegexSplitter> splitter;  // kRegexSplit; kMetaspace with split
    MetaspaceSettings metaspace;              // kMetaspace
  };
  // A piece of text on its way through the pre-tokenizer, and where its
  // bytes came from.
  struct Part {
    std::string_view text;
    OffsetMap map;
  };
  // `part` with `prefix` before it (from its first character) and each
  // space replaced by `space` (kept when empty), stored in texts/aligns.
  Part Rewrite(const Part& part, std::string_view prefix, std::string_view space, std::deque<std::string>* texts,
               std::deque<Alignment>* aligns) const;
  // Metaspace over a part: spaces become the replacement, which is also
  // prepended as the scheme says.
  Part Metaspace(const Part& part, const PreStep& step, std::deque<std::string>* texts,
                 std::deque<Alignment>* aligns) const;
  // ByteLevel's add_prefix_space and GPT-2 split, then BPE of each word.
  void EncodeByteLevel(const Part& part, std::deque<std::string>* texts, std::deque<Alignment>* aligns,
                       Encoding* out) const;
  // The first BPE symbols of a word of a SentencePiece-style model: its
  // characters, or their <0xNN> byte tokens, or unk.
  void CharSymbols(std::string_view word, std::vector<std::pair<int32_t, uint32_t>>* symbols) const;
  std::string DecodeTokens(std::vector<std::string> tokens) const;

  // A decoder stage of a SentencePiece-style model.
  struct DecodeStep {
    enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
    std::string from, to;  // kReplace; kMetaspace: from = replacement
    std::string strip;     // kStrip: the character, taken `start` / `stop` times
    int start = 0, stop = 0;
    bool strip_first_space = true;  // kMetaspace: prepend_scheme != never
  };

  // Encodes text that holds no non-normalized added token: normalizes it,
  // splits out the normalized added tokens, pre-tokenizes the rest.
  void EncodeNormalizable(std::string_view text, size_t base, Encoding* out) const;
  // Runs the pre-tokenizer over one piece and BPE over its words.
  void EncodePiece(std::string_view piece, const OffsetMap& map, Encoding* out) const;
  void EncodeWord(std::string_view word, const OffsetMap& map, Encoding* out) const;
  // BPE of a word of raw bytes, appended to `out`.
  void BpeWord(std::string_view word, std::vector<WordToken>* out) const;
  void PushAdded(int32_t token, size_t begin, size_t end, Encoding* out) const {
    out->ids.push_back(added_[token].id);
    out->offsets.emplace_back(begin, end);
  }

  // Model.
  absl::flat_hash_map<std::string, int32_t> vocab_;  // byte-level token text -> id
  absl::flat_hash_map<int32_t, std::string> id_to_token_;
  absl::flat_hash_map<std::string, int32_t> bytes_to_id_;  // raw token bytes -> id
  std::array<int32_t, 256> byte_ids_{};                    // -1 where a byte has no token
  absl::flat_hash_map<uint64_t, Merge> merges_;
  bool ignore_merges_ = false;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;

  // Added tokens, split before pre-tokenization.
  std::vector<AddedToken> added_;
  absl::flat_hash_map<std::string, int32_t> added_by_content_;  // -> index in added_
  absl::flat_hash_map<int32_t, int32_t> added_by_id_;           // -> index in added_
  AddedTokenMatcher raw_matcher_;         // normalized=false: matched in the raw text
  AddedTokenMatcher normalized_matcher_;  // normalized=true: after the normalizer

  std::unique_ptr<Normalizer> normalizer_;  // null: none
  std::unique_ptr<PostProcessor> post_processor_;  // null: none
  std::vector<PreStep> pre_steps_;          // before ByteLevel, in order
  // Byte-level BPE (GPT-2, Llama 3, Qwen): the pre-tokenizer ends in
  // ByteLevel and tokens are bytes. Otherwise SentencePiece-style BPE
  // (Llama 2, Mistral, Gemma): tokens are UTF-8 text ("\u2581" for a space)
  // with <0xNN> tokens for bytes when byte_fallback is set.
  bool byte_level_ = false;
  bool add_prefix_space_ = false;
  bool byte_level_regex_ = false;  // ByteLevel's use_regex: the GPT-2 split
  bool byte_fallback_ = false;
  std::array<int32_t, 256> fallback_ids_{};  // <0xNN> token ids, -1 where absent
  std::vector<DecodeStep> decoders_;         // SentencePiece-style models

  // Decoding: each id's bytes and whether it is a special token.
  absl::flat_hash_map<int32_t, std::string> id_bytes_;
  absl::flat_hash_map<int32_t, bool> special_ids_;
  int64_t vocab_size_ = 0;

  mutable WordCache cache_;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> BpeTokenizer::Load(const std::string& path,
                                                              const Json& root) {
  if (!root.is_object()) return FieldError(path, "top level", "is not a JSON object");
  auto tok = std::make_unique<BpeTokenizer>();
  // The pre-tokenizer first: whether it ends in ByteLevel says how the
  // model's tokens are written.
  const auto pre = root.find("pre_tokenizer");
  if (pre != root.end() && !pre->is_null()) E3_RETURN_IF_ERROR(tok->LoadPreTokenizer(path, *pre));
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object()) return FieldError(path, "model", "is missing");
  E3_RETURN_IF_ERROR(tok->LoadModel(path, *model));
  // The normalizer before the added tokens: normalized ones are matched
  // as the normalizer writes them.
  const auto normalizer = root.find("normalizer");
  if (normalizer != root.end()) {
    E3_ASSIGN_OR_RETURN(tok->normalizer_, Normalizer::FromJson(path, "normalizer", *normalizer));
  }
  const auto added = root.find("added_tokens");
  if (added != root.end() && !added->is_null())
    E3_RETURN_IF_ERROR(tok->LoadAddedTokens(path, *added));
  const auto decoder = root.find("decoder");
  E3_RETURN_IF_ERROR(tok->LoadDecoder(path, "decoder", decoder == root.end() ? Json() : *decoder));
  const auto post = root.find("post_processor");
  if (post != root.end()) {
    E3_ASSIGN_OR_RETURN(tok->post_processor_, PostProcessor::FromJson(path, "post_processor", *post));
  }
  tok->BuildDecodingTables();
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

void BpeTokenizer::BuildDecodingTables() {
  // Added tokens override the model's entries, as in HF.
  for (const auto& [id, token] : id_to_token_) {
    std::optional<std::string> bytes = byte_level_ ? ByteLevelToBytes(token) : std::nullopt;
    // HF's ByteLevel decoder passes through the UTF-8 of a token that has a
    // character outside the byte alphabet.
    id_bytes_[id] = bytes ? *std::move(bytes) : token;
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
  }
  for (const AddedToken& a : added_) {
    // Decoded from its normalized form, as HF does since tokenizers 0.20, so
    // that the decoder inverts the normalizer ("▁<think>" -> " <think>").
    std::optional<std::string> bytes = byte_level_ ? ByteLevelToBytes(a.pattern) : std::nullopt;
    id_bytes_[a.id] = bytes ? *std::move(bytes) : a.pattern;
    if (a.special) special_ids_[a.id] = true;
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{a.id} + 1);
  }
}

absl::Status BpeTokenizer::LoadDecoder(const std::string& path, const std::string& field, const Json& decoder) {
  const std::string type = TypeOf(decoder);
  if (byte_level_) {
    if (type == "ByteLevel") return absl::OkStatus();
    return FieldError(path, field,
                      absl::StrCat("is ", decoder.is_null() ? "missing" : Show(decoder),
                                   "; expected {\"type\": \"ByteLevel\"} (the pre-tokenizer is ByteLevel)"));
  }
  if (decoder.is_null()) return absl::OkStatus();  // tokens joined by spaces, as HF does
  if (type == "Sequence") {
    const auto list = decoder.find("decoders");
    if (list == decoder.end() || !list->is_array()) return FieldError(path, field + ".decoders", "is missing");
    for (size_t i = 0; i < list->size(); ++i) {
      E3_RETURN_IF_ERROR(LoadDecoder(path, absl::StrCat(field, ".decoders[", i, "]"), (*list)[i]));
    }
    return absl::OkStatus();
  }
  DecodeStep step;
  if (type == "Replace") {
    const auto pattern = decoder.find("pattern");
    const auto content = decoder.find("content");
    if (pattern == decoder.end() || !pattern->is_object() || !pattern->contains("String") ||
        !(*pattern)["String"].is_string() || content == decoder.end() || !content->is_string()) {
      return FieldError(path, field, absl::StrCat("is ", Show(decoder), "; expected a Replace of a String"));
    }
    step.kind = DecodeStep::Kind::kReplace;
    step.from = (*pattern)["String"].get<std::string>();
    step.to = content->get<std::string>();
  } else if (type == "ByteFallback") {
    step.kind = DecodeStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecodeStep::Kind::kFuse;
  } else if (type == "Strip") {
    const auto content = decoder.find("content");
    if (content == decoder.end() || !content->is_string()) return FieldError(path, field + ".content", "is missing");
    step.kind = DecodeStep::Kind::kStrip;
    step.strip = content->get<std::string>();
    const auto count = [&](const char* key) {
      const auto it = decoder.find(key);
      return it != decoder.end() && it->is_number_integer() ? static_cast<int>(it->get<int64_t>()) : 0;
    };
    step.start = count("start");
    step.stop = count("stop");
  } else if (type == "Metaspace") {
    step.kind = DecodeStep::Kind::kMetaspace;
    E3_ASSIGN_OR_RETURN(const MetaspaceSettings m, MetaspaceSettingsOf(path, field, decoder));
    step.from = m.replacement;
    step.strip_first_space = m.prepend != MetaspacePrepend::kNever;
  } else {
    return FieldError(path, field,
                      absl::StrCat("is ", Show(decoder),
                                   "; supported decoders: ByteLevel, Metaspace, or a Sequence of Replace, "
                                   "ByteFallback, Fuse, Strip and Metaspace"));
  }
  decoders_.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status BpeTokenizer::LoadModel(const std::string& path, const Json& model) {
  const std::string type = TypeOf(model);
  // Old files omit model.type; a model with merges is BPE.
  if (type != "BPE" && !(type.empty() && model.contains("merges"))) {
    return FieldError(path, "model.type",
                      absl::StrCat("is ", model.contains("type") ? Show(model["type"]) : "missing",
                                   "; expected \"BPE\""));
  }
  E3_ASSIGN_OR_RETURN(byte_fallback_, GetBool(path, model, "model", "byte_fallback", false));
  E3_ASSIGN_OR_RETURN(ignore_merges_, GetBool(path, model, "model", "ignore_merges", false));
  E3_ASSIGN_OR_RETURN(fuse_unk_, GetBool(path, model, "model", "fuse_unk", false));
  if (const auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    return FieldError(path, "model.dropout", absl::StrCat("is ", Show(*it), "; expected null"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = model.find(key);
    if (it != model.end() && !it->is_null() &&
        !(it->is_string() && it->get<std::string>().empty())) {
      return FieldError(path, absl::StrCat("model.", key),
                        absl::StrCat("is ", Show(*it), "; expected null"));
    }
  }

  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return FieldError(path, "model.vocab", "is missing; expected an object of token -> id");
  }
  vocab_.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return FieldError(path, absl::StrCat("model.vocab[\"", token, "\"]"),
                        absl::StrCat("is ", Show(id), "; expected a non-negative integer id"));
    }
    const auto i = static_cast<int32_t>(id.get<int64_t>());
    vocab_[token] = i;
    id_to_token_[i] = token;
    // Words reach BPE as raw bytes: a byte-level token's text maps back
    // to them; a SentencePiece-style token is its text.
    if (!byte_level_) {
      bytes_to_id_.emplace(token, i);
    } else if (std::optional<std::string> bytes = ByteLevelToBytes(token)) {
      bytes_to_id_.emplace(*std::move(bytes), i);
    }
  }
  const std::array<char32_t, 256> byte_chars = ByteToUnicode();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    unicode::AppendUtf8(byte_chars[b], &ch);
    const auto it = vocab_.find(ch);
    byte_ids_[b] = it == vocab_.end() || !byte_level_ ? -1 : it->second;
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const auto fb = vocab_.find(name);
    fallback_ids_[b] = fb == vocab_.end() ? -1 : fb->second;
  }
  if (const auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    const auto unk = it->is_string() ? vocab_.find(it->get<std::string>()) : vocab_.end();
    if (unk == vocab_.end()) {
      return FieldError(path, "model.unk_token",
                        absl::StrCat("is ", Show(*it), "; expected a token of model.vocab"));
    }
    unk_id_ = unk->second;
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return FieldError(path, "model.merges", "is missing; expected a list");
  }
  merges_.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& m = (*merges)[rank];
    std::string left, right;
    if (m.is_string()) {
      const std::vector<std::string> parts = absl::StrSplit(m.get<std::string>(), ' ');
      if (parts.size() != 2) {
        return FieldError(path, absl::StrCat("model.merges[", rank, "]"),
                          absl::StrCat("is ", Show(m), "; expected \"left right\""));
      }
      left = parts[0];
      right = parts[1];
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return FieldError(path, absl::StrCat("model.merges[", rank, "]"),
                        absl::StrCat("is ", Show(m), "; expected \"left right\" or [left, right]"));
    }
    const auto l = vocab_.find(left), r = vocab_.find(right), lr = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || lr == vocab_.end()) {
      return FieldError(path, absl::StrCat("model.merges[", rank, "]"),
                        absl::StrCat(Show(m), " uses or makes a token missing from model.vocab"));
    }
    // A repeated pair keeps its last rank, as HF's map does.
    merges_[PairKey(l->second, r->second)] = Merge{static_cast<uint32_t>(rank), lr->second};
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::LoadAddedTokens(const std::string& path, const Json& added) {
  if (!added.is_array()) return FieldError(path, "added_tokens", "is not a list");
  // HF re-derives the ids when it loads the file (AddedVocabulary::
  // add_tokens): a token already in the vocab takes that id, any other the
  // next id past the vocab and the added tokens so far. Real files agree
  // with the ids they list; where one does not, HF's ids are the ones to
  // reproduce.
  const auto model_size = static_cast<int64_t>(vocab_.size());
  int64_t max_added = -1;
  for (size_t i = 0; i < added.size(); ++i) {
    const Json& t = added[i];
    const std::string field = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object()) return FieldError(path, field, "is not an object");
    const auto id = t.find("id");
    const auto content = t.find("content");
    if (id == t.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() > INT32_MAX) {
      return FieldError(path, field + ".id", "is missing or not a non-negative integer");
    }
    if (content == t.end() || !content->is_string() || content->get<std::string>().empty()) {
      return FieldError(path, field + ".content", "is missing or empty");
    }
    AddedToken a;
    a.content = content->get<std::string>();
    E3_ASSIGN_OR_RETURN(a.special, GetBool(path, t, field, "special", false));
    E3_ASSIGN_OR_RETURN(a.lstrip, GetBool(path, t, field, "lstrip", false));
    E3_ASSIGN_OR_RETURN(a.rstrip, GetBool(path, t, field, "rstrip", false));
    E3_ASSIGN_OR_RETURN(a.single_word, GetBool(path, t, field, "single_word", false));
    E3_ASSIGN_OR_RETURN(a.normalized, GetBool(path, t, field, "normalized", !a.special));
    if (const auto same = added_by_content_.find(a.content); same != added_by_content_.end()) {
      // A repeated content keeps its id and takes the later flags.
      a.id = added_[same->second].id;
      added_[same->second] = std::move(a);
      continue;
    }
    if (const auto in_vocab = vocab_.find(a.content); in_vocab != vocab_.end()) {
      a.id = in_vocab->second;
    } else {
      const int64_t next = max_added < 0 ? model_size : std::max(max_added, model_size - 1) + 1;
      if (next > INT32_MAX) return FieldError(path, field, "gets an id past the int32 range");
      a.id = static_cast<int32_t>(next);
    }
    max_added = std::max<int64_t>(max_added, a.id);
    const auto index = static_cast<int32_t>(added_.size());
    added_by_content_[a.content] = index;
    added_by_id_[a.id] = index;
    added_.push_back(std::move(a));
  }
  for (size_t i = 0; i < added_.size(); ++i) {
    AddedToken& a = added_[i];
    a.pattern = a.content;
    if (a.normalized && normalizer_) {
      NormalizedText n(a.content);
      normalizer_->Apply(&n);
      a.pattern = n.text;
    }
    (a.normalized ? normalized_matcher_ : raw_matcher_).Add(static_cast<int32_t>(i), a);
  }
  raw_matcher_.Finish(added_);
  normalized_matcher_.Finish(added_);
  return absl::OkStatus();
}

absl::Status BpeTokenizer::LoadPreTokenizer(const std::string& path, const Json& pre) {
  if (TypeOf(pre) != "Sequence") return LoadPreTokenizerStep(path, "pre_tokenizer", pre, true);
  const auto steps = pre.find("pretokenizers");
  if (steps == pre.end() || !steps->is_array() || steps->empty()) {
    return FieldError(path, "pre_tokenizer.pretokenizers", "is missing or empty");
  }
  for (size_t i = 0; i < steps->size(); ++i) {
    E3_RETURN_IF_ERROR(LoadPreTokenizerStep(path,
                                            absl::StrCat("pre_tokenizer.pretokenizers[", i, "]"),
                                            (*steps)[i], i + 1 == steps->size()));
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::LoadPreTokenizerStep(const std::string& path, const std::string& field,
                                                const Json& step, bool last) {
  const std::string type = TypeOf(step);
  if (type == "ByteLevel") {
    if (!last) return FieldError(path, field, "is ByteLevel but not the last pre-tokenizer");
    byte_level_ = true;
    E3_ASSIGN_OR_RETURN(add_prefix_space_, GetBool(path, step, field, "add_prefix_space", false));
    E3_ASSIGN_OR_RETURN(byte_level_regex_, GetBool(path, step, field, "use_regex", true));
    return absl::OkStatus();
  }
  PreStep pre;
  if (type == "Metaspace") {
    pre.kind = PreStep::Kind::kMetaspace;
    E3_ASSIGN_OR_RETURN(pre.metaspace, MetaspaceSettingsOf(path, field, step));
    E3_ASSIGN_OR_RETURN(const bool split, GetBool(path, step, field, "split", true));
    if (split) {
      E3_ASSIGN_OR_RETURN(pre.splitter,
                          RegexSplitter::Create(pre.metaspace.replacement, false, SplitBehavior::kMergedWithNext, false));
    }
    pre_steps_.push_back(std::move(pre));
    return absl::OkStatus();
  }
  if (type != "Split") {
    return FieldError(path, field,
                      absl::StrCat("is ", Show(step), "; supported pre-tokenizers: Split, Metaspace, and ByteLevel last"));
  }
  const auto behavior_name = step.find("behavior");
  if (behavior_name == step.end() || !behavior_name->is_string()) {
    return FieldError(path, field + ".behavior", "is missing");
  }
  auto behavior = SplitBehaviorFromName(behavior_name->get<std::string>());
  if (!behavior.ok()) return FieldError(path, field + ".behavior", absl::StrCat("is ", behavior.status().message()));
  E3_ASSIGN_OR_RETURN(const bool invert, GetBool(path, step, field, "invert", false));
  const auto pattern_json = step.find("pattern");
  auto pattern = PatternFromJson(pattern_json == step.end() ? Json() : *pattern_json);
  if (!pattern.ok()) return FieldError(path, field + ".pattern", std::string(pattern.status().message()));
  const auto& [text, is_regex] = *pattern;
  // The known patterns, split the way the hand-written matchers do.
  const std::optional<SplitPattern> known =
      is_regex && *behavior == SplitBehavior::kIsolated && !invert ? SplitPatternFromRegex(text) : std::nullopt;
  if (known) {
    pre.kind = PreStep::Kind::kKnownSplit;
    pre.known = *known;
  } else {
    pre.kind = PreStep::Kind::kRegexSplit;
    auto splitter = RegexSplitter::Create(text, is_regex, *behavior, invert);
    if (!splitter.ok()) return FieldError(path, field + ".pattern", std::string(splitter.status().message()));
    pre.splitter = *std::move(splitter);
  }
  pre_steps_.push_back(std::move(pre));
  return absl::OkStatus();
}

Encoding BpeTokenizer::Encode(std::string_view text) const {
  Encoding out;
  out.ids.reserve(text.size() / 3);
  out.offsets.reserve(text.size() / 3);
  if (raw_matcher_.empty()) {
    EncodeNormalizable(text, 0, &out);
    return out;
  }
  std::vector<AddedSplit> splits;
  raw_matcher_.Split(text, added_, &splits);
  for (const AddedSplit& s : splits) {
    if (s.token >= 0) {
      PushAdded(s.token, s.begin, s.end, &out);
    } else {
      EncodeNormalizable(text.substr(s.begin, s.end - s.begin), s.begin, &out);
    }
  }
  return out;
}

PostEncoding BpeTokenizer::ToPost(std::string_view text) const {
  Encoding e = Encode(text);
  PostEncoding p{std::move(e.ids), std::move(e.offsets), {}};
  if (post_processor_ && post_processor_->needs_tokens()) {
    p.tokens.reserve(p.ids.size());
    for (int32_t id : p.ids) p.tokens.push_back(IdToToken(id).value_or(""));
  }
  return p;
}

Encoding BpeTokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  if (!post_processor_) return Encode(text);  // HF without a post_processor adds nothing
  PostEncoding p = post_processor_->Process({ToPost(text)}, options.add_special_tokens);
  return Encoding{std::move(p.ids), std::move(p.offsets)};
}

absl::StatusOr<Encoding> BpeTokenizer::EncodePair(std::string_view a, std::string_view b,
                                                  const EncodeOptions& options) const {
  if (!post_processor_) {
    // HF's default: the two encodings one after the other.
    Encoding out = Encode(a);
    Encoding second = Encode(b);
    out.ids.insert(out.ids.end(), second.ids.begin(), second.ids.end());
    out.offsets.insert(out.offsets.end(), second.offsets.begin(), second.offsets.end());
    return out;
  }
  if (!post_processor_->supports_pair()) {
    return absl::FailedPreconditionError(
        "the tokenizer's post_processor has a TemplateProcessing without a pair template");
  }
  PostEncoding p = post_processor_->Process({ToPost(a), ToPost(b)}, options.add_special_tokens);
  return Encoding{std::move(p.ids), std::move(p.offsets)};
}

void BpeTokenizer::EncodeNormalizable(std::string_view text, size_t base, Encoding* out) const {
  OffsetMap map{base};
  std::optional<NormalizedText> normalized;
  if (normalizer_) {
    normalized.emplace(text);
    normalizer_->Apply(&*normalized);
    if (!normalized->identity) {
      text = normalized->text;
      map.align = &normalized->align;
    }
  }
  if (normalized_matcher_.empty()) {
    EncodePiece(text, map, out);
    return;
  }
  std::vector<AddedSplit> splits;
  normalized_matcher_.Split(text, added_, &splits);
  for (const AddedSplit& s : splits) {
    if (s.token >= 0) {
      PushAdded(s.token, map.Begin(s.begin), map.End(s.end - 1), out);
    } else {
      EncodePiece(text.substr(s.begin, s.end - s.begin), map.Sub(s.begin), out);
    }
  }
}

void BpeTokenizer::EncodePiece(std::string_view piece, const OffsetMap& map, Encoding* out) const {
  // Each stage splits (or rewrites) every part the previous one made.
  // Rewritten text lives in `texts`/`aligns` until the piece is encoded.
  std::deque<std::string> texts;
  std::deque<Alignment> aligns;
  std::vector<Part> parts{{piece, map}}, next;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const PreStep& step : pre_steps_) {
    next.clear();
    for (const Part& part : parts) {
      Part p = step.kind == PreStep::Kind::kMetaspace ? Metaspace(part, step, &texts, &aligns) : part;
      if (step.kind == PreStep::Kind::kMetaspace && !step.splitter) {
        next.push_back(p);
        continue;
      }
      ranges.clear();
      if (step.kind == PreStep::Kind::kKnownSplit) {
        SplitByPattern(step.known, p.text, &ranges);
      } else {
        step.splitter->Split(p.text, &ranges);
      }
      for (const auto& [b, e] : ranges) {
        if (e > b) next.push_back({p.text.substr(b, e - b), p.map.Sub(b)});
      }
    }
    parts.swap(next);
  }
  for (const Part& part : parts) {
    if (part.text.empty()) continue;
    if (byte_level_) {
      EncodeByteLevel(part, &texts, &aligns, out);
    } else {
      EncodeWord(part.text, part.map, out);
    }
  }
}

BpeTokenizer::Part BpeTokenizer::Rewrite(const Part& part, std::string_view prefix, std::string_view space,
                                         std::deque<std::string>* texts, std::deque<Alignment>* aligns) const {
  // Alignments are relative to the part's base, as OffsetMap reads them.
  const auto from = [&](size_t i) {
    return std::make_pair(static_cast<uint32_t>(part.map.Begin(i) - part.map.base),
                          static_cast<uint32_t>(part.map.End(i) - part.map.base));
  };
  std::string& text = texts->emplace_back();
  Alignment& align = aligns->emplace_back();
  if (!prefix.empty()) {
    const unicode::DecodedChar first = unicode::DecodeUtf8(part.text, 0);
    const auto whole = std::make_pair(from(0).first, from((first.valid ? first.len : 1) - 1).second);
    text.append(prefix);
    align.insert(align.end(), prefix.size(), whole);
  }
  for (size_t i = 0; i < part.text.size(); ++i) {
    if (part.text[i] == ' ' && !space.empty()) {
      text.append(space);
      align.insert(align.end(), space.size(), from(i));
    } else {
      text.push_back(part.text[i]);
      align.push_back(from(i));
    }
  }
  return Part{text, OffsetMap{part.map.base, &align, 0}};
}

BpeTokenizer::Part BpeTokenizer::Metaspace(const Part& part, const PreStep& step, std::deque<std::string>* texts,
                                           std::deque<Alignment>* aligns) const {
  // HF replaces the spaces first, then prepends unless the text now starts
  // with the replacement; "first" only for the input's first part.
  const MetaspaceSettings& m = step.metaspace;
  const bool prepend = !part.text.empty() && part.text[0] != ' ' && part.text.rfind(m.replacement, 0) != 0 &&
                       (m.prepend == MetaspacePrepend::kAlways ||
                        (m.prepend == MetaspacePrepend::kFirst && part.map.Begin(0) == 0));
  return Rewrite(part, prepend ? m.replacement : "", m.replacement, texts, aligns);
}

void BpeTokenizer::EncodeByteLevel(const Part& part, std::deque<std::string>* texts, std::deque<Alignment>* aligns,
                                   Encoding* out) const {
  // ByteLevel's add_prefix_space: HF prepends to each piece, the new space
  // aligned with the piece's first character.
  const Part p = add_prefix_space_ && part.text[0] != ' ' ? Rewrite(part, " ", "", texts, aligns) : part;
  if (!byte_level_regex_) {
    EncodeWord(p.text, p.map, out);
    return;
  }
  std::vector<std::pair<size_t, size_t>> words;
  SplitByPattern(SplitPattern::kGpt2, p.text, &words);
  for (const auto& [wb, we] : words) EncodeWord(p.text.substr(wb, we - wb), p.map.Sub(wb), out);
}

void BpeTokenizer::EncodeWord(std::string_view word, const OffsetMap& map, Encoding* out) const {
  if (word.empty()) return;
  std::vector<WordToken> tokens;
  if (ignore_merges_) {
    if (const auto it = bytes_to_id_.find(AbslView(word)); it != bytes_to_id_.end()) {
      tokens.push_back({it->second, 0, static_cast<uint32_t>(word.size())});
    }
  }
  if (tokens.empty() && !cache_.Lookup(word, &tokens)) {
    BpeWord(word, &tokens);
    cache_.Insert(word, tokens.data(), tokens.size());
  }
  for (const WordToken& t : tokens) {
    out->ids.push_back(t.id);
    out->offsets.emplace_back(map.Begin(t.begin), map.End(t.begin + t.len - 1));
  }
}

void BpeTokenizer::CharSymbols(std::string_view word, std::vector<std::pair<int32_t, uint32_t>>* symbols) const {
  // HF's BPE::merge_word: each character is its token, else its bytes'
  // <0xNN> tokens (byte_fallback), else unk (runs fused when fuse_unk). A
  // pending unk goes out before the next known character, but after byte
  // tokens, as HF orders them. Lengths are UTF-8 bytes; a character with
  // neither is dropped.
  std::optional<std::pair<int32_t, uint32_t>> unk;
  for (size_t i = 0; i < word.size();) {
    const unicode::DecodedChar c = unicode::DecodeUtf8(word, i);
    const size_t len = c.valid ? c.len : 1;
    const auto known = bytes_to_id_.find(AbslView(word.substr(i, len)));
    if (known != bytes_to_id_.end()) {
      if (unk) symbols->push_back(*std::exchange(unk, std::nullopt));
      symbols->push_back({known->second, static_cast<uint32_t>(len)});
      i += len;
      continue;
    }
    bool all_bytes = byte_fallback_;
    for (size_t k = 0; all_bytes && k < len; ++k) all_bytes = fallback_ids_[static_cast<uint8_t>(word[i + k])] >= 0;
    if (all_bytes) {
      for (size_t k = 0; k < len; ++k) symbols->push_back({fallback_ids_[static_cast<uint8_t>(word[i + k])], 1});
    } else if (unk_id_) {
      if (unk && fuse_unk_) {
        unk->second += static_cast<uint32_t>(len);
      } else {
        if (unk) symbols->push_back(*unk);
        unk = std::make_pair(*unk_id_, static_cast<uint32_t>(len));
      }
    } else {
      symbols->push_back({-1, static_cast<uint32_t>(len)});  // dropped, keeps the offsets
    }
    i += len;
  }
  if (unk) symbols->push_back(*unk);
}

void BpeTokenizer::BpeWord(std::string_view word, std::vector<WordToken>* out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t begin, len;  // bytes; len 0 once merged into its left neighbour
  };
  std::vector<std::pair<int32_t, uint32_t>> initial;
  initial.reserve(word.size());
  if (!byte_level_) {
    CharSymbols(word, &initial);
  } else {
    for (size_t i = 0; i < word.size(); ++i) {
      int32_t id = byte_ids_[static_cast<uint8_t>(word[i])];
      if (id < 0) {
        // A byte without a token: HF emits unk when there is one (fusing
        // runs when asked), else drops the byte.
        if (!unk_id_) {
          initial.push_back({-1, 1});
          continue;
        }
        if (fuse_unk_ && !initial.empty() && initial.back().first == *unk_id_) {
          ++initial.back().second;
          continue;
        }
        id = *unk_id_;
      }
      initial.push_back({id, 1});
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(initial.size());
  uint32_t at = 0;
  for (const auto& [id, len] : initial) {
    if (id >= 0) {
      const auto n = static_cast<int32_t>(symbols.size());
      symbols.push_back({id, n - 1, n + 1, at, len});
    }
    at += len;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // Lowest rank first; equal ranks (the same pair) leftmost first.
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  const auto push_pair = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Skip stale candidates: the pair changed since it was queued.
    const auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    left.len = right.begin + right.len - left.begin;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.len > 0) out->push_back({s.id, s.begin, s.len});
  }
}

// HF's decoders over the token strings, in order, then joined.
std::string BpeTokenizer::DecodeTokens(std::vector<std::string> tokens) const {
  if (decoders_.empty()) return absl::StrJoin(tokens, " ");  // HF without a decoder
  for (const DecodeStep& d : decoders_) {
    std::vector<std::string> next;
    switch (d.kind) {
      case DecodeStep::Kind::kReplace:
        for (std::string& t : tokens) t = absl::StrReplaceAll(t, {{d.from, d.to}});
        continue;
      case DecodeStep::Kind::kByteFallback: {
        // Runs of <0xNN> tokens become their bytes when those are UTF-8,
        // else one U+FFFD per byte.
        std::string run;
        size_t run_tokens = 0;
        const auto flush = [&] {
          if (run_tokens == 0) return;
          if (unicode::ToValidUtf8Lossy(run) == run) {
            next.push_back(run);
          } else {
            for (size_t k = 0; k < run_tokens; ++k) next.push_back("\xEF\xBF\xBD");
          }
          run.clear();
          run_tokens = 0;
        };
        for (std::string& t : tokens) {
          unsigned value = 0;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
              std::isxdigit(static_cast<unsigned char>(t[4])) && std::sscanf(t.c_str() + 3, "%2x", &value) == 1) {
            run.push_back(static_cast<char>(value));
            ++run_tokens;
            continue;
          }
          flush();
          next.push_back(std::move(t));
        }
        flush();
        break;
      }
      case DecodeStep::Kind::kFuse:
        next.push_back(absl::StrJoin(tokens, ""));
        break;
      case DecodeStep::Kind::kStrip:
        for (std::string& t : tokens) {
          for (int k = 0; k < d.start && t.rfind(d.strip, 0) == 0; ++k) t.erase(0, d.strip.size());
          for (int k = 0; k < d.stop && t.size() >= d.strip.size() &&
                          t.compare(t.size() - d.strip.size(), d.strip.size(), d.strip) == 0;
               ++k) {
            t.resize(t.size() - d.strip.size());
          }
        }
        continue;
      case DecodeStep::Kind::kMetaspace:
        // Every replacement becomes a space, except in the first token,
        // where HF drops them when a prefix was prepended.
        for (size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = absl::StrReplaceAll(tokens[i], {{d.from, i == 0 && d.strip_first_space ? "" : " "}});
        }
        continue;
    }
    tokens.swap(next);
  }
  return unicode::ToValidUtf8Lossy(absl::StrJoin(tokens, ""));
}

std::string BpeTokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  if (!byte_level_) {
    std::vector<std::string> tokens;
    for (int32_t id : ids) {
      if (skip_special_tokens && special_ids_.contains(id)) continue;
      const auto it = id_bytes_.find(id);
      if (it != id_bytes_.end()) tokens.push_back(it->second);  // HF skips ids it does not know
    }
    return DecodeTokens(std::move(tokens));
  }
  std::string bytes;
  for (int32_t id : ids) {
    const auto it = id_bytes_.find(id);
    if (it == id_bytes_.end()) continue;  // HF skips ids it does not know
    if (skip_special_tokens && special_ids_.contains(id)) continue;
    bytes += it->second;
  }
  return unicode::ToValidUtf8Lossy(bytes);
}

std::optional<int32_t> BpeTokenizer::TokenToId(std::string_view token) const {
  if (const auto it = added_by_content_.find(AbslView(token)); it != added_by_content_.end()) {
    return added_[it->second].id;
  }
  if (const auto it = vocab_.find(AbslView(token)); it != vocab_.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> BpeTokenizer::IdToToken(int32_t id) const {
  if (const auto it = added_by_id_.find(id); it != added_by_id_.end())
    return added_[it->second].content;
  if (const auto it = id_to_token_.find(id); it != id_to_token_.end()) return it->second;
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  E3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  const Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return BpeTokenizer::Load(path, root);
}

}  // namespace e3
