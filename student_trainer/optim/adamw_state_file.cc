#include "student_trainer/optim/adamw_state_file.h"

#include <sstream>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors.h"
#include "common/torch/tensor_convert.h"

namespace e3 {
namespace {

constexpr char kStepKey[] = "step";

// The key LibTorch's optimizers file a parameter's state under: its
// TensorImpl, as a pointer (2.x) or as that pointer printed (1.13).
template <typename Key>
Key ParamKey(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// Moments keep the parameter's own float type: fp64 drafts, fp64 moments.
at::ScalarType MomentType(const at::Tensor& p) {
  return p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

using StateKey = std::decay_t<decltype(std::declval<torch::optim::AdamW&>().state())>::key_type;

}  // namespace

absl::Status WriteAdamWState(const std::string& path, int64_t step,
                             const std::vector<NamedMoments>& moments) {
  std::vector<TensorToWrite> tensors;
  try {
    for (const NamedMoments& m : moments) {
      E3_ASSIGN_OR_RETURN(TensorToWrite a,
                          TensorToWritable("exp_avg." + m.name, m.exp_avg.to(at::kFloat)));
      E3_ASSIGN_OR_RETURN(TensorToWrite b,
                          TensorToWritable("exp_avg_sq." + m.name, m.exp_avg_sq.to(at::kFloat)));
      tensors.push_back(std::move(a));
      tensors.push_back(std::move(b));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(path, ": copying the optimizer state: ", e.what_without_backtrace()));
  }
  return WriteSafetensors(path, tensors, {{kStepKey, absl::StrCat(step)}});
}

namespace {

constexpr const char* kMomentPrefixes[] = {"exp_avg.", "exp_avg_sq."};

// The step in the metadata; DataLoss naming the file when it is not a count.
absl::StatusOr<int64_t> StepOf(const SafetensorsFile& file) {
  int64_t step = 0;
  auto it = file.metadata().find(kStepKey);
  if (it == file.metadata().end() || !absl::SimpleAtoi(it->second, &step) || step < 0) {
    return absl::DataLossError(
        absl::StrCat(file.path(), ": metadata \"step\": expected a count of steps"));
  }
  return step;
}

// Every moment of every (name, shape) is in `file` with that shape.
absl::Status CheckMoments(const SafetensorsFile& file,
                          const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  for (const auto& [name, shape] : shapes) {
    for (const char* prefix : kMomentPrefixes) {
      auto view = file.Get(prefix + name);
      if (!view.ok()) return absl::DataLossError(std::string(view.status().message()));
      if (view->shape != shape) {
        return absl::DataLossError(
            absl::StrCat(file.path(), ": ", prefix, name, ": shape does not match the draft's"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckAdamWState(const std::string& path,
                             const std::vector<std::pair<std::string, at::Tensor>>& params) {
  E3_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  E3_RETURN_IF_ERROR(StepOf(*file).status());
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& [name, p] : params) shapes.emplace_back(name, p.sizes().vec());
  return CheckMoments(*file, shapes);
}

absl::StatusOr<int64_t> ReadAdamWState(const std::string& path,
                                       const std::vector<NamedMoments>& into) {
  E3_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  E3_ASSIGN_OR_RETURN(const int64_t step, StepOf(*file));
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const NamedMoments& m : into) shapes.emplace_back(m.name, m.exp_avg.sizes().vec());
  E3_RETURN_IF_ERROR(CheckMoments(*file, shapes));
  torch::NoGradGuard no_grad;
  for (const NamedMoments& m : into) {
    for (const auto& [prefix, dst] :
         {std::pair<std::string, at::Tensor>{"exp_avg.", m.exp_avg},
          std::pair<std::string, at::Tensor>{"exp_avg_sq.", m.exp_avg_sq}}) {
      E3_ASSIGN_OR_RETURN(const TensorView view, file->Get(prefix + m.name));
      E3_ASSIGN_OR_RETURN(at::Tensor t, ViewToTensor(view, at::kFloat));
      try {
        dst.copy_(t);
      } catch (const c10::Error& e) {
        return absl::InternalError(
            absl::StrCat(path, ": ", prefix, m.name, ": ", e.what_without_backtrace()));
      }
    }
  }
  return step;
}

std::vector<NamedMoments> ZeroMoments(
    const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::vector<NamedMoments> out;
  for (const auto& [name, p] : params) {
    const auto options = p.options().dtype(MomentType(p));
    out.push_back(NamedMoments{name, at::zeros_like(p, options), at::zeros_like(p, options)});
  }
  return out;
}

std::pair<int64_t, std::vector<NamedMoments>> MomentsOfTorchAdamW(
    torch::optim::AdamW& optimizer, const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::pair<int64_t, std::vector<NamedMoments>> out{0, ZeroMoments(params)};
  auto& states = optimizer.state();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = states.find(ParamKey<StateKey>(params[i].second));
    if (it == states.end()) continue;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    out.first = std::max<int64_t>(out.first, s.step());
    out.second[i].exp_avg = s.exp_avg();
    out.second[i].exp_avg_sq = s.exp_avg_sq();
  }
  return out;
}

void SetTorchAdamWMoments(torch::optim::AdamW& optimizer,
                          const std::vector<std::pair<std::string, at::Tensor>>& params,
                          int64_t step, const std::vector<NamedMoments>& moments) {
  auto& states = optimizer.state();
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i].second;
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(step);
    const auto options = p.options().dtype(MomentType(p));
    s->exp_avg(moments[i].exp_avg.to(options).clone());
    s->exp_avg_sq(moments[i].exp_avg_sq.to(options).clone());
    states[ParamKey<StateKey>(p)] = std::move(s);
  }
}

}  // namespace e3
