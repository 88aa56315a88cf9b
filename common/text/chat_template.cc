#include "common/text/chat_template.h"

#include <cstdint>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "common/base/fnv1a.h"
#include "common/base/status_macros.h"
#include "common/text/chat_template_env_py.h"
#include "common/text/embedded_python.h"

namespace e3 {

struct ChatTemplate::State {
  std::string handle;  // the compiled template, in chat_template_env.py
  std::string origin;
  nlohmann::ordered_json variables;
  bool train_reasoning = true;
  bool generation_blocks = false;
  std::string fingerprint;
};

namespace {

using Json = nlohmann::ordered_json;

constexpr char kEnvModule[] = "e3_chat_template_env";
// The special tokens transformers passes to a template (special_tokens_map).
constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

absl::StatusOr<std::string> CallEnv(const std::string& function, const std::vector<std::string>& args) {
  return CallPython(kEnvModule, kChatTemplateEnvPy, function, args);
}

// A token as tokenizer_config.json writes it: a string or an AddedToken
// object {"content": ...}; null when neither.
Json TokenText(const Json& value) {
  if (value.is_string()) return value;
  if (value.is_object() && value.contains("content") && value["content"].is_string()) return value["content"];
  return Json();
}

absl::StatusOr<Json> ReadJsonObject(const std::string& path) {
  if (!IsRegularFile(path)) return Json::object();
  E3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  Json config = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return config;
}

// The special tokens as template variables: special_tokens_map.json's,
// then tokenizer_config.json's over them.
Json SpecialTokenVariables(const Json& special_map, const Json& config) {
  Json vars = Json::object();
  for (const Json* source : {&special_map, &config}) {
    for (const char* key : kSpecialTokens) {
      if (!source->contains(key)) continue;
      const Json text = TokenText((*source)[key]);
      if (!text.is_null()) vars[key] = text;
    }
    const auto extra = source->find("additional_special_tokens");
    if (extra != source->end() && extra->is_array()) {
      Json list = Json::array();
      for (const Json& t : *extra) {
        if (!TokenText(t).is_null()) list.push_back(TokenText(t));
      }
      vars["additional_special_tokens"] = list;
    }
  }
  return vars;
}

// tokenizer_config.json's "chat_template": a string, or named templates.
absl::StatusOr<std::string> TemplateOfConfig(const Json& entry, const std::string& path, const std::string& name) {
  if (entry.is_string()) return entry.get<std::string>();
  if (!entry.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": chat_template is ", entry.type_name(),
                                                   "; expected a string or a list of {name, template}"));
  }
  std::vector<std::string> names;
  for (const Json& e : entry) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string()) continue;
    names.push_back(e["name"].get<std::string>());
    if (names.back() == name && e.contains("template") && e["template"].is_string()) {
      return e["template"].get<std::string>();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": no chat template named \"", name,
                                                 "\"; it has ", absl::StrJoin(names, ", "),
                                                 " (choose with --chat_template_name)"));
}

bool IsAsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() && IsAsciiSpace(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view TrimLeft(std::string_view s) {
  while (!s.empty() && IsAsciiSpace(s.front())) s.remove_prefix(1);
  return s;
}

std::string_view Trim(std::string_view s) { return TrimLeft(TrimRight(s)); }

// Where inline reasoning ends (DeepSeek-R1, Qwen3).
constexpr std::string_view kThinkEnd = "</think>";

// What the reader of a turn sees: its content after any inline reasoning
// (DeepSeek-R1 style "<think>...</think>answer"), trimmed.
std::string_view VisibleContent(const ChatMessage& m) {
  std::string_view c = m.content;
  const size_t think_end = c.rfind(kThinkEnd);
  if (think_end != std::string_view::npos) c.remove_prefix(think_end + kThinkEnd.size());
  return Trim(c);
}

struct Rendering {
  std::string text;
  std::vector<std::pair<size_t, size_t>> spans;
};

absl::StatusOr<std::vector<Rendering>> RenderMany(const ChatTemplate::State& s, const std::vector<ChatMessage>& messages,
                                                  const Json& tools, const Json& renders) {
  Json request = {{"variables", s.variables}, {"tools", tools}, {"renders", renders}};
  Json& list = request["messages"] = Json::array();
  for (const ChatMessage& m : messages) list.push_back(MessageToJson(m));
  E3_ASSIGN_OR_RETURN(const std::string reply,
                      CallEnv("render", {s.handle, request.dump(-1, ' ', false, Json::error_handler_t::replace)}));
  const Json parsed = Json::parse(reply, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.contains("renders")) {
    return absl::InternalError("chat_template_env.render returned no renders");
  }
  std::vector<Rendering> out;
  for (const Json& r : parsed["renders"]) {
    Rendering one;
    one.text = r["text"].get<std::string>();
    for (const Json& span : r["spans"]) one.spans.emplace_back(span[0].get<size_t>(), span[1].get<size_t>());
    out.push_back(std::move(one));
  }
  return out;
}

// Moves a span's start past the turn's reasoning, to its visible content.
size_t SkipReasoning(const std::string& text, std::pair<size_t, size_t> span, const ChatMessage& m) {
  size_t from = span.first;
  const std::string reasoning = std::string(Trim(ReasoningOf(m)));
  if (!reasoning.empty()) {
    const size_t at = text.find(reasoning, from);
    if (at != std::string::npos && at < span.second) from = at + reasoning.size();
  }
  const size_t think_end = text.rfind(kThinkEnd, span.second);
  if (think_end != std::string::npos && think_end >= from && think_end < span.second) from = think_end + kThinkEnd.size();
  const std::string_view visible = VisibleContent(m);
  if (visible.empty()) return from;
  const size_t at = text.find(visible, from);
  return at != std::string::npos && at < span.second ? at : from;
}

// Where assistant turn `m` lies in the full rendering `text`, at or after
// `cursor`. `own` is the turn's own rendering: the conversation up to and
// with it (`alone`) past its common prefix with the conversation before it
// plus the generation prompt (what the prompt supplies, e.g. a forced
// "<think>\n", is not the model's to predict). It is found whole where the
// template renders the turn the same in and out of context; without a
// leading <think>...</think> block where the template drops earlier turns'
// reasoning; else the visible content is found, plus the terminator the
// template writes after it.
absl::StatusOr<std::pair<size_t, size_t>> LocateTurn(const std::string& text, size_t cursor, std::string_view own,
                                                     const std::string& alone, const ChatMessage& m, size_t index) {
  own = TrimRight(own);
  std::vector<std::string_view> candidates = {own};
  const size_t think_end = own.find(kThinkEnd);
  if (own.rfind("<think>", 0) == 0 && think_end != std::string_view::npos) {
    candidates.push_back(TrimLeft(own.substr(think_end + kThinkEnd.size())));
  }
  for (std::string_view c : candidates) {
    const size_t at = c.empty() ? std::string::npos : text.find(c, cursor);
    if (at != std::string::npos) return std::make_pair(at, at + c.size());
  }
  const std::string_view content = VisibleContent(m);
  const size_t at = content.empty() ? std::string::npos : text.find(content, cursor);
  if (at == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("messages[", index,
                                                   "]: cannot locate the assistant turn in the template's rendering "
                                                   "(its text is not in the conversation's)"));
  }
  size_t end = at + content.size();
  const size_t in_alone = alone.rfind(content);
  if (in_alone != std::string::npos) {
    const std::string_view terminator = TrimRight(std::string_view(alone).substr(in_alone + content.size()));
    if (text.compare(end, terminator.size(), terminator) == 0) end += terminator.size();
  }
  return std::make_pair(at, end);
}

// The assistant spans of `messages`' rendering, from two renders per
// assistant turn: the conversation before it with the generation prompt,
// and with it (where they part is where the model's writing starts).
absl::StatusOr<RenderedChat> RenderWithTurnSpans(const ChatTemplate::State& s, const std::vector<ChatMessage>& messages,
                                                 const Json& tools) {
  Json renders = Json::array({{{"add_generation_prompt", false}}});
  std::vector<size_t> turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    turns.push_back(i);
    renders.push_back({{"count", i}, {"add_generation_prompt", true}});
    renders.push_back({{"count", i + 1}, {"add_generation_prompt", false}});
  }
  E3_ASSIGN_OR_RETURN(std::vector<Rendering> r, RenderMany(s, messages, tools, renders));
  RenderedChat out;
  out.text = std::move(r[0].text);
  size_t cursor = 0;
  for (size_t k = 0; k < turns.size(); ++k) {
    const std::string& before = r[1 + 2 * k].text;
    const std::string& alone = r[2 + 2 * k].text;
    size_t common = 0;
    while (common < before.size() && common < alone.size() && before[common] == alone[common]) ++common;
    const std::string_view own = std::string_view(alone).substr(common);
    E3_ASSIGN_OR_RETURN(auto span, LocateTurn(out.text, cursor, own, alone, messages[turns[k]], turns[k]));
    if (!s.train_reasoning) span.first = SkipReasoning(out.text, span, messages[turns[k]]);
    cursor = span.second;
    if (span.second > span.first) out.assistant_spans.push_back(span);
  }
  return out;
}

absl::StatusOr<RenderedChat> RenderWithGenerationBlocks(const ChatTemplate::State& s,
                                                        const std::vector<ChatMessage>& messages, const Json& tools,
                                                        bool add_generation_prompt) {
  E3_ASSIGN_OR_RETURN(std::vector<Rendering> r,
                      RenderMany(s, messages, tools, Json::array({{{"add_generation_prompt", add_generation_prompt}}})));
  RenderedChat out;
  out.text = std::move(r[0].text);
  out.assistant_spans = std::move(r[0].spans);
  std::vector<const ChatMessage*> assistants;
  for (const ChatMessage& m : messages) {
    if (m.role == "assistant") assistants.push_back(&m);
  }
  // One block per assistant turn is the common layout; only then can a
  // block's reasoning be told from its content.
  if (!s.train_reasoning && assistants.size() == out.assistant_spans.size()) {
    for (size_t k = 0; k < assistants.size(); ++k) {
      out.assistant_spans[k].first = SkipReasoning(out.text, out.assistant_spans[k], *assistants[k]);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Json> ParseTemplateKwargs(const std::string& text) {
  const std::string_view trimmed = Trim(text);
  if (trimmed.empty()) return Json::object();
  if (trimmed.front() == '{') {
    Json parsed = Json::parse(trimmed, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("--chat_template_kwargs \"", text, "\" is not a JSON object"));
    }
    return parsed;
  }
  Json out = Json::object();
  const std::vector<std::string> pairs = absl::StrSplit(std::string(trimmed), ',', absl::SkipWhitespace());
  for (const std::string& pair : pairs) {
    const size_t eq = pair.find('=');
    const std::string key(eq == std::string::npos ? std::string_view() : Trim(std::string_view(pair).substr(0, eq)));
    if (key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chat_template_kwargs: \"", pair, "\" is not key=value (e.g. enable_thinking=false)"));
    }
    const std::string value(Trim(std::string_view(pair).substr(eq + 1)));
    Json parsed = Json::parse(value, nullptr, /*allow_exceptions=*/false);
    out[key] = parsed.is_discarded() ? Json(value) : parsed;
  }
  return out;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromText(const std::string& source, const std::string& origin,
                                                    Json variables, bool train_reasoning) {
  auto handle = CallEnv("compile", {source});
  if (!handle.ok()) {
    return absl::Status(handle.status().code(), absl::StrCat(origin, ": ", handle.status().message()));
  }
  auto state = std::make_shared<State>();
  state->handle = *std::move(handle);
  state->origin = origin;
  state->variables = variables.is_object() ? std::move(variables) : Json::object();
  state->train_reasoning = train_reasoning;
  static const std::regex kGenerationTag(R"(\{%-?\s*generation\s*-?%\})");
  state->generation_blocks = std::regex_search(source, kGenerationTag);
  state->fingerprint = absl::StrCat(
      Fnv1a(absl::StrCat(source, "|", state->variables.dump(), "|", train_reasoning ? "reasoning" : "answers"),
            kFingerprintSeed));
  return ChatTemplate(std::move(state));
}

absl::StatusOr<ChatTemplate> ChatTemplate::Load(const std::string& model_dir, const ChatTemplateOptions& options) {
  const std::string config_path = model_dir + "/tokenizer_config.json";
  const std::string jinja_path = model_dir + "/chat_template.jinja";
  E3_ASSIGN_OR_RETURN(const Json config, ReadJsonObject(config_path));
  E3_ASSIGN_OR_RETURN(const Json special_map, ReadJsonObject(model_dir + "/special_tokens_map.json"));
  std::string origin, source;
  if (!options.file.empty()) {
    origin = options.file;
    if (!IsRegularFile(origin)) return absl::NotFoundError(absl::StrCat("--chat_template file not found: ", origin));
    E3_ASSIGN_OR_RETURN(source, ReadFileToString(origin));
  } else if (IsRegularFile(jinja_path)) {  // transformers prefers it to the config's
    origin = jinja_path;
    E3_ASSIGN_OR_RETURN(source, ReadFileToString(origin));
  } else if (config.contains("chat_template")) {
    origin = config_path;
    E3_ASSIGN_OR_RETURN(source, TemplateOfConfig(config["chat_template"], config_path, options.name));
  } else {
    return absl::NotFoundError(absl::StrCat("no chat template in ", model_dir,
                                            " (neither chat_template.jinja nor a \"chat_template\" in "
                                            "tokenizer_config.json); pass --chat_template=FILE"));
  }
  Json variables = SpecialTokenVariables(special_map, config);
  if (!options.kwargs.is_null() && !options.kwargs.is_object()) {
    return absl::InvalidArgumentError("chat template kwargs must be a JSON object");
  }
  for (auto it = options.kwargs.begin(); it != options.kwargs.end(); ++it) variables[it.key()] = it.value();
  return FromText(source, origin, std::move(variables), options.train_reasoning);
}

const std::string& ChatTemplate::origin() const { return state_->origin; }
bool ChatTemplate::has_generation_blocks() const { return state_->generation_blocks; }
const std::string& ChatTemplate::fingerprint() const { return state_->fingerprint; }

absl::StatusOr<RenderedChat> ChatTemplate::Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                                  const Json& tools) const {
  if (state_->generation_blocks) return RenderWithGenerationBlocks(*state_, messages, tools, add_generation_prompt);
  if (!add_generation_prompt) return RenderWithTurnSpans(*state_, messages, tools);
  // A prompt: nothing in it is trained, so no spans.
  E3_ASSIGN_OR_RETURN(std::vector<Rendering> r,
                      RenderMany(*state_, messages, tools, Json::array({{{"add_generation_prompt", true}}})));
  RenderedChat out;
  out.text = std::move(r[0].text);
  return out;
}

absl::StatusOr<TokenizedChat> TokenizeChat(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                           const std::vector<ChatMessage>& messages, bool train_on_all_tokens,
                                           const Json& tools) {
  E3_ASSIGN_OR_RETURN(RenderedChat rendered,
                      chat_template.Render(messages, /*add_generation_prompt=*/false, tools));
  Encoding enc = tokenizer.Encode(rendered.text);
  TokenizedChat out;
  out.loss_mask.resize(enc.ids.size(), train_on_all_tokens ? 1 : 0);
  if (!train_on_all_tokens) {
    // Tokens and spans both ascend, so one pass pairs them.
    size_t span = 0;
    const auto& spans = rendered.assistant_spans;
    for (size_t k = 0; k < enc.ids.size(); ++k) {
      const auto [begin, end] = enc.offsets[k];
      while (span < spans.size() && spans[span].second <= begin) ++span;
      if (span < spans.size() && spans[span].first < end && begin < spans[span].second) out.loss_mask[k] = 1;
    }
  }
  out.input_ids = std::move(enc.ids);
  out.text = std::move(rendered.text);
  out.offsets = std::move(enc.offsets);
  return out;
}

absl::StatusOr<std::vector<int32_t>> TokenizePrompt(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                                    const std::vector<ChatMessage>& messages, const Json& tools) {
  E3_ASSIGN_OR_RETURN(const RenderedChat rendered,
                      chat_template.Render(messages, /*add_generation_prompt=*/true, tools));
  return std::move(tokenizer.Encode(rendered.text).ids);
}

absl::Status PinTemplateClockForTesting(const std::string& iso_date) {
  return CallEnv("set_now", {iso_date}).status();
}

}  // namespace e3
