// POSIX shared memory segments: the teacher writes a batch's tensors into
// one, the student on the same host maps it read-only, and the teacher
// unlinks it when the batch is acked (or its subscriber is reclaimed).
#ifndef E3_COMMON_TRANSPORT_SHM_SEGMENT_H_
#define E3_COMMON_TRANSPORT_SHM_SEGMENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace e3 {

class ShmSegment {
 public:
  // Creates (exclusively) and maps read-write. `name` must start with '/'.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name, size_t size);
  // Maps an existing segment read-only; its size must be at least min_size.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& name, size_t min_size);
  // Removes the name (mappings stay valid until unmapped). Idempotent.
  static void Unlink(const std::string& name);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // The creator unlinks the name on destruction.
  void set_unlink_on_destroy(bool v) { unlink_on_destroy_ = v; }

 private:
  ShmSegment(std::string name, uint8_t* data, size_t size) : name_(std::move(name)), data_(data), size_(size) {}
  std::string name_;
  uint8_t* data_;
  size_t size_;
  bool unlink_on_destroy_ = false;
};

}  // namespace e3

#endif  // E3_COMMON_TRANSPORT_SHM_SEGMENT_H_
