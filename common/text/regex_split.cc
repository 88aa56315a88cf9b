#include "common/text/regex_split.h"

#include <oniguruma.h>

#include <algorithm>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/text/unicode.h"

namespace e3 {
namespace {

using Range = std::pair<size_t, size_t>;

// Oniguruma's global setup, once per process.
void InitOnigurumaOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

bool IsValidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const unicode::DecodedChar c = unicode::DecodeUtf8(text, i);
    if (!c.valid) return false;
    i += c.len;
  }
  return true;
}

size_t NextCharLength(std::string_view text, size_t at) {
  if (at >= text.size()) return 1;
  const unicode::DecodedChar c = unicode::DecodeUtf8(text, at);
  return c.valid ? c.len : 1;
}

// Text and match pieces, each flagged as a match, as HF's find_matches
// returns them.
std::vector<std::pair<Range, bool>> Pieces(std::string_view text, const std::vector<Range>& matches) {
  std::vector<std::pair<Range, bool>> out;
  size_t prev = 0;
  for (const Range& m : matches) {
    if (prev != m.first) out.push_back({{prev, m.first}, false});
    out.push_back({m, true});
    prev = m.second;
  }
  if (prev != text.size()) out.push_back({{prev, text.size()}, false});
  return out;
}

// HF's NormalizedString::split by behaviour.
std::vector<Range> ApplyBehavior(std::vector<std::pair<Range, bool>> pieces, SplitBehavior behavior) {
  std::vector<Range> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& [r, is_match] : pieces) {
        if (!is_match) out.push_back(r);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const auto& [r, is_match] : pieces) out.push_back(r);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& [r, is_match] : pieces) {
        if (is_match && !previous_match && !out.empty()) {
          out.back().second = r.second;
        } else {
          out.push_back(r);
        }
        previous_match = is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->second && !previous_match && !out.empty()) {
          out.back().first = it->first.first;
        } else {
          out.push_back(it->first);
        }
        previous_match = it->second;
      }
      std::reverse(out.begin(), out.end());
      break;
    case SplitBehavior::kContiguous:
      for (const auto& [r, is_match] : pieces) {
        if (is_match == previous_match && !out.empty()) {
          out.back().second = r.second;
        } else {
          out.push_back(r);
        }
        previous_match = is_match;
      }
      break;
  }
  return out;
}

}  // namespace

absl::StatusOr<SplitBehavior> SplitBehaviorFromName(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", name, "\"; expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous"));
}

absl::StatusOr<PatternSpec> PatternFromJson(const nlohmann::json& pattern) {
  PatternSpec spec;
  if (pattern.is_object()) {
    for (const char* key : {"Regex", "String"}) {
      const auto it = pattern.find(key);
      if (it == pattern.end() || !it->is_string()) continue;
      spec.text = it->get<std::string>();
      spec.is_regex = std::string(key) == "Regex";
      break;
    }
  }
  if (spec.text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("is ", pattern.is_null() ? "missing" : pattern.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                     "; expected {\"Regex\": ...} or {\"String\": ...}"));
  }
  return spec;
}

absl::StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::Create(const std::string& pattern, bool is_regex,
                                                                    SplitBehavior behavior, bool invert) {
  auto s = std::unique_ptr<RegexSplitter>(new RegexSplitter());
  s->behavior_ = behavior;
  s->invert_ = invert;
  if (!is_regex) {
    if (pattern.empty()) return absl::InvalidArgumentError("an empty split string");
    s->literal_ = pattern;
    return s;
  }
  InitOnigurumaOnce();
  OnigRegex regex = nullptr;
  OnigErrorInfo info;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&regex, begin, begin + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_DEFAULT, &info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &info);
    return absl::InvalidArgumentError(absl::StrCat("the regex does not compile: ", reinterpret_cast<char*>(message)));
  }
  s->regex_ = regex;
  return s;
}

RegexSplitter::~RegexSplitter() {
  if (regex_ != nullptr) onig_free(static_cast<OnigRegex>(regex_));
}

void RegexSplitter::FindMatches(std::string_view text, std::vector<Range>* matches) const {
  if (regex_ == nullptr) {
    for (size_t at = text.find(literal_); at != std::string_view::npos; at = text.find(literal_, at + literal_.size())) {
      matches->push_back({at, at + literal_.size()});
    }
    return;
  }
  auto* regex = static_cast<OnigRegex>(regex_);
  OnigRegion* region = onig_region_new();
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = str + text.size();
  size_t last_end = 0;
  bool have_last_match = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    onig_region_clear(region);
    const int at = onig_search(regex, str, end, str + last_end, end, region, ONIG_OPTION_NONE);
    if (at < 0) break;
    const auto b = static_cast<size_t>(region->beg[0]), e = static_cast<size_t>(region->end[0]);
    if (b == e && have_last_match && last_end == last_match_end) {
      last_end += NextCharLength(text, last_end);  // no empty match right after the last one
      continue;
    }
    last_end = e;
    have_last_match = true;
    last_match_end = e;
    matches->push_back({b, e});
  }
  onig_region_free(region, 1);
}

void RegexSplitter::Split(std::string_view text, std::vector<Range>* pieces) const {
  if (text.empty()) return;
  if (regex_ != nullptr && !IsValidUtf8(text)) {
    pieces->push_back({0, text.size()});
    return;
  }
  std::vector<Range> matches;
  FindMatches(text, &matches);
  std::vector<std::pair<Range, bool>> flagged = Pieces(text, matches);
  if (invert_) {
    for (auto& p : flagged) p.second = !p.second;
  }
  for (const Range& r : ApplyBehavior(std::move(flagged), behavior_)) {
    if (r.second > r.first) pieces->push_back(r);
  }
}

}  // namespace e3
