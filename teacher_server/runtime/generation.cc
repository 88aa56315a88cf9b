#include "teacher_server/runtime/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "teacher_server/layers/kv_cache.h"

namespace e3 {
namespace {

// Picks each sequence's next token from its logits row: a draw from
// softmax(logits / temperature) on one seeded generator.
class Sampler {
 public:
  Sampler(double temperature, uint64_t seed)
      : temperature_(temperature), generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  std::vector<int32_t> Draw(const at::Tensor& logits) {  // [n, V]
    const at::Tensor probs = at::softmax(logits.to(at::kCPU, at::kFloat) / temperature_, -1);
    const at::Tensor picked = at::multinomial(probs, 1, /*replacement=*/false, generator_).view({-1});
    std::vector<int32_t> out;
    for (int64_t i = 0; i < picked.numel(); ++i) out.push_back(static_cast<int32_t>(picked[i].item<int64_t>()));
    return out;
  }

 private:
  double temperature_;
  at::Generator generator_;
};

// One forward that appends `tokens[s]` to cache sequence `sequences[s]`
// and returns the token after each sample's last one: the argmax, or a
// draw by `sampler` (which needs logits: callers keep its forwards short).
absl::StatusOr<std::vector<int32_t>> AppendAndPredict(CausalLM& model, KvCache& cache,
                                                      const std::vector<int64_t>& sequences,
                                                      const std::vector<std::vector<int32_t>>& tokens,
                                                      Sampler* sampler) {
  std::vector<int64_t> ids, positions, cu{0};
  for (size_t s = 0; s < sequences.size(); ++s) {
    const int64_t past = cache.lengths()[sequences[s]];
    for (size_t i = 0; i < tokens[s].size(); ++i) {
      ids.push_back(tokens[s][i]);
      positions.push_back(past + static_cast<int64_t>(i));
    }
    cu.push_back(static_cast<int64_t>(ids.size()));
  }
  const at::Device device = model.options().device;
  E3_ASSIGN_OR_RETURN(PackedBatch batch,
                      MakePackedBatch(torch::tensor(ids, torch::kLong), cu, model.config().vocab_size, device));
  batch.position_ids = torch::tensor(positions, torch::kLong).to(device);
  E3_RETURN_IF_ERROR(cache.BeginAppend(sequences, cu));
  ForwardOptions fwd;
  fwd.return_argmax = sampler == nullptr;
  fwd.return_logits = sampler != nullptr;
  fwd.kv_cache = &cache;
  auto out = model.Forward(batch, fwd);
  cache.CommitAppend();
  if (!out.ok()) return out.status();
  std::vector<int64_t> last;
  for (size_t s = 0; s < sequences.size(); ++s) last.push_back(cu[s + 1] - 1);
  if (sampler != nullptr) {
    return sampler->Draw(out->logits.index_select(0, torch::tensor(last, torch::kLong).to(out->logits.device())));
  }
  const at::Tensor argmax = out->target_argmax.to(at::kCPU, at::kInt);
  std::vector<int32_t> next;
  for (int64_t row : last) next.push_back(argmax[row].item<int32_t>());
  return next;
}

// Prefills the prompts of one group in forwards of about prefill_tokens,
// returning each one's first generated token. When sampling, every prompt
// but its last token is prefilled first, and the last tokens then go in
// one forward whose few rows of logits the sampler reads.
absl::StatusOr<std::vector<int32_t>> Prefill(CausalLM& model, KvCache& cache,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const GenerationOptions& options, Sampler* sampler) {
  std::vector<int32_t> first(prompts.size());
  size_t begin = 0;
  while (begin < prompts.size()) {
    std::vector<int64_t> sequences;
    std::vector<std::vector<int32_t>> tokens;
    int64_t budget = 0;
    for (size_t s = begin; s < prompts.size(); ++s) {
      const int64_t n = static_cast<int64_t>(prompts[s].size());
      if (!sequences.empty() && budget + n > options.prefill_tokens) break;
      sequences.push_back(static_cast<int64_t>(s));
      tokens.push_back(prompts[s]);
      budget += n;
    }
    begin += sequences.size();
    if (sampler == nullptr) {
      E3_ASSIGN_OR_RETURN(std::vector<int32_t> next, AppendAndPredict(model, cache, sequences, tokens, nullptr));
      for (size_t i = 0; i < sequences.size(); ++i) first[sequences[i]] = next[i];
      continue;
    }
    std::vector<int64_t> heads;
    std::vector<std::vector<int32_t>> head_tokens, last_tokens;
    for (size_t i = 0; i < sequences.size(); ++i) {
      last_tokens.push_back({tokens[i].back()});
      if (tokens[i].size() < 2) continue;
      heads.push_back(sequences[i]);
      head_tokens.emplace_back(tokens[i].begin(), tokens[i].end() - 1);
    }
    if (!heads.empty()) E3_RETURN_IF_ERROR(AppendAndPredict(model, cache, heads, head_tokens, nullptr).status());
    E3_ASSIGN_OR_RETURN(std::vector<int32_t> next, AppendAndPredict(model, cache, sequences, last_tokens, sampler));
    for (size_t i = 0; i < sequences.size(); ++i) first[sequences[i]] = next[i];
  }
  return first;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> GenerateGroup(CausalLM& model,
                                                                const std::vector<std::vector<int32_t>>& prompts,
                                                                const GenerationOptions& options, Sampler* sampler) {
  const ModelConfig& c = model.config();
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  const CausalLM::KvCacheShape shape = model.kv_cache_shape();
  KvCache cache(c.num_hidden_layers, static_cast<int64_t>(prompts.size()), longest + options.max_new_tokens,
                shape.kv_heads, shape.head_dim,
                torch::TensorOptions().dtype(model.options().dtype).device(model.options().device));
  std::vector<std::vector<int32_t>> out(prompts.size());
  E3_ASSIGN_OR_RETURN(std::vector<int32_t> next, Prefill(model, cache, prompts, options, sampler));
  const std::set<int32_t> stop(options.stop_ids.begin(), options.stop_ids.end());
  std::vector<int64_t> active;
  for (size_t s = 0; s < prompts.size(); ++s) active.push_back(static_cast<int64_t>(s));
  while (!active.empty()) {
    if (options.cancel != nullptr && options.cancel->load()) return absl::CancelledError("generation cancelled");
    std::vector<int64_t> still;
    std::vector<std::vector<int32_t>> feed;
    for (size_t i = 0; i < active.size(); ++i) {
      const int64_t s = active[i];
      out[s].push_back(next[i]);
      if (stop.count(next[i]) || static_cast<int64_t>(out[s].size()) >= options.max_new_tokens) continue;
      still.push_back(s);
      feed.push_back({next[i]});
    }
    active = std::move(still);
    if (active.empty()) break;
    E3_ASSIGN_OR_RETURN(next, AppendAndPredict(model, cache, active, feed, sampler));
  }
  return out;
}

// Prompt indices by length (stable: equal lengths keep their order), so
// that groups hold prompts of similar length.
std::vector<size_t> ByLength(const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<size_t> order(prompts.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return prompts[a].size() < prompts[b].size(); });
  return order;
}

// Bytes of KV cache one sequence position takes over all layers.
int64_t KvCacheRowBytes(const CausalLM& model) {
  const ModelConfig& c = model.config();
  return c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim *
         static_cast<int64_t>(c10::elementSize(model.options().dtype));
}

// The end of the group that starts at order[begin]: at most max_sequences
// prompts whose cache (each sized for the group's longest prompt plus
// max_new_tokens) fits kv_cache_bytes; at least one prompt.
size_t GroupEnd(const std::vector<std::vector<int32_t>>& prompts, const std::vector<size_t>& order,
                size_t begin, const GenerationOptions& options, int64_t row_bytes) {
  const size_t most = static_cast<size_t>(std::max<int64_t>(1, options.max_sequences));
  size_t end = begin + 1;
  while (end < order.size() && end - begin < most) {
    // Sorted by length: the candidate is the group's longest.
    const int64_t rows = static_cast<int64_t>(prompts[order[end]].size()) + options.max_new_tokens;
    const int64_t bytes = static_cast<int64_t>(end - begin + 1) * rows * row_bytes;
    if (options.kv_cache_bytes > 0 && bytes > options.kv_cache_bytes) break;
    ++end;
  }
  return end;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<int32_t>>> GenerateContinuations(CausalLM& model,
                                                                      const std::vector<std::vector<int32_t>>& prompts,
                                                                      const GenerationOptions& options) {
  for (size_t s = 0; s < prompts.size(); ++s) {
    if (prompts[s].empty()) return absl::InvalidArgumentError(absl::StrCat("prompt ", s, " is empty"));
  }
  std::vector<std::vector<int32_t>> out(prompts.size());
  if (options.max_new_tokens <= 0) return out;
  std::optional<Sampler> sampler;
  if (options.temperature > 0) sampler.emplace(options.temperature, options.seed);
  const std::vector<size_t> order = ByLength(prompts);
  const int64_t row_bytes = KvCacheRowBytes(model);
  int64_t tokens = 0;
  for (size_t begin = 0; begin < order.size();) {
    const size_t end = GroupEnd(prompts, order, begin, options, row_bytes);
    std::vector<std::vector<int32_t>> part;
    for (size_t i = begin; i < end; ++i) part.push_back(prompts[order[i]]);
    auto done = GenerateGroup(model, part, options, sampler ? &*sampler : nullptr);
    if (!done.ok()) {
      return absl::Status(done.status().code(),
                          absl::StrCat("generating a group of ", end - begin, " prompts (prompt ", order[begin],
                                       " among them): ", done.status().message()));
    }
    for (size_t i = begin; i < end; ++i) {
      tokens += static_cast<int64_t>((*done)[i - begin].size());
      out[order[i]] = std::move((*done)[i - begin]);
    }
    if (options.on_progress) {
      options.on_progress(static_cast<int64_t>(end), static_cast<int64_t>(prompts.size()), tokens);
    }
    begin = end;
  }
  return out;
}

}  // namespace e3
