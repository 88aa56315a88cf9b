// EventFileWriter's files read back by ReadEventFile: the name TensorBoard
// discovers, the version record, every scalar exactly as float32, records
// visible after Flush, and the errors a run gets instead of a crash (a
// directory that cannot be made, a write the file size limit stops).
#include "common/tensorboard/event_writer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <limits>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "common/base/file_util.h"
#include "common/tensorboard/event_reader.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::unique_ptr<EventFileWriter> OpenWriterIn(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<EventFileWriter>> writer = EventFileWriter::Open(dir);
  EXPECT_TRUE(writer.ok()) << writer.status();
  return writer.ok() ? std::move(*writer) : nullptr;
}

// The one event file in `dir`, "" (with a test failure) otherwise.
std::string OnlyEventFile(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> files = ListEventFiles(dir);
  EXPECT_TRUE(files.ok()) << files.status();
  if (!files.ok() || files->size() != 1) {
    ADD_FAILURE() << "expected one event file in " << dir;
    return "";
  }
  return files->front();
}

TEST(EventFileWriterTest, NamesTheFileAsTensorBoardFindsIt) {
  const std::string dir = JoinPath(testing::ScratchDir("event_writer_name"), "run.out/tb");
  std::unique_ptr<EventFileWriter> writer = OpenWriterIn(dir);
  ASSERT_NE(writer, nullptr);
  EXPECT_EQ(Dirname(writer->path()), dir);
  const std::string name = writer->path().substr(dir.size() + 1);
  EXPECT_NE(name.find("tfevents"), std::string::npos) << name;
  const std::regex pattern(R"(events\.out\.tfevents\.\d{10}\.[^/]+\.)" +
                           std::to_string(::getpid()) + R"(\.e3)");
  EXPECT_TRUE(std::regex_match(name, pattern)) << name;
  EXPECT_EQ(OnlyEventFile(dir), writer->path());
}

TEST(EventFileWriterTest, StartsWithTheFileVersion) {
  const std::string dir = testing::ScratchDir("event_writer_version");
  const double before = WallNow();
  std::unique_ptr<EventFileWriter> writer = OpenWriterIn(dir);
  ASSERT_NE(writer, nullptr);
  absl::StatusOr<EventFileContents> contents = ReadEventFile(writer->path());
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(contents->file_version, "brain.Event:2");
  EXPECT_EQ(contents->writer, "e3train");
  EXPECT_TRUE(contents->scalars.empty());
  const std::string name = writer->path().substr(dir.size() + 1);
  const long long stamped = std::stoll(name.substr(std::string("events.out.tfevents.").size(), 10));
  EXPECT_GE(stamped, static_cast<long long>(before));
  EXPECT_LE(stamped, static_cast<long long>(WallNow()));
}

TEST(EventFileWriterTest, ReadsBackEveryScalarOfSeveralTags) {
  const std::string dir = testing::ScratchDir("event_writer_scalars");
  std::unique_ptr<EventFileWriter> writer = OpenWriterIn(dir);
  ASSERT_NE(writer, nullptr);
  const std::vector<std::string> tags = {"train/loss", "train/acc_0", "lr"};
  std::vector<ScalarEvent> written;
  for (int64_t step = 0; step < 40; ++step) {
    for (size_t t = 0; t < tags.size(); ++t) {
      const double value = 16.0 / (step + 1) - 0.37 * static_cast<double>(t);
      const double wall_time = 1.7e9 + 0.25 * static_cast<double>(step);
      ASSERT_TRUE(writer->AddScalar(tags[t], step, value, wall_time).ok());
      written.push_back({wall_time, step, tags[t], static_cast<float>(value)});
    }
  }
  ASSERT_TRUE(writer->AddScalar("big_step", int64_t{1} << 40, 0.1, 1.8e9).ok());
  written.push_back({1.8e9, int64_t{1} << 40, "big_step", 0.1f});
  writer.reset();
  absl::StatusOr<EventFileContents> contents = ReadEventFile(OnlyEventFile(dir));
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(contents->file_version, "brain.Event:2");
  ASSERT_EQ(contents->scalars.size(), written.size());
  for (size_t i = 0; i < written.size(); ++i) {
    const ScalarEvent& got = contents->scalars[i];
    EXPECT_EQ(got.tag, written[i].tag) << i;
    EXPECT_EQ(got.step, written[i].step) << i;
    EXPECT_EQ(got.value, written[i].value) << i;
    EXPECT_EQ(got.wall_time, written[i].wall_time) << i;
  }
}

TEST(EventFileWriterTest, StampsScalarsWithTheCurrentTime) {
  const std::string dir = testing::ScratchDir("event_writer_now");
  std::unique_ptr<EventFileWriter> writer = OpenWriterIn(dir);
  ASSERT_NE(writer, nullptr);
  const double before = WallNow();
  ASSERT_TRUE(writer->AddScalar("loss", 7, 2.5).ok());
  const double after = WallNow();
  ASSERT_TRUE(writer->Flush().ok());
  absl::StatusOr<std::vector<ScalarEvent>> scalars = ReadScalarEvents(writer->path());
  ASSERT_TRUE(scalars.ok()) << scalars.status();
  ASSERT_EQ(scalars->size(), 1u) << "Flush makes the record visible while the writer is open";
  EXPECT_GE((*scalars)[0].wall_time, before);
  EXPECT_LE((*scalars)[0].wall_time, after);
  EXPECT_EQ((*scalars)[0].value, 2.5f);
}

TEST(EventFileWriterTest, ValuesBeyondFloat32BecomeInfinite) {
  const std::string dir = testing::ScratchDir("event_writer_range");
  std::unique_ptr<EventFileWriter> writer = OpenWriterIn(dir);
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->AddScalar("x", 1, 1e300).ok());
  ASSERT_TRUE(writer->AddScalar("x", 2, -1e300).ok());
  ASSERT_TRUE(writer->AddScalar("x", 3, std::nan("")).ok());
  ASSERT_TRUE(writer->Flush().ok());
  absl::StatusOr<std::vector<ScalarEvent>> scalars = ReadScalarEvents(writer->path());
  ASSERT_TRUE(scalars.ok()) << scalars.status();
  ASSERT_EQ(scalars->size(), 3u);
  EXPECT_EQ((*scalars)[0].value, std::numeric_limits<float>::infinity());
  EXPECT_EQ((*scalars)[1].value, -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan((*scalars)[2].value));
}

// A path below a regular file cannot become a directory, even for root.
TEST(EventFileWriterTest, ADirectoryThatCannotBeMadeIsAnError) {
  const std::string file = testing::ScratchPath("event_writer_blocker");
  ASSERT_TRUE(WriteFileAtomically(file, "not a directory").ok());
  const std::string dir = JoinPath(file, "tb");
  absl::StatusOr<std::unique_ptr<EventFileWriter>> writer = EventFileWriter::Open(dir);
  ASSERT_FALSE(writer.ok());
  EXPECT_NE(writer.status().message().find(dir), absl::string_view::npos) << writer.status();
  EXPECT_NE(writer.status().message().find("Not a directory"), absl::string_view::npos)
      << writer.status();
}

// In a child process whose file size limit (soft, SIGXFSZ ignored, so
// write() fails with EFBIG) stands in for a full disk: Flush names the
// file and the error, and once the limit is lifted a Flush completes the
// same byte stream, so every scalar reads back.
int WriteThroughAFullDisk(const std::string& dir) {
  std::signal(SIGXFSZ, SIG_IGN);
  std::unique_ptr<EventFileWriter> writer = OpenWriterIn(dir);
  rlimit limit;
  if (writer == nullptr || ::getrlimit(RLIMIT_FSIZE, &limit) != 0) return 10;
  const rlimit saved = limit;
  limit.rlim_cur = 4096;
  if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 11;
  for (int step = 0; step < 200; ++step) {
    if (!writer->AddScalar("loss", step, step * 0.5).ok()) return 12;
  }
  const absl::Status failed = writer->Flush();
  const std::string message(failed.message());
  if (failed.ok()) return 13;
  if (message.find(writer->path()) == std::string::npos) return 14;
  if (message.find("File too large") == std::string::npos) return 15;
  if (::setrlimit(RLIMIT_FSIZE, &saved) != 0) return 16;
  if (!writer->Flush().ok()) return 17;
  absl::StatusOr<std::vector<ScalarEvent>> scalars = ReadScalarEvents(writer->path());
  if (!scalars.ok() || scalars->size() != 200) return 18;
  return (*scalars)[199].step == 199 && (*scalars)[199].value == 99.5f ? 0 : 19;
}

TEST(EventFileWriterTest, AFailedWriteIsReportedAndResumed) {
  const std::string dir = testing::ScratchDir("event_writer_full");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(WriteThroughAFullDisk(dir));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see WriteThroughAFullDisk for the step that failed";
}

}  // namespace
}  // namespace e3
