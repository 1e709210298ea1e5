# ctest driver (cmake -P): build megamoe CPU-only from MEGAMOE_SOURCE_DIR, install it into
# a temporary prefix under WORK_DIR, then configure, build and run the downstream project
# in this directory against that prefix with find_package(megamoe).
# Variables: MEGAMOE_SOURCE_DIR, WORK_DIR, GENERATOR, MAKE_PROGRAM (optional), CXX_COMPILER.
foreach(v MEGAMOE_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_install_test.cmake: ${v} is not set")
  endif()
endforeach()

set(lib_build ${WORK_DIR}/lib-build)
set(prefix ${WORK_DIR}/prefix)
set(ds_build ${WORK_DIR}/downstream-build)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

set(common -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if(MAKE_PROGRAM)
  list(APPEND common -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()

function(step name)
  message(STATUS "[install test] ${name}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "[install test] ${name} failed (${rc})")
  endif()
endfunction()

step(configure-library ${CMAKE_COMMAND} -S ${MEGAMOE_SOURCE_DIR} -B ${lib_build} ${common}
     -DMEGAMOE_ENABLE_CUDA=OFF -DMEGAMOE_BUILD_TESTS=OFF -DMEGAMOE_BUILD_TOOLS=OFF
     -DMEGAMOE_BUILD_PYTHON=OFF)
step(build-library ${CMAKE_COMMAND} --build ${lib_build} --parallel 2)
step(install-library ${CMAKE_COMMAND} --install ${lib_build} --prefix ${prefix})
step(configure-downstream ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR} -B ${ds_build} ${common}
     -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
step(build-downstream ${CMAKE_COMMAND} --build ${ds_build})
step(run-downstream ${ds_build}/megamoe_downstream)
