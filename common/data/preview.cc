#include "common/data/preview.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"

namespace e3 {
namespace {

int64_t Trained(const LinePreview& line) {
  int64_t n = 0;
  for (uint8_t m : line.loss_mask) n += m;
  return n;
}

std::string Percent(int64_t part, int64_t whole) {
  return whole > 0 ? absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole))
                   : "-";
}

std::string Tokens(int64_t n) { return absl::StrCat(n, n == 1 ? " token" : " tokens"); }

// The rendering with each token's bytes in place, cut where the kept
// tokens end. A token's bytes run from the end of the one before (bytes no
// token covers go with the next token) to its own end; tokens sharing
// bytes (a character split over byte-fallback tokens) leave the later ones
// empty.
std::string MarkedRendering(const LinePreview& line, const PreviewMarkers& markers) {
  std::string out;
  size_t cursor = 0;
  bool open = false;
  for (size_t k = 0; k < line.input_ids.size() && k < line.offsets.size(); ++k) {
    const bool trained = line.loss_mask[k] != 0;
    if (trained != open) {
      out += trained ? markers.open : markers.close;
      open = trained;
    }
    const size_t end = std::min(line.text.size(), std::max(cursor, line.offsets[k].second));
    out.append(line.text, cursor, end - cursor);
    cursor = end;
  }
  if (open) out += markers.close;
  // Bytes after the last token: none unless the line was cut.
  if (static_cast<int64_t>(line.input_ids.size()) == line.tokens_before_cut) out.append(line.text, cursor);
  return out;
}

// A pre-tokenized line: each run of tokens with the same loss_mask decoded.
std::string MarkedDecoding(const LinePreview& line, const Tokenizer& tokenizer, const PreviewMarkers& markers) {
  std::string out;
  const absl::Span<const int32_t> ids(line.input_ids);
  size_t begin = 0;
  while (begin < ids.size()) {
    size_t end = begin;
    while (end < ids.size() && line.loss_mask[end] == line.loss_mask[begin]) ++end;
    const std::string text = tokenizer.Decode(ids.subspan(begin, end - begin));
    if (line.loss_mask[begin] != 0) {
      absl::StrAppend(&out, markers.open, text, markers.close);
    } else {
      out += text;
    }
    begin = end;
  }
  return out;
}

}  // namespace

PreviewMarkers BracketMarkers() { return {"[[", "]]", "between [[ and ]]"}; }
PreviewMarkers ColorMarkers() { return {"\x1b[1;32m", "\x1b[0m", "in \x1b[1;32mbold green\x1b[0m"}; }

std::string FormatLinePreview(const LinePreview& line, const std::string& source, const Tokenizer& tokenizer,
                              const PreviewMarkers& markers) {
  const std::string where = absl::StrCat(source, ":", line.line);
  if (line.outcome == LineOutcome::kEmpty) return absl::StrCat("--- ", where, ": blank line, skipped\n\n");
  if (line.outcome == LineOutcome::kMalformed) {
    std::string what = line.error;
    const std::string prefix = where + ": ";
    if (what.rfind(prefix, 0) == 0) what = what.substr(prefix.size());
    return absl::StrCat("--- ", where, ": malformed, not a sample: ", what, "\n\n");
  }
  const int64_t tokens = static_cast<int64_t>(line.input_ids.size());
  const int64_t trained = Trained(line);
  std::string out = absl::StrCat("--- ", where, ": ", line.conversation ? "conversation" : "input_ids", ", ",
                                 Tokens(tokens));
  if (line.tokens_before_cut > tokens) {
    absl::StrAppend(&out, " (cut from ", line.tokens_before_cut, " to max_seq_len)");
  }
  absl::StrAppend(&out, ", ", trained, " trained (", Percent(trained, tokens), ")");
  if (line.outcome == LineOutcome::kTooShort) {
    absl::StrAppend(&out, ": dropped, too short to train on");
  } else if (line.outcome == LineOutcome::kNoTrainedToken) {
    absl::StrAppend(&out, ": dropped, no trained token (",
                    line.conversation ? "no assistant turn inside max_seq_len; train_on_all_tokens trains every token"
                                      : "its loss_mask is all 0",
                    ")");
  }
  out += "\n";
  std::string text = line.conversation ? MarkedRendering(line, markers) : MarkedDecoding(line, tokenizer, markers);
  if (!text.empty() && text.back() != '\n') text += "\n";
  out += text;
  if (line.tokens_before_cut > tokens) {
    absl::StrAppend(&out, "[... ", Tokens(line.tokens_before_cut - tokens),
                    " past max_seq_len not shown: training never sees them ...]\n");
  }
  for (const std::string& w : line.warnings) absl::StrAppend(&out, "warning: ", where, ": ", w, "\n");
  out += "\n";
  return out;
}

PreviewTotals TotalsOf(const std::vector<LinePreview>& lines) {
  PreviewTotals t;
  for (const LinePreview& line : lines) {
    ++t.lines;
    t.warnings += static_cast<int64_t>(line.warnings.size());
    switch (line.outcome) {
      case LineOutcome::kEmpty:
        ++t.empty;
        break;
      case LineOutcome::kMalformed:
        ++t.malformed;
        break;
      case LineOutcome::kTooShort:
      case LineOutcome::kNoTrainedToken:
        ++t.dropped;
        break;
      case LineOutcome::kKept:
        ++t.kept;
        t.tokens += static_cast<int64_t>(line.input_ids.size());
        t.trained += Trained(line);
        break;
    }
  }
  return t;
}

std::string DescribeTotals(const PreviewTotals& t) {
  return absl::StrCat(t.lines, t.lines == 1 ? " line: " : " lines: ", t.kept, t.kept == 1 ? " sample (" : " samples (",
                      Tokens(t.tokens), ", ", t.trained, " trained, ", Percent(t.trained, t.tokens), "), ", t.dropped,
                      " dropped, ", t.malformed, " malformed, ", t.empty, " blank; ", t.warnings,
                      t.warnings == 1 ? " warning" : " warnings");
}

}  // namespace e3
