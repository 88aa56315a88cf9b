#include "common/transport/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace e3 {

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name, size_t size) {
  if (name.empty() || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("shm name \"", name, "\" must be /<name> with no other '/'"));
  }
  const size_t mapped = size == 0 ? 1 : size;
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("shm_open(", name, "): ", std::strerror(errno)));
  if (::ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrCat("shm ", name, ": cannot size to ", mapped, " bytes: ",
                                                     std::strerror(err), " (is /dev/shm full?)"));
  }
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return absl::InternalError(absl::StrCat("shm ", name, ": mmap failed: ", std::strerror(err)));
  }
  auto seg = std::unique_ptr<ShmSegment>(new ShmSegment(name, static_cast<uint8_t*>(p), mapped));
  seg->unlink_on_destroy_ = true;
  return seg;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& name, size_t min_size) {
  int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("shm_open(", name, "): ", std::strerror(errno),
                                            " (teacher on another host, or segment already reclaimed?)"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < min_size) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("shm ", name, ": smaller than the ", min_size, " bytes described"));
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("shm ", name, ": mmap failed: ", std::strerror(err)));
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, static_cast<uint8_t*>(p), size));
}

void ShmSegment::Unlink(const std::string& name) { ::shm_unlink(name.c_str()); }

ShmSegment::~ShmSegment() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (unlink_on_destroy_) ::shm_unlink(name_.c_str());
}

}  // namespace e3
