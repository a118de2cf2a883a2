# SPDX-License-Identifier: Apache-2.0
# expect(WHAT CODE TEXT WANT_CODE [FRAGMENT ...]): fails the test script unless
# a command named WHAT exited with WANT_CODE and its output TEXT holds every
# FRAGMENT. Shared by the command's test scripts.
function(expect what code text want_code)
  if(NOT code STREQUAL want_code)
    message(FATAL_ERROR "${what}: exit ${code}, expected ${want_code}\n${text}")
  endif()
  foreach(fragment ${ARGN})
    string(FIND "${text}" "${fragment}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${what}: output lacks '${fragment}'\n${text}")
    endif()
  endforeach()
endfunction()
