#include "teacher_server/causal_lm.h"

#include "teacher_server/models/decoder_lm.h"

namespace e3 {

absl::StatusOr<std::unique_ptr<CausalLM>> LoadCausalLM(const ModelDir& dir, const ModelOptions& options) {
  // Every supported architecture (ModelConfig's Architecture) is a
  // DecoderLM variant.
  auto model = DecoderLM::Load(dir, options);
  if (!model.ok()) return model.status();
  return std::unique_ptr<CausalLM>(std::move(model).value());
}

}  // namespace e3
