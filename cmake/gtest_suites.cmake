cmake_minimum_required(VERSION 3.18)
# Registers the ctest tests of a GoogleTest binary: run after the binary is
# built (cmake -P), it lists the binary's tests and writes add_test() calls.
# Suites whose names are in E2E (they start `morph` processes) get one ctest
# test each, labelled "e2e", run in one process (--gtest_filter=Suite.*).
# All other suites are unit tests: they run together in one process, the
# ctest test UNIT (labelled "unit"), so libtorch starts once for all of
# them (about 0.8 CPU-s a start: a process per suite cost the suite ~45
# CPU-s). One suite alone: BINARY --gtest_filter='Suite.*'.
# COSTS gives e2e suites their ctest COST (the order `ctest -j` starts
# tests in where it has no timings of its own: descending); others cost 1.
#   -DBINARY=path -DOUT=file.cmake -DUNIT=unit -DE2E=Cli,Pipeline -DTIMEOUT=seconds
#   -DCOSTS=Cli=130,Pipeline=150
string(REPLACE "," ";" E2E "${E2E}")
string(REPLACE "," ";" COSTS "${COSTS}")
execute_process(COMMAND "${BINARY}" --gtest_list_tests
                OUTPUT_VARIABLE listing RESULT_VARIABLE rc TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${BINARY} --gtest_list_tests failed (${rc}):\n${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(script "")
set(seen "")
set(unit_filter "")
foreach(line IN LISTS lines)
  # A suite line has no indentation: "Suite." or "Prefix/Suite.  # TypeParam = ...".
  if(line MATCHES "^([^ #][^ ]*)\\.")
    set(suite "${CMAKE_MATCH_1}")
    if(suite IN_LIST seen)
      continue()
    endif()
    list(APPEND seen "${suite}")
    # The suite's own name, without an instantiation prefix ("Models/TrainerModels").
    string(REGEX REPLACE "^.*/" "" base "${suite}")
    if(NOT base IN_LIST E2E)
      if(unit_filter STREQUAL "")
        set(unit_filter "${suite}.*")
      else()
        string(APPEND unit_filter ":${suite}.*")
      endif()
      continue()
    endif()
    string(APPEND script "add_test([==[${suite}]==] \"${BINARY}\" [==[--gtest_filter=${suite}.*]==])\n")
    set(cost 1)
    foreach(pair IN LISTS COSTS)
      if(pair MATCHES "^${base}=(.+)$")
        set(cost "${CMAKE_MATCH_1}")
      endif()
    endforeach()
    string(APPEND script "set_tests_properties([==[${suite}]==] PROPERTIES TIMEOUT ${TIMEOUT} LABELS e2e COST ${cost})\n")
  endif()
endforeach()
if(seen STREQUAL "")
  message(FATAL_ERROR "${BINARY} lists no tests")
endif()
if(NOT unit_filter STREQUAL "")
  string(APPEND script "add_test([==[${UNIT}]==] \"${BINARY}\" [==[--gtest_filter=${unit_filter}]==])\n")
  string(APPEND script "set_tests_properties([==[${UNIT}]==] PROPERTIES TIMEOUT ${TIMEOUT} LABELS unit COST 1)\n")
endif()
file(WRITE "${OUT}" "${script}")
