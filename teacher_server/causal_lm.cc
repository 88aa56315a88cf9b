#include "teacher_server/causal_lm.h"

#include "teacher_server/models/llama.h"

namespace e3 {

absl::StatusOr<std::unique_ptr<CausalLM>> LoadCausalLM(const ModelDir& dir, const ModelOptions& options) {
  switch (dir.config().architecture) {
    case Architecture::kLlama: {
      auto model = LlamaModel::Load(dir, options);
      if (!model.ok()) return model.status();
      return std::unique_ptr<CausalLM>(std::move(model).value());
    }
  }
  return absl::UnimplementedError("unknown architecture");
}

}  // namespace e3
