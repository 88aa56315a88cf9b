// teacher_server --preview_data's text: the lines of a data file as the
// teacher trains on them (PreviewLines in dataset.h), written for a person
// to check: each line's rendering with the trained tokens (loss_mask 1)
// between markers, its token counts, why a line is not a sample, and the
// reasoning a chat template dropped.
#ifndef E3_COMMON_DATA_PREVIEW_H_
#define E3_COMMON_DATA_PREVIEW_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/data/dataset.h"
#include "common/text/tokenizer.h"

namespace e3 {

// What goes around each run of trained tokens.
struct PreviewMarkers {
  std::string open;
  std::string close;
  std::string described;  // "between [[ and ]]", for the header
};
// "[[" and "]]": for files, pipes and tests.
PreviewMarkers BracketMarkers();
// Bold green, then a reset: for a terminal.
PreviewMarkers ColorMarkers();

// One line: a header "--- <source>:<line>: <kind>, N tokens, M trained
// (P%)" (or why it is not a sample), its text with the markers, and one
// "warning: " line per dropped reasoning. A chat line's text is the
// template's rendering cut where the tokens kept end, each token's bytes
// in place; a pre-tokenized line's is its runs of tokens decoded.
std::string FormatLinePreview(const LinePreview& line, const std::string& source,
                              const Tokenizer& tokenizer, const PreviewMarkers& markers);

struct PreviewTotals {
  int64_t lines = 0;
  int64_t kept = 0;
  int64_t dropped = 0;  // too short, or no trained token
  int64_t malformed = 0;
  int64_t empty = 0;
  int64_t tokens = 0;   // over kept samples
  int64_t trained = 0;  // over kept samples
  int64_t warnings = 0;
};
PreviewTotals TotalsOf(const std::vector<LinePreview>& lines);
// "3 lines: 2 samples (402 tokens, 300 trained, 74.6%), 1 dropped, 0
// malformed, 0 blank; 0 warnings".
std::string DescribeTotals(const PreviewTotals& totals);

}  // namespace e3

#endif  // E3_COMMON_DATA_PREVIEW_H_
