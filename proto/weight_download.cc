#include "proto/weight_download.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace e3 {
namespace {

const std::vector<DType> kFloatTypes = {DType::kF32, DType::kF16, DType::kBF16};

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<std::map<std::string, ExpectedWeight>> ExpectedWeightsOf(
    const v1::ModelInfo& model) {
  const int64_t V = model.vocab_size(), N = model.draft_vocab_size(), H = model.hidden_size();
  if (V < 1 || N < 1 || H < 1 || N > V) {
    return absl::DataLossError(absl::StrCat(
        "GetInfoResponse.model: vocab_size ", V, ", draft_vocab_size ", N, ", hidden_size ", H,
        "; expected all >= 1 and draft_vocab_size <= vocab_size"));
  }
  std::map<std::string, ExpectedWeight> out;
  out["embed_tokens"] = {{V, H}, kFloatTypes};
  out["target_head"] = {{N, H}, kFloatTypes};
  out["target_head_rest"] = {{V - N, H}, kFloatTypes};
  out["d2t"] = {{N}, {DType::kI64}};
  out["t2d"] = {{V}, {DType::kBool}};
  return out;
}

absl::Status WeightDownload::Add(const v1::WeightChunk& chunk) {
  const v1::TensorRef& ref = chunk.tensor();
  const std::string& name = ref.name();
  auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(source_, ": WeightChunk for \"", name, "\": ", what));
  };
  const std::vector<int64_t> shape(ref.shape().begin(), ref.shape().end());
  auto it = parts_.find(name);
  Partial fresh;
  const Partial* p = nullptr;
  if (it != parts_.end()) {
    p = &it->second;
    if (shape != p->shape || chunk.total_bytes() != p->bytes.size()) {
      return corrupt("shape or total_bytes differ from the tensor's first chunk");
    }
  } else {
    auto want = expected_.find(name);
    if (want == expected_.end()) return corrupt("not a weight this student uses");
    auto dtype = FromWire(ref.dtype());
    bool dtype_ok = false;
    if (dtype.ok()) {
      for (DType d : want->second.dtypes) dtype_ok |= d == *dtype;
    }
    if (!dtype_ok)
      return corrupt(
          absl::StrCat("tensor.dtype is ", v1::DType_Name(ref.dtype()), "; not expected here"));
    if (shape != want->second.shape) {
      return corrupt(absl::StrCat("tensor.shape is ", ShapeText(shape), "; the model's dims need ",
                                  ShapeText(want->second.shape)));
    }
    // Each dim fits in int64; their product in bytes may not.
    uint64_t need = DTypeSize(*dtype);
    for (int64_t d : shape) {
      if (__builtin_mul_overflow(need, static_cast<uint64_t>(d), &need)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            source_, ": weight \"", name, "\" of shape ", ShapeText(shape), " exceeds 2^64 bytes"));
      }
    }
    if (chunk.total_bytes() != need) {
      return corrupt(
          absl::StrCat("total_bytes is ", chunk.total_bytes(), "; shape and dtype need ", need));
    }
    if (need > max_total_bytes_ - total_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          source_, ": weight \"", name, "\" needs ", need, " bytes, which with the ", total_bytes_,
          " already received exceeds the cap of ", max_total_bytes_, " (--max_weights_bytes)"));
    }
    fresh.dtype = *dtype;
    fresh.shape = shape;
    p = &fresh;
  }
  // Checked before the first chunk's tensor is allocated.
  const uint64_t total = chunk.total_bytes(), filled = p->filled;
  const std::string& data = ref.inline_data();
  if (chunk.offset() != filled) {
    return corrupt(absl::StrCat("offset is ", chunk.offset(), "; expected ", filled,
                                " (chunks come in order)"));
  }
  if (data.size() > total - filled) {
    return corrupt(absl::StrCat(data.size(), " bytes at offset ", chunk.offset(),
                                " run past total_bytes ", total));
  }
  if (it == parts_.end()) {
    fresh.bytes.resize(total);
    total_bytes_ += total;
    it = parts_.emplace(name, std::move(fresh)).first;
  }
  Partial& dst = it->second;
  if (!data.empty()) std::memcpy(dst.bytes.data() + dst.filled, data.data(), data.size());
  dst.filled += data.size();
  return absl::OkStatus();
}

absl::StatusOr<ReceivedTensor> WeightDownload::Get(const std::string& name) const {
  auto it = parts_.find(name);
  if (it == parts_.end() || it->second.filled != it->second.bytes.size()) {
    const uint64_t got = it == parts_.end() ? 0 : it->second.filled;
    const uint64_t of = it == parts_.end() ? 0 : it->second.bytes.size();
    return absl::DataLossError(absl::StrCat(source_, ": no complete weight \"", name, "\" (", got,
                                            " of ", of, " bytes received)"));
  }
  ReceivedTensor t;
  t.name = name;
  t.dtype = it->second.dtype;
  t.shape = it->second.shape;
  t.data = it->second.bytes.data();
  t.nbytes = it->second.bytes.size();
  return t;
}

}  // namespace e3
