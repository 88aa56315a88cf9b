// Kineto profiling for the benchmarks (CUDA builds): runs a callable a few
// times under the profiler and prints the GPU kernels that take the most
// time per call, to see where a step or a forward goes.
#ifndef E3_BENCH_KINETO_PROFILE_H_
#define E3_BENCH_KINETO_PROFILE_H_

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#ifdef E3_HAS_CUDA
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

namespace e3::bench {

// Calls step(false) `steps` times under the profiler (nothing when steps <= 0).
template <typename Step>
void ProfileSteps(Step& step, int steps) {
  if (steps <= 0) return;
#ifdef E3_HAS_CUDA
  namespace prof = torch::autograd::profiler;
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  const std::set<prof::ActivityType> activities = {prof::ActivityType::CPU, prof::ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  for (int i = 0; i < steps; ++i) step(false);
  auto result = prof::disableProfiler();
  std::map<std::string, std::pair<double, int64_t>> by_kernel;  // total us, count
  double total_us = 0;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    const double us = static_cast<double>(e.durationNs()) / 1e3;
    auto& slot = by_kernel[e.name().substr(0, 90)];
    slot.first += us;
    slot.second += 1;
    total_us += us;
  }
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [name, v] : by_kernel) order.push_back({v.first, name});
  std::sort(order.rbegin(), order.rend());
  std::printf("profile: GPU busy %.1f ms per call over %d calls; top kernels (ms per call, launches per call):\n",
              total_us / 1e3 / steps, steps);
  for (size_t i = 0; i < order.size() && i < 30; ++i) {
    std::printf("  %8.2f %6.0f  %s\n", order[i].first / 1e3 / steps,
                static_cast<double>(by_kernel[order[i].second].second) / steps, order[i].second.c_str());
  }
#else
  (void)step;
  std::printf("profile: needs a CUDA build of LibTorch\n");
#endif
}

}  // namespace e3::bench

#endif  // E3_BENCH_KINETO_PROFILE_H_
