// Status plumbing used across the project (absl::Status inside, converted
// to grpc::Status only at service edges).
#ifndef E3_COMMON_BASE_STATUS_MACROS_H_
#define E3_COMMON_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define E3_STATUS_CONCAT_INNER_(a, b) a##b
#define E3_STATUS_CONCAT_(a, b) E3_STATUS_CONCAT_INNER_(a, b)

// Returns early from the enclosing function when `expr` is not OK.
#define E3_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status e3_status_ = (expr);          \
    if (!e3_status_.ok()) return e3_status_;     \
  } while (0)

// `lhs = value of expr`, or return its error.
#define E3_ASSIGN_OR_RETURN(lhs, expr) \
  E3_ASSIGN_OR_RETURN_IMPL_(E3_STATUS_CONCAT_(e3_statusor_, __COUNTER__), lhs, expr)
#define E3_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // E3_COMMON_BASE_STATUS_MACROS_H_
