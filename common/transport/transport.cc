#include "common/transport/transport.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace e3 {

const char* TransportName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kInline: return "inline";
    case TransportKind::kShm: return "shm";
    case TransportKind::kCudaIpc: return "cuda_ipc";
    case TransportKind::kNccl: return "nccl";
  }
  return "?";
}

absl::StatusOr<TransportKind> ParseTransport(const std::string& name) {
  for (TransportKind k : {TransportKind::kInline, TransportKind::kShm, TransportKind::kCudaIpc, TransportKind::kNccl}) {
    if (name == TransportName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport \"", name, "\" (expected inline, shm, cuda_ipc or nccl)"));
}

std::vector<TransportKind> DefaultTransports(bool on_gpu) {
  if (on_gpu) return {TransportKind::kNccl, TransportKind::kCudaIpc, TransportKind::kShm, TransportKind::kInline};
  return {TransportKind::kShm, TransportKind::kInline};
}

absl::StatusOr<std::vector<TransportKind>> ParseTransportList(const std::string& list) {
  std::vector<TransportKind> out;
  for (const auto& piece : std::vector<std::string>(absl::StrSplit(list, ',', absl::SkipWhitespace()))) {
    auto kind = ParseTransport(std::string(absl::StripAsciiWhitespace(piece)));
    if (!kind.ok()) return kind.status();
    out.push_back(*kind);
  }
  if (out.empty()) return absl::InvalidArgumentError("empty transport list");
  return out;
}

namespace {

std::string Names(const std::vector<TransportKind>& kinds) {
  std::vector<std::string> names;
  for (auto k : kinds) names.push_back(TransportName(k));
  return absl::StrJoin(names, ",");
}

// Why `kind` cannot run in this placement; empty when it can.
std::string Excluded(TransportKind kind, const Placement& p) {
  switch (kind) {
    case TransportKind::kInline: return "";
    case TransportKind::kShm: return p.same_host ? "" : "shm needs both on one host";
    case TransportKind::kCudaIpc:
      if (!p.same_host) return "cuda_ipc needs both on one host";
      if (!p.teacher_on_gpu || !p.student_on_gpu) return "cuda_ipc needs both on GPUs";
      return "";
    case TransportKind::kNccl:
      if (!p.teacher_on_gpu || !p.student_on_gpu) return "nccl needs both on GPUs";
      if (!p.nccl_unique_id) return "nccl needs the student's NCCL unique id";
      if (p.same_gpu) return "nccl cannot join two ranks on one GPU (teacher and student share it)";
      return "";
  }
  return "unknown";
}

}  // namespace

absl::StatusOr<TransportKind> NegotiateTransport(const std::vector<TransportKind>& offered,
                                                 const std::vector<TransportKind>& accepted,
                                                 const Placement& placement) {
  std::vector<std::string> why;
  for (int k = static_cast<int>(TransportKind::kNccl); k >= 0; --k) {
    auto kind = static_cast<TransportKind>(k);
    bool in_offer = std::find(offered.begin(), offered.end(), kind) != offered.end();
    bool in_accept = std::find(accepted.begin(), accepted.end(), kind) != accepted.end();
    if (!in_offer || !in_accept) continue;
    std::string reason = Excluded(kind, placement);
    if (reason.empty()) return kind;
    why.push_back(reason);
  }
  return absl::FailedPreconditionError(absl::StrCat("no common transport: teacher offers [", Names(offered),
                                                    "], student accepts [", Names(accepted), "]",
                                                    why.empty() ? "" : "; ", absl::StrJoin(why, "; ")));
}

}  // namespace e3
