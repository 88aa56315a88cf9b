// Writes known scalars into a new event file in --logdir with the
// production EventFileWriter, and the same values as --expected JSON (tag ->
// [[step, value], ...]) for tools/tensorboard_readback.py to compare with
// what TensorBoard's own readers see (ctest tensorboard_readback_test).
//
// The values cover what the student logs: a loss falling from ~16, ratios
// in [0, 1], a learning rate decaying to 2e-9, throughputs near 1e6, negatives,
// decimals that float32 cannot hold exactly, and step 0.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tensorboard/event_writer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, logdir, "", "directory for the event file (created)");
ABSL_FLAG(std::string, expected, "",
          "JSON file of the values written: tag -> [[step, value], ...]");

namespace e3 {
namespace {

constexpr int kSteps = 60;
// A fixed wall time for the one tag written with an explicit timestamp.
constexpr double kFixedWallTime = 1.7e9;

// The scalars of one training step, by tag.
std::map<std::string, double> StepScalars(int step) {
  return {
      {"train/loss", 16.0 * std::exp(-0.02 * step) + 0.1},
      {"train/acc_0", std::min(1.0, 0.013 * step)},
      {"train/lr", 1e-3 * std::pow(0.8, step)},
      {"perf/tokens_per_s", 812345.678 + 1000.0 * step},
      {"debug/signed", (step % 2 == 0 ? -1.0 : 1.0) * 0.1 * step},
  };
}

// Writes every step's scalars, recording each in `expected`.
absl::Status WriteSamples(EventFileWriter& writer, nlohmann::json& expected) {
  for (int step = 0; step < kSteps; ++step) {
    for (const auto& [tag, value] : StepScalars(step)) {
      if (tag == "debug/signed") {
        E3_RETURN_IF_ERROR(writer.AddScalar(tag, step, value, kFixedWallTime + step));
      } else {
        E3_RETURN_IF_ERROR(writer.AddScalar(tag, step, value));
      }
      expected[tag].push_back({step, value});
    }
    if (step % 16 == 0) E3_RETURN_IF_ERROR(writer.Flush());
  }
  return writer.Flush();
}

absl::Status Run(const std::string& logdir, const std::string& expected_path) {
  E3_ASSIGN_OR_RETURN(std::unique_ptr<EventFileWriter> writer, EventFileWriter::Open(logdir));
  nlohmann::json expected = nlohmann::json::object();
  E3_RETURN_IF_ERROR(WriteSamples(*writer, expected));
  std::ofstream out(expected_path);
  out << expected.dump(1) << "\n";
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat(expected_path, ": cannot write"));
  std::printf("wrote %s and %s\n", writer->path().c_str(), expected_path.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace e3

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string logdir = absl::GetFlag(FLAGS_logdir);
  const std::string expected = absl::GetFlag(FLAGS_expected);
  if (logdir.empty() || expected.empty()) {
    std::fprintf(stderr, "usage: %s --logdir=DIR --expected=FILE.json\n", argv[0]);
    return 2;
  }
  const absl::Status status = e3::Run(logdir, expected);
  if (!status.ok()) {
    std::fprintf(stderr, "tensorboard_sample_writer: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
