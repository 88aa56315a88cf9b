# e3_library(NAME <n> SRCS ... DEPS ... [TORCH])
#   One library per folder, aliased as e3::<n>. TORCH marks targets that
#   include LibTorch; those get the shared precompiled header. With
#   E3_UNITY_BUILD its sources compile in unity batches (a library whose
#   files cannot share one turns UNITY_BUILD off, as common/ does).
# e3_test(NAME <n> SRCS ... DEPS ... [TORCH] [LABELS ...] [TIMEOUT s] [COST s])
#   One test binary per test file, discovered with gtest_discover_tests.
#   COST (seconds, about) orders a parallel ctest run that has no timings
#   of its own yet: the costliest tests start first.
# e3_test_group(GROUP <n> SRCS ... <e3_test's other arguments>)
#   The same tests as one e3_test per file, or, with E3_GROUPED_TESTS, one
#   binary <n> compiled in unity batches. Each case still runs in a process
#   of its own (gtest_discover_tests), so only compile-time names collide:
#   helpers in the anonymous namespaces of two files of a batch.

include(CMakeParseArguments)

function(e3_apply_common target)
  target_compile_options(${target} PRIVATE ${E3_WARNING_FLAGS})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
endfunction()

# One PCH for every LibTorch target: common/torch/torch_core.h (the parts
# of LibTorch the code uses) is most of their compile time. GCC only
# accepts a PCH built with the same code-model flags; libraries compile
# with -fPIC, so executables that reuse it do too (they still link as PIE).
function(_e3_make_torch_pch)
  add_library(e3_torch_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
  # Same flags as its users, or the compiler rejects the PCH (GCC quietly,
  # clang with an error): -pthread defines _REENTRANT, which the torch
  # headers test. glibc's in-libc pthreads keep Threads::Threads from
  # adding it, and not every user links gRPC or Abseil, which do, so the
  # PCH and each of its users (e3_use_torch_pch) add it themselves.
  target_link_libraries(e3_torch_pch PRIVATE e3_torch Threads::Threads)
  target_compile_options(e3_torch_pch PRIVATE -pthread)
  target_precompile_headers(e3_torch_pch PRIVATE "${PROJECT_SOURCE_DIR}/common/torch/torch_core.h")
endfunction()

# Sets `out` to whether `file` includes LibTorch, directly or through the
# project's own headers (include paths from the source root). Answers are
# kept for the whole configure run.
function(_e3_includes_torch file out)
  get_property(_known GLOBAL PROPERTY "E3_INCLUDES_TORCH:${file}" SET)
  if(_known)
    get_property(_answer GLOBAL PROPERTY "E3_INCLUDES_TORCH:${file}")
    set(${out} ${_answer} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "E3_INCLUDES_TORCH:${file}" FALSE)  # include cycles end here
  set(_answer FALSE)
  file(STRINGS ${file} _includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(_line IN LISTS _includes)
    if(_line MATCHES "<(torch|ATen|c10)/")
      set(_answer TRUE)
    elseif(_line MATCHES "\"([^\"]+)\"")
      # (CMAKE_MATCH_1 is only set once MATCHES ran, so test it apart.)
      set(_header "${PROJECT_SOURCE_DIR}/${CMAKE_MATCH_1}")
      if(EXISTS "${_header}")
        _e3_includes_torch("${_header}" _answer)
      endif()
    endif()
    if(_answer)
      break()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "E3_INCLUDES_TORCH:${file}" ${_answer})
  set(${out} ${_answer} PARENT_SCOPE)
endfunction()

# Gives `target`'s sources that include LibTorch the shared PCH. The others
# compile without it: a PCH of LibTorch costs a file that does not use it
# about 4 s of compile time (GCC still processes the headers' inline code).
function(e3_use_torch_pch target)
  if(NOT E3_USE_PCH)
    return()
  endif()
  if(NOT TARGET e3_torch_pch)
    _e3_make_torch_pch()
  endif()
  target_precompile_headers(${target} REUSE_FROM e3_torch_pch)
  target_compile_options(${target} PRIVATE -pthread)
  get_target_property(_type ${target} TYPE)
  if(_type STREQUAL "EXECUTABLE")
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
  get_target_property(_sources ${target} SOURCES)
  foreach(_src IN LISTS _sources)
    get_filename_component(_path ${_src} ABSOLUTE)
    if(NOT _path MATCHES "\\.(cc|cpp)$" OR NOT EXISTS ${_path})
      continue()
    endif()
    _e3_includes_torch(${_path} _uses_torch)
    if(NOT _uses_torch)
      set_source_files_properties(${_src} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
endfunction()

function(e3_library)
  cmake_parse_arguments(E3 "TORCH" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(e3_${E3_NAME} ${E3_SRCS})
  add_library(e3::${E3_NAME} ALIAS e3_${E3_NAME})
  e3_apply_common(e3_${E3_NAME})
  target_link_libraries(e3_${E3_NAME} PUBLIC ${E3_DEPS})
  if(E3_UNITY_BUILD)
    set_target_properties(e3_${E3_NAME} PROPERTIES UNITY_BUILD ON)
  endif()
  if(E3_TORCH)
    target_link_libraries(e3_${E3_NAME} PUBLIC e3_torch)
    e3_use_torch_pch(e3_${E3_NAME})
  endif()
endfunction()

function(e3_test)
  cmake_parse_arguments(E3 "TORCH;BY_SUITE" "NAME;TIMEOUT;COST" "SRCS;DEPS;LABELS" ${ARGN})
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
  set(_cost)
  if(E3_COST)
    set(_cost COST ${E3_COST})
  endif()
  if(E3_BY_SUITE)
    e3_discover_suites(${E3_NAME} ${_label} ${E3_TIMEOUT})
    return()
  endif()
  gtest_discover_tests(${E3_NAME}
    PROPERTIES LABELS ${_label} TIMEOUT ${E3_TIMEOUT} ${_cost}
    DISCOVERY_TIMEOUT 60)
endfunction()

# Registers one CTest test per GoogleTest suite of `target` (its cases run
# in one process, `--gtest_filter=<suite>.*`), listed after each build by
# cmake/E3ListSuites.cmake as gtest_discover_tests lists cases. For binaries
# that load LibTorch: each process spends about 0.9 s loading it, which is
# most of a typical case's time (docs/decisions/0019-fitting-ci-into-its-budget.md).
function(e3_discover_suites target label timeout)
  set(_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -D "BINARY=$<TARGET_FILE:${target}>" -D "OUTPUT=${_file}"
            -D "LABEL=${label}" -D "TIMEOUT=${timeout}" -P "${PROJECT_SOURCE_DIR}/cmake/E3ListSuites.cmake"
    BYPRODUCTS ${_file}
    VERBATIM)
  # Until the first build lists the suites, one test says so (as
  # gtest_discover_tests does).
  set(_include "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_include.cmake")
  file(WRITE ${_include}
    "if(EXISTS [=[${_file}]=])\n"
    "  include([=[${_file}]=])\n"
    "else()\n"
    "  add_test([=[${target}_NOT_BUILT]=] [=[${target}_NOT_BUILT]=])\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_include})
endfunction()

function(e3_test_group)
  cmake_parse_arguments(E3 "TORCH" "GROUP;TIMEOUT;COST" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT E3_SRCS)
    return()
  endif()
  # e3_test's arguments other than NAME and SRCS, as given.
  set(_rest DEPS ${E3_DEPS})
  if(E3_TORCH)
    list(APPEND _rest TORCH)
  endif()
  if(E3_LABELS)
    list(APPEND _rest LABELS ${E3_LABELS})
  endif()
  foreach(_key TIMEOUT COST)
    if(E3_${_key})
      list(APPEND _rest ${_key} ${E3_${_key}})
    endif()
  endforeach()
  if(E3_GROUPED_TESTS)
    if(E3_TORCH)
      list(APPEND _rest BY_SUITE)
    endif()
    e3_test(NAME ${E3_GROUP} SRCS ${E3_SRCS} ${_rest})
    set_target_properties(${E3_GROUP} PROPERTIES UNITY_BUILD ON)
    return()
  endif()
  foreach(_src ${E3_SRCS})
    get_filename_component(_name ${_src} NAME_WE)
    e3_test(NAME ${_name} SRCS ${_src} ${_rest})
  endforeach()
endfunction()
