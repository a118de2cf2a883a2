# The bf16 and f16 cases PyTorch computed (tests/cases/lowp, written by
# tests/cases/make_lowp_cases.py) must pass on every backend compiled in
# that offers them (the reference offers all), with the tolerances derived
# from SPEC §10.5 (the attention cases under their "rounding": "pytorch");
# and `--explain` must rerun each of them under every profile and name the
# nearest. It does not name `pytorch` for these: PyTorch's CPU flash kernel
# rounds its weights against the real-valued row maximum, tandem's profile
# against an integer exponent (SPEC §10.3), so their rounding errors are
# independent and `exact`, with fewer roundings, comes nearer.
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
  string(REGEX MATCH "explain: ${dir}: out: nearest (pytorch|exact|ggml)[^\n]*; next " line
         "${out}")
  if(line STREQUAL "")
    message(FATAL_ERROR "--explain names no nearest profile for ${dir}")
  endif()
  math(EXPR explained "${explained} + 1")
endforeach()
if(explained LESS 6)
  message(FATAL_ERROR "only ${explained} PyTorch attention cases found in ${CASES}")
endif()
