// The student's side of GetWeights: chunks assembled into whole tensors,
// with every size checked before a byte is allocated. What each tensor
// must be follows from the model dims the teacher's GetInfo gave, so a
// lying or broken teacher cannot make the student allocate more than
// those tensors, nor more than a total cap (--max_weights_bytes).
#ifndef E3_PROTO_WEIGHT_DOWNLOAD_H_
#define E3_PROTO_WEIGHT_DOWNLOAD_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/dtype.h"
#include "proto/teacher.pb.h"
#include "proto/wire_codec.h"

namespace e3 {

struct ExpectedWeight {
  std::vector<int64_t> shape;
  std::vector<DType> dtypes;  // any of these
};

// What GetWeights serves, from the model dims (V vocab, N draft vocab,
// H hidden): embed_tokens [V, H], target_head [N, H] and
// target_head_rest [V - N, H] in a float dtype, d2t [N] int64, t2d [V]
// bool. DataLoss naming the field when the dims are not positive or
// N > V.
absl::StatusOr<std::map<std::string, ExpectedWeight>> ExpectedWeightsOf(const v1::ModelInfo& model);

class WeightDownload {
 public:
  // `source` names the teacher in errors ("GetWeights from host:port").
  WeightDownload(std::map<std::string, ExpectedWeight> expected, uint64_t max_total_bytes,
                 std::string source)
      : expected_(std::move(expected)),
        max_total_bytes_(max_total_bytes),
        source_(std::move(source)) {}

  // Takes one chunk: a known name with its expected shape and dtype,
  // total_bytes equal to what they need, and the bytes that follow the
  // ones received so far (the teacher sends each tensor in order).
  // DataLoss naming the tensor and field otherwise; ResourceExhausted when
  // the tensors together pass the total cap.
  absl::Status Add(const v1::WeightChunk& chunk);
  // A tensor received whole; DataLoss when missing or incomplete. The
  // bytes live as long as this object.
  absl::StatusOr<ReceivedTensor> Get(const std::string& name) const;
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  struct Partial {
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
    uint64_t filled = 0;
  };
  std::map<std::string, ExpectedWeight> expected_;
  uint64_t max_total_bytes_;
  std::string source_;
  std::map<std::string, Partial> parts_;
  uint64_t total_bytes_ = 0;
};

}  // namespace e3

#endif  // E3_PROTO_WEIGHT_DOWNLOAD_H_
