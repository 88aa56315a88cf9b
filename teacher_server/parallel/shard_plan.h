// Which slice of each weight a tensor-parallel rank holds, Megatron/SGLang
// style. One plan per rank, computed from the config alone so that every
// rank agrees without talking:
//   - attention: query heads split evenly; KV heads split evenly when there
//     are at least as many as ranks, else each rank holds the one KV head
//     its query heads read (GQA replication);
//   - dense MLP: the intermediate dimension split (gate/up rows, down cols);
//   - embedding and lm_head: the vocabulary split into ceil(V / tp) rows;
//   - MoE: experts split over ep_size groups; inside a group each expert's
//     intermediate dimension is split over the tp / ep_size ranks (SGLang's
//     moe_tp_size). ep_size = 1 is pure TP of every expert; ep_size = tp
//     gives each rank whole experts;
//   - DeepSeek's shared experts: one MLP, its intermediate dimension split
//     over all tp ranks like a dense MLP (whatever ep_size); MLA's heads
//     split like query heads (q_heads).
// Every partial result (o_proj, down_proj, experts, embedding) is summed by
// one all-reduce over all tp ranks.
#ifndef E3_TEACHER_SERVER_PARALLEL_SHARD_PLAN_H_
#define E3_TEACHER_SERVER_PARALLEL_SHARD_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/parallel_layout.h"
#include "common/model/model_config.h"

namespace e3 {

struct ShardRange {
  int64_t begin = 0;
  int64_t size = 0;
  int64_t end() const { return begin + size; }
};

struct ShardPlan {
  ParallelLayout layout;  // the teacher's ranks: one replica of tp ranks
  ShardRange q_heads;
  ShardRange kv_heads;
  ShardRange intermediate;         // dense MLP
  ShardRange vocab;                // embedding and lm_head rows
  ShardRange experts;              // MoE: the experts this rank computes
  ShardRange expert_intermediate;  // MoE: its slice of each of them
  ShardRange shared_expert_intermediate;  // DeepSeek: its slice of the shared experts

  bool sharded() const { return layout.tensor_parallel(); }
  // Biases after a row-parallel product are added by one rank only, so the
  // all-reduce sums them once.
  bool adds_reduced_bias() const { return layout.is_first(); }
  std::string Describe() const;

  // Errors name the config field that does not divide and the sizes.
  static absl::StatusOr<ShardPlan> Make(const ModelConfig& config, const ParallelLayout& layout);
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_PARALLEL_SHARD_PLAN_H_
