// What a student downloads from a teacher once: the frozen weights and the
// acceptance eval set.
#include "student_trainer/feed/teacher_client.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "proto/request_limits.h"
#include "proto/subscription_wire.h"
#include "proto/weight_download.h"
#include "proto/wire_codec.h"
#include "student_trainer/feed/teacher_rpc.h"
#include "student_trainer/feed/teacher_wait.h"

namespace e3 {

using teacher_rpc::FromGrpc;
using teacher_rpc::ToTensor;

absl::StatusOr<EvalSetFetch> TeacherClient::FetchEvalSet() {
  v1::GetEvalSetRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  // The eval batches carry aux states only: the draft's layers of them.
  if (features_.has_value()) *req.mutable_features() = FeatureRequestToWire(*features_);
  // The whole set in one stream (about 100 MB per batch on an 8B target):
  // a generous deadline of its own instead of the per-call one.
  auto ctx = NewContext(false);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  auto reader = stub_->GetEvalSet(ctx.get(), req);
  EvalSetFetch out;
  v1::EvalSetChunk chunk;
  std::vector<v1::EvalSetChunk> chunks;
  while (reader->Read(&chunk)) chunks.push_back(chunk);
  grpc::Status st = reader->Finish();
  if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) return out;  // no eval set there
  if (!st.ok()) return FromGrpc(st, absl::StrCat("GetEvalSet from ", options_.address));
  if (chunks.empty()) return absl::DataLossError(absl::StrCat("GetEvalSet from ", options_.address, ": no message"));
  out.available = true;
  out.prompts = chunks[0].prompts();
  out.generated = chunks[0].generated();
  out.ready = chunks[0].ready();
  if (!out.ready) return out;
  for (const v1::EvalSetChunk& c : chunks) {
    E3_RETURN_IF_ERROR(CheckProtocolVersion(c.batch().version(), "teacher"));
    std::string prefix;
    {
      std::lock_guard<std::mutex> lock(mu_);
      prefix = shm_prefix_;
    }
    E3_ASSIGN_OR_RETURN(auto received, ReceivedBatch::Resolve(c.batch(), prefix));
    auto get = [&](const char* name) -> absl::StatusOr<at::Tensor> {
      E3_ASSIGN_OR_RETURN(ReceivedTensor t, received->Get(name));
      return ToTensor(t);
    };
    E3_ASSIGN_OR_RETURN(at::Tensor ids, get("input_ids"));
    E3_ASSIGN_OR_RETURN(at::Tensor cu, get("cu_seqlens"));
    E3_ASSIGN_OR_RETURN(at::Tensor mask, get("loss_mask"));
    E3_ASSIGN_OR_RETURN(at::Tensor aux, get("aux_hidden"));
    E3_ASSIGN_OR_RETURN(EvalBatch b, EvalBatchFromWire(ids, cu, mask, aux));
    const int64_t width = static_cast<int64_t>(info_.aux_layer_ids.size()) * info_.config.hidden_size;
    if (b.aux_hidden.size(1) != width) {
      return absl::DataLossError(absl::StrCat("GetEvalSet from ", options_.address, ": aux_hidden of ",
                                              b.aux_hidden.size(1), " columns; expected ", width, " (aux layers [",
                                              absl::StrJoin(info_.aux_layer_ids, ", "), "])"));
    }
    out.batches.push_back(std::move(b));
  }
  if (static_cast<int>(out.batches.size()) != chunks[0].batch_count()) {
    return absl::DataLossError(absl::StrCat("GetEvalSet from ", options_.address, ": ", out.batches.size(),
                                            " batches of ", chunks[0].batch_count()));
  }
  return out;
}

absl::StatusOr<FrozenWeights> TeacherClient::FetchWeights(bool with_rest_head) {
  v1::GetWeightsRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  if (with_rest_head) {
    for (const char* name : {"embed_tokens", "target_head", "d2t", "t2d", "target_head_rest"}) req.add_names(name);
  }
  auto ctx = NewContext(true);
  auto reader = stub_->GetWeights(ctx.get(), req);
  const std::string source = absl::StrCat("GetWeights from ", options_.address);
  E3_ASSIGN_OR_RETURN(auto expected, ExpectedWeightsOf(info_.raw.model()));
  WeightDownload download(std::move(expected), options_.max_weights_bytes, source);
  v1::WeightChunk chunk;
  while (reader->Read(&chunk)) {
    absl::Status added = download.Add(chunk);
    if (!added.ok()) {
      ctx->TryCancel();
      reader->Finish();
      return added;
    }
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) return FromGrpc(st, source);
  auto get = [&](const std::string& name) -> absl::StatusOr<at::Tensor> {
    E3_ASSIGN_OR_RETURN(ReceivedTensor t, download.Get(name));
    return ToTensor(t);
  };
  FrozenWeights w;
  E3_ASSIGN_OR_RETURN(w.embed_tokens, get("embed_tokens"));
  E3_ASSIGN_OR_RETURN(w.target_head, get("target_head"));
  E3_ASSIGN_OR_RETURN(at::Tensor d2t, get("d2t"));
  E3_ASSIGN_OR_RETURN(at::Tensor t2d, get("t2d"));
  d2t = d2t.to(at::kLong).contiguous();
  t2d = t2d.to(at::kByte).contiguous();
  w.vocab.target_vocab_size = t2d.numel();
  w.vocab.d2t.assign(d2t.data_ptr<int64_t>(), d2t.data_ptr<int64_t>() + d2t.numel());
  w.vocab.t2d.assign(t2d.data_ptr<uint8_t>(), t2d.data_ptr<uint8_t>() + t2d.numel());
  E3_RETURN_IF_ERROR(ValidateVocabMap(w.vocab, absl::StrCat("vocab map from teacher ", options_.address)));
  if (with_rest_head) {
    E3_ASSIGN_OR_RETURN(w.target_head_rest, get("target_head_rest"));
    const int64_t rest_rows = w.vocab.target_vocab_size - static_cast<int64_t>(w.vocab.d2t.size());
    if (w.target_head_rest.dim() != 2 || w.target_head_rest.size(0) != rest_rows ||
        w.target_head_rest.size(1) != w.target_head.size(1)) {
      return absl::DataLossError(absl::StrCat("teacher ", options_.address, " sent target_head_rest of shape [",
                                              absl::StrJoin(w.target_head_rest.sizes().vec(), ", "), "], expected [",
                                              rest_rows, ", ", w.target_head.size(1), "]"));
    }
  }
  return w;
}

}  // namespace e3
