#include "common/file_util.h"
#include "common/chat_template.h"

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/unicode.h"
#include "nlohmann/json.hpp"

namespace e3 {

// A turn renders as
//   turn_prefix ROLE role_suffix CONTENT terminator turn_suffix
// and the generation prompt as turn_prefix "assistant" role_suffix. An
// assistant turn trains on CONTENT + terminator.
struct ChatTemplate::Spec {
  std::string name;
  // Whether the template renders `bos_token`, and when: up front even for an
  // empty conversation, or glued to the first message (Meta's Llama 3).
  bool uses_bos = false;
  bool bos_with_first_message = false;
  std::string bos;
  std::string turn_prefix, role_suffix, terminator, turn_suffix;
  // Jinja's `| trim` (Python's str.strip()) on the content.
  bool trim_content = false;
  // Jinja texts that render exactly this, for detection.
  std::vector<std::string> known_texts;
};

namespace {

using Json = nlohmann::json;

constexpr char kLlama3Bos[] = "<|begin_of_text|>";

// The bundled tiny-code-llama's template.
constexpr char kLlama3PlainJinja[] =
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
// meta-llama/Meta-Llama-3-8B-Instruct's tokenizer_config.json.
constexpr char kLlama3Jinja[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
// The plain ChatML template of the transformers chat-templating docs (no
// default system prompt, unlike Qwen's own, which we do not claim).
constexpr char kChatMlJinja[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}";

const std::vector<const ChatTemplate::Spec*>& Builtins() {
  static const auto* const kBuiltins = [] {
    auto* specs = new std::vector<const ChatTemplate::Spec*>();
    auto* llama3 = new ChatTemplate::Spec;
    llama3->name = "llama3";
    llama3->uses_bos = true;
    llama3->bos_with_first_message = true;
    llama3->bos = kLlama3Bos;
    llama3->turn_prefix = "<|start_header_id|>";
    llama3->role_suffix = "<|end_header_id|>\n\n";
    llama3->terminator = "<|eot_id|>";
    llama3->trim_content = true;
    llama3->known_texts = {kLlama3Jinja};
    specs->push_back(llama3);

    auto* qwen = new ChatTemplate::Spec;
    qwen->name = "qwen";
    qwen->turn_prefix = "<|im_start|>";
    qwen->role_suffix = "\n";
    qwen->terminator = "<|im_end|>";
    qwen->turn_suffix = "\n";
    qwen->known_texts = {kChatMlJinja};
    specs->push_back(qwen);

    auto* plain = new ChatTemplate::Spec(*llama3);
    plain->name = "llama3-plain";
    plain->bos_with_first_message = false;
    plain->trim_content = false;
    plain->known_texts = {kLlama3PlainJinja};
    specs->push_back(plain);
    return specs;
  }();
  return *kBuiltins;
}

// A built-in with another BOS text. Specs live for the whole process (the
// ChatTemplate handle is a plain pointer), so each distinct one is made once.
const ChatTemplate::Spec* WithBos(const ChatTemplate::Spec* base, const std::string& bos) {
  if (!base->uses_bos || base->bos == bos) return base;
  static std::mutex mu;
  static auto* interned =
      new std::map<std::pair<std::string, std::string>, std::unique_ptr<ChatTemplate::Spec>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*interned)[{base->name, bos}];
  if (!slot) {
    slot = std::make_unique<ChatTemplate::Spec>(*base);
    slot->bos = bos;
  }
  return slot.get();
}

std::string_view TrimPythonSpace(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    const unicode::DecodedChar c = unicode::DecodeUtf8(s, begin);
    if (!c.valid || !unicode::IsPythonSpace(c.cp)) break;
    begin += c.len;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    const unicode::DecodedChar c = unicode::DecodeUtf8(s, start);
    if (!c.valid || start + c.len != end || !unicode::IsPythonSpace(c.cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

bool IsJinjaSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// A canonical form of a Jinja template for comparing two texts: the
// whitespace rules transformers renders with (trim_blocks, lstrip_blocks,
// `-` markers, no kept trailing newline) are applied to the literal text,
// comments are dropped, and inside tags whitespace outside string literals
// is removed and string escapes are resolved. Two templates with the same
// canonical form render the same.
std::string CanonicalJinja(std::string_view t) {
  struct Part {
    bool is_tag;
    char kind;  // '{', '%', '#' for tags
    bool strip_before, strip_after;
    std::string text;  // literal text, or canonical tag body
  };
  std::vector<Part> parts;
  size_t i = 0;
  while (i < t.size()) {
    const size_t open = t.find('{', i);
    if (open == std::string_view::npos || open + 1 >= t.size() ||
        (t[open + 1] != '{' && t[open + 1] != '%' && t[open + 1] != '#')) {
      const size_t end = open == std::string_view::npos ? t.size() : open + 1;
      if (parts.empty() || parts.back().is_tag) parts.push_back({false, 0, false, false, ""});
      parts.back().text.append(t.substr(i, end - i));
      i = end;
      continue;
    }
    if (open > i) {
      if (parts.empty() || parts.back().is_tag) parts.push_back({false, 0, false, false, ""});
      parts.back().text.append(t.substr(i, open - i));
    }
    const char kind = t[open + 1];
    const char close_char = kind == '{' ? '}' : kind;
    Part tag{true, kind, false, false, ""};
    size_t j = open + 2;
    if (j < t.size() && t[j] == '-') {
      tag.strip_before = true;
      ++j;
    } else if (j < t.size() && t[j] == '+') {
      ++j;
    }
    if (kind == '#') {
      // A comment renders nothing; only its whitespace markers matter.
      const size_t close = t.find("#}", j);
      const size_t end = close == std::string_view::npos ? t.size() : close;
      tag.strip_after = end > j && t[end - 1] == '-';
      parts.push_back(std::move(tag));
      i = close == std::string_view::npos ? t.size() : close + 2;
      continue;
    }
    // Scan the body, keeping string literals intact.
    char quote = 0;
    std::string body;
    for (; j < t.size(); ++j) {
      const char c = t[j];
      if (quote != 0) {
        if (c == '\\' && j + 1 < t.size()) {
          const char e = t[++j];
          body.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e);
        } else if (c == quote) {
          body.push_back('\'');
          quote = 0;
        } else {
          body.push_back(c);
        }
        continue;
      }
      if (c == '\'' || c == '"') {
        quote = c;
        body.push_back('\'');
        continue;
      }
      if ((c == '-' || c == '+') && j + 2 < t.size() && t[j + 1] == close_char && t[j + 2] == '}') {
        tag.strip_after = c == '-';
        j += 3;
        break;
      }
      if (c == close_char && j + 1 < t.size() && t[j + 1] == '}') {
        j += 2;
        break;
      }
      if (!IsJinjaSpace(c)) body.push_back(c);
    }
    tag.text = std::move(body);
    parts.push_back(std::move(tag));
    i = j;
  }

  // Whitespace control, as Jinja applies it to the literal text. Stripping
  // before tags looks at the source text (a line start is a line start even
  // when trim_blocks later eats its newline), so it runs first.
  const auto literal = [&](size_t k) {
    return k < parts.size() && !parts[k].is_tag ? &parts[k] : nullptr;
  };
  for (size_t k = 1; k < parts.size(); ++k) {
    Part* before = literal(k - 1);
    if (!parts[k].is_tag || before == nullptr) continue;
    std::string& s = before->text;
    if (parts[k].strip_before) {
      while (!s.empty() && IsJinjaSpace(s.back())) s.pop_back();
    } else if (parts[k].kind != '{') {
      // lstrip_blocks: spaces and tabs between a line start and the tag.
      size_t p = s.size();
      while (p > 0 && (s[p - 1] == ' ' || s[p - 1] == '\t')) --p;
      if (p == 0 ? k == 1 : s[p - 1] == '\n') s.resize(p);
    }
  }
  for (size_t k = 0; k + 1 < parts.size(); ++k) {
    Part* after = literal(k + 1);
    if (!parts[k].is_tag || after == nullptr) continue;
    std::string& s = after->text;
    if (parts[k].strip_after) {
      size_t p = 0;
      while (p < s.size() && IsJinjaSpace(s[p])) ++p;
      s.erase(0, p);
    } else if (parts[k].kind != '{') {
      // trim_blocks: the first newline after a block tag.
      if (s.rfind("\r\n", 0) == 0) {
        s.erase(0, 2);
      } else if (!s.empty() && (s[0] == '\n' || s[0] == '\r')) {
        s.erase(0, 1);
      }
    }
  }
  if (!parts.empty() && !parts.back().is_tag) {
    std::string& s = parts.back().text;
    if (!s.empty() && s.back() == '\n') s.pop_back();
  }

  std::string out;
  for (const Part& p : parts) {
    if (!p.is_tag) {
      out += p.text;
    } else if (p.kind != '#') {
      // \x01 and \x02 cannot appear in template text, so a tag never
      // compares equal to literal text.
      absl::StrAppend(&out, "\x01", std::string(1, p.kind), p.text, "\x02");
    }
  }
  return out;
}

std::string UnsupportedMessage(const std::string& file) {
  return absl::StrCat("unsupported chat template in ", file,
                      "; pass --chat_template=", absl::StrJoin(ChatTemplate::BuiltinNames(), "|"));
}

}  // namespace

std::vector<std::string> ChatTemplate::BuiltinNames() {
  std::vector<std::string> names;
  for (const Spec* s : Builtins()) names.push_back(s->name);
  return names;
}

absl::StatusOr<ChatTemplate> ChatTemplate::ByName(std::string_view name) {
  for (const Spec* s : Builtins()) {
    if (s->name == name) return ChatTemplate(s);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown chat template \"", std::string(name),
                                                 "\"; expected one of ",
                                                 absl::StrJoin(BuiltinNames(), ", ")));
}

absl::StatusOr<ChatTemplate> ChatTemplate::DetectFromModelDir(const std::string& model_dir) {
  const std::string jinja_path = model_dir + "/chat_template.jinja";
  const std::string config_path = model_dir + "/tokenizer_config.json";
  Json config;  // null when there is no tokenizer_config.json
  if (IsRegularFile(config_path)) {
    E3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(config_path));
    config = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
    }
  }

  // transformers prefers chat_template.jinja over the config's string.
  std::string source, text;
  if (IsRegularFile(jinja_path)) {
    source = jinja_path;
    E3_ASSIGN_OR_RETURN(text, ReadFileToString(jinja_path));
  } else if (config.is_object() && config.contains("chat_template")) {
    source = config_path;
    const Json& t = config["chat_template"];
    if (t.is_string()) {
      text = t.get<std::string>();
    } else if (t.is_array()) {
      // Named templates: [{"name": ..., "template": ...}]; "default" is used.
      for (const Json& entry : t) {
        if (entry.is_object() && entry.value("name", Json()) == "default" &&
            entry.contains("template") && entry["template"].is_string()) {
          text = entry["template"].get<std::string>();
        }
      }
      if (text.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(config_path, ": chat_template is a list without a \"default\" template"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": chat_template is not a string"));
    }
  } else {
    return absl::NotFoundError(
        absl::StrCat("no chat template in ", model_dir,
                     " (neither chat_template.jinja nor a \"chat_template\" in "
                     "tokenizer_config.json); pass --chat_template=",
                     absl::StrJoin(BuiltinNames(), "|")));
  }

  const std::string canonical = CanonicalJinja(text);
  for (const Spec* s : Builtins()) {
    for (const std::string& known : s->known_texts) {
      if (CanonicalJinja(known) != canonical) continue;
      if (!s->uses_bos || !config.is_object()) return ChatTemplate(s);
      // transformers passes the config's bos_token; an absent one renders
      // as Jinja's undefined, the empty string.
      std::string bos;
      const auto it = config.find("bos_token");
      if (it != config.end() && it->is_string()) {
        bos = it->get<std::string>();
      } else if (it != config.end() && it->is_object() && it->contains("content") &&
                 (*it)["content"].is_string()) {
        bos = (*it)["content"].get<std::string>();
      }
      return ChatTemplate(WithBos(s, bos));
    }
  }
  return absl::InvalidArgumentError(UnsupportedMessage(source));
}

const std::string& ChatTemplate::name() const { return spec_->name; }

absl::StatusOr<RenderedChat> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                  bool add_generation_prompt) const {
  const Spec& s = *spec_;
  RenderedChat out;
  if (s.uses_bos && !s.bos_with_first_message) out.text += s.bos;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, ": role \"", m.role,
                       "\" is not supported; expected system, user or assistant"));
    }
    if (i == 0 && s.uses_bos && s.bos_with_first_message) out.text += s.bos;
    absl::StrAppend(&out.text, s.turn_prefix, m.role, s.role_suffix);
    const size_t begin = out.text.size();
    const std::string_view content = s.trim_content ? TrimPythonSpace(m.content) : m.content;
    out.text.append(content);
    out.text += s.terminator;
    if (m.role == "assistant") out.assistant_spans.emplace_back(begin, out.text.size());
    out.text += s.turn_suffix;
  }
  if (add_generation_prompt) absl::StrAppend(&out.text, s.turn_prefix, "assistant", s.role_suffix);
  return out;
}

absl::StatusOr<TokenizedChat> TokenizeChat(const Tokenizer& tokenizer,
                                           const ChatTemplate& chat_template,
                                           const std::vector<ChatMessage>& messages,
                                           bool train_on_all_tokens) {
  E3_ASSIGN_OR_RETURN(const RenderedChat rendered,
                      chat_template.Render(messages, /*add_generation_prompt=*/false));
  Encoding enc = tokenizer.Encode(rendered.text);
  TokenizedChat out;
  out.loss_mask.resize(enc.ids.size(), train_on_all_tokens ? 1 : 0);
  if (!train_on_all_tokens) {
    // Tokens and spans both ascend, so one pass pairs them.
    size_t span = 0;
    const auto& spans = rendered.assistant_spans;
    for (size_t k = 0; k < enc.ids.size(); ++k) {
      const size_t first_byte = enc.offsets[k].first;
      while (span < spans.size() && spans[span].second <= first_byte) ++span;
      if (span < spans.size() && spans[span].first <= first_byte) out.loss_mask[k] = 1;
    }
  }
  out.input_ids = std::move(enc.ids);
  return out;
}

absl::StatusOr<std::vector<int32_t>> TokenizePrompt(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                                    const std::vector<ChatMessage>& messages) {
  E3_ASSIGN_OR_RETURN(const RenderedChat rendered, chat_template.Render(messages, /*add_generation_prompt=*/true));
  return std::move(tokenizer.Encode(rendered.text).ids);
}

}  // namespace e3
