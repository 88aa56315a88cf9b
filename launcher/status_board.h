// One live status line per process: its name, device, state, time and the
// last line of its log. On a terminal the block of lines is rewritten in
// place, each cut to the terminal's width (a wrapped line would break the
// rewrite); into a file or a pipe (CI, nohup) the lines that changed are
// printed whole, at most once per interval, so a log shows progress
// without flooding and without losing the end of a line.
#ifndef E3_LAUNCHER_STATUS_BOARD_H_
#define E3_LAUNCHER_STATUS_BOARD_H_

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace e3 {

struct ProcessStatus {
  std::string name;
  std::string device;
  std::string state;  // starting, running, done, failed (exit 1), ...
  double seconds = 0;
  std::string last_line;  // of its log
};

// The line for `s`, cut to `width` characters (0: whole).
std::string FormatStatusLine(const ProcessStatus& s, size_t width);

class StatusBoard {
 public:
  using Clock = std::chrono::steady_clock;
  // `interval`: how often a non-terminal board prints the lines that changed.
  StatusBoard(FILE* out, bool terminal, std::chrono::milliseconds interval);

  // Shows `rows`; `force` prints now (a non-terminal board too).
  void Show(const std::vector<ProcessStatus>& rows, bool force = false);
  // Prints `text` above the board (a terminal's board is redrawn below it
  // at the next Show).
  void Print(const std::string& text);
  // Leaves the lines last shown on the screen: what comes next goes below.
  void Keep() { lines_shown_ = 0; }

 private:
  void Clear();
  // The terminal's width now, less one column (a full line would wrap).
  size_t TerminalWidth() const;

  FILE* out_;
  bool terminal_;
  std::chrono::milliseconds interval_;
  int lines_shown_ = 0;
  Clock::time_point last_print_{};
  std::map<std::string, std::string>
      printed_;  // per process, the last line printed (without the time)
};

}  // namespace e3

#endif  // E3_LAUNCHER_STATUS_BOARD_H_
