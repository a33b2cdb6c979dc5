cmake_minimum_required(VERSION 3.18)
# Registers one ctest test per GoogleTest suite of a test binary: run after
# the binary is built (cmake -P), it lists the binary's tests and writes
# add_test() calls that run each suite in one process
# (--gtest_filter=Suite.*), so libtorch starts once per suite instead of
# once per test. Suites whose names are in E2E (they start `morph`
# processes) are labelled "e2e", the others "unit". COSTS gives suites
# their ctest COST (the order `ctest -j` starts tests in where it has no
# timings of its own: descending); other suites cost 1.
#   -DBINARY=path -DOUT=file.cmake -DE2E=Cli,Pipeline -DTIMEOUT=seconds -DCOSTS=Cli=130,Pipeline=150
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
    set(label unit)
    if(base IN_LIST E2E)
      set(label e2e)
    endif()
    string(APPEND script "add_test([==[${suite}]==] \"${BINARY}\" [==[--gtest_filter=${suite}.*]==])\n")
    set(cost 1)
    foreach(pair IN LISTS COSTS)
      if(pair MATCHES "^${base}=(.+)$")
        set(cost "${CMAKE_MATCH_1}")
      endif()
    endforeach()
    string(APPEND script "set_tests_properties([==[${suite}]==] PROPERTIES TIMEOUT ${TIMEOUT} LABELS ${label} COST ${cost})\n")
  endif()
endforeach()
if(seen STREQUAL "")
  message(FATAL_ERROR "${BINARY} lists no tests")
endif()
file(WRITE "${OUT}" "${script}")
