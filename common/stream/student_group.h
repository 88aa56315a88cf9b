// Student groups: the students that train one draft together (one
// data-parallel job) share a data stream, and a teacher can serve several
// groups at once, each its own stream from its own cursor, with its own
// commits and ledger. The unnamed group is the teacher's default one;
// others are named by teachers.student_groups on the teacher and
// students.group on each of their students
// (docs/decisions/0065-feature-subscriptions.md).
#ifndef E3_COMMON_STREAM_STUDENT_GROUP_H_
#define E3_COMMON_STREAM_STUDENT_GROUP_H_

#include <string>

#include "absl/status/status.h"

namespace e3 {

// The longest group name: it goes into file names (the group's ledger),
// shm segment names and log lines.
inline constexpr size_t kMaxStudentGroupName = 64;

// OK for "" (the default group) and for 1..64 characters of [A-Za-z0-9_-];
// InvalidArgument naming `where` (a flag or a message field) otherwise.
absl::Status CheckStudentGroupName(const std::string& name, const std::string& where);

// How logs and errors name a group: "the default student group" or
// "student group \"dflash\"".
std::string DescribeStudentGroup(const std::string& name);

}  // namespace e3

#endif  // E3_COMMON_STREAM_STUDENT_GROUP_H_
