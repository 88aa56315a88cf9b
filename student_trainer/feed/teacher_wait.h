// How a student waits for a teacher that went away mid-run (killed and
// restarted, drained, unreachable): bounded by --teacher_wait_s, with
// backoff between attempts capped so that a teacher that is back is found
// within seconds, and visibly: a line when it goes, one every
// progress_every while it stays away (the address and the time waited),
// and one when it is back. The caller makes the attempts.
#ifndef E3_STUDENT_TRAINER_FEED_TEACHER_WAIT_H_
#define E3_STUDENT_TRAINER_FEED_TEACHER_WAIT_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace e3 {

struct TeacherWaitOptions {
  std::string address;  // the teacher, for the log lines
  int rank = 0;         // this student's, for the log lines
  absl::Duration limit = absl::Seconds(1800);
  absl::Duration initial_backoff = absl::Milliseconds(500);
  absl::Duration max_backoff = absl::Seconds(2);
  absl::Duration progress_every = absl::Seconds(10);
};

class TeacherWait {
 public:
  explicit TeacherWait(TeacherWaitOptions options)
      : options_(std::move(options)), backoff_(options_.initial_backoff) {}

  bool away() const { return since_.has_value(); }
  // An attempt failed (`why`); `resume_at` says where the student will
  // resubscribe. Logs as due. Unavailable naming --teacher_wait_s once the
  // teacher has been away longer than the limit; else how long to wait
  // before the next attempt.
  absl::StatusOr<absl::Duration> Failed(const std::string& why, const std::string& resume_at);
  // A subscription was accepted: logs the return if the teacher was away.
  void Accepted(const std::string& resumed_at);

 private:
  TeacherWaitOptions options_;
  std::optional<absl::Time> since_;  // the teacher went away
  absl::Time last_line_;
  absl::Duration backoff_;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_FEED_TEACHER_WAIT_H_
