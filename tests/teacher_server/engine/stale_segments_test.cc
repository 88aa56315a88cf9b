#include "teacher_server/engine/stale_segments.h"

#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/transport/shm_segment.h"
#include "gtest/gtest.h"

namespace e3 {
namespace {

bool SegmentExists(const std::string& name) { return ShmSegment::Open(name, 1).ok(); }

// A pid that no process holds any more: a child that has exited and been
// reaped.
pid_t DeadPid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

TEST(StaleSegmentsTest, RemovesTheSegmentsOfDeadTeachersOnly) {
  const std::string prefix = absl::StrCat("/e3stale", ::getpid());
  const std::string dead = absl::StrCat(prefix, "-", DeadPid(), "-0-7");
  const std::string live = absl::StrCat(prefix, "-", ::getpid(), "-0-7");
  const std::string other = absl::StrCat(prefix, "x-", DeadPid(), "-0-7");  // another prefix
  for (const std::string& name : {dead, live, other}) {
    auto segment = ShmSegment::Create(name, 64);
    ASSERT_TRUE(segment.ok()) << name << ": " << segment.status();
    (*segment)->set_unlink_on_destroy(false);  // as a teacher killed before its cleanup
  }
  EXPECT_EQ(RemoveStaleSegments(prefix), 1);
  EXPECT_FALSE(SegmentExists(dead));
  EXPECT_TRUE(SegmentExists(live));
  EXPECT_TRUE(SegmentExists(other));
  ShmSegment::Unlink(live);
  ShmSegment::Unlink(other);
}

TEST(StaleSegmentsTest, MissingDirectoryRemovesNothing) {
  EXPECT_EQ(RemoveStaleSegments("/e3", "/nonexistent-shm-dir"), 0);
}

}  // namespace
}  // namespace e3
