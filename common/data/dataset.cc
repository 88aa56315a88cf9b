#include "common/data/dataset.h"

#include "common/base/file_util.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/line_reader.h"
#include "common/base/status_macros.h"
#include "common/text/chat_message.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

using Json = nlohmann::ordered_json;

// Lines tokenized per parallel round. Bounds the raw text held in memory
// and lets max_samples stop reading early.
constexpr size_t kBlockLines = 2048;
// Threads beyond this gain little: tokenizing is memory-bound.
constexpr unsigned kMaxDefaultThreads = 16;
// Longest excerpt of an offending value quoted back in a message.
constexpr size_t kMaxQuoted = 40;

enum class LineKind { kEmpty, kMalformed, kChat, kPretokenized };

struct ParsedLine {
  LineKind kind = LineKind::kEmpty;
  std::string error;  // kMalformed: what was wrong, without "path:line: "
  std::string cause;  // kMalformed: its kind, for the counts by cause
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> loss_mask;
  // With LineContext::keep_text (PreviewLines): a chat line's rendering,
  // each token's byte span in it, and the reasoning it dropped.
  std::string text;
  std::vector<std::pair<size_t, size_t>> offsets;
  std::vector<std::string> warnings;
};

struct LineContext {
  const Tokenizer* tokenizer;
  const ChatTemplate* chat_template;
  int64_t vocab_size;
  bool train_on_all_tokens;
  bool prompts_only;
  bool keep_text = false;
};

// Records where and why a line failed to parse. The DOM parser with
// exceptions off only says "discarded"; this recovers the position.
class ErrorLocator : public Json::json_sax_t {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    message = absl::StrCat("invalid JSON at byte ", position, ": ", ex.what());
    return false;
  }
  std::string message = "invalid JSON";
};

std::string Quote(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMaxQuoted) text = text.substr(0, kMaxQuoted) + "...";
  return text;
}

const char* TypeName(const Json& value) { return value.type_name(); }

ParsedLine Malformed(std::string error, std::string cause) {
  ParsedLine out;
  out.kind = LineKind::kMalformed;
  out.error = std::move(error);
  out.cause = std::move(cause);
  return out;
}

// The causes a line is counted under in DatasetStats::malformed_by_cause.
constexpr char kCauseJson[] = "invalid JSON";
constexpr char kCauseFormat[] = "neither a conversation nor input_ids";
constexpr char kCauseTurns[] = "bad turns";
constexpr char kCauseTemplate[] = "template could not render";
constexpr char kCauseIds[] = "bad input_ids/loss_mask";
constexpr char kCauseNoUser[] = "no user turn";
constexpr char kCauseTooLong[] = "line too long";

ParsedLine TooLong(size_t bytes, int64_t max_bytes) {
  return Malformed(absl::StrCat("the line is ", bytes, " bytes, over the limit of ", max_bytes,
                                " (--max_line_bytes, data.max_line_bytes); it was not read"),
                   kCauseTooLong);
}

// The turns up to the last user turn, as a serving engine's prompt.
ParsedLine PromptOfConversation(std::vector<ChatMessage> messages, const nlohmann::ordered_json& tools,
                                const LineContext& ctx) {
  size_t last_user = messages.size();
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "user") last_user = i;
  }
  if (last_user == messages.size()) return Malformed("has no user turn to take a prompt from", kCauseNoUser);
  messages.resize(last_user + 1);
  auto ids = TokenizePrompt(*ctx.tokenizer, *ctx.chat_template, messages, tools);
  if (!ids.ok()) {
    return Malformed(absl::StrCat("the chat template (", ctx.chat_template->origin(),
                                  ") could not render the prompt: ", ids.status().message()),
                     kCauseTemplate);
  }
  ParsedLine out;
  out.kind = LineKind::kChat;
  out.input_ids = std::move(ids).value();
  out.loss_mask.assign(out.input_ids.size(), 0);
  return out;
}

// A pre-tokenized line's prompt: the ids before its last run of trained
// tokens (the last assistant turn), or all of them.
void KeepPromptOfPretokenized(ParsedLine* line) {
  size_t end = line->loss_mask.size();
  while (end > 0 && line->loss_mask[end - 1] == 0) --end;
  if (end > 0) {
    while (end > 0 && line->loss_mask[end - 1] == 1) --end;
    line->input_ids.resize(end);
  }
  line->loss_mask.assign(line->input_ids.size(), 0);
}

// The reasoning assistant turn `m` carries in the data: its
// reasoning_content or thinking field (named in *field), else the
// <think>...</think> its content starts with; empty when none.
std::string SourceReasoning(const ChatMessage& m, const Json& turn, std::string* field) {
  for (const char* key : {"reasoning_content", "thinking"}) {
    if (turn.is_object() && turn.contains(key) && turn[key].is_string()) {
      *field = absl::StrCat("\"", key, "\"");
      return turn[key].get<std::string>();
    }
  }
  const std::string& c = m.content;
  const size_t open = c.find("<think>");
  const size_t close = c.find("</think>");
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  *field = "<think> in \"content\"";
  return c.substr(open + 7, close - open - 7);
}

// Warnings for the reasoning of assistant turns that `text` (the
// conversation's rendering) does not contain: the template dropped it, so
// it is neither seen nor trained.
std::vector<std::string> DroppedReasoning(const Json& line, const std::vector<ChatMessage>& messages,
                                          const std::string& text, const ChatTemplate& chat_template) {
  const char* key = line.contains("messages") ? "messages" : "conversations";
  const Json& turns = line[key];
  std::vector<std::string> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    std::string field;
    std::string reasoning = SourceReasoning(messages[i], turns[i], &field);
    const size_t first = reasoning.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) continue;
    reasoning = reasoning.substr(first, reasoning.find_last_not_of(" \t\r\n") + 1 - first);
    if (text.find(reasoning) != std::string::npos) continue;
    out.push_back(absl::StrCat(key, "[", i, "] (assistant): its reasoning (", field, ", ", reasoning.size(),
                               " bytes) is not in the rendered text: the chat template (", chat_template.origin(),
                               ") drops it, so it is not trained"));
  }
  return out;
}

ParsedLine ParseConversation(const Json& line, const LineContext& ctx) {
  auto parsed = MessagesOfLine(line);
  if (!parsed.ok()) return Malformed(std::string(parsed.status().message()), kCauseTurns);
  auto tools = ToolsOfLine(line);
  if (!tools.ok()) return Malformed(std::string(tools.status().message()), kCauseTurns);
  std::vector<ChatMessage> messages = std::move(parsed).value();
  if (ctx.prompts_only) return PromptOfConversation(std::move(messages), *tools, ctx);
  auto tokenized = TokenizeChat(*ctx.tokenizer, *ctx.chat_template, messages, ctx.train_on_all_tokens, *tools);
  if (!tokenized.ok()) {
    return Malformed(absl::StrCat("the chat template (", ctx.chat_template->origin(),
                                  ") could not render the conversation: ", tokenized.status().message()),
                     kCauseTemplate);
  }
  ParsedLine out;
  out.kind = LineKind::kChat;
  out.input_ids = std::move(tokenized->input_ids);
  out.loss_mask = std::move(tokenized->loss_mask);
  if (ctx.keep_text) {
    out.warnings = DroppedReasoning(line, messages, tokenized->text, *ctx.chat_template);
    out.text = std::move(tokenized->text);
    out.offsets = std::move(tokenized->offsets);
  }
  return out;
}

ParsedLine ParsePretokenized(const Json& object, const LineContext& ctx) {
  auto ids_it = object.find("input_ids");
  auto mask_it = object.find("loss_mask");
  const auto bad = [](std::string error) { return Malformed(std::move(error), kCauseIds); };
  if (mask_it == object.end()) return bad("has \"input_ids\" but no \"loss_mask\"");
  if (!ids_it->is_array()) {
    return bad(
        absl::StrCat("\"input_ids\" is ", TypeName(*ids_it), "; expected an array of token ids"));
  }
  if (!mask_it->is_array()) {
    return bad(
        absl::StrCat("\"loss_mask\" is ", TypeName(*mask_it), "; expected an array of 0/1"));
  }
  if (ids_it->size() != mask_it->size()) {
    return bad(absl::StrCat("\"input_ids\" has ", ids_it->size(),
                                  " values but \"loss_mask\" has ", mask_it->size(),
                                  "; expected the same length"));
  }
  ParsedLine out;
  out.kind = LineKind::kPretokenized;
  out.input_ids.reserve(ids_it->size());
  out.loss_mask.reserve(mask_it->size());
  for (size_t t = 0; t < ids_it->size(); ++t) {
    const Json& id = (*ids_it)[t];
    int64_t value = -1;
    if (id.is_number_unsigned()) {
      // Clamp before narrowing so huge values cannot wrap into range.
      value = static_cast<int64_t>(std::min<uint64_t>(
          id.get<uint64_t>(), static_cast<uint64_t>(std::numeric_limits<int64_t>::max())));
    } else if (id.is_number_integer()) {
      value = id.get<int64_t>();
    }
    if (!id.is_number_integer() || value < 0 || value >= ctx.vocab_size) {
      return bad(absl::StrCat("input_ids[", t, "] is ", Quote(id),
                                    "; expected an integer in [0, ", ctx.vocab_size, ")"));
    }
    out.input_ids.push_back(static_cast<int32_t>(value));
    const Json& mask = (*mask_it)[t];
    if (mask.is_boolean()) {
      out.loss_mask.push_back(mask.get<bool>() ? 1 : 0);
    } else if (mask.is_number_integer() && (mask.get<int64_t>() == 0 || mask.get<int64_t>() == 1)) {
      out.loss_mask.push_back(static_cast<uint8_t>(mask.get<int64_t>()));
    } else {
      return bad(absl::StrCat("loss_mask[", t, "] is ", Quote(mask), "; expected 0 or 1"));
    }
  }
  return out;
}

ParsedLine ParseLine(std::string_view line, const LineContext& ctx) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // CRLF files
  if (line.find_first_not_of(" \t") == std::string_view::npos) return ParsedLine();
  Json object = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) {
    ErrorLocator locator;
    Json::sax_parse(line.begin(), line.end(), &locator);
    return Malformed(locator.message, kCauseJson);
  }
  if (!object.is_object()) {
    return Malformed(absl::StrCat("line is a JSON ", TypeName(object), "; expected an object"), kCauseFormat);
  }
  const bool has_chat = HasConversation(object);
  const bool has_ids = object.contains("input_ids");
  if (has_chat && has_ids) {
    return Malformed("has both a conversation and \"input_ids\"; expected one of them", kCauseFormat);
  }
  if (has_chat) return ParseConversation(object, ctx);
  if (has_ids) {
    ParsedLine line = ParsePretokenized(object, ctx);
    if (ctx.prompts_only && line.kind == LineKind::kPretokenized) KeepPromptOfPretokenized(&line);
    return line;
  }
  return Malformed("expected a \"messages\" or \"conversations\" array, or \"input_ids\" and \"loss_mask\" arrays",
                   kCauseFormat);
}

// Parses lines[i] into results[i] over `threads` workers. Each slot is
// written by exactly one worker, so the output order is the input order.
void ParseBlock(const std::vector<std::string>& lines, const LineContext& ctx, unsigned threads,
                std::vector<ParsedLine>* results) {
  results->assign(lines.size(), ParsedLine());
  threads = std::min<unsigned>(threads, static_cast<unsigned>(lines.size()));
  if (threads <= 1) {
    for (size_t i = 0; i < lines.size(); ++i) (*results)[i] = ParseLine(lines[i], ctx);
    return;
  }
  // Lines vary a lot in length; hand them out one at a time.
  std::atomic<size_t> next{0};
  auto work = [&]() {
    for (size_t i = next.fetch_add(1); i < lines.size(); i = next.fetch_add(1)) {
      (*results)[i] = ParseLine(lines[i], ctx);
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  for (unsigned t = 1; t < threads; ++t) workers.emplace_back(work);
  work();
  for (auto& w : workers) w.join();
}

unsigned ThreadCount(int requested) {
  if (requested > 0) return static_cast<unsigned>(requested);
  const unsigned hw = std::thread::hardware_concurrency();
  return std::max(1u, std::min(hw == 0 ? 1u : hw, kMaxDefaultThreads));
}

absl::Status ValidateOptions(const DatasetOptions& options) {
  if (options.max_length < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_length is ", options.max_length, "; expected >= 0 (0: no cut)"));
  }
  if (options.max_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_samples is ", options.max_samples, "; expected >= 0 (0: all)"));
  }
  if (options.min_length < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_length is ", options.min_length, "; expected >= 0"));
  }
  if (options.max_length > 0 && options.min_length > options.max_length) {
    return absl::InvalidArgumentError(absl::StrCat("min_length ", options.min_length,
                                                   " exceeds max_length ", options.max_length,
                                                   "; every sample would be dropped"));
  }
  if (options.vocab_size < 0 || options.vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size is ", options.vocab_size,
                     "; expected 0 (the tokenizer's) or a positive int32"));
  }
  return absl::OkStatus();
}

void AddKeptToStats(const Sample& sample, DatasetStats* stats) {
  ++stats->kept;
  stats->total_tokens += sample.size();
  for (uint8_t m : sample.loss_mask) stats->loss_tokens += m;
  stats->max_sample_length = std::max(stats->max_sample_length, sample.size());
}

LineContext MakeContext(const DatasetOptions& options, const Tokenizer& tokenizer,
                        const ChatTemplate& chat_template, bool keep_text) {
  LineContext ctx;
  ctx.tokenizer = &tokenizer;
  ctx.chat_template = &chat_template;
  ctx.vocab_size = options.vocab_size > 0 ? options.vocab_size : tokenizer.vocab_size();
  ctx.train_on_all_tokens = options.train_on_all_tokens;
  ctx.prompts_only = options.prompts_only;
  ctx.keep_text = keep_text;
  return ctx;
}

// Reads options.path (at most `max_lines` lines; 0: all) in blocks, parses
// each block's lines over the tokenizer threads, and hands every line to
// `each(line_number, parsed, &stop)` in file order until it sets stop or
// returns an error. Dataset::Load and PreviewLines read through this alone.
absl::Status ForEachParsedLine(const DatasetOptions& options, const LineContext& ctx, int64_t max_lines,
                               const std::function<absl::Status(int64_t, ParsedLine&, bool*)>& each) {
  auto opened = LineReader::Open(options.path);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(), absl::StrCat("dataset: ", opened.status().message(),
                                                             " (expected a .jsonl or .jsonl.gz file)"));
  }
  LineReader& in = **opened;
  in.set_max_line_bytes(static_cast<size_t>(std::max<int64_t>(0, options.max_line_bytes)));
  const unsigned threads = ThreadCount(options.num_threads);
  std::vector<std::string> lines;
  std::vector<size_t> skipped;  // per line of the block: bytes of a line too long to read
  std::vector<ParsedLine> parsed;
  int64_t line_number = 0;
  bool stop = false;
  bool more = true;
  while (!stop && more) {
    lines.clear();
    skipped.clear();
    size_t block = kBlockLines;
    if (max_lines > 0) block = std::min<size_t>(block, static_cast<size_t>(max_lines - line_number));
    if (block == 0) break;
    std::string line;
    size_t line_skipped = 0;
    while (lines.size() < block && (more = in.Next(&line, &line_skipped))) {
      lines.push_back(std::move(line));
      skipped.push_back(line_skipped);
    }
    if (lines.empty()) break;
    if (line_number == 0 && lines[0].rfind("\xEF\xBB\xBF", 0) == 0) lines[0].erase(0, 3);  // BOM
    ParseBlock(lines, ctx, threads, &parsed);
    for (size_t i = 0; i < lines.size(); ++i) {
      if (skipped[i] > 0) parsed[i] = TooLong(skipped[i], options.max_line_bytes);
    }
    for (ParsedLine& p : parsed) {
      E3_RETURN_IF_ERROR(each(++line_number, p, &stop));
      if (stop) break;
    }
  }
  if (!in.status().ok()) {
    return absl::DataLossError(absl::StrCat(in.status().message(), " (after line ", line_number, ")"));
  }
  return absl::OkStatus();
}

// What training makes of a parsed line: the cut to max_length (counted in
// *truncated), then the drop rules.
LineOutcome Judge(const DatasetOptions& options, ParsedLine* p, bool* truncated) {
  *truncated = false;
  if (p->kind == LineKind::kEmpty) return LineOutcome::kEmpty;
  if (p->kind == LineKind::kMalformed) return LineOutcome::kMalformed;
  if (options.max_length > 0 && static_cast<int64_t>(p->input_ids.size()) > options.max_length) {
    p->input_ids.resize(static_cast<size_t>(options.max_length));
    p->loss_mask.resize(static_cast<size_t>(options.max_length));
    *truncated = true;
  }
  if (static_cast<int64_t>(p->input_ids.size()) < options.min_length) return LineOutcome::kTooShort;
  if (options.drop_empty_loss_mask &&
      std::find(p->loss_mask.begin(), p->loss_mask.end(), 1) == p->loss_mask.end()) {
    return LineOutcome::kNoTrainedToken;
  }
  return LineOutcome::kKept;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Load(const DatasetOptions& options,
                                                       const Tokenizer& tokenizer,
                                                       const ChatTemplate& chat_template) {
  if (absl::Status valid = ValidateOptions(options); !valid.ok()) return valid;
  const LineContext ctx = MakeContext(options, tokenizer, chat_template, /*keep_text=*/false);
  auto dataset = std::unique_ptr<Dataset>(new Dataset());
  dataset->source_ = options.path;
  DatasetStats& stats = dataset->stats_;
  auto each = [&](int64_t line_number, ParsedLine& p, bool* stop) -> absl::Status {
    ++stats.lines_read;
    bool truncated = false;
    const LineKind kind = p.kind;
    switch (Judge(options, &p, &truncated)) {
      case LineOutcome::kEmpty:
        ++stats.empty_lines;
        return absl::OkStatus();
      case LineOutcome::kMalformed: {
        std::string message = absl::StrCat(options.path, ":", line_number, ": ", p.error);
        if (!options.skip_malformed) {
          return absl::InvalidArgumentError(
              absl::StrCat(message, " (set skip_malformed to skip and count such lines)"));
        }
        ++stats.malformed;
        ++stats.malformed_by_cause[p.cause];
        if (static_cast<int>(stats.first_errors.size()) < options.max_error_messages) {
          stats.first_errors.push_back(std::move(message));
        }
        return absl::OkStatus();
      }
      case LineOutcome::kTooShort:
        stats.truncated += truncated;
        ++stats.dropped_short;
        return absl::OkStatus();
      case LineOutcome::kNoTrainedToken:
        stats.truncated += truncated;
        ++stats.dropped_empty_mask;
        return absl::OkStatus();
      case LineOutcome::kKept:
        stats.truncated += truncated;
        break;
    }
    Sample sample;
    sample.id = static_cast<int64_t>(dataset->samples_.size());
    sample.line = line_number;
    sample.input_ids = std::move(p.input_ids);
    sample.loss_mask = std::move(p.loss_mask);
    AddKeptToStats(sample, &stats);
    ++(kind == LineKind::kChat ? stats.conversations : stats.pretokenized);
    dataset->samples_.push_back(std::move(sample));
    *stop = options.max_samples > 0 && stats.kept >= options.max_samples;
    return absl::OkStatus();
  };
  E3_RETURN_IF_ERROR(ForEachParsedLine(options, ctx, /*max_lines=*/0, each));
  return dataset;
}

absl::StatusOr<std::vector<LinePreview>> PreviewLines(const DatasetOptions& options, const Tokenizer& tokenizer,
                                                      const ChatTemplate& chat_template, int64_t lines) {
  if (absl::Status valid = ValidateOptions(options); !valid.ok()) return valid;
  if (lines < 1) return absl::InvalidArgumentError(absl::StrCat("lines is ", lines, "; expected >= 1"));
  const LineContext ctx = MakeContext(options, tokenizer, chat_template, /*keep_text=*/true);
  std::vector<LinePreview> out;
  auto each = [&](int64_t line_number, ParsedLine& p, bool*) -> absl::Status {
    LinePreview v;
    v.line = line_number;
    v.conversation = p.kind == LineKind::kChat;
    v.tokens_before_cut = static_cast<int64_t>(p.input_ids.size());
    bool truncated = false;
    v.outcome = Judge(options, &p, &truncated);
    if (v.outcome == LineOutcome::kMalformed) {
      v.error = absl::StrCat(options.path, ":", line_number, ": ", p.error);
    }
    v.input_ids = std::move(p.input_ids);
    v.loss_mask = std::move(p.loss_mask);
    v.text = std::move(p.text);
    v.offsets = std::move(p.offsets);
    v.offsets.resize(std::min(v.offsets.size(), v.input_ids.size()));
    v.warnings = std::move(p.warnings);
    out.push_back(std::move(v));
    return absl::OkStatus();
  };
  E3_RETURN_IF_ERROR(ForEachParsedLine(options, ctx, lines, each));
  return out;
}

std::unique_ptr<Dataset> Dataset::FromSamples(std::vector<Sample> samples, std::string source) {
  auto dataset = std::unique_ptr<Dataset>(new Dataset());
  dataset->source_ = std::move(source);
  dataset->samples_ = std::move(samples);
  DatasetStats& stats = dataset->stats_;
  for (size_t i = 0; i < dataset->samples_.size(); ++i) {
    Sample& sample = dataset->samples_[i];
    sample.id = static_cast<int64_t>(i);
    AddKeptToStats(sample, &stats);
  }
  stats.lines_read = stats.kept;
  return dataset;
}

std::vector<int64_t> Dataset::Lengths() const {
  std::vector<int64_t> lengths;
  lengths.reserve(samples_.size());
  for (const Sample& sample : samples_) lengths.push_back(sample.size());
  return lengths;
}

absl::StatusOr<std::vector<ChatLine>> ReadChatLines(const std::string& path, bool skip_malformed,
                                                    int64_t* malformed) {
  E3_ASSIGN_OR_RETURN(std::unique_ptr<LineReader> in, LineReader::Open(path));
  std::vector<ChatLine> out;
  *malformed = 0;
  std::string text;
  for (int64_t number = 1; in->Next(&text); ++number) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    Json object = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    absl::Status bad;
    ChatLine line;
    line.line = number;
    if (HasConversation(object)) {
      auto messages = MessagesOfLine(object);
      auto tools = ToolsOfLine(object);
      if (messages.ok()) line.messages = std::move(messages).value();
      if (tools.ok()) line.tools = std::move(tools).value();
      bad = messages.ok() ? tools.status() : messages.status();
    } else if (object.is_object() && object.contains("input_ids")) {
      line.pretokenized = text;
    } else {
      bad = absl::InvalidArgumentError("expected a \"messages\" or \"conversations\" array, or \"input_ids\"");
    }
    if (!bad.ok()) {
      if (!skip_malformed) return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": ", bad.message()));
      ++*malformed;
      continue;
    }
    out.push_back(std::move(line));
  }
  if (!in->status().ok()) return in->status();
  return out;
}

std::string Dataset::Summary() const {
  const DatasetStats& s = stats_;
  std::string out =
      absl::StrCat(source_, ": ", s.lines_read, " lines, ", s.kept, " samples kept (", s.malformed,
                   " malformed, ", s.truncated, " truncated, ", s.dropped_short, " too short, ",
                   s.dropped_empty_mask, " without trained tokens, ", s.empty_lines,
                   " empty lines); ", s.total_tokens, " tokens");
  if (s.kept > 0) {
    absl::StrAppend(
        &out, absl::StrFormat(" (mean %.1f, max %d per sample)",
                              static_cast<double>(s.total_tokens) / s.kept, s.max_sample_length));
  }
  absl::StrAppend(&out, ", ", s.loss_tokens, " trained");
  if (s.total_tokens > 0) {
    absl::StrAppend(&out, absl::StrFormat(" (%.1f%%)", 100.0 * s.loss_tokens / s.total_tokens));
  }
  if (!s.malformed_by_cause.empty()) {
    std::vector<std::string> causes;
    for (const auto& [cause, n] : s.malformed_by_cause) causes.push_back(absl::StrCat(n, " ", cause));
    absl::StrAppend(&out, "; malformed by cause: ", absl::StrJoin(causes, ", "));
  }
  if (!s.first_errors.empty()) absl::StrAppend(&out, "; first malformed: ", s.first_errors[0]);
  return out;
}

}  // namespace e3
