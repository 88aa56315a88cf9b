#include "common/text/post_processor.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/text/tokenizer_json.h"
#include "common/text/unicode.h"

namespace e3 {

using Json = nlohmann::json;

namespace {

using tokenizer_json::FieldError;
using tokenizer_json::Show;
using tokenizer_json::GetBool;

// Rust's char::is_whitespace (Unicode White_Space), which HF's offset
// trimming uses besides the byte-level space "Ġ".
bool IsWhiteSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}
bool IsTrimmed(char32_t c) { return c == 0x120 || IsWhiteSpace(c); }

// HF's byte_level::process_offsets: a token's leading and trailing spaces
// (counted in characters, subtracted from byte offsets, as HF does) leave
// its offsets; a single leading space of the first token stays when the
// processor's add_prefix_space says the pre-tokenizer added it.
void TrimOffsets(PostEncoding* e, bool add_prefix_space) {
  for (size_t i = 0; i < e->ids.size(); ++i) {
    const std::string& token = e->tokens[i];
    std::vector<char32_t> chars;
    for (size_t k = 0; k < token.size();) {
      const unicode::DecodedChar c = unicode::DecodeUtf8(token, k);
      chars.push_back(c.valid ? c.cp : 0xFFFD);
      k += c.valid ? c.len : 1;
    }
    size_t leading = 0, trailing = 0;
    while (leading < chars.size() && IsTrimmed(chars[leading])) ++leading;
    while (trailing < chars.size() && IsTrimmed(chars[chars.size() - 1 - trailing])) ++trailing;
    auto& [begin, end] = e->offsets[i];
    if (leading > 0) {
      const bool first = i == 0 || begin == 0;
      if (first && add_prefix_space && leading == 1) leading = 0;
      begin = std::min(begin + leading, end);
    }
    if (trailing > 0 && end >= trailing) end = std::max(end - trailing, begin);
  }
}

void Append(PostEncoding* to, PostEncoding from) {
  to->ids.insert(to->ids.end(), from.ids.begin(), from.ids.end());
  to->offsets.insert(to->offsets.end(), from.offsets.begin(), from.offsets.end());
  for (std::string& t : from.tokens) to->tokens.push_back(std::move(t));
}

// A special token added by a processor: offsets (0, 0).
PostEncoding Special(const std::vector<int32_t>& ids, const std::vector<std::string>& tokens) {
  PostEncoding e;
  e.ids = ids;
  e.offsets.assign(ids.size(), {0, 0});
  e.tokens = tokens;
  return e;
}

}  // namespace

struct PostProcessor::Step {
  enum class Kind { kByteLevel, kTemplate, kBert, kRoberta } kind;
  bool trim = false;             // kByteLevel, kRoberta: trim_offsets
  bool add_prefix_space = true;  // kByteLevel, kRoberta
  // kTemplate: pieces; a piece is a sequence (0 = A, 1 = B) or a special
  // token (index into `specials`).
  struct Piece {
    int sequence = -1;
    int special = -1;
  };
  std::vector<Piece> single, pair;
  bool has_pair = false;
  struct SpecialTokens {
    std::vector<int32_t> ids;
    std::vector<std::string> tokens;
  };
  std::vector<SpecialTokens> specials;
  // kBert, kRoberta.
  SpecialTokens cls, sep;

  std::vector<PostEncoding> Apply(std::vector<PostEncoding> in, bool add_special_tokens) const;
};

std::vector<PostEncoding> PostProcessor::Step::Apply(std::vector<PostEncoding> in, bool add) const {
  switch (kind) {
    case Kind::kByteLevel:
      if (trim) {
        for (PostEncoding& e : in) TrimOffsets(&e, add_prefix_space);
      }
      return in;
    case Kind::kTemplate: {
      // HF lays the sequences out as the template says even without
      // special tokens (a pair template may put B first).
      const std::vector<Piece>& t = in.size() == 2 ? pair : single;
      std::vector<PostEncoding> out;
      for (const Piece& p : t) {
        if (p.sequence >= 0) {
          out.push_back(in[p.sequence]);
        } else if (add) {
          out.push_back(Special(specials[p.special].ids, specials[p.special].tokens));
        }
      }
      return out;
    }
    case Kind::kBert:
    case Kind::kRoberta: {
      if (kind == Kind::kRoberta && trim) {
        for (PostEncoding& e : in) TrimOffsets(&e, add_prefix_space);
      }
      if (!add) return in;
      // [CLS] A [SEP] B [SEP]; Roberta: <s> A </s> </s> B </s>.
      std::vector<PostEncoding> out;
      for (size_t i = 0; i < in.size(); ++i) {
        PostEncoding e;
        if (i == 0) {
          e = Special(cls.ids, cls.tokens);
        } else if (kind == Kind::kRoberta) {
          e = Special(sep.ids, sep.tokens);
        }
        Append(&e, std::move(in[i]));
        Append(&e, Special(sep.ids, sep.tokens));
        out.push_back(std::move(e));
      }
      return out;
    }
  }
  return in;
}

PostProcessor::~PostProcessor() = default;

namespace {

using Step = PostProcessor::Step;

// BertProcessing's / RobertaProcessing's "cls" or "sep": [token, id].
absl::StatusOr<Step::SpecialTokens> TokenPair(const std::string& path, const std::string& field,
                                              const Json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_string() ||
      !(*it)[1].is_number_integer() || (*it)[1].get<int64_t>() < 0 ||
      (*it)[1].get<int64_t>() > INT32_MAX) {
    return FieldError(
        path, absl::StrCat(field, ".", key),
        absl::StrCat("is ", it == config.end() ? "missing" : Show(*it), "; expected [token, id]"));
  }
  return Step::SpecialTokens{{static_cast<int32_t>((*it)[1].get<int64_t>())},
                             {(*it)[0].get<std::string>()}};
}

// TemplateProcessing: `single` and `pair` are lists of {"Sequence": {"id":
// "A"|"B"}} and {"SpecialToken": {"id": name}}; `special_tokens` maps each
// name to its ids and tokens. Type ids are read past: the Encoding has none.
absl::StatusOr<Step> LoadTemplate(const std::string& path, const std::string& field,
                                  const Json& config) {
  Step step;
  step.kind = Step::Kind::kTemplate;
  absl::flat_hash_map<std::string, int> special_index;
  const auto specials = config.find("special_tokens");
  if (specials != config.end() && !specials->is_null()) {
    if (!specials->is_object())
      return FieldError(path, field + ".special_tokens", "is not an object");
    for (const auto& [name, value] : specials->items()) {
      const std::string f = absl::StrCat(field, ".special_tokens[\"", name, "\"]");
      const auto ids = value.is_object() ? value.find("ids") : value.end();
      const auto tokens = value.is_object() ? value.find("tokens") : value.end();
      if (ids == value.end() || !ids->is_array() || tokens == value.end() || !tokens->is_array() ||
          ids->size() != tokens->size()) {
        return FieldError(path, f,
                          absl::StrCat("is ", Show(value),
                                       "; expected {\"ids\": [...], \"tokens\": [...]} "
                                       "of the same length"));
      }
      Step::SpecialTokens s;
      for (size_t k = 0; k < ids->size(); ++k) {
        const Json& id = (*ids)[k];
        const Json& token = (*tokens)[k];
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX ||
            !token.is_string()) {
          return FieldError(path, f,
                            absl::StrCat("has ids ", Show(*ids), " and tokens ", Show(*tokens),
                                         "; expected non-negative integer ids and string tokens"));
        }
        s.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
        s.tokens.push_back(token.get<std::string>());
      }
      special_index[name] = static_cast<int>(step.specials.size());
      step.specials.push_back(std::move(s));
    }
  }
  const auto pieces = [&](const char* key, std::vector<Step::Piece>* out) -> absl::Status {
    const Json& list = config[key];
    const std::string f = absl::StrCat(field, ".", key);
    if (!list.is_array())
      return FieldError(path, f, absl::StrCat("is ", Show(list), "; expected a list of pieces"));
    for (size_t i = 0; i < list.size(); ++i) {
      const Json& p = list[i];
      const std::string pf = absl::StrCat(f, "[", i, "]");
      const bool is_sequence = p.is_object() && p.size() == 1 && p.contains("Sequence");
      const bool is_special = p.is_object() && p.size() == 1 && p.contains("SpecialToken");
      const Json* inner = is_sequence ? &p["Sequence"] : is_special ? &p["SpecialToken"] : nullptr;
      if (inner == nullptr || !inner->is_object() || !inner->contains("id") ||
          !(*inner)["id"].is_string()) {
        return FieldError(
            path, pf,
            absl::StrCat("is ", Show(p),
                         "; expected {\"Sequence\": {\"id\": \"A\"|\"B\"}} or {\"SpecialToken\": "
                         "{\"id\": name}}"));
      }
      const std::string id = (*inner)["id"].get<std::string>();
      Step::Piece piece;
      if (is_sequence) {
        if (id != "A" && id != "B") {
          return FieldError(path, pf,
                            absl::StrCat("is ", Show(p), "; a Sequence id is \"A\" or \"B\""));
        }
        piece.sequence = id == "A" ? 0 : 1;
      } else {
        const auto it = special_index.find(id);
        if (it == special_index.end()) {
          return FieldError(path, pf,
                            absl::StrCat("names special token \"", id, "\", missing from ", field,
                                         ".special_tokens"));
        }
        piece.special = it->second;
      }
      out->push_back(piece);
    }
    return absl::OkStatus();
  };
  if (!config.contains("single")) return FieldError(path, field + ".single", "is missing");
  E3_RETURN_IF_ERROR(pieces("single", &step.single));
  for (const Step::Piece& p : step.single) {
    if (p.sequence == 1)
      return FieldError(path, field + ".single", "uses sequence B; a single template has only A");
  }
  // An absent, null or empty `pair` leaves pairs unsupported (HF's builder
  // refuses such a file; we load it for its single template).
  if (config.contains("pair") && !config["pair"].is_null() &&
      !(config["pair"].is_array() && config["pair"].empty())) {
    E3_RETURN_IF_ERROR(pieces("pair", &step.pair));
    bool a = false, b = false;
    for (const Step::Piece& p : step.pair) {
      a |= p.sequence == 0;
      b |= p.sequence == 1;
    }
    // As HF's TemplateProcessingBuilder checks.
    if (!a || !b) return FieldError(path, field + ".pair", "must use both sequences A and B");
    step.has_pair = true;
  }
  return step;
}

absl::Status LoadStep(const std::string& path, const std::string& field, const Json& config,
                      bool* added_tokens, std::vector<Step>* steps) {
  const auto type_it = config.is_object() ? config.find("type") : config.end();
  const std::string type =
      type_it != config.end() && type_it->is_string() ? type_it->get<std::string>() : "";
  if (type == "Sequence") {
    const auto list = config.find("processors");
    if (list == config.end() || !list->is_array())
      return FieldError(path, field + ".processors", "is missing");
    for (size_t i = 0; i < list->size(); ++i) {
      E3_RETURN_IF_ERROR(LoadStep(path, absl::StrCat(field, ".processors[", i, "]"), (*list)[i],
                                  added_tokens, steps));
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    E3_ASSIGN_OR_RETURN(step.trim, GetBool(path, config, field, "trim_offsets", true));
    E3_ASSIGN_OR_RETURN(step.add_prefix_space,
                        GetBool(path, config, field, "add_prefix_space", true));
  } else if (type == "TemplateProcessing") {
    // HF's template handles one or two sequences; after a processor that
    // added tokens it would see more and panic.
    if (*added_tokens) {
      return FieldError(
          path, field,
          "is a TemplateProcessing after a processor that adds tokens; HF cannot run it");
    }
    E3_ASSIGN_OR_RETURN(step, LoadTemplate(path, field, config));
    *added_tokens = true;
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    step.kind = type == "BertProcessing" ? Step::Kind::kBert : Step::Kind::kRoberta;
    E3_ASSIGN_OR_RETURN(step.cls, TokenPair(path, field, config, "cls"));
    E3_ASSIGN_OR_RETURN(step.sep, TokenPair(path, field, config, "sep"));
    if (step.kind == Step::Kind::kRoberta) {
      E3_ASSIGN_OR_RETURN(step.trim, GetBool(path, config, field, "trim_offsets", true));
      E3_ASSIGN_OR_RETURN(step.add_prefix_space,
                          GetBool(path, config, field, "add_prefix_space", true));
    }
    *added_tokens = true;
  } else {
    return FieldError(
        path, field,
        absl::StrCat("is ", Show(config),
                     "; supported post-processors: TemplateProcessing, BertProcessing, "
                     "RobertaProcessing, ByteLevel and Sequence of them"));
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostProcessor>> PostProcessor::FromJson(const std::string& path,
                                                                       const std::string& field,
                                                                       const Json& config) {
  if (config.is_null()) return nullptr;
  std::unique_ptr<PostProcessor> pp(new PostProcessor());
  bool added_tokens = false;
  E3_RETURN_IF_ERROR(LoadStep(path, field, config, &added_tokens, &pp->steps_));
  for (const Step& s : pp->steps_) {
    pp->needs_tokens_ |= s.trim;
    if (s.kind == Step::Kind::kTemplate && !s.has_pair) pp->supports_pair_ = false;
  }
  return pp;
}

PostEncoding PostProcessor::Process(std::vector<PostEncoding> sequences,
                                    bool add_special_tokens) const {
  for (const Step& s : steps_) sequences = s.Apply(std::move(sequences), add_special_tokens);
  PostEncoding out;
  for (PostEncoding& e : sequences) Append(&out, std::move(e));
  return out;
}

}  // namespace e3
