# e3_library(NAME <n> SRCS ... DEPS ... [TORCH])
#   One library per folder, aliased as e3::<n>. TORCH marks targets that
#   include LibTorch; those get the shared precompiled header.
# e3_test(NAME <n> SRCS ... DEPS ... [TORCH] [LABELS ...] [TIMEOUT s])
#   One test binary per test file, discovered with gtest_discover_tests.

include(CMakeParseArguments)

function(e3_apply_common target)
  target_compile_options(${target} PRIVATE ${E3_WARNING_FLAGS})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
endfunction()

# One PCH for every LibTorch target: torch/torch.h is ~60% of their compile
# time. GCC only accepts a PCH built with the same code-model flags, and
# libraries compile with -fPIC while executables compile with -fPIE, so there
# are two: e3_torch_pch (a library) and e3_torch_pch_exe (an executable).
function(_e3_make_torch_pch name kind)
  if(kind STREQUAL "EXECUTABLE")
    add_executable(${name} ${PROJECT_SOURCE_DIR}/cmake/torch_pch_main.cc)
  else()
    add_library(${name} STATIC ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
  endif()
  # Same flags as its users, or GCC rejects the PCH: they all get
  # -pthread from gRPC/Abseil (it defines _REENTRANT, which the torch
  # headers test), and glibc's in-libc pthreads keep Threads::Threads from
  # adding it, so add it here.
  target_link_libraries(${name} PRIVATE e3_torch Threads::Threads)
  target_compile_options(${name} PRIVATE -pthread)
  target_precompile_headers(${name} PRIVATE <torch/torch.h>)
endfunction()

function(e3_use_torch_pch target)
  if(NOT E3_USE_PCH)
    return()
  endif()
  get_target_property(_type ${target} TYPE)
  if(_type STREQUAL "EXECUTABLE")
    set(_pch e3_torch_pch_exe)
  else()
    set(_pch e3_torch_pch)
  endif()
  if(NOT TARGET ${_pch})
    _e3_make_torch_pch(${_pch} ${_type})
  endif()
  target_precompile_headers(${target} REUSE_FROM ${_pch})
endfunction()

function(e3_library)
  cmake_parse_arguments(E3 "TORCH" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(e3_${E3_NAME} ${E3_SRCS})
  add_library(e3::${E3_NAME} ALIAS e3_${E3_NAME})
  e3_apply_common(e3_${E3_NAME})
  target_link_libraries(e3_${E3_NAME} PUBLIC ${E3_DEPS})
  if(E3_TORCH)
    target_link_libraries(e3_${E3_NAME} PUBLIC e3_torch)
    e3_use_torch_pch(e3_${E3_NAME})
  endif()
endfunction()

function(e3_test)
  cmake_parse_arguments(E3 "TORCH" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT E3_TIMEOUT)
    set(E3_TIMEOUT 120)
  endif()
  add_executable(${E3_NAME} ${E3_SRCS})
  e3_apply_common(${E3_NAME})
  target_link_libraries(${E3_NAME} PRIVATE ${E3_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${E3_NAME} PRIVATE
    E3_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(E3_TORCH)
    target_link_libraries(${E3_NAME} PRIVATE e3_torch)
    e3_use_torch_pch(${E3_NAME})
  endif()
  # One label per test: `gpu`, else the one given (e.g. `e2e`), else
  # `torch` / `notorch`. gtest_discover_tests writes PROPERTIES unquoted
  # into set_tests_properties (CMake 3.25), so a list would split: LABELS
  # would keep its first entry and TIMEOUT would be lost.
  if(E3_LABELS)
    list(GET E3_LABELS 0 _label)
  elseif(E3_TORCH)
    set(_label torch)
  else()
    set(_label notorch)
  endif()
  gtest_discover_tests(${E3_NAME}
    PROPERTIES LABELS ${_label} TIMEOUT ${E3_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
endfunction()
