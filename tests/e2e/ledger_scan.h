// Reads a teacher's ledger (JSON lines, teacher_server/engine/ledger.h) the way
// the fault tests judge "exactly once": which samples were committed how
// many times, over the whole file (a restarted teacher appends to it).
#ifndef E3_TESTS_E2E_LEDGER_SCAN_H_
#define E3_TESTS_E2E_LEDGER_SCAN_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"

namespace e3::testing {

struct LedgerScan {
  int64_t dataset_samples = -1;  // from the "open" events
  int64_t max_committed_index = -1;
  int64_t commits = 0;  // commit events
  int64_t deliveries = 0;
  int64_t redeliveries = 0;
  int64_t opens = 0;  // one per teacher process that opened the file
  std::map<int64_t, int> committed;  // epoch-0 sample -> times committed
  std::map<int64_t, std::map<int64_t, int>> by_epoch;  // epoch -> sample -> times committed

  // Every sample of the dataset committed, and none twice.
  bool ExactlyOnce() const {
    if (dataset_samples < 0 || static_cast<int64_t>(committed.size()) != dataset_samples) return false;
    return std::all_of(committed.begin(), committed.end(), [](const auto& kv) { return kv.second == 1; });
  }
  // The same for each of epochs [0, epochs).
  bool ExactlyOnceOver(int64_t epochs) const {
    for (int64_t e = 0; e < epochs; ++e) {
      auto it = by_epoch.find(e);
      if (it == by_epoch.end() || static_cast<int64_t>(it->second.size()) != dataset_samples) return false;
      for (const auto& kv : it->second) {
        if (kv.second != 1) return false;
      }
    }
    return true;
  }
  std::string Describe() const {
    int64_t twice = 0;
    for (const auto& [s, n] : committed) twice += n > 1;
    std::ostringstream out;
    out << committed.size() << " of " << dataset_samples << " samples committed, " << twice << " more than once; "
        << commits << " commits, " << deliveries << " deliveries (" << redeliveries << " again), " << opens
        << " teacher processes";
    return out.str();
  }
};

inline LedgerScan ScanLedger(const std::string& path) {
  LedgerScan s;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;  // a line being written
    const std::string event = j.value("event", "");
    if (event == "open") {
      s.dataset_samples = j["dataset_samples"].get<int64_t>();
      s.opens += 1;
    } else if (event == "commit") {
      s.commits += 1;
      s.max_committed_index = std::max<int64_t>(s.max_committed_index, j["index"].get<int64_t>());
      const int64_t epoch = j["epoch"].get<int64_t>();
      for (auto& id : j["samples"]) {
        s.by_epoch[epoch][id.get<int64_t>()] += 1;
        if (epoch == 0) s.committed[id.get<int64_t>()] += 1;
      }
    } else if (event == "deliver") {
      s.deliveries += 1;
      if (j["send"].get<int>() > 1) s.redeliveries += 1;
    }
  }
  return s;
}

}  // namespace e3::testing

#endif  // E3_TESTS_E2E_LEDGER_SCAN_H_
