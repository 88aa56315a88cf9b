#include "common/base/parallel_layout.h"

#include "absl/strings/str_cat.h"

namespace e3 {

absl::StatusOr<ParallelLayout> ParallelLayout::Make(int rank, int world_size, int tp_size, int ep_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside a world of ", world_size));
  }
  if (tp_size < 1 || world_size % tp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp size ", tp_size, " must divide the world size ", world_size));
  }
  if (ep_size < 1 || tp_size % ep_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ep size ", ep_size, " must divide tp size ", tp_size,
                                                   " (experts split over ep groups, each expert over the tp / ep "
                                                   "ranks of its group)"));
  }
  return ParallelLayout(rank, world_size, tp_size, ep_size);
}

std::string ParallelLayout::Describe() const {
  return absl::StrCat("rank ", rank_, "/", world_size_, " (tp ", tp_size_, ", ep ", ep_size_, ")");
}

}  // namespace e3
