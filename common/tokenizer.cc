#include "common/file_util.h"
#include "common/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <optional>
#include <queue>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/pretokenizer.h"
#include "common/status_macros.h"
#include "common/unicode.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

using Json = nlohmann::json;
using Alignment = std::vector<std::pair<uint32_t, uint32_t>>;

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

// Renders a JSON value for an error message; never throws.
std::string Show(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

absl::Status FieldError(const std::string& path, const std::string& field,
                        const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, " ", what));
}

// `obj[key]` as a bool: absent or null gives `fallback`.
absl::StatusOr<bool> GetBool(const std::string& path, const Json& obj, const std::string& field,
                             const char* key, bool fallback) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return FieldError(path, absl::StrCat(field, ".", key),
                      absl::StrCat("is ", Show(*it), "; expected a boolean"));
  }
  return it->get<bool>();
}

// The "type" of a tokenizer.json component, or "" when absent.
std::string TypeOf(const Json& component) {
  const auto it = component.find("type");
  return it != component.end() && it->is_string() ? it->get<std::string>() : "";
}

struct AddedToken {
  int32_t id;
  std::string content;
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
    if (token.content.empty()) return;
    auto& list = by_first_byte_[static_cast<uint8_t>(token.content[0])];
    list.push_back(index);
    any_ = true;
  }
  void Finish(const std::vector<AddedToken>& tokens) {
    for (auto& list : by_first_byte_) {
      std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
        return tokens[a].content.size() > tokens[b].content.size();
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
        if (text.substr(pos, tokens[t].content.size()) == tokens[t].content) {
          found = t;
          break;
        }
      }
      if (found < 0) {
        ++pos;
        continue;
      }
      const AddedToken& tok = tokens[found];
      size_t begin = pos, end = pos + tok.content.size();
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

// One BPE token of a word: its id and its length in the word's bytes.
struct WordToken {
  int32_t id;
  uint32_t len;
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
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  std::optional<std::string> IdToToken(int32_t id) const override;
  int64_t vocab_size() const override { return vocab_size_; }

 private:
  absl::Status LoadModel(const std::string& path, const Json& model);
  absl::Status LoadAddedTokens(const std::string& path, const Json& added);
  absl::Status LoadNormalizer(const std::string& path, const Json& normalizer);
  absl::Status LoadPreTokenizer(const std::string& path, const Json& pre);
  absl::Status LoadPreTokenizerStep(const std::string& path, const std::string& field,
                                    const Json& step, bool last);

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

  bool nfc_ = false;
  std::vector<SplitPattern> splits_;  // Split pre-tokenizers, in order
  bool add_prefix_space_ = false;
  bool byte_level_regex_ = false;  // ByteLevel's use_regex: the GPT-2 split

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
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object()) return FieldError(path, "model", "is missing");
  E3_RETURN_IF_ERROR(tok->LoadModel(path, *model));
  const auto added = root.find("added_tokens");
  if (added != root.end() && !added->is_null())
    E3_RETURN_IF_ERROR(tok->LoadAddedTokens(path, *added));
  const auto normalizer = root.find("normalizer");
  if (normalizer != root.end()) E3_RETURN_IF_ERROR(tok->LoadNormalizer(path, *normalizer));
  const auto pre = root.find("pre_tokenizer");
  if (pre == root.end() || pre->is_null()) {
    return FieldError(path, "pre_tokenizer", "is missing; expected ByteLevel (byte-level BPE)");
  }
  E3_RETURN_IF_ERROR(tok->LoadPreTokenizer(path, *pre));
  const auto decoder = root.find("decoder");
  if (decoder == root.end() || !decoder->is_object() || TypeOf(*decoder) != "ByteLevel") {
    return FieldError(path, "decoder",
                      absl::StrCat("is ", decoder == root.end() ? "missing" : Show(*decoder),
                                   "; expected {\"type\": \"ByteLevel\"}"));
  }

  // Decoding tables: added tokens override the model's entries, as in HF.
  for (const auto& [id, token] : tok->id_to_token_) {
    std::optional<std::string> bytes = ByteLevelToBytes(token);
    // HF's ByteLevel decoder passes through the UTF-8 of a token that has a
    // character outside the byte alphabet.
    tok->id_bytes_[id] = bytes ? *std::move(bytes) : token;
    tok->vocab_size_ = std::max<int64_t>(tok->vocab_size_, int64_t{id} + 1);
  }
  for (const AddedToken& a : tok->added_) {
    std::optional<std::string> bytes = ByteLevelToBytes(a.content);
    tok->id_bytes_[a.id] = bytes ? *std::move(bytes) : a.content;
    if (a.special) tok->special_ids_[a.id] = true;
    tok->vocab_size_ = std::max<int64_t>(tok->vocab_size_, int64_t{a.id} + 1);
  }
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

absl::Status BpeTokenizer::LoadModel(const std::string& path, const Json& model) {
  const std::string type = TypeOf(model);
  // Old files omit model.type; a model with merges is BPE.
  if (type != "BPE" && !(type.empty() && model.contains("merges"))) {
    return FieldError(path, "model.type",
                      absl::StrCat("is ", model.contains("type") ? Show(model["type"]) : "missing",
                                   "; expected \"BPE\""));
  }
  E3_ASSIGN_OR_RETURN(const bool byte_fallback,
                      GetBool(path, model, "model", "byte_fallback", false));
  if (byte_fallback)
    return FieldError(path, "model.byte_fallback", "is true; only false is supported");
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
    if (std::optional<std::string> bytes = ByteLevelToBytes(token))
      bytes_to_id_.emplace(*std::move(bytes), i);
  }
  const std::array<char32_t, 256> byte_chars = ByteToUnicode();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    unicode::AppendUtf8(byte_chars[b], &ch);
    const auto it = vocab_.find(ch);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
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
    (added_[i].normalized ? normalized_matcher_ : raw_matcher_)
        .Add(static_cast<int32_t>(i), added_[i]);
  }
  raw_matcher_.Finish(added_);
  normalized_matcher_.Finish(added_);
  return absl::OkStatus();
}

absl::Status BpeTokenizer::LoadNormalizer(const std::string& path, const Json& normalizer) {
  if (normalizer.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(normalizer);
  if (type == "NFC") {
    nfc_ = true;
    return absl::OkStatus();
  }
  // An empty Sequence, or one holding only NFC, is the same thing.
  if (type == "Sequence" && normalizer.contains("normalizers") &&
      normalizer["normalizers"].is_array()) {
    for (const Json& n : normalizer["normalizers"]) {
      if (TypeOf(n) != "NFC") {
        return FieldError(path, "normalizer.normalizers",
                          absl::StrCat("holds ", Show(n), "; only NFC is supported"));
      }
      nfc_ = true;
    }
    return absl::OkStatus();
  }
  return FieldError(path, "normalizer",
                    absl::StrCat("is ", Show(normalizer), "; expected null or NFC"));
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
    E3_ASSIGN_OR_RETURN(add_prefix_space_, GetBool(path, step, field, "add_prefix_space", false));
    E3_ASSIGN_OR_RETURN(byte_level_regex_, GetBool(path, step, field, "use_regex", true));
    return absl::OkStatus();
  }
  if (last) {
    return FieldError(
        path, field, absl::StrCat("is ", Show(step), "; the last pre-tokenizer must be ByteLevel"));
  }
  if (type != "Split") {
    return FieldError(path, field,
                      absl::StrCat("is ", Show(step), "; expected Split or ByteLevel"));
  }
  const auto behavior = step.find("behavior");
  if (behavior == step.end() || *behavior != "Isolated") {
    return FieldError(path, field + ".behavior",
                      absl::StrCat("is ", behavior == step.end() ? "missing" : Show(*behavior),
                                   "; expected \"Isolated\""));
  }
  E3_ASSIGN_OR_RETURN(const bool invert, GetBool(path, step, field, "invert", false));
  if (invert) return FieldError(path, field + ".invert", "is true; expected false");
  const auto pattern = step.find("pattern");
  const Json* regex = nullptr;
  if (pattern != step.end() && pattern->is_object()) {
    const auto it = pattern->find("Regex");
    if (it != pattern->end() && it->is_string()) regex = &*it;
  }
  if (regex == nullptr) {
    return FieldError(path, field + ".pattern",
                      absl::StrCat("is ", pattern == step.end() ? "missing" : Show(*pattern),
                                   "; expected {\"Regex\": <a known pattern>}"));
  }
  const std::optional<SplitPattern> known = SplitPatternFromRegex(regex->get<std::string>());
  if (!known) {
    return FieldError(path, field + ".pattern.Regex",
                      absl::StrCat("is an unsupported pattern: ", Show(*regex),
                                   " (supported: the GPT-2, Llama 3 and Qwen2 patterns)"));
  }
  splits_.push_back(*known);
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

void BpeTokenizer::EncodeNormalizable(std::string_view text, size_t base, Encoding* out) const {
  std::string normalized;
  Alignment align;
  OffsetMap map{base};
  if (nfc_ && unicode::MayNeedNfc(text)) {
    normalized = unicode::Nfc(text, &align);
    text = normalized;
    map.align = &align;
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
  // Apply the Split stages in turn; each piece of one is split by the next.
  std::vector<std::pair<size_t, size_t>> ranges{{0, piece.size()}};
  std::vector<std::pair<size_t, size_t>> next;
  for (SplitPattern pattern : splits_) {
    next.clear();
    for (const auto& [b, e] : ranges) {
      const size_t first = next.size();
      SplitByPattern(pattern, piece.substr(b, e - b), &next);
      for (size_t k = first; k < next.size(); ++k) {
        next[k].first += b;
        next[k].second += b;
      }
    }
    ranges.swap(next);
  }

  std::vector<std::pair<size_t, size_t>> words;
  std::string prefixed;
  Alignment prefixed_align;
  for (const auto& [b, e] : ranges) {
    if (b == e) continue;
    std::string_view part = piece.substr(b, e - b);
    OffsetMap part_map = map.Sub(b);
    // ByteLevel's add_prefix_space: HF prepends to each piece, the new space
    // aligned with the piece's first character.
    if (add_prefix_space_ && part[0] != ' ') {
      prefixed.assign(1, ' ');
      prefixed.append(part);
      prefixed_align.resize(prefixed.size());
      const auto rel = [&](size_t v) { return static_cast<uint32_t>(v - map.base); };
      const unicode::DecodedChar first = unicode::DecodeUtf8(part, 0);
      prefixed_align[0] = {rel(part_map.Begin(0)), rel(part_map.End(first.len - 1))};
      for (size_t i = 0; i < part.size(); ++i) {
        prefixed_align[i + 1] = {rel(part_map.Begin(i)), rel(part_map.End(i))};
      }
      part = prefixed;
      part_map = OffsetMap{map.base, &prefixed_align, 0};
    }
    if (!byte_level_regex_) {
      EncodeWord(part, part_map, out);
      continue;
    }
    words.clear();
    SplitByPattern(SplitPattern::kGpt2, part, &words);
    for (const auto& [wb, we] : words) EncodeWord(part.substr(wb, we - wb), part_map.Sub(wb), out);
  }
}

void BpeTokenizer::EncodeWord(std::string_view word, const OffsetMap& map, Encoding* out) const {
  if (word.empty()) return;
  std::vector<WordToken> tokens;
  if (ignore_merges_) {
    if (const auto it = bytes_to_id_.find(AbslView(word)); it != bytes_to_id_.end()) {
      tokens.push_back({it->second, static_cast<uint32_t>(word.size())});
    }
  }
  if (tokens.empty() && !cache_.Lookup(word, &tokens)) {
    BpeWord(word, &tokens);
    cache_.Insert(word, tokens.data(), tokens.size());
  }
  size_t pos = 0;
  for (const WordToken& t : tokens) {
    out->ids.push_back(t.id);
    out->offsets.emplace_back(map.Begin(pos), map.End(pos + t.len - 1));
    pos += t.len;
  }
}

void BpeTokenizer::BpeWord(std::string_view word, std::vector<WordToken>* out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len;  // bytes; 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    int32_t id = byte_ids_[static_cast<uint8_t>(word[i])];
    if (id < 0) {
      // A byte without a token: HF emits unk when there is one (fusing runs
      // when asked), else drops the byte.
      if (!unk_id_) continue;
      if (fuse_unk_ && !symbols.empty() && symbols.back().id == *unk_id_) {
        ++symbols.back().len;
        continue;
      }
      id = *unk_id_;
    }
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, 1});
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
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.len > 0) out->push_back({s.id, s.len});
  }
}

std::string BpeTokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
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
