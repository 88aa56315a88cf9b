// Kineto profiling for the benchmarks (CUDA builds): runs a callable a few
// times under the profiler and prints the GPU kernels that take the most
// time per call, to see where a step or a forward goes.
#ifndef E3_BENCH_KINETO_PROFILE_H_
#define E3_BENCH_KINETO_PROFILE_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#ifdef E3_HAS_CUDA
#include <torch/csrc/autograd/profiler_kineto.h>

#include "common/torch/torch_core.h"

#endif

namespace e3::bench {

// A kernel's name without what every name repeats (namespaces, `void`, the
// parameter list), so that the functor of an ATen elementwise kernel fits
// in a line.
inline std::string ShortKernelName(std::string name) {
  for (const char* noise : {"void ", "at::native::", "(anonymous namespace)::", "e3::kernels::", "c10::"}) {
    for (size_t at = name.find(noise); at != std::string::npos; at = name.find(noise, at)) {
      name.erase(at, std::char_traits<char>::length(noise));
    }
  }
  const size_t params = name.find('(');
  if (params != std::string::npos) name.resize(params);
  return name.substr(0, 130);
}

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
  // Kernels still queued when the profiler stops are never recorded.
  torch::cuda::synchronize();
  auto result = prof::disableProfiler();
  std::map<std::string, std::pair<double, int64_t>> by_kernel;  // total us, count
  double total_us = 0;
  struct Span {
    uint64_t start, end;
    std::string name;
  };
  std::vector<Span> spans;
  std::vector<std::pair<uint64_t, uint64_t>> cpu_spans;  // start, end
  std::vector<std::string> cpu_names;
  for (const auto& e : result->events()) {
    if (e.deviceType() == c10::DeviceType::CPU) {
      cpu_spans.push_back({e.startNs(), e.endNs()});
      cpu_names.push_back(e.name().substr(0, 60));
    }
    // Named host ranges (e3::...) come back as GPU-side annotations too:
    // not kernels.
    if (e.deviceType() != c10::DeviceType::CUDA || e.name().rfind("e3::", 0) == 0) continue;
    const double us = static_cast<double>(e.durationNs()) / 1e3;
    auto& slot = by_kernel[ShortKernelName(e.name())];
    slot.first += us;
    slot.second += 1;
    total_us += us;
    spans.push_back({e.startNs(), e.endNs(), e.name().substr(0, 60)});
  }
  // The GPU's idle time: the time between the first kernel's start and the
  // last one's end that no kernel covers, and the largest such gaps with
  // what ran before and after them (launch gaps, host waits, syncs).
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  if (!spans.empty()) {
    uint64_t covered_to = spans[0].start, idle = 0;
    std::vector<std::pair<uint64_t, size_t>> gaps;  // ns, index of the span after the gap
    for (size_t i = 0; i < spans.size(); ++i) {
      if (spans[i].start > covered_to) {
        idle += spans[i].start - covered_to;
        gaps.push_back({spans[i].start - covered_to, i});
      }
      covered_to = std::max(covered_to, spans[i].end);
    }
    std::sort(gaps.rbegin(), gaps.rend());
    std::printf("profile: %zu GPU events over %.1f ms (%.1f ms per call), GPU idle %.1f ms per call\n", spans.size(),
                static_cast<double>(covered_to - spans[0].start) / 1e6,
                static_cast<double>(covered_to - spans[0].start) / 1e6 / steps,
                static_cast<double>(idle) / 1e6 / steps);
    for (size_t g = 0; g < gaps.size() && g < 8; ++g) {
      const size_t i = gaps[g].second;
      std::printf("  gap %8.1f us  after %s\n                 before %s\n", static_cast<double>(gaps[g].first) / 1e3,
                  spans[i - 1].name.c_str(), spans[i].name.c_str());
      // What the host ran meanwhile: the CPU ops and named ranges that
      // overlap the gap most.
      const uint64_t gap_end = spans[i].start, gap_begin = gap_end - gaps[g].first;
      std::vector<std::pair<uint64_t, size_t>> inside;
      for (size_t c = 0; c < cpu_spans.size(); ++c) {
        const uint64_t from = std::max(cpu_spans[c].first, gap_begin), to = std::min(cpu_spans[c].second, gap_end);
        if (to > from) inside.push_back({to - from, c});
      }
      std::sort(inside.rbegin(), inside.rend());
      for (size_t c = 0; c < inside.size() && c < 8 && g < 3; ++c) {
        std::printf("      host %8.1f us in the gap  %s\n", static_cast<double>(inside[c].first) / 1e3,
                    cpu_names[inside[c].second].c_str());
      }
    }
  }
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [name, v] : by_kernel) order.push_back({v.first, name});
  std::sort(order.rbegin(), order.rend());
  std::printf("profile: GPU busy %.1f ms per call over %d calls; top kernels (ms per call, launches per call):\n",
              total_us / 1e3 / steps, steps);
  constexpr size_t kShown = 80;
  for (size_t i = 0; i < order.size() && i < kShown; ++i) {
    std::printf("  %8.2f %6.0f  %s\n", order[i].first / 1e3 / steps,
                static_cast<double>(by_kernel[order[i].second].second) / steps, order[i].second.c_str());
  }
  double rest_us = 0;
  for (size_t i = kShown; i < order.size(); ++i) rest_us += order[i].first;
  if (order.size() > kShown) {
    std::printf("  %8.2f         the other %zu kernels\n", rest_us / 1e3 / steps, order.size() - kShown);
  }
#else
  (void)step;
  std::printf("profile: needs a CUDA build of LibTorch\n");
#endif
}

}  // namespace e3::bench

#endif  // E3_BENCH_KINETO_PROFILE_H_
