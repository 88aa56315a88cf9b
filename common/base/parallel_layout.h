// One process's place in its run's parallelism, as TensorRT-LLM's
// WorldConfig describes it: the ranks of one job laid out as data-parallel
// replicas of tp_size consecutive tensor-parallel ranks, and inside each
// replica ep_size expert groups of tp_size / ep_size consecutive ranks
// (SGLang's moe_tp_size). Every question about ranks is a query here, so
// the arithmetic lives in one place:
//   - a teacher is one replica (world = tp);
//   - a student group is data-parallel only (tp = ep = 1).
#ifndef E3_COMMON_BASE_PARALLEL_LAYOUT_H_
#define E3_COMMON_BASE_PARALLEL_LAYOUT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace e3 {

class ParallelLayout {
 public:
  // One process alone.
  ParallelLayout() = default;
  // Errors name the size that does not divide, or the rank that lies
  // outside the world.
  static absl::StatusOr<ParallelLayout> Make(int rank, int world_size, int tp_size = 1, int ep_size = 1);
  // A data-parallel group of `world_size` ranks.
  static absl::StatusOr<ParallelLayout> DataParallel(int rank, int world_size) {
    return Make(rank, world_size);
  }

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int tp_size() const { return tp_size_; }
  int ep_size() const { return ep_size_; }
  int dp_size() const { return world_size_ / tp_size_; }
  int tp_rank() const { return rank_ % tp_size_; }
  int dp_rank() const { return rank_ / tp_size_; }
  // MoE: the ranks that split each expert of one group, this rank's group
  // and its place in it.
  int moe_tp_size() const { return tp_size_ / ep_size_; }
  int ep_rank() const { return tp_rank() / moe_tp_size(); }
  int moe_tp_rank() const { return tp_rank() % moe_tp_size(); }

  bool tensor_parallel() const { return tp_size_ > 1; }
  bool data_parallel() const { return dp_size() > 1; }
  // The rank that writes what the group writes once (checkpoints, exports,
  // the event files) and speaks for it in logs.
  bool is_first() const { return rank_ == 0; }
  // Whether item `i` of a list dealt round-robin over the data-parallel
  // replicas falls to this rank's replica.
  bool OwnsRoundRobin(int64_t i) const { return i % dp_size() == dp_rank(); }

  // "rank 3/4 (tp 2, ep 1)" for logs.
  std::string Describe() const;

 private:
  ParallelLayout(int rank, int world_size, int tp_size, int ep_size)
      : rank_(rank), world_size_(world_size), tp_size_(tp_size), ep_size_(ep_size) {}

  int rank_ = 0;
  int world_size_ = 1;
  int tp_size_ = 1;
  int ep_size_ = 1;
};

}  // namespace e3

#endif  // E3_COMMON_BASE_PARALLEL_LAYOUT_H_
