#include "teacher_server/data/eval_set.h"

#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "teacher_server/models/aux_capture.h"
#include "teacher_server/runtime/generation.h"

namespace e3 {
namespace {

using Clock = std::chrono::steady_clock;

struct PackedEval {
  std::vector<int32_t> ids, cu{0};
  std::vector<uint8_t> mask;
  std::vector<std::vector<int32_t>> samples;
};

// `batch` (host bytes) with its aux_hidden [T, num_layers * H] restricted
// to the layers at `positions`; the other tensors copied as they are.
absl::StatusOr<std::shared_ptr<const PayloadBuffer>> WithAuxLayers(const PayloadBuffer& batch, int64_t num_layers,
                                                                   const std::vector<int64_t>& positions) {
  std::vector<PayloadSource> sources;
  at::Tensor aux;
  for (const PayloadTensor& t : batch.tensors()) {
    const uint8_t* data = batch.data() + t.offset;
    if (t.name != "aux_hidden") {
      sources.push_back({t.name, t.dtype, t.shape, data, t.nbytes});
      continue;
    }
    E3_ASSIGN_OR_RETURN(const at::ScalarType type, ToScalarType(t.dtype));
    try {
      const at::Tensor all = torch::from_blob(const_cast<uint8_t*>(data), t.shape, torch::TensorOptions().dtype(type));
      aux = SelectAuxStates(all, num_layers, positions).contiguous();
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("eval set: selecting aux layers: ", e.what_without_backtrace()));
    }
    sources.push_back({t.name, t.dtype, {aux.size(0), aux.size(1)}, aux.data_ptr(),
                       static_cast<size_t>(aux.numel()) * DTypeSize(t.dtype)});
  }
  E3_ASSIGN_OR_RETURN(auto sliced, PayloadBuffer::Build(TransportKind::kInline, sources));
  return std::shared_ptr<const PayloadBuffer>(std::move(sliced));
}

}  // namespace

std::unique_ptr<EvalSet> EvalSet::Start(CausalLM* model, std::vector<std::vector<int32_t>> prompts,
                                        EvalSetOptions options) {
  std::unique_ptr<EvalSet> set(new EvalSet(model, std::move(prompts), std::move(options)));
  set->thread_ = std::thread([s = set.get()] { s->Run(); });
  return set;
}

EvalSet::EvalSet(CausalLM* model, std::vector<std::vector<int32_t>> prompts, EvalSetOptions options)
    : model_(model), prompts_(std::move(prompts)), options_(std::move(options)) {
  progress_.prompts = static_cast<int64_t>(prompts_.size());
}

EvalSet::~EvalSet() {
  cancel_ = true;
  if (thread_.joinable()) thread_.join();
}

EvalSetProgress EvalSet::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_;
}

std::vector<std::shared_ptr<const PayloadBuffer>> EvalSet::batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_;
}

absl::StatusOr<std::vector<std::shared_ptr<const PayloadBuffer>>> EvalSet::batches(
    const std::vector<int64_t>& aux_positions) const {
  const int64_t captured = static_cast<int64_t>(options_.aux_layer_ids.size());
  std::vector<std::shared_ptr<const PayloadBuffer>> all = batches();
  if (EveryAuxLayer(aux_positions, captured) || all.empty()) return all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sliced_.find(aux_positions);
    if (it != sliced_.end()) return it->second;
  }
  std::vector<std::shared_ptr<const PayloadBuffer>> out;
  for (const auto& batch : all) {
    E3_ASSIGN_OR_RETURN(std::shared_ptr<const PayloadBuffer> sliced, WithAuxLayers(*batch, captured, aux_positions));
    out.push_back(std::move(sliced));
  }
  std::lock_guard<std::mutex> lock(mu_);
  return sliced_.emplace(aux_positions, std::move(out)).first->second;
}

void EvalSet::Run() {
  absl::Status st = Generate();
  if (st.ok()) st = BuildBatches();
  std::lock_guard<std::mutex> lock(mu_);
  if (!st.ok()) {
    progress_.error = st;
    if (!absl::IsCancelled(st)) std::printf("teacher: eval set failed: %s\n", std::string(st.message()).c_str());
    std::fflush(stdout);
    return;
  }
  progress_.ready = true;
  std::printf("teacher: eval set ready: %ld prompts, %ld continuation tokens in %ld batches (%.1f s, %.0f tok/s)\n",
              static_cast<long>(progress_.prompts), static_cast<long>(progress_.continuation_tokens),
              static_cast<long>(progress_.batches), progress_.generate_seconds,
              progress_.continuation_tokens / std::max(progress_.generate_seconds, 1e-9));
  std::fflush(stdout);
}

absl::Status EvalSet::Generate() {
  const auto t0 = Clock::now();
  GenerationOptions g;
  g.max_new_tokens = options_.max_new_tokens;
  g.stop_ids = options_.stop_ids;
  g.max_sequences = options_.generate_batch;
  g.prefill_tokens = options_.tokens_per_batch;
  g.cancel = &cancel_;
  g.on_progress = [&](int64_t done, int64_t total, int64_t /*tokens*/) {
    std::lock_guard<std::mutex> lock(mu_);
    progress_.generated = done;
    std::printf("teacher: eval set: generated %ld of %ld prompts\n", static_cast<long>(done),
                static_cast<long>(total));
    std::fflush(stdout);
  };
  E3_ASSIGN_OR_RETURN(continuations_, GenerateContinuations(*model_, prompts_, g));
  std::lock_guard<std::mutex> lock(mu_);
  progress_.generate_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const auto& c : continuations_) progress_.continuation_tokens += static_cast<int64_t>(c.size());
  return absl::OkStatus();
}

absl::Status EvalSet::BuildBatches() {
  // Samples whose continuation has at least two tokens: the first comes
  // from the prompt's prefill, so a round needs one more to draft against.
  std::vector<PackedEval> packs(1);
  for (size_t s = 0; s < prompts_.size(); ++s) {
    if (continuations_[s].size() < 2) continue;
    std::vector<int32_t> sample = prompts_[s];
    sample.insert(sample.end(), continuations_[s].begin(), continuations_[s].end());
    PackedEval* p = &packs.back();
    if (!p->samples.empty() &&
        static_cast<int64_t>(p->ids.size() + sample.size()) > options_.tokens_per_batch) {
      packs.emplace_back();
      p = &packs.back();
    }
    p->ids.insert(p->ids.end(), sample.begin(), sample.end());
    p->mask.insert(p->mask.end(), prompts_[s].size(), 0);
    p->mask.insert(p->mask.end(), continuations_[s].size(), 1);
    p->cu.push_back(static_cast<int32_t>(p->ids.size()));
    p->samples.push_back(std::move(sample));
  }
  if (packs.back().samples.empty()) packs.pop_back();
  std::vector<std::shared_ptr<const PayloadBuffer>> batches;
  for (PackedEval& p : packs) {
    if (cancel_) return absl::CancelledError("eval set cancelled");
    E3_ASSIGN_OR_RETURN(PackedBatch batch, PackSamples(p.samples, model_->config().vocab_size, model_->options().device));
    ForwardOptions fwd;
    fwd.aux_layer_ids = options_.aux_layer_ids;
    fwd.return_argmax = false;
    E3_ASSIGN_OR_RETURN(ForwardOutput out, model_->Forward(batch, fwd));
    at::Tensor aux;
    DType dtype;
    try {
      aux = out.aux_hidden.to(at::kCPU).contiguous();
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("eval set: copying aux states: ", e.what_without_backtrace()));
    }
    E3_ASSIGN_OR_RETURN(dtype, FromScalarType(aux.scalar_type()));
    const int64_t T = static_cast<int64_t>(p.ids.size());
    std::vector<PayloadSource> sources = {
        {"input_ids", DType::kI32, {T}, p.ids.data(), p.ids.size() * 4},
        {"cu_seqlens", DType::kI32, {static_cast<int64_t>(p.cu.size())}, p.cu.data(), p.cu.size() * 4},
        {"loss_mask", DType::kU8, {T}, p.mask.data(), p.mask.size()},
        {"aux_hidden", dtype, {aux.size(0), aux.size(1)}, aux.data_ptr(),
         static_cast<size_t>(aux.numel()) * DTypeSize(dtype)},
    };
    E3_ASSIGN_OR_RETURN(auto payload, PayloadBuffer::Build(TransportKind::kInline, sources));
    batches.push_back(std::move(payload));
  }
  std::lock_guard<std::mutex> lock(mu_);
  batches_ = std::move(batches);
  progress_.batches = static_cast<int64_t>(batches_.size());
  return absl::OkStatus();
}

}  // namespace e3
