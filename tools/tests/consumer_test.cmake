# Installs a tandem build into a scratch prefix, then configures, builds and
# runs tests/consumer against it with find_package(tandem), as a user would.
# Usage: cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK=... -DGENERATOR=...
#              -DCXX=... -DBUILD_TYPE=... [-DSANITIZE=ON] -P consumer_test.cmake
cmake_minimum_required(VERSION 3.25)

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${what}:\n${out}${err}")
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit ${code})")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK}")
set(prefix "${WORK}/prefix")
step("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(f include/tandem/tandem.hpp include/tandem/reference/backend.hpp bin/tandem)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "the install lacks ${f}")
  endif()
endforeach()
file(GLOB config "${prefix}/lib*/cmake/tandem/tandemConfig.cmake")
if(NOT config)
  message(FATAL_ERROR "the install lacks lib/cmake/tandem/tandemConfig.cmake")
endif()
step("installed tandem --version" "${prefix}/bin/tandem" --version)

set(flags "")
if(SANITIZE)
  set(flags -DCMAKE_CXX_FLAGS=-fsanitize=address,undefined
            -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined)
endif()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()
step("configure the consumer" ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK}/build"
     -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
     "-DCMAKE_PREFIX_PATH=${prefix}" ${flags})
step("build the consumer" ${CMAKE_COMMAND} --build "${WORK}/build")
step("run the consumer" "${WORK}/build/consumer")
