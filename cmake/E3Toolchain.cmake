# Compiler-wide settings: ccache, sanitizers. Warnings are added per target
# by the e3_* helpers so generated and third-party code stays quiet.

find_program(E3_CCACHE ccache)
if(E3_CCACHE)
  # PCH and ccache only cooperate when ccache ignores the PCH timestamps.
  set(_e3_launcher ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      ${E3_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${_e3_launcher})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_e3_launcher})
endif()

set(E3_WARNING_FLAGS -Wall -Wextra -Wno-unused-parameter)

if(E3_SANITIZE AND E3_TSAN)
  message(FATAL_ERROR "E3_SANITIZE (ASan) and E3_TSAN cannot share a build")
endif()
if(E3_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
if(E3_TSAN)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "E3_TSAN needs clang (tools/test.sh uses clang++-14)")
  endif()
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()
if(E3_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "E3_FUZZ needs clang: libFuzzer ships with it (tools/test.sh uses clang++-14)")
  endif()
  # Coverage for libFuzzer in every object; only the harnesses link its
  # main (tests/fuzz/CMakeLists.txt), the tests keep gtest's.
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
