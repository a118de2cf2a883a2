# The command line of `tandem`: --version, --help (with the per-op default
# tolerances), usage errors (exit 2), `run` writing .npy outputs, --json rows,
# and --backend optimized when it is not compiled in.
# Usage: cmake -DTANDEM=... -DVERSION=... -DCASES=... -DOPTIMIZED=ON|OFF -DWORK=... -P cli_test.cmake
cmake_minimum_required(VERSION 3.25)
function(run_tandem out_code out_text)
  execute_process(COMMAND "${TANDEM}" ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  set(${out_code} "${code}" PARENT_SCOPE)
  set(${out_text} "${out}${err}" PARENT_SCOPE)
endfunction()

include("${CMAKE_CURRENT_LIST_DIR}/expect.cmake")

run_tandem(code text --version)
expect("--version" "${code}" "${text}" 0 "${VERSION}")

run_tandem(code text --help)
expect("--help" "${code}" "${text}" 0 "check" "run" "attention_backward" "2e-04"
       "rtol" "atol" "Exit status")

run_tandem(code text)
expect("no subcommand" "${code}" "${text}" 2)
run_tandem(code text check)
expect("check without cases" "${code}" "${text}" 2 "CASE")
run_tandem(code text check --backend fastest ${CASES}/examples/swiglu)
expect("unknown backend" "${code}" "${text}" 2 "fastest")
run_tandem(code text frobnicate)
expect("unknown subcommand" "${code}" "${text}" 2)

# A case directory that does not exist is a case that cannot be run.
run_tandem(code text check --backend reference ${WORK}/no/such/case)
expect("missing case directory" "${code}" "${text}" 2 "case '${WORK}/no/such/case'"
       "is not a directory")

# check on a good case: a table with one row per backend and output.
run_tandem(code text check --backend reference ${CASES}/examples/swiglu)
expect("check swiglu" "${code}" "${text}" 0 "max abs err" "max rel err" "verdict"
       "reference  out" "pass")

# --json: one object per line on stdout, parseable.
execute_process(COMMAND "${TANDEM}" check --backend reference --json ${CASES}/examples/swiglu
                        ${CASES}/bad/unknown_op
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
expect("check --json" "${code}" "${out}${err}" 2)
string(REGEX MATCHALL "\n" newlines "${out}")
list(LENGTH newlines count)
if(NOT count EQUAL 2)
  message(FATAL_ERROR "--json: expected 2 lines, got ${count}\n${out}")
endif()
string(FIND "${out}" "\n" nl)
string(SUBSTRING "${out}" 0 ${nl} first)
math(EXPR nl "${nl} + 1")
string(SUBSTRING "${out}" ${nl} -1 second)
string(JSON verdict GET "${first}" verdict)
string(JSON output GET "${first}" output)
string(JSON rtol_type TYPE "${first}" rtol)
if(NOT verdict STREQUAL "pass" OR NOT output STREQUAL "out" OR NOT rtol_type STREQUAL "NUMBER")
  message(FATAL_ERROR "--json: unexpected first object ${first}")
endif()
string(JSON verdict GET "${second}" verdict)
string(JSON error GET "${second}" error)
if(NOT verdict STREQUAL "error")
  message(FATAL_ERROR "--json: unexpected second object ${second}")
endif()

# A mismatch and an error together: the error wins (exit 2).
run_tandem(code text check --backend reference ${CASES}/formats/mismatch_reported
           ${CASES}/bad/unknown_op)
expect("mismatch + error" "${code}" "${text}" 2 "FAIL" "ERROR")

# run: writes <output>.npy for every output of the op; the written file is a
# valid case input again (rewrite the case to expect it).
file(REMOVE_RECURSE "${WORK}")
run_tandem(code text run ${CASES}/examples/swiglu --backend reference --out ${WORK}/out)
expect("run" "${code}" "${text}" 0 "out.npy")
if(NOT EXISTS "${WORK}/out/out.npy")
  message(FATAL_ERROR "run did not write ${WORK}/out/out.npy")
endif()
file(MAKE_DIRECTORY "${WORK}/again")
file(COPY "${CASES}/examples/swiglu/x.npy" DESTINATION "${WORK}/again")
file(COPY "${WORK}/out/out.npy" DESTINATION "${WORK}/again")
file(WRITE "${WORK}/again/case.json"
     [=[{"op": "swiglu", "inputs": {"x": "x.npy"}, "expected": {"out": "out.npy"},
        "tolerance": {"rtol": 0, "atol": 0}}]=])
run_tandem(code text check --backend reference ${WORK}/again)
expect("check of run's output" "${code}" "${text}" 0 "pass")
run_tandem(code text run ${CASES}/bad/unknown_op --out ${WORK}/bad)
expect("run on a bad case" "${code}" "${text}" 2 "unknown op")

if(NOT OPTIMIZED)
  run_tandem(code text check --backend optimized ${CASES}/examples/swiglu)
  expect("--backend optimized without it" "${code}" "${text}" 2 "not available")
  run_tandem(code text run ${CASES}/examples/swiglu --backend optimized --out ${WORK}/opt)
  expect("run --backend optimized without it" "${code}" "${text}" 2 "not available")
endif()
