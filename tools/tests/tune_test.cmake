# `tandem tune` on the tiny shapes within 2 seconds writes a tuning file with
# this CPU's identity, which `tandem check` then loads through TANDEM_TUNING
# (the example still passes, no message) and `tandem tune --compare` times
# beside the default; a file for another CPU is ignored
# with one message naming it; a malformed one is an error naming the field.
# Usage: cmake -DTANDEM=... -DCASE=<example case dir> -DWORK=... -P tune_test.cmake
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

include("${CMAKE_CURRENT_LIST_DIR}/expect.cmake")

function(check_with tuning out_code out_text)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env TANDEM_TUNING=${tuning}
                          "${TANDEM}" check --backend optimized "${CASE}"
                  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_code} "${code}" PARENT_SCOPE)
  set(${out_text} "${out}${err}" PARENT_SCOPE)
endfunction()

set(file "${WORK}/tuning.json")
execute_process(COMMAND "${TANDEM}" tune --tiny --seconds 2 --threads 1 --out "${file}"
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
expect("tune" "${code}" "${out}${err}" 0 "tuning on" "prefill D=16: rows_per_tile"
       "decode D=16: no bit-neutral field" "wrote ${file}")
file(READ "${file}" json)
foreach(key "\"format\": 1" "\"vendor\"" "\"brand\"" "\"target\"" "\"classes\"")
  expect("tuning file" 0 "${json}" 0 "${key}")
endforeach()

check_with("${file}" code text)
expect("check with the tuned file" "${code}" "${text}" 0 "pass")
string(FIND "${text}" "ignored" at)
if(NOT at EQUAL -1)
  message(FATAL_ERROR "a file tuned here was ignored:\n${text}")
endif()

# --compare: a file with a tuned prefill class, timed beside the default.
string(REGEX REPLACE "\"classes\": \\[[^]]*\\]"
       "\"classes\": [{\"kind\": \"prefill\", \"D\": 16, \"rows_per_tile\": 64}]" tuned "${json}")
file(WRITE "${WORK}/tuned.json" "${tuned}")
execute_process(COMMAND "${TANDEM}" tune --tiny --seconds 1 --threads 1 --compare "${WORK}/tuned.json"
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
expect("tune --compare" "${code}" "${out}${err}" 0 "| prefill D=16 | 384 / 64 |" "| same |"
       "| decode D=16 | 384 (not tuned) |")
check_with("${WORK}/tuned.json" code text)
expect("check with a tuned class" "${code}" "${text}" 0 "pass")

string(REGEX REPLACE "\"vendor\": \"[^\"]*\"" "\"vendor\": \"OtherVendor\"" foreign "${json}")
file(WRITE "${WORK}/foreign.json" "${foreign}")
check_with("${WORK}/foreign.json" code text)
expect("check with a foreign file" "${code}" "${text}" 0 "pass"
       "tuning file ${WORK}/foreign.json was made on OtherVendor" "ignored, default geometry used")

file(WRITE "${WORK}/bad.json" "{\"format\": 1, \"cpu\": {\"vendor\": \"x\", \"brand\": \"\", \"target\": \"AVX2\", \"family\": 1, \"model\": 1}, \"classes\": [{\"kind\": \"prefill\", \"D\": 64, \"key_block\": 32}]}")
check_with("${WORK}/bad.json" code text)
expect("check with a malformed file" "${code}" "${text}" 2
       "tuning file ${WORK}/bad.json: classes[0].key_block is not a bit-neutral field")
