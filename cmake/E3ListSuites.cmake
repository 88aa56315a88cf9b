# Writes OUTPUT, a CTest script with one test per GoogleTest suite of
# BINARY (`--gtest_filter=<suite>.*`), labelled LABEL with TIMEOUT seconds.
# Run after each build of BINARY (cmake/E3Helpers.cmake,
# e3_discover_suites): cmake -D BINARY=... -D OUTPUT=... -D LABEL=...
# -D TIMEOUT=... -P E3ListSuites.cmake
execute_process(COMMAND "${BINARY}" --gtest_list_tests
  OUTPUT_VARIABLE _listing ERROR_VARIABLE _errors RESULT_VARIABLE _rc TIMEOUT 60)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${BINARY} --gtest_list_tests exited with ${_rc}:\n${_listing}${_errors}")
endif()
# Suite lines start in the first column and end with '.', then maybe a
# comment ("Shapes/TttFastTest.  # TypeParam = ..."); case lines are
# indented.
string(REPLACE ";" "\\;" _listing "${_listing}")
string(REPLACE "\n" ";" _lines "${_listing}")
set(_script "")
set(_count 0)
foreach(_line IN LISTS _lines)
  if(_line MATCHES "^([^ #][^ ]*)\\.( |$)")
    set(_suite "${CMAKE_MATCH_1}")
    string(APPEND _script
      "add_test([=[${_suite}]=] [=[${BINARY}]=] [=[--gtest_filter=${_suite}.*]=])\n"
      "set_tests_properties([=[${_suite}]=] PROPERTIES LABELS [=[${LABEL}]=] TIMEOUT ${TIMEOUT})\n")
    math(EXPR _count "${_count} + 1")
  endif()
endforeach()
if(_count EQUAL 0)
  message(FATAL_ERROR "${BINARY} lists no test suite:\n${_listing}")
endif()
file(WRITE "${OUTPUT}" "${_script}")
