#include "common/text/normalizer.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/text/regex_split.h"
#include "common/text/tokenizer_json.h"
#include "common/text/unicode.h"

namespace e3 {
namespace {

using Json = nlohmann::json;
using Range = std::pair<size_t, size_t>;

using tokenizer_json::FieldError;
using tokenizer_json::Show;

// Rewrites `t` with each [begin, end) of `ranges` (ascending, disjoint)
// replaced by `content`, whose bytes all come from the range they replace.
void ReplaceRanges(NormalizedText* t, const std::vector<Range>& ranges, const std::string& content) {
  if (ranges.empty()) return;
  t->Materialize();
  std::string text;
  Alignment align;
  size_t at = 0;
  for (const auto& [b, e] : ranges) {
    text.append(t->text, at, b - at);
    align.insert(align.end(), t->align.begin() + static_cast<std::ptrdiff_t>(at),
                 t->align.begin() + static_cast<std::ptrdiff_t>(b));
    const std::pair<uint32_t, uint32_t> from = {t->align[b].first, t->align[e - 1].second};
    text += content;
    align.insert(align.end(), content.size(), from);
    at = e;
  }
  text.append(t->text, at, std::string::npos);
  align.insert(align.end(), t->align.begin() + static_cast<std::ptrdiff_t>(at), t->align.end());
  t->text = std::move(text);
  t->align = std::move(align);
}

class NfcNormalizer final : public Normalizer {
 public:
  void Apply(NormalizedText* t) const override {
    if (!unicode::MayNeedNfc(t->text)) return;
    Alignment local;
    std::string text = unicode::Nfc(t->text, &local);
    if (text == t->text) return;
    t->Materialize();
    for (auto& [b, e] : local) {  // compose with what came before
      const uint32_t begin = t->align[b].first, end = t->align[e - 1].second;
      b = begin;
      e = end;
    }
    t->text = std::move(text);
    t->align = std::move(local);
  }
};

// Prepend: the string goes before non-empty text, from its first character.
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Apply(NormalizedText* t) const override {
    if (t->text.empty() || prefix_.empty()) return;
    t->Materialize();
    const unicode::DecodedChar first = unicode::DecodeUtf8(t->text, 0);
    const size_t len = first.valid ? first.len : 1;
    const std::pair<uint32_t, uint32_t> from = {t->align[0].first, t->align[len - 1].second};
    t->text.insert(0, prefix_);
    t->align.insert(t->align.begin(), prefix_.size(), from);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<RegexSplitter> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Apply(NormalizedText* t) const override {
    std::vector<Range> matches;
    pattern_->FindMatches(t->text, &matches);
    std::vector<Range> nonempty;
    for (const Range& m : matches) {
      if (m.second > m.first) nonempty.push_back(m);
    }
    ReplaceRanges(t, nonempty, content_);
  }

 private:
  std::unique_ptr<RegexSplitter> pattern_;
  std::string content_;
};

// Strip: Unicode whitespace off the left and/or right.
class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Apply(NormalizedText* t) const override {
    size_t begin = 0, end = t->text.size();
    while (left_ && begin < end) {
      const unicode::DecodedChar c = unicode::DecodeUtf8(t->text, begin);
      if (!c.valid || unicode::ClassOf(c.cp) != unicode::CharClass::kSpace) break;
      begin += c.len;
    }
    while (right_ && end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<uint8_t>(t->text[start]) & 0xC0) == 0x80) --start;
      const unicode::DecodedChar c = unicode::DecodeUtf8(t->text, start);
      if (!c.valid || start + c.len != end || unicode::ClassOf(c.cp) != unicode::CharClass::kSpace) break;
      end = start;
    }
    if (begin == 0 && end == t->text.size()) return;
    t->Materialize();
    t->text = t->text.substr(begin, end - begin);
    t->align = Alignment(t->align.begin() + static_cast<std::ptrdiff_t>(begin),
                         t->align.begin() + static_cast<std::ptrdiff_t>(end));
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void Apply(NormalizedText* t) const override {
    for (const auto& s : steps_) s->Apply(t);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

absl::StatusOr<std::string> StringField(const std::string& path, const std::string& field, const Json& j,
                                        const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return FieldError(path, absl::StrCat(field, ".", key), "is missing or not a string");
  }
  return it->get<std::string>();
}

}  // namespace

void NormalizedText::Materialize() {
  if (!identity) return;
  align.resize(text.size());
  for (size_t i = 0; i < text.size(); ++i) align[i] = {static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1)};
  identity = false;
}

absl::StatusOr<std::unique_ptr<Normalizer>> Normalizer::FromJson(const std::string& path, const std::string& field,
                                                                 const Json& config) {
  if (config.is_null()) return std::unique_ptr<Normalizer>();
  const std::string type = config.is_object() && config.contains("type") && config["type"].is_string()
                               ? config["type"].get<std::string>()
                               : "";
  if (type == "NFC") return std::unique_ptr<Normalizer>(new NfcNormalizer());
  if (type == "Prepend") {
    auto prefix = StringField(path, field, config, "prepend");
    if (!prefix.ok()) return prefix.status();
    return std::unique_ptr<Normalizer>(new PrependNormalizer(*std::move(prefix)));
  }
  if (type == "Replace") {
    const auto it = config.find("pattern");
    auto pattern = PatternFromJson(it == config.end() ? Json() : *it);
    if (!pattern.ok()) return FieldError(path, field + ".pattern", std::string(pattern.status().message()));
    auto content = StringField(path, field, config, "content");
    if (!content.ok()) return content.status();
    auto splitter = RegexSplitter::Create(pattern->text, pattern->is_regex, SplitBehavior::kIsolated, false);
    if (!splitter.ok()) return FieldError(path, field + ".pattern", std::string(splitter.status().message()));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(*std::move(splitter), *std::move(content)));
  }
  if (type == "Strip") {
    const auto flag = [&](const char* key) {
      const auto it = config.find(key);
      return it == config.end() || !it->is_boolean() || it->get<bool>();
    };
    const bool left = flag("strip_left"), right = flag("strip_right");
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "Sequence") {
    const auto list = config.find("normalizers");
    if (list == config.end() || !list->is_array()) return FieldError(path, field + ".normalizers", "is missing");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      auto step = FromJson(path, absl::StrCat(field, ".normalizers[", i, "]"), (*list)[i]);
      if (!step.ok()) return step.status();
      if (*step) steps.push_back(*std::move(step));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  return FieldError(path, field,
                    absl::StrCat("is ", Show(config),
                                 "; supported normalizers: NFC, Prepend, Replace, Strip and Sequence of them"));
}

}  // namespace e3
