# Every dependency is found with find_package (Debian packages on the CPU
# machine; the same packages unpacked by .device/env.sh on the GPU machine).

find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
# TLS key checks (common/rpc/tls_key_pair.h); gRPC links it already.
find_package(OpenSSL REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED COMPONENTS core)
# The run config (common/run_config.h) is YAML (Debian libyaml-cpp-dev).
find_package(yaml-cpp REQUIRED)
if(E3_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()

# cpp-httplib ships no CMake config on Debian 12: find the header and the
# compiled library (it serves /metrics; see DESIGN.md on civetweb).
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
find_library(HTTPLIB_LIBRARY NAMES cpp-httplib httplib REQUIRED)
add_library(e3_httplib INTERFACE)
target_include_directories(e3_httplib SYSTEM INTERFACE ${HTTPLIB_INCLUDE_DIR})
target_link_libraries(e3_httplib INTERFACE ${HTTPLIB_LIBRARY} Threads::Threads)
target_compile_definitions(e3_httplib INTERFACE CPPHTTPLIB_USE_POLL)

# The GPU transports (common/gpu) need only the CUDA runtime and NCCL, not
# a CUDA LibTorch, so they build wherever the toolkit is installed (the CPU
# machine has it for compiling and linking). Sanitizer builds leave them
# out: ASan and the CUDA driver do not mix, and TSan cannot see the
# driver's synchronization.
find_package(CUDAToolkit QUIET)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
set(E3_WITH_CUDA_RUNTIME OFF)
if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND NOT E3_SANITIZE AND NOT E3_TSAN)
  set(E3_WITH_CUDA_RUNTIME ON)
  set(E3_NCCL_INCLUDE_DIR ${NCCL_INCLUDE_DIR})
  set(E3_NCCL_LIBRARY ${NCCL_LIBRARY})
endif()
message(STATUS "e3: GPU transports (CUDA runtime + NCCL): ${E3_WITH_CUDA_RUNTIME}")

set(E3_HAS_CUDA OFF)
if(E3_WITH_TORCH)
  find_package(Torch REQUIRED)
  # LibTorch's own CUDA kernels are used only when the LibTorch we found
  # was built with CUDA (pip LibTorch on the GPU machine); Debian's 1.13 is
  # CPU-only.
  if(TARGET torch_cuda OR CAFFE2_USE_CUDA)
    set(E3_HAS_CUDA ON)
    if(NOT E3_WITH_CUDA_RUNTIME)
      message(FATAL_ERROR "LibTorch has CUDA but the CUDA toolkit or NCCL was not found: pass -DNCCL_INCLUDE_DIR and -DNCCL_LIBRARY")
    endif()
  endif()
  # Torch's own flags carry -D_GLIBCXX_USE_CXX11_ABI; we link through the
  # imported targets so that ABI matches.
  add_library(e3_torch INTERFACE)
  target_link_libraries(e3_torch INTERFACE ${TORCH_LIBRARIES})
  target_include_directories(e3_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  if(E3_HAS_CUDA)
    # The custom CUDA kernels (kernels/*.cu).
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)  # A100, H100/H200
    endif()
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS ${CUDAToolkit_BIN_DIR}/nvcc)
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_BIN_DIR}/nvcc)
    endif()
    enable_language(CUDA)
    target_compile_definitions(e3_torch INTERFACE E3_HAS_CUDA=1)
    target_include_directories(e3_torch SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(e3_torch INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
  endif()
  message(STATUS "e3: LibTorch ${Torch_VERSION}, CUDA ${E3_HAS_CUDA}")
endif()
