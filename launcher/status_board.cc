#include "launcher/status_board.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include "absl/strings/str_format.h"

namespace e3 {
namespace {

std::string Elapsed(double seconds) {
  const int s = static_cast<int>(seconds);
  return s >= 3600 ? absl::StrFormat("%dh%02dm", s / 3600, s / 60 % 60)
                   : absl::StrFormat("%dm%02ds", s / 60, s % 60);
}

std::string Head(const ProcessStatus& s) {
  return absl::StrFormat("%-16s %-7s %-14s", s.name, s.device, s.state);
}

}  // namespace

std::string FormatStatusLine(const ProcessStatus& s, size_t width) {
  std::string line = absl::StrFormat("%s %7s  %s", Head(s), Elapsed(s.seconds), s.last_line);
  if (width > 0 && line.size() > width)
    line = line.substr(0, width > 3 ? width - 3 : width) + "...";
  return line;
}

StatusBoard::StatusBoard(FILE* out, bool terminal, std::chrono::milliseconds interval)
    : out_(out), terminal_(terminal), interval_(interval) {}

size_t StatusBoard::TerminalWidth() const {
  // Asked at every redraw: the window may have been resized. A terminal
  // that does not say gets the common 80 columns.
  winsize ws{};
  if (::ioctl(::fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20) return ws.ws_col - 1;
  return 79;
}

void StatusBoard::Clear() {
  if (!terminal_ || lines_shown_ == 0) return;
  std::fprintf(out_, "\033[%dA\r\033[J", lines_shown_);
  lines_shown_ = 0;
}

void StatusBoard::Show(const std::vector<ProcessStatus>& rows, bool force) {
  if (terminal_) {
    Clear();
    const size_t width = TerminalWidth();
    for (const ProcessStatus& s : rows)
      std::fprintf(out_, "%s\n", FormatStatusLine(s, width).c_str());
    lines_shown_ = static_cast<int>(rows.size());
    std::fflush(out_);
    return;
  }
  const Clock::time_point now = Clock::now();
  if (!force && now - last_print_ < interval_) return;
  last_print_ = now;
  for (const ProcessStatus& s : rows) {
    const std::string key = Head(s) + s.last_line;
    if (printed_[s.name] == key) continue;
    printed_[s.name] = key;
    std::fprintf(out_, "e3_launch: %s\n", FormatStatusLine(s, /*width=*/0).c_str());
  }
  std::fflush(out_);
}

void StatusBoard::Print(const std::string& text) {
  Clear();
  std::fprintf(out_, "%s", text.c_str());
  if (!text.empty() && text.back() != '\n') std::fprintf(out_, "\n");
  std::fflush(out_);
}

}  // namespace e3
