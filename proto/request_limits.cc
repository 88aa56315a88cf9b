#include "proto/request_limits.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/stream/sample_order.h"
#include "common/stream/student_group.h"

namespace e3 {
namespace {

// NCCL_UNIQUE_ID_BYTES: the id the student makes for the NCCL transport.
constexpr size_t kNcclUniqueIdBytes = 128;
// Below this a cap would refuse the protocol's own small messages.
constexpr int64_t kMinMessageCap = 1 << 10;

absl::Status Invalid(const char* message, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(message, ".", field, " ", what));
}

// Printable ASCII without quotes or backslashes: these names go into log
// lines and the ledger's JSON as they are.
absl::Status CheckName(const char* message, const char* field, const std::string& name,
                       size_t max_bytes, bool required) {
  if (name.empty()) {
    if (required) return Invalid(message, field, "is empty; expected a name");
    return absl::OkStatus();
  }
  if (name.size() > max_bytes) {
    return Invalid(message, field,
                   absl::StrCat("is ", name.size(), " bytes; expected at most ", max_bytes));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') {
      return Invalid(message, field,
                     absl::StrCat("has byte 0x", absl::Hex(c, absl::kZeroPad2), " at ", i,
                                  "; expected printable ASCII without quotes or backslashes"));
    }
  }
  return absl::OkStatus();
}

// Hash fields are short hex strings; they reach log lines and errors.
absl::Status CheckFingerprint(const char* message, const v1::DataFingerprint& f, const RequestLimits& limits) {
  for (auto [field, value] : {std::pair{"resume_fingerprint.dataset", &f.dataset()},
                              {"resume_fingerprint.chat_template", &f.chat_template()},
                              {"resume_fingerprint.samples", &f.samples()},
                              {"resume_fingerprint.draft_vocab", &f.draft_vocab()},
                              {"resume_fingerprint.aux_layers", &f.aux_layers()},
                              {"resume_fingerprint.features", &f.features()}}) {
    if (auto s = CheckName(message, field, *value, limits.max_name_bytes, false); !s.ok()) return s;
  }
  if (f.epochs() < 0 || f.num_data_shards() < 0 || f.data_shard() < 0 || f.tokens_per_batch() < 0) {
    return Invalid(message, "resume_fingerprint", "has a negative epochs, shard or token budget; expected >= 0");
  }
  return absl::OkStatus();
}

absl::Status CheckFeatures(const char* message, const v1::FeatureRequest& f, const RequestLimits& limits) {
  if (f.aux_layer_ids_size() > limits.max_feature_layers) {
    return Invalid(message, "features.aux_layer_ids",
                   absl::StrCat("holds ", f.aux_layer_ids_size(), " layers; expected at most ",
                                limits.max_feature_layers));
  }
  for (int i = 0; i < f.aux_layer_ids_size(); ++i) {
    if (f.aux_layer_ids(i) < 0) {
      return Invalid(message, absl::StrCat("features.aux_layer_ids[", i, "]"),
                     absl::StrCat("is ", f.aux_layer_ids(i), "; expected a layer id >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGroup(const char* message, const std::string& group) {
  return CheckStudentGroupName(group, absl::StrCat(message, ".student_group"));
}

absl::Status CheckCursor(const char* message, const char* field, const v1::Cursor& c) {
  if (c.epoch() < 0 || c.next_batch() < 0) {
    return Invalid(message, field,
                   absl::StrCat("is {epoch ", c.epoch(), ", next_batch ", c.next_batch(),
                                "}; expected both >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckMessageSizeCap(int64_t bytes, const char* flag) {
  const int64_t most = std::numeric_limits<int>::max();
  if (bytes < kMinMessageCap || bytes > most) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " is ", bytes, "; expected ", kMinMessageCap, " <= bytes <= ", most));
  }
  return absl::OkStatus();
}

absl::Status CheckGetInfoRequest(const v1::GetInfoRequest& req) {
  // 0 means 1 (older students leave it unset).
  if (req.world_size() < 0 || req.world_size() > kMaxWorldSize) {
    return Invalid(
        "GetInfoRequest", "world_size",
        absl::StrCat("is ", req.world_size(), "; expected 0 <= world_size <= ", kMaxWorldSize));
  }
  return absl::OkStatus();
}

absl::Status CheckSubscribeRequest(const v1::SubscribeRequest& req, const RequestLimits& limits) {
  constexpr char kMsg[] = "SubscribeRequest";
  if (auto s = CheckName(kMsg, "subscriber_id", req.subscriber_id(), limits.max_name_bytes, true);
      !s.ok())
    return s;
  if (auto s = CheckName(kMsg, "host", req.host(), limits.max_name_bytes, false); !s.ok()) return s;
  if (req.world_size() < 1 || req.world_size() > kMaxWorldSize) {
    return Invalid(
        kMsg, "world_size",
        absl::StrCat("is ", req.world_size(), "; expected 1 <= world_size <= ", kMaxWorldSize));
  }
  if (req.rank() < 0 || req.rank() >= req.world_size()) {
    return Invalid(
        kMsg, "rank",
        absl::StrCat("is ", req.rank(), "; expected 0 <= rank < world_size ", req.world_size()));
  }
  if (req.credit_window() < 0) {
    return Invalid(kMsg, "credit_window",
                   absl::StrCat("is ", req.credit_window(), "; expected >= 0 (0: the default)"));
  }
  if (auto s = CheckCursor(kMsg, "resume", req.resume()); !s.ok()) return s;
  E3_RETURN_IF_ERROR(CheckGroup(kMsg, req.student_group()));
  if (req.has_features()) E3_RETURN_IF_ERROR(CheckFeatures(kMsg, req.features(), limits));
  if (!req.nccl_unique_id().empty() && req.nccl_unique_id().size() != kNcclUniqueIdBytes) {
    return Invalid(kMsg, "nccl_unique_id",
                   absl::StrCat("is ", req.nccl_unique_id().size(), " bytes; expected 0 or ",
                                kNcclUniqueIdBytes));
  }
  if (req.student_device() < 0) {
    return Invalid(kMsg, "student_device",
                   absl::StrCat("is ", req.student_device(), "; expected >= 0"));
  }
  if (req.has_committed()) {
    if (auto s = CheckCursor(kMsg, "committed", req.committed()); !s.ok()) return s;
    const auto& c = req.committed();
    const auto& r = req.resume();
    // A student checkpoints only what it has consumed.
    if (c.epoch() > r.epoch() || (c.epoch() == r.epoch() && c.next_batch() > r.next_batch())) {
      return Invalid(kMsg, "committed",
                     absl::StrCat("is ", c.epoch(), ":", c.next_batch(), ", past resume ", r.epoch(), ":",
                                  r.next_batch(), "; expected committed <= resume"));
    }
  }
  return CheckFingerprint(kMsg, req.resume_fingerprint(), limits);
}

absl::Status CheckAckRequest(const v1::AckRequest& req, const RequestLimits& limits) {
  constexpr char kMsg[] = "AckRequest";
  if (auto s = CheckName(kMsg, "subscriber_id", req.subscriber_id(), limits.max_name_bytes, true);
      !s.ok())
    return s;
  if (req.rank() < 0 || req.rank() >= kMaxWorldSize) {
    return Invalid(kMsg, "rank",
                   absl::StrCat("is ", req.rank(), "; expected 0 <= rank < ", kMaxWorldSize));
  }
  if (req.batch_ids_size() > limits.max_ack_batch_ids) {
    return Invalid(kMsg, "batch_ids",
                   absl::StrCat("holds ", req.batch_ids_size(), " ids; expected at most ",
                                limits.max_ack_batch_ids));
  }
  if (req.has_committed()) E3_RETURN_IF_ERROR(CheckCursor(kMsg, "committed", req.committed()));
  E3_RETURN_IF_ERROR(CheckGroup(kMsg, req.student_group()));
  // The generation is what fences an Ack to the subscription it belongs
  // to; without it any process that knows a subscriber id could commit.
  if (req.subscription_generation() == 0) {
    return Invalid(kMsg, "subscription_generation",
                   "is 0; an Ack carries the generation its Subscribe's acceptance announced");
  }
  return absl::OkStatus();
}

absl::Status CheckGetEvalSetRequest(const v1::GetEvalSetRequest& req, const RequestLimits& limits) {
  if (req.has_features()) return CheckFeatures("GetEvalSetRequest", req.features(), limits);
  return absl::OkStatus();
}

absl::Status CheckGetWeightsRequest(const v1::GetWeightsRequest& req, const RequestLimits& limits) {
  constexpr char kMsg[] = "GetWeightsRequest";
  if (req.names_size() > limits.max_weight_names) {
    return Invalid(kMsg, "names",
                   absl::StrCat("holds ", req.names_size(), " names; expected at most ",
                                limits.max_weight_names));
  }
  for (const std::string& name : req.names()) {
    if (auto s = CheckName(kMsg, "names[]", name, limits.max_name_bytes, true); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckGenerateRequest(const v1::GenerateRequest& req, const RequestLimits& limits) {
  constexpr char kMsg[] = "GenerateRequest";
  const int64_t prompt = req.input_ids_size();
  if (prompt == 0) return Invalid(kMsg, "input_ids", "is empty; expected a prompt");
  if (prompt > limits.max_generate_prompt_tokens) {
    return Invalid(
        kMsg, "input_ids",
        absl::StrCat("holds ", prompt, " tokens; expected at most ",
                     limits.max_generate_prompt_tokens, " (--max_generate_prompt_tokens)"));
  }
  for (int i = 0; i < req.input_ids_size(); ++i) {
    const int32_t id = req.input_ids(i);
    if (id < 0 || id >= limits.vocab_size) {
      return Invalid(
          kMsg, absl::StrCat("input_ids[", i, "]"),
          absl::StrCat("is ", id, "; expected 0 <= id < vocab_size ", limits.vocab_size));
    }
  }
  const int64_t max_new = req.max_new_tokens();
  if (max_new < 1 || max_new > limits.max_generate_new_tokens) {
    return Invalid(kMsg, "max_new_tokens",
                   absl::StrCat("is ", max_new, "; expected 1 <= max_new_tokens <= ",
                                limits.max_generate_new_tokens, " (--max_generate_new_tokens)"));
  }
  if (prompt + max_new > limits.max_positions) {
    return Invalid(kMsg, "max_new_tokens",
                   absl::StrCat("is ", max_new, " after a prompt of ", prompt,
                                " tokens; prompt + max_new_tokens exceeds max_position_embeddings ",
                                limits.max_positions));
  }
  return absl::OkStatus();
}

}  // namespace e3
