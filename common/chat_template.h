// Chat templates without a Jinja engine: each supported template is a
// small description (BOS, per-turn header and footer, generation prompt)
// that renders byte-exactly what the Jinja template renders, and records
// which byte spans the loss trains on. Templates are chosen by name or
// detected from a model directory; an unknown template is a clear error.
#ifndef E3_COMMON_CHAT_TEMPLATE_H_
#define E3_COMMON_CHAT_TEMPLATE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer.h"

namespace e3 {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct RenderedChat {
  std::string text;
  // [begin, end) byte spans of `text` that are assistant output (content and
  // the turn terminator), i.e. what the draft is trained to predict.
  std::vector<std::pair<size_t, size_t>> assistant_spans;
};

struct TokenizedChat {
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> loss_mask;  // 1 where the token is trained on
};

class ChatTemplate {
 public:
  // Built-in names: "llama3" (Meta Llama 3 instruct), "qwen" (ChatML), and
  // "llama3-plain" (Llama 3 headers without trimming or a default system
  // prompt: the bundled tiny-code-llama's template).
  static absl::StatusOr<ChatTemplate> ByName(std::string_view name);
  // Reads chat_template.jinja, or tokenizer_config.json's "chat_template",
  // and matches it against the built-ins.
  static absl::StatusOr<ChatTemplate> DetectFromModelDir(const std::string& model_dir);
  static std::vector<std::string> BuiltinNames();

  const std::string& name() const;
  absl::StatusOr<RenderedChat> Render(const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt) const;

  // Opaque description; see chat_template.cc.
  struct Spec;
  explicit ChatTemplate(const Spec* spec) : spec_(spec) {}

 private:
  const Spec* spec_;
};

// Renders, tokenizes the whole text once (so BPE merges across template
// boundaries exactly as HF does) and marks a token trainable when its first
// byte lies in an assistant span, or everywhere when `train_on_all_tokens`
// (ModelOpt's default).
absl::StatusOr<TokenizedChat> TokenizeChat(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                           const std::vector<ChatMessage>& messages,
                                           bool train_on_all_tokens);

// The prompt a serving engine would send for `messages`: rendered with the
// generation prompt (the assistant header) and tokenized; no loss mask.
absl::StatusOr<std::vector<int32_t>> TokenizePrompt(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                                    const std::vector<ChatMessage>& messages);

}  // namespace e3

#endif  // E3_COMMON_CHAT_TEMPLATE_H_
