#include "teacher_server/parallel/shard_plan.h"

#include "absl/strings/str_cat.h"

namespace e3 {
namespace {

ShardRange Even(int64_t total, int parts, int index) {
  const int64_t per = total / parts;
  return {per * index, per};
}

absl::Status NotDivisible(const ModelConfig& c, const char* field, int64_t value, const std::string& by) {
  return absl::InvalidArgumentError(
      absl::StrCat(c.source, ": field \"", field, "\" = ", value, " does not divide over ", by));
}

}  // namespace

std::string ShardPlan::Describe() const {
  return absl::StrCat(layout.Describe(), ": q heads [", q_heads.begin, ", ",
                      q_heads.end(), "), kv heads [", kv_heads.begin, ", ", kv_heads.end(), "), vocab [",
                      vocab.begin, ", ", vocab.end(), ")",
                      experts.size > 0 ? absl::StrCat(", experts [", experts.begin, ", ", experts.end(),
                                                      ") x intermediate [", expert_intermediate.begin, ", ",
                                                      expert_intermediate.end(), ")")
                                       : "");
}

absl::StatusOr<ShardPlan> ShardPlan::Make(const ModelConfig& c, const ParallelLayout& layout) {
  const int rank = layout.tp_rank();
  const int tp_size = layout.tp_size();
  const int ep_size = layout.ep_size();
  if (ep_size > 1 && c.moe.num_experts == 0) {
    return absl::InvalidArgumentError(absl::StrCat(c.source, ": ep size ", ep_size, " needs a MoE model; \"",
                                                   c.architecture_name, "\" has no experts"));
  }
  ShardPlan p;
  p.layout = layout;
  const std::string ranks = absl::StrCat(tp_size, " tensor-parallel ranks");
  if (c.num_attention_heads % tp_size != 0) {
    return NotDivisible(c, "num_attention_heads", c.num_attention_heads, ranks);
  }
  p.q_heads = Even(c.num_attention_heads, tp_size, rank);
  if (c.num_key_value_heads >= tp_size) {
    if (c.num_key_value_heads % tp_size != 0) {
      return NotDivisible(c, "num_key_value_heads", c.num_key_value_heads, ranks);
    }
    p.kv_heads = Even(c.num_key_value_heads, tp_size, rank);
  } else {
    if (tp_size % c.num_key_value_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          c.source, ": field \"num_key_value_heads\" = ", c.num_key_value_heads, " must divide the ", ranks,
          " to be replicated over them"));
    }
    // tp / kv consecutive ranks share one KV head: the one their query
    // heads (group size heads / kv) read.
    p.kv_heads = {rank / (tp_size / c.num_key_value_heads), 1};
  }
  bool has_dense_layer = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) has_dense_layer = has_dense_layer || !c.IsMoeLayer(i);
  if (has_dense_layer && c.intermediate_size % tp_size != 0) {
    return NotDivisible(c, "intermediate_size", c.intermediate_size, ranks);
  }
  if (has_dense_layer) p.intermediate = Even(c.intermediate_size, tp_size, rank);
  const int64_t rows = (c.vocab_size + tp_size - 1) / tp_size;
  p.vocab = {rows * rank, std::min(c.vocab_size, rows * (rank + 1)) - rows * rank};
  if (p.vocab.size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(c.source, ": field \"vocab_size\" = ", c.vocab_size,
                                                   " leaves rank ", rank, " no rows over ", ranks));
  }
  if (c.moe.num_experts > 0) {
    if (c.moe.num_experts % ep_size != 0) {
      return NotDivisible(c, "num_experts", c.moe.num_experts, absl::StrCat(ep_size, " expert-parallel groups"));
    }
    const int moe_tp = layout.moe_tp_size();
    if (c.moe.intermediate_size % moe_tp != 0) {
      return NotDivisible(c, c.architecture == Architecture::kMixtral || c.architecture == Architecture::kGptOss
                                 ? "intermediate_size"
                                 : "moe_intermediate_size",
                          c.moe.intermediate_size, absl::StrCat(moe_tp, " ranks per expert group"));
    }
    p.experts = Even(c.moe.num_experts, ep_size, layout.ep_rank());
    p.expert_intermediate = Even(c.moe.intermediate_size, moe_tp, layout.moe_tp_rank());
  }
  if (c.IsDeepseek() && c.deepseek.n_shared_experts > 0) {
    // Split, not replicated: each rank computes 1/tp of it and the sum
    // rides on the all-reduce the routed experts need anyway.
    const int64_t shared = c.moe.intermediate_size * c.deepseek.n_shared_experts;
    if (shared % tp_size != 0) {
      return NotDivisible(c, "moe_intermediate_size * n_shared_experts", shared, ranks);
    }
    p.shared_expert_intermediate = Even(shared, tp_size, rank);
  }
  return p;
}

}  // namespace e3
