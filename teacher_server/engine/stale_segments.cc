#include "teacher_server/engine/stale_segments.h"

#include <signal.h>

#include <cerrno>
#include <cstdlib>

#include "common/base/file_util.h"
#include "common/transport/shm_segment.h"

namespace e3 {

int RemoveStaleSegments(const std::string& prefix, const std::string& shm_dir) {
  auto names = ListDir(shm_dir);
  if (!names.ok()) return 0;
  // Segment names start with '/'; their files in shm_dir do not.
  const std::string head = prefix.substr(1) + "-";
  int removed = 0;
  for (const std::string& name : *names) {
    if (name.rfind(head, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + head.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ShmSegment::Unlink("/" + name);
      ++removed;
    }
  }
  return removed;
}

}  // namespace e3
