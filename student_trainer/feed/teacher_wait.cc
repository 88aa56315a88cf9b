#include "student_trainer/feed/teacher_wait.h"

#include <algorithm>
#include <cstdio>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace e3 {

absl::StatusOr<absl::Duration> TeacherWait::Failed(const std::string& why, const std::string& resume_at) {
  const absl::Time now = absl::Now();
  const std::string flag = absl::StrCat("--teacher_wait_s=", absl::ToDoubleSeconds(options_.limit));
  if (!since_.has_value()) {
    since_ = now;
    last_line_ = now;
    std::printf("student[%d]: teacher %s unreachable (%s); waiting up to %.0f s (%s) for it to come back, then "
                "resubscribing after the last batch trained (now %s)\n",
                options_.rank, options_.address.c_str(), why.c_str(), absl::ToDoubleSeconds(options_.limit),
                flag.c_str(), resume_at.c_str());
    std::fflush(stdout);
  } else if (now - last_line_ >= options_.progress_every) {
    last_line_ = now;
    std::printf("student[%d]: still waiting for teacher %s: unreachable for %.0f s of %.0f s (last error: %s)\n",
                options_.rank, options_.address.c_str(), absl::ToDoubleSeconds(now - *since_),
                absl::ToDoubleSeconds(options_.limit), why.c_str());
    std::fflush(stdout);
  }
  if (now - *since_ >= options_.limit) {
    return absl::UnavailableError(absl::StrCat("teacher at ", options_.address, " lost: unreachable for ",
                                               absl::ToDoubleSeconds(now - *since_), " s (", flag,
                                               "); last error: ", why));
  }
  const absl::Duration wait = backoff_;
  backoff_ = std::min(backoff_ * 2, options_.max_backoff);
  return wait;
}

void TeacherWait::Accepted(const std::string& resumed_at) {
  if (since_.has_value()) {
    std::printf("student[%d]: teacher %s is back after %.1f s; resubscribed at %s\n", options_.rank,
                options_.address.c_str(), absl::ToDoubleSeconds(absl::Now() - *since_), resumed_at.c_str());
    std::fflush(stdout);
  }
  since_.reset();
  backoff_ = options_.initial_backoff;
}

}  // namespace e3
