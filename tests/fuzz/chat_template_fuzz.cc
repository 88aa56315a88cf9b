// A hostile conversation (one data line's "messages" and "tools") through
// real chat templates (tiny-code-llama's, Llama 3.1's with tools, Qwen3's
// with reasoning): refused with a message, or rendered with ascending
// assistant spans inside the text, and tokenized with one mask entry per
// id.
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "common/text/chat_message.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using Json = nlohmann::ordered_json;

struct Templates {
  std::unique_ptr<e3::Tokenizer> tokenizer;
  std::vector<e3::ChatTemplate> templates;
};

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Templates& Loaded() {
  static const Templates* t = [] {
    auto* out = new Templates;
    const std::string tiny = e3::fuzz::SourcePath("examples/tiny-code-llama");
    out->tokenizer = e3::Tokenizer::FromFile(tiny + "/tokenizer.json").value();
    out->templates.push_back(e3::ChatTemplate::Load(tiny, {}).value());
    const std::string dir = e3::fuzz::SourcePath("tests/fixtures/chat_templates/");
    out->templates.push_back(e3::ChatTemplate::FromText(Read(dir + "llama-3.1.jinja"),
                                                        "llama-3.1.jinja",
                                                        Json{{"bos_token", "<|begin_of_text|>"}})
                                 .value());
    out->templates.push_back(
        e3::ChatTemplate::FromText(Read(dir + "qwen3.jinja"), "qwen3.jinja", Json::object(), false)
            .value());
    return out;
  }();
  return *t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Templates& t = Loaded();
  const Json line = Json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (line.is_discarded() || !line.is_object() || !e3::HasConversation(line)) return 0;
  auto messages = e3::MessagesOfLine(line);
  if (!messages.ok()) {
    E3_FUZZ_CHECK(!messages.status().message().empty());
    return 0;
  }
  auto tools = e3::ToolsOfLine(line);
  if (!tools.ok()) return 0;
  for (const e3::ChatTemplate& tmpl : t.templates) {
    for (bool prompt : {false, true}) {
      auto r = tmpl.Render(*messages, prompt, *tools);
      if (!r.ok()) {
        E3_FUZZ_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
        continue;
      }
      size_t last_end = 0;
      for (const auto& [b, e] : r->assistant_spans) {
        E3_FUZZ_CHECK(b >= last_end && b <= e && e <= r->text.size());
        last_end = e;
      }
    }
    auto tokenized = e3::TokenizeChat(*t.tokenizer, tmpl, *messages, false, *tools);
    if (tokenized.ok()) E3_FUZZ_CHECK(tokenized->input_ids.size() == tokenized->loss_mask.size());
  }
  return 0;
}
