#include "student_trainer/eval/acceptance_eval.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_convert.h"
#include "nlohmann/json.hpp"

namespace e3 {

absl::StatusOr<std::unique_ptr<AcceptanceEval>> AcceptanceEval::Create(TeacherClient* client,
                                                                        AcceptanceEvalOptions options,
                                                                        ProcessGroup* group, const ParallelLayout& layout,
                                                                        const at::Device& device) {
  if (options.chain < 1) return absl::InvalidArgumentError(absl::StrCat("--eval_chain=", options.chain, ": expected >= 1"));
  std::unique_ptr<AcceptanceEval> e(new AcceptanceEval(client, std::move(options), group, layout, device));
  E3_ASSIGN_OR_RETURN(EvalSetFetch probe, client->FetchEvalSet());
  e->available_ = probe.available;
  if (probe.ready) {
    e->batches_ = std::move(probe.batches);
    e->have_set_ = !layout.data_parallel();  // under data parallelism rank 0 still says when
  }
  return e;
}

AcceptanceEval::AcceptanceEval(TeacherClient* client, AcceptanceEvalOptions options, ProcessGroup* group,
                               const ParallelLayout& layout, const at::Device& device)
    : client_(client),
      options_(std::move(options)),
      group_(group),
      layout_(layout),
      device_(device),
      chains_(ReportedChainLengths(options_.chain)) {}

absl::StatusOr<bool> AcceptanceEval::EnsureSet(bool log_waiting) {
  if (have_set_) return true;
  bool ready = !batches_.empty();
  int prompts = 0, generated = 0;
  if (!ready && (layout_.is_first() || group_ == nullptr)) {
    E3_ASSIGN_OR_RETURN(EvalSetFetch f, client_->FetchEvalSet());
    ready = f.ready;
    prompts = f.prompts;
    generated = f.generated;
    if (ready) batches_ = std::move(f.batches);
  }
  if (group_ != nullptr) {
    // Rank 0's answer is everyone's: all measure at the same steps.
    at::Tensor flag = torch::tensor({layout_.is_first() && ready ? 1 : 0}, torch::kLong).to(device_);
    E3_RETURN_IF_ERROR(group_->Broadcast(flag, 0));
    ready = flag.to(at::kCPU).item<int64_t>() == 1;
    if (ready && batches_.empty()) {
      E3_ASSIGN_OR_RETURN(EvalSetFetch f, client_->FetchEvalSet());
      if (!f.ready) return absl::InternalError("the teacher's eval set was ready for rank 0 but not here");
      batches_ = std::move(f.batches);
    }
  }
  if (!ready && log_waiting && layout_.is_first()) {
    // After the continuations, the teacher still runs the target over them
    // for their hidden states.
    const std::string stage = prompts > 0 && generated == prompts
                                  ? absl::StrCat("all ", prompts, " continuations generated, their hidden states not yet")
                                  : absl::StrCat(generated, " of ", prompts, " prompts generated");
    std::printf("student[0]: eval set not ready at the teacher (%s); acceptance skipped\n", stage.c_str());
    std::fflush(stdout);
  }
  have_set_ = ready;
  return ready;
}

absl::StatusOr<std::optional<AcceptanceReport>> AcceptanceEval::Measure(DraftModel& draft) {
  if (!available_ || !have_set_) return std::optional<AcceptanceReport>();
  E3_ASSIGN_OR_RETURN(AcceptanceReport r, MeasureAcceptance(draft, batches_, chains_, group_, layout_));
  return std::optional<AcceptanceReport>(std::move(r));
}

absl::StatusOr<std::optional<AcceptanceReport>> AcceptanceEval::AtStep(int64_t step, DraftModel& draft) {
  if (!available_ || options_.every <= 0 || step % options_.every != 0) return std::optional<AcceptanceReport>();
  E3_ASSIGN_OR_RETURN(bool ready, EnsureSet(/*log_waiting=*/true));
  if (!ready) return std::optional<AcceptanceReport>();
  E3_ASSIGN_OR_RETURN(last_, Measure(draft));
  measured_at_ = step;
  return last_;
}

absl::StatusOr<std::optional<AcceptanceReport>> AcceptanceEval::Final(int64_t step, DraftModel& draft) {
  if (!available_) return std::optional<AcceptanceReport>();
  if (step == measured_at_ && last_.has_value()) return last_;
  E3_ASSIGN_OR_RETURN(const bool ready, AwaitSet());
  if (!ready) return std::optional<AcceptanceReport>();
  return Measure(draft);
}

absl::StatusOr<bool> AcceptanceEval::AwaitSet() {
  if (!available_ || gave_up_waiting_) return false;
  if (have_set_) return true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.wait_s);
  bool said = false;
  for (;;) {
    E3_ASSIGN_OR_RETURN(bool ready, EnsureSet(/*log_waiting=*/!said));
    said = true;
    if (ready) break;
    // Every rank leaves together: rank 0's clock decides.
    int64_t give_up = std::chrono::steady_clock::now() >= deadline ? 1 : 0;
    if (group_ != nullptr) {
      at::Tensor t = torch::tensor({give_up}, torch::kLong).to(device_);
      E3_RETURN_IF_ERROR(group_->Broadcast(t, 0));
      give_up = t.to(at::kCPU).item<int64_t>();
    }
    if (give_up) {
      if (layout_.is_first()) std::printf("student[0]: the teacher's eval set was not ready within %.0f s; no final acceptance\n",
                                  options_.wait_s);
      gave_up_waiting_ = true;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  return true;
}

absl::Status AcceptanceEval::Dump(const DraftModel& draft, const AcceptanceReport& report) const {
  if (options_.dump.empty() || !layout_.is_first() || batches_.empty()) return absl::OkStatus();
  std::vector<at::Tensor> ids, aux;
  std::vector<int64_t> cu{0}, prompt_lengths;
  for (const EvalBatch& b : batches_) {
    ids.push_back(b.input_ids);
    aux.push_back(b.aux_hidden);
    for (size_t s = 0; s + 1 < b.cu_seqlens.size(); ++s) cu.push_back(cu.back() + b.cu_seqlens[s + 1] - b.cu_seqlens[s]);
    prompt_lengths.insert(prompt_lengths.end(), b.prompt_lengths.begin(), b.prompt_lengths.end());
  }
  nlohmann::json meta = {{"chains", report.chain_lengths}, {"samples", report.samples}};
  for (size_t i = 0; i < report.chain_lengths.size(); ++i) {
    const std::string k = std::to_string(report.chain_lengths[i]);
    meta["tau"][k] = report.counts[i].tau();
    meta["rounds"][k] = report.counts[i].rounds;
    meta["tokens"][k] = report.counts[i].tokens;
  }
  std::vector<TensorToWrite> tensors;
  try {
    std::vector<std::pair<std::string, at::Tensor>> named = {
        {"input_ids", torch::cat(ids).to(at::kInt)},
        {"cu_seqlens", torch::tensor(cu, torch::kInt)},
        {"prompt_lengths", torch::tensor(prompt_lengths, torch::kInt)},
        {"aux_hidden", torch::cat(aux)},
        {"embed_tokens", draft.target_embed_tokens().to(at::kCPU)},
    };
    // A draft without a head of its own (DFlash) proposes through the
    // target's, which its export does not hold.
    if (draft.target_lm_head().defined()) named.emplace_back("target_lm_head", draft.target_lm_head().to(at::kCPU));
    for (const auto& [name, t] : named) {
      E3_ASSIGN_OR_RETURN(TensorToWrite w, TensorToWritable(name, t.contiguous()));
      tensors.push_back(std::move(w));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("--eval_dump ", options_.dump, ": ", e.what_without_backtrace()));
  }
  return WriteSafetensors(options_.dump, tensors, {{"meta", meta.dump()}});
}

}  // namespace e3
