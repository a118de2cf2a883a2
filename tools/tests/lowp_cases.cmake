# The bf16 and f16 cases PyTorch computed (tests/cases/lowp, written by
# tests/cases/make_lowp_cases.py) must pass on every backend compiled in
# that offers them (the reference offers all), with the tolerances derived
# from SPEC §10.5; and `--explain` must name `pytorch` as the profile nearest
# to each attention case that declares "rounding": "pytorch".
# Usage: cmake -DTANDEM=<tandem> -DCASES=<tests/cases/lowp> -P lowp_cases.cmake
cmake_minimum_required(VERSION 3.25)
file(GLOB dirs LIST_DIRECTORIES true "${CASES}/*")
execute_process(COMMAND "${TANDEM}" check --backend all --explain ${dirs}
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "tandem check --explain -> exit ${code}\n${out}${err}")
if(NOT code EQUAL 0)
  message(FATAL_ERROR "tandem check exited with ${code}, expected 0")
endif()
set(explained 0)
foreach(dir ${dirs})
  file(READ "${dir}/case.json" spec)
  if(NOT spec MATCHES "\"rounding\": \"pytorch\"")
    continue()
  endif()
  string(FIND "${out}" "explain: ${dir}: out: nearest pytorch" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "--explain does not name pytorch as nearest for ${dir}")
  endif()
  math(EXPR explained "${explained} + 1")
endforeach()
if(explained LESS 6)
  message(FATAL_ERROR "only ${explained} PyTorch attention cases found in ${CASES}")
endif()
