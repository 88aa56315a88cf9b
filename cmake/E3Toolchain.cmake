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

if(E3_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
