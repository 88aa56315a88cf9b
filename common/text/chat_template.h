// Hugging Face chat templates, rendered as transformers renders them: the
// template's own Jinja text in Jinja2, in CPython embedded in this process
// (common/text/chat_template_env.py;
// docs/decisions/0004-chat-templates-in-embedded-cpython.md). The loss
// mask covers what the assistant generates: the template's
// {% generation %} blocks where it has them, else each assistant turn's
// own rendering located in the conversation's (see AssistantSpans in
// chat_template.cc).
#ifndef E3_COMMON_TEXT_CHAT_TEMPLATE_H_
#define E3_COMMON_TEXT_CHAT_TEMPLATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/text/chat_message.h"
#include "common/text/tokenizer.h"
#include "nlohmann/json.hpp"

namespace e3 {

struct RenderedChat {
  std::string text;
  // [begin, end) byte spans of `text` that are assistant output (what the
  // draft is trained to predict), ascending.
  std::vector<std::pair<size_t, size_t>> assistant_spans;
};

struct TokenizedChat {
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> loss_mask;  // 1 where the token is trained on
  // The rendering the ids encode, and each id's [begin, end) byte span in
  // it (teacher_server --preview_data shows the trained spans in the text).
  std::string text;
  std::vector<std::pair<size_t, size_t>> offsets;
};

struct ChatTemplateOptions {
  // A .jinja file that replaces the model directory's template.
  std::string file;
  // Which of tokenizer_config.json's named templates (a list of {name,
  // template}) to use; transformers' default is "default".
  std::string name = "default";
  // Extra template variables (e.g. {"enable_thinking": false}), as
  // apply_chat_template's keyword arguments.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  // Whether an assistant turn's reasoning (thinking) is trained, or only
  // what follows it.
  bool train_reasoning = true;
};

// Parses --chat_template_kwargs: a JSON object, or comma-separated
// key=value pairs whose values are JSON (true, 3, "x") or else strings.
absl::StatusOr<nlohmann::ordered_json> ParseTemplateKwargs(const std::string& text);

class ChatTemplate {
 public:
  // The template transformers would use for `model_dir`: options.file, or
  // chat_template.jinja, or tokenizer_config.json's "chat_template"; the
  // special tokens (bos_token, eos_token, ...) of tokenizer_config.json and
  // special_tokens_map.json become variables.
  static absl::StatusOr<ChatTemplate> Load(const std::string& model_dir, const ChatTemplateOptions& options);
  // A template from its text; `variables` are passed to every render.
  static absl::StatusOr<ChatTemplate> FromText(const std::string& source, const std::string& origin,
                                               nlohmann::ordered_json variables, bool train_reasoning = true);

  // Where the template came from, e.g. "/models/x/tokenizer_config.json".
  const std::string& origin() const;
  bool has_generation_blocks() const;
  // A fingerprint of what renders: the template text and its variables.
  const std::string& fingerprint() const;

  // The conversation's text and its assistant spans. With the generation
  // prompt (a prompt, nothing in it trained) spans come only from
  // generation blocks; without it, from blocks or each turn's rendering.
  // A template error (raise_exception, a bad field) is InvalidArgument
  // with Jinja's message.
  absl::StatusOr<RenderedChat> Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                      const nlohmann::ordered_json& tools = nullptr) const;

  struct State;

 private:
  explicit ChatTemplate(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

// Renders, tokenizes the whole text once (so BPE merges across template
// boundaries exactly as HF does) and marks a token trainable when it
// overlaps an assistant span (transformers' assistant mask rule), or
// everywhere when `train_on_all_tokens` (ModelOpt's default).
absl::StatusOr<TokenizedChat> TokenizeChat(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                           const std::vector<ChatMessage>& messages, bool train_on_all_tokens,
                                           const nlohmann::ordered_json& tools = nullptr);

// The prompt a serving engine would send for `messages`: rendered with the
// generation prompt (the assistant header) and tokenized; no loss mask.
absl::StatusOr<std::vector<int32_t>> TokenizePrompt(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                                    const std::vector<ChatMessage>& messages,
                                                    const nlohmann::ordered_json& tools = nullptr);

// Pins the templates' strftime_now() to an ISO date ("" unpins), for
// reproducible tests against golden renders.
absl::Status PinTemplateClockForTesting(const std::string& iso_date);

}  // namespace e3

#endif  // E3_COMMON_TEXT_CHAT_TEMPLATE_H_
