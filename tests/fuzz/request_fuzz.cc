// Hostile requests to the teacher, as the bytes of the protobuf messages
// its handlers receive (GetInfo, Subscribe, Ack, GetWeights, Generate,
// chosen by the first byte): the checks every handler runs first
// (proto/request_limits.h) either refuse a request naming its field, or
// pass only what the engine and the model can take (rank < world <=
// kMaxWorldSize, ids in the vocab, prompt and new tokens within the caps),
// and transport negotiation on what passed picks one both sides listed.

#include <cstdint>
#include <vector>

#include "common/stream/sample_order.h"
#include "common/transport/transport.h"
#include "proto/request_limits.h"
#include "proto/wire_codec.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/quiet_protobuf_init.h"

namespace {

e3::RequestLimits Limits() {
  e3::RequestLimits l;
  l.vocab_size = 256;
  l.max_positions = 512;
  l.max_generate_new_tokens = 64;
  l.max_generate_prompt_tokens = 100;
  return l;
}

void Refused(const absl::Status& s, const char* message) {
  E3_FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  E3_FUZZ_CHECK(s.message().find(message) == 0);
}

void Subscribe(const e3::v1::SubscribeRequest& req) {
  absl::Status s = e3::CheckSubscribeRequest(req, Limits());
  if (!s.ok()) return Refused(s, "SubscribeRequest.");
  E3_FUZZ_CHECK(req.world_size() >= 1 && req.world_size() <= e3::kMaxWorldSize);
  E3_FUZZ_CHECK(req.rank() >= 0 && req.rank() < req.world_size());
  E3_FUZZ_CHECK(e3::ShardSpec::Create(req.rank(), req.world_size()).ok());
  E3_FUZZ_CHECK(!req.subscriber_id().empty() &&
                req.subscriber_id().size() <= Limits().max_name_bytes);
  E3_FUZZ_CHECK(req.resume().epoch() >= 0 && req.resume().next_batch() >= 0);
  // As the handler does: unknown transports are ignored.
  std::vector<e3::TransportKind> accepted;
  for (int t : req.accepted_transports()) {
    auto kind = e3::FromWire(static_cast<e3::v1::Transport>(t));
    if (kind.ok()) accepted.push_back(*kind);
  }
  const std::vector<e3::TransportKind> offered = {e3::TransportKind::kShm,
                                                  e3::TransportKind::kInline};
  e3::Placement placement;
  placement.same_host = !req.host().empty() && req.host() == "teacher-host";
  placement.student_on_gpu = req.student_on_gpu();
  placement.nccl_unique_id = !req.nccl_unique_id().empty();
  auto chosen = e3::NegotiateTransport(offered, accepted, placement);
  if (chosen.ok()) {
    bool in_both = false;
    for (auto k : accepted) in_both |= k == *chosen;
    E3_FUZZ_CHECK(in_both && (*chosen == e3::TransportKind::kInline || placement.same_host));
  } else {
    E3_FUZZ_CHECK(chosen.status().code() == absl::StatusCode::kFailedPrecondition);
  }
}

void Generate(const e3::v1::GenerateRequest& req) {
  absl::Status s = e3::CheckGenerateRequest(req, Limits());
  if (!s.ok()) return Refused(s, "GenerateRequest.");
  E3_FUZZ_CHECK(req.input_ids_size() >= 1 &&
                req.input_ids_size() <= Limits().max_generate_prompt_tokens);
  E3_FUZZ_CHECK(req.max_new_tokens() >= 1 &&
                req.max_new_tokens() <= Limits().max_generate_new_tokens);
  E3_FUZZ_CHECK(req.input_ids_size() + req.max_new_tokens() <= Limits().max_positions);
  for (int32_t id : req.input_ids()) E3_FUZZ_CHECK(id >= 0 && id < Limits().vocab_size);
}

template <typename T>
bool Parse(const uint8_t* data, size_t size, T* msg) {
  return msg->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t kind = data[0] % 5;
  ++data;
  --size;
  switch (kind) {
    case 0: {
      e3::v1::GetInfoRequest req;
      if (!Parse(data, size, &req)) return 0;
      absl::Status s = e3::CheckGetInfoRequest(req);
      if (!s.ok()) Refused(s, "GetInfoRequest.world_size");
      (void)e3::CheckProtocolVersion(req.version(), "student");
      break;
    }
    case 1: {
      e3::v1::SubscribeRequest req;
      if (Parse(data, size, &req)) Subscribe(req);
      break;
    }
    case 2: {
      e3::v1::AckRequest req;
      if (!Parse(data, size, &req)) return 0;
      absl::Status s = e3::CheckAckRequest(req, Limits());
      if (!s.ok()) {
        Refused(s, "AckRequest.");
        break;
      }
      E3_FUZZ_CHECK(req.rank() >= 0 && req.rank() < e3::kMaxWorldSize);
      E3_FUZZ_CHECK(req.batch_ids_size() <= Limits().max_ack_batch_ids);
      break;
    }
    case 3: {
      e3::v1::GetWeightsRequest req;
      if (!Parse(data, size, &req)) return 0;
      absl::Status s = e3::CheckGetWeightsRequest(req, Limits());
      if (!s.ok()) Refused(s, "GetWeightsRequest.names");
      break;
    }
    default: {
      e3::v1::GenerateRequest req;
      if (Parse(data, size, &req)) Generate(req);
      break;
    }
  }
  return 0;
}
