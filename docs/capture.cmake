# Runs one command and writes what a terminal would show into OUT, for a page
# to include: the command line, its output and its exit status. Fails when
# the exit status is not EXPECT, so a page never shows a stale transcript.
#   cmake -DOUT=file -DEXPECT=0 -DSHOW="tandem check ..." -DWORKDIR=dir -P capture.cmake -- cmd args...
set(cmd)
set(after_dashes FALSE)
foreach(i RANGE ${CMAKE_ARGC})
  if(after_dashes AND DEFINED CMAKE_ARGV${i})
    list(APPEND cmd "${CMAKE_ARGV${i}}")
  elseif("${CMAKE_ARGV${i}}" STREQUAL "--")
    set(after_dashes TRUE)
  endif()
endforeach()
execute_process(COMMAND ${cmd} WORKING_DIRECTORY "${WORKDIR}"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT "${rc}" STREQUAL "${EXPECT}")
  message(FATAL_ERROR "${SHOW}: exit status ${rc}, the page expects ${EXPECT}\n${out}${err}")
endif()
file(WRITE "${OUT}" "$ ${SHOW}\n${out}${err}$ echo $?\n${rc}\n")
