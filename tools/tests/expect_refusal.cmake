# Runs `tandem check --backend optimized` on each case of CASES and expects it
# refused: exit 2, naming the case, with the optimized backend's message for
# an attention feature it does not implement yet (SPEC §2.7–2.10).
# Usage: cmake -DTANDEM=<tandem> "-DCASES=<dir>;<dir>..." -P expect_refusal.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT CASES)
  message(FATAL_ERROR "no cases given")
endif()
foreach(case ${CASES})
  execute_process(COMMAND "${TANDEM}" check --backend optimized "${case}"
                  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(all "${out}${err}")
  message(STATUS "tandem check --backend optimized ${case} -> exit ${code}\n${all}")
  if(NOT code EQUAL 2)
    message(FATAL_ERROR "${case}: exit ${code}, expected 2 (refused)")
  endif()
  foreach(fragment "case '${case}'" "is not supported by the optimized backend yet")
    string(FIND "${all}" "${fragment}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${case}: output lacks '${fragment}'")
    endif()
  endforeach()
endforeach()
