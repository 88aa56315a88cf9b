// Polls `pred` every 10 ms until it holds or `limit` passes; returns its
// last value. For tests that wait on another thread or process.
#ifndef E3_TESTS_WAIT_FOR_H_
#define E3_TESTS_WAIT_FOR_H_

#include <chrono>
#include <functional>
#include <thread>

namespace e3::testing {

inline bool WaitFor(const std::function<bool()>& pred,
                    std::chrono::milliseconds limit = std::chrono::milliseconds(30000)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

}  // namespace e3::testing

#endif  // E3_TESTS_WAIT_FOR_H_
