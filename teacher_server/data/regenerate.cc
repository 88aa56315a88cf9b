#include "teacher_server/data/regenerate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/fnv1a.h"
#include "common/base/status_macros.h"
#include "common/data/dataset.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

using Clock = std::chrono::steady_clock;

// Index of the k-th assistant turn of `messages`, or -1.
int64_t AssistantTurn(const std::vector<ChatMessage>& messages, int64_t k) {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "assistant" && k-- == 0) return static_cast<int64_t>(i);
  }
  return -1;
}

// The line as training data, every turn's fields and the tools kept.
std::string ConversationLine(const ChatLine& line) {
  nlohmann::ordered_json turns = nlohmann::ordered_json::array();
  for (const ChatMessage& m : line.messages) turns.push_back(MessageToJson(m));
  nlohmann::ordered_json out = {{"messages", turns}};
  if (!line.tools.is_null()) out["tools"] = line.tools;
  return out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// Replaces the k-th assistant turn of every conversation that has one, in
// one batched generation. Returns false when none has a k-th turn.
absl::StatusOr<bool> RegenerateTurn(CausalLM& model, const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                    int64_t k, const GenerationOptions& generation, std::vector<ChatLine>* lines,
                                    RegenerateReport* report) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::pair<size_t, int64_t>> where;  // (line, message index)
  const int64_t max_prompt = model.config().max_position_embeddings - generation.max_new_tokens;
  bool any = false;
  for (size_t i = 0; i < lines->size(); ++i) {
    std::vector<ChatMessage>& messages = (*lines)[i].messages;
    const int64_t turn = AssistantTurn(messages, k);
    if (turn < 0) continue;
    any = true;
    std::vector<ChatMessage> context(messages.begin(), messages.begin() + turn);
    auto ids = TokenizePrompt(tokenizer, chat_template, context, (*lines)[i].tools);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", (*lines)[i].line, ": the chat template refused turn ",
                                                     turn, ": ", ids.status().message()));
    }
    if (static_cast<int64_t>(ids->size()) > max_prompt || ids->empty()) {
      report->kept_turns += 1;  // no room for a continuation within the model's positions
      continue;
    }
    prompts.push_back(std::move(ids).value());
    where.emplace_back(i, turn);
  }
  if (!any) return false;
  GenerationOptions g = generation;
  const auto t0 = Clock::now();
  auto last_print = t0;
  g.on_progress = [&](int64_t done, int64_t total, int64_t tokens) {
    // A line every 10 s: a large dataset's turn takes minutes.
    const auto now = Clock::now();
    if (done < total && now - last_print < std::chrono::seconds(10)) return;
    last_print = now;
    const double secs = std::chrono::duration<double>(now - t0).count();
    std::printf("teacher: regenerating assistant turn %ld: %ld of %ld conversations, %ld tokens (%.0f tok/s)\n",
                static_cast<long>(k + 1), static_cast<long>(done), static_cast<long>(total),
                static_cast<long>(tokens), tokens / std::max(secs, 1e-9));
    std::fflush(stdout);
  };
  E3_ASSIGN_OR_RETURN(auto continuations, GenerateContinuations(model, prompts, g));
  const std::set<int32_t> stop(generation.stop_ids.begin(), generation.stop_ids.end());
  for (size_t j = 0; j < where.size(); ++j) {
    std::vector<int32_t>& c = continuations[j];
    report->tokens += static_cast<int64_t>(c.size());
    // The template writes the turn's terminator itself.
    if (!c.empty() && stop.count(c.back())) c.pop_back();
    // The continuation is the whole turn as the model writes it (its
    // thinking and tool calls in the text), so the data's are dropped.
    ChatMessage& turn = (*lines)[where[j].first].messages[where[j].second];
    turn.content = tokenizer.Decode(c);
    turn.content_is_null = false;
    for (const char* key : {"reasoning_content", "thinking", "tool_calls"}) turn.fields.erase(key);
    report->turns += 1;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> RegenerationFingerprint(const std::string& data_path, const std::string& model_config_json,
                                                    const std::string& template_fingerprint,
                                                    const GenerationOptions& generation, int64_t max_lines) {
  E3_ASSIGN_OR_RETURN(std::string data, ReadFileToString(data_path));
  uint64_t h = Fnv1a(data, kFingerprintSeed);
  h = Fnv1a(model_config_json, h);
  h = Fnv1a(absl::StrCat(template_fingerprint, "|", generation.max_new_tokens, "|", generation.temperature, "|",
                         generation.seed, "|", max_lines, "|", generation.stop_ids.size()),
            h);
  for (int32_t id : generation.stop_ids) h = Fnv1a(absl::StrCat(id, ","), h);
  return absl::StrFormat("%016x", h);
}

absl::StatusOr<RegenerateReport> RegenerateData(CausalLM& model, const Tokenizer& tokenizer,
                                                const ChatTemplate& chat_template, const std::string& data_path,
                                                const std::string& fingerprint, const RegenerateOptions& options) {
  RegenerateReport report;
  report.fingerprint = fingerprint;
  const std::string stamp_path = options.cache_path + ".fingerprint";
  auto stamp = ReadFileToString(stamp_path);
  if (stamp.ok() && *stamp == fingerprint + "\n" && ReadFileToString(options.cache_path).ok()) {
    report.reused = true;
    return report;
  }
  const auto t0 = Clock::now();
  E3_ASSIGN_OR_RETURN(std::vector<ChatLine> lines, ReadChatLines(data_path, options.skip_malformed, &report.malformed));
  if (options.max_lines > 0 && static_cast<int64_t>(lines.size()) > options.max_lines) lines.resize(options.max_lines);
  for (const ChatLine& l : lines) {
    if (l.messages.empty()) ++report.pretokenized;
    else if (AssistantTurn(l.messages, 0) >= 0) ++report.conversations;
  }
  for (int64_t k = 0;; ++k) {
    E3_ASSIGN_OR_RETURN(bool more, RegenerateTurn(model, tokenizer, chat_template, k, options.generation, &lines,
                                                  &report));
    if (!more) break;
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("teacher: regenerated assistant turn %ld of the conversations: %ld turns, %ld tokens (%.0f tok/s)\n",
                static_cast<long>(k + 1), static_cast<long>(report.turns), static_cast<long>(report.tokens),
                report.tokens / std::max(secs, 1e-9));
    std::fflush(stdout);
  }
  std::string text;
  for (const ChatLine& l : lines) absl::StrAppend(&text, l.messages.empty() ? l.pretokenized : ConversationLine(l), "\n");
  // The data first, then its stamp: a crash in between leaves no stamp, so
  // the next start regenerates instead of trusting a partial file.
  E3_RETURN_IF_ERROR(WriteFileAtomically(options.cache_path, text));
  E3_RETURN_IF_ERROR(WriteFileAtomically(stamp_path, fingerprint + "\n"));
  report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return report;
}

}  // namespace e3
