#include "teacher_server/runtime/tp_control.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace e3 {
namespace {

// The control header, broadcast first, one int64 tensor of fixed length
// (a broadcast needs the same shape on every rank).
enum Kind : int64_t { kHeartbeat = 0, kForward = 1, kShutdown = 2 };
enum Slot : int64_t { kKind = 0, kTokens, kOffsets, kLogits, kArgmax, kSplit, kNumAux, kFirstAux };
constexpr int64_t kMaxAux = 26;
constexpr int64_t kHeaderLen = kFirstAux + kMaxAux;

at::TensorOptions Int64On(const at::Device& device) {
  return at::TensorOptions().dtype(at::kLong).device(device);
}

absl::Status SendKind(TpGroup& tp, const at::Device& device, Kind kind) {
  at::Tensor header = torch::zeros({kHeaderLen}, Int64On(device));
  header[kKind] = static_cast<int64_t>(kind);
  absl::Status st = tp.group().Broadcast(header, 0);
  // On a GPU the broadcast is only queued on a stream: wait for it, so a
  // shutdown has left this process before the group is torn down.
  if (st.ok()) (void)header.cpu();
  return st;
}

}  // namespace

TpLeader::TpLeader(std::unique_ptr<CausalLM> shard, absl::Duration heartbeat)
    : shard_(std::move(shard)), last_message_(absl::Now()) {
  heartbeat_ = std::thread([this, heartbeat] { HeartbeatLoop(heartbeat); });
}

TpLeader::~TpLeader() { Shutdown(); }

void TpLeader::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  heartbeat_.join();
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  absl::Status st = SendKind(*shard_->options().tp, shard_->options().device, kShutdown);
  if (!st.ok()) std::fprintf(stderr, "teacher: tensor-parallel shutdown: %s\n", std::string(st.message()).c_str());
}

void TpLeader::HeartbeatLoop(absl::Duration period) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, absl::ToChronoMilliseconds(period / 4));
    if (stopping_ || absl::Now() - last_message_ < period) continue;
    absl::Status st = SendKind(*shard_->options().tp, shard_->options().device, kHeartbeat);
    if (!st.ok()) {
      std::fprintf(stderr, "teacher: tensor-parallel heartbeat: %s\n", std::string(st.message()).c_str());
      return;
    }
    last_message_ = absl::Now();
  }
}

absl::StatusOr<ForwardOutput> TpLeader::Forward(const PackedBatch& batch, const ForwardOptions& options) {
  E3_RETURN_IF_ERROR(shard_->CheckForward(batch, options));
  const int64_t num_aux = static_cast<int64_t>(options.aux_layer_ids.size());
  if (num_aux > kMaxAux) {
    return absl::InvalidArgumentError(absl::StrCat(num_aux, " aux layers; tensor parallelism carries at most ", kMaxAux));
  }
  TpGroup& tp = *shard_->options().tp;
  const at::Device device = shard_->options().device;
  // The leader's flags decide the micro-batch split for every rank.
  ForwardOptions sent = options;
  if (sent.micro_batch_split < 0) sent.micro_batch_split = MicroBatchSplit(shard_->options(), batch.cu_seqlens);
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return absl::FailedPreconditionError("tensor-parallel group already shut down");
  try {
    std::vector<int64_t> h(kHeaderLen, 0);
    h[kKind] = kForward;
    h[kTokens] = batch.num_tokens();
    h[kOffsets] = static_cast<int64_t>(batch.cu_seqlens.size());
    h[kLogits] = options.return_logits;
    h[kArgmax] = options.return_argmax;
    h[kSplit] = sent.micro_batch_split;
    h[kNumAux] = num_aux;
    for (int64_t k = 0; k < num_aux; ++k) h[kFirstAux + k] = options.aux_layer_ids[k];
    E3_RETURN_IF_ERROR(tp.group().Broadcast(torch::tensor(h, at::kLong).to(device), 0));
    // ids, positions and offsets in one message.
    at::Tensor offsets = torch::tensor(batch.cu_seqlens, at::kLong).to(device);
    at::Tensor body = torch::cat({batch.input_ids.to(at::kLong), batch.position_ids.to(at::kLong), offsets});
    E3_RETURN_IF_ERROR(tp.group().Broadcast(body, 0));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("tensor-parallel batch broadcast: ", e.what_without_backtrace()));
  }
  last_message_ = absl::Now();
  auto out = shard_->Forward(batch, sent);
  if (!out.ok()) {
    // The followers are inside the same forward, at whichever collective
    // this rank failed before. No later broadcast can line up with theirs,
    // so the group is lost: exit at once (the launcher or orchestrator
    // restarts the teacher; the ledger and the students' checkpoints
    // bound what is redone) rather than serve from a desynchronised group.
    std::fprintf(stderr, "teacher: tensor-parallel forward failed after the batch went to every rank (%s); "
                 "the group cannot recover, exiting\n", std::string(out.status().message()).c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(3);
  }
  return out;
}

absl::Status RunTpFollower(CausalLM& shard) {
  TpGroup& tp = *shard.options().tp;
  const at::Device device = shard.options().device;
  int64_t forwards = 0;
  while (true) {
    PackedBatch batch;
    ForwardOptions options;
    try {
      at::Tensor header = torch::zeros({kHeaderLen}, Int64On(device));
      E3_RETURN_IF_ERROR(tp.group().Broadcast(header, 0));
      header = header.cpu();
      const int64_t* h = header.data_ptr<int64_t>();
      if (h[kKind] == kHeartbeat) continue;
      if (h[kKind] == kShutdown) {
        std::printf("teacher rank %d: leader shut down after %ld forwards\n", tp.rank(), static_cast<long>(forwards));
        return absl::OkStatus();
      }
      if (h[kKind] != kForward || h[kTokens] <= 0 || h[kOffsets] < 2 || h[kNumAux] < 0 || h[kNumAux] > kMaxAux ||
          h[kSplit] < 0 || h[kSplit] >= h[kOffsets] - 1) {
        return absl::DataLossError(absl::StrCat("tensor-parallel header from the leader is malformed (kind ",
                                                h[kKind], ", tokens ", h[kTokens], ")"));
      }
      const int64_t T = h[kTokens], n_off = h[kOffsets];
      at::Tensor body = torch::empty({2 * T + n_off}, Int64On(device));
      E3_RETURN_IF_ERROR(tp.group().Broadcast(body, 0));
      batch.input_ids = body.narrow(0, 0, T);
      batch.position_ids = body.narrow(0, T, T);
      at::Tensor offsets = body.narrow(0, 2 * T, n_off).cpu();
      batch.cu_seqlens.assign(offsets.data_ptr<int64_t>(), offsets.data_ptr<int64_t>() + n_off);
      options.return_logits = h[kLogits] != 0;
      options.return_argmax = h[kArgmax] != 0;
      options.micro_batch_split = h[kSplit];
      for (int64_t k = 0; k < h[kNumAux]; ++k) options.aux_layer_ids.push_back(static_cast<int32_t>(h[kFirstAux + k]));
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("tensor-parallel follower: ", e.what_without_backtrace()));
    }
    auto out = shard.Forward(batch, options);
    if (!out.ok()) return out.status();
    ++forwards;
  }
}

}  // namespace e3
