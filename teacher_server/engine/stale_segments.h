// Shared-memory segments a teacher leaves behind when it dies without
// unlinking them (SIGKILL, the OOM killer) would stay in /dev/shm until
// the machine reboots. Their names carry the pid of the teacher that made
// them (Engine::shm_segment_prefix), so a later teacher can tell them
// from the live ones of teachers beside it.
#ifndef E3_TEACHER_SERVER_ENGINE_STALE_SEGMENTS_H_
#define E3_TEACHER_SERVER_ENGINE_STALE_SEGMENTS_H_

#include <string>

namespace e3 {

// Unlinks the segments named `<prefix>-<pid>-...` whose process no longer
// exists; returns how many. `shm_dir` is where the system lists them.
int RemoveStaleSegments(const std::string& prefix, const std::string& shm_dir = "/dev/shm");

}  // namespace e3

#endif  // E3_TEACHER_SERVER_ENGINE_STALE_SEGMENTS_H_
