// e3_launch runs of the bundled model for the end-to-end tests: the
// binary, a small run config (one teacher, one student, on the CPU), and
// the processes a launcher started, read from /proc.
#ifndef E3_TESTS_E2E_LAUNCHER_RUN_H_
#define E3_TESTS_E2E_LAUNCHER_RUN_H_

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/base/file_util.h"
#include "tests/e2e/subprocess.h"

namespace e3::testing {

inline std::string Launcher() { return BuildDir() + "/launcher/e3_launch"; }

// How long a run of the bundled model lasts.
struct TinyRunLength {
  int64_t max_samples = 80;
  int64_t epochs = 1;
  int64_t max_steps = 6;  // 0: to the end of the data
  int64_t checkpoint_every = 3;
};

// Writes `dir`/run.yaml: the bundled model on the CPU, one teacher and one
// student, one thread each (CI has two cores), output in `dir`/run.
inline std::string WriteTinyRunConfig(const std::string& dir, const TinyRunLength& length = {}) {
  const std::string src = E3_SOURCE_DIR;
  const std::string path = dir + "/run.yaml";
  std::ofstream out(path);
  out << "model:\n  dir: " << src << "/examples/tiny-code-llama\n"
      << "data:\n  train: " << src << "/examples/data/train_conversations.jsonl\n"
      << "  max_samples: " << length.max_samples << "\n  max_seq_len: 256\n"
      << "  epochs: " << length.epochs << "\n"
      << "draft:\n  vocab_size: 256\n"
      << "schedule:\n  tokens_per_batch: 256\n  lr: 2e-3\n  warmup_steps: 2\n"
      << "  max_steps: " << length.max_steps << "\n  log_every: 2\n"
      << "  checkpoint_every: " << length.checkpoint_every << "\n"
      << "teachers:\n  devices: [cpu]\n  threads: 1\n"
      << "students:\n  devices: [cpu]\n  threads: 1\n"
      << "run:\n  out: " << dir << "/run\n";
  return path;
}

// The fields of /proc/<pid>/stat after the command's name (state, ppid,
// ...); empty when there is no such process.
inline std::vector<std::string> ProcStat(pid_t pid) {
  const std::string line = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t name_end = line.rfind(')');
  if (name_end == std::string::npos) return {};
  std::istringstream rest(line.substr(name_end + 1));
  std::vector<std::string> fields;
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;
}

// The processes whose parent is `parent`.
inline std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const std::string& entry : ListDir("/proc").value_or(std::vector<std::string>())) {
    if (entry.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(entry));
    const std::vector<std::string> stat = ProcStat(pid);
    if (stat.size() > 1 && stat[1] == std::to_string(parent)) out.push_back(pid);
  }
  return out;
}

// Whether `pid` has ended: gone, or a zombie its new parent has not reaped.
inline bool Ended(pid_t pid) {
  const std::vector<std::string> stat = ProcStat(pid);
  return stat.empty() || stat[0] == "Z";
}

}  // namespace e3::testing

#endif  // E3_TESTS_E2E_LAUNCHER_RUN_H_
