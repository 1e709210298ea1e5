# ctest driver (cmake -P): build megamoe CPU-only from MEGAMOE_SOURCE_DIR, install it into
# a temporary prefix under WORK_DIR, then configure, build and run the downstream project
# in this directory against that prefix with find_package(megamoe).
# Variables: MEGAMOE_SOURCE_DIR, WORK_DIR, GENERATOR, MAKE_PROGRAM (optional), CXX_COMPILER,
# SHARED (ON: build libmegamoe shared), DOWNSTREAM_DIR (default: this directory),
# PKG_CONFIG (optional: also build DOWNSTREAM_DIR/main.cpp with `pkg-config megamoe` flags).
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

if(NOT DEFINED SHARED)
  set(SHARED OFF)
endif()
if(NOT DEFINED DOWNSTREAM_DIR)
  set(DOWNSTREAM_DIR ${CMAKE_CURRENT_LIST_DIR})
endif()
# The shared form also proves that the library configures and builds with tests and tools
# requested but GoogleTest and CLI11 absent (they are skipped with a message).
if(SHARED)
  set(optional -DMEGAMOE_BUILD_TESTS=ON -DMEGAMOE_BUILD_TOOLS=ON -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON
               -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON)
else()
  set(optional -DMEGAMOE_BUILD_TESTS=OFF -DMEGAMOE_BUILD_TOOLS=OFF)
endif()
step(configure-library ${CMAKE_COMMAND} -S ${MEGAMOE_SOURCE_DIR} -B ${lib_build} ${common}
     -DMEGAMOE_ENABLE_CUDA=OFF ${optional} -DMEGAMOE_BUILD_PYTHON=OFF -DMEGAMOE_SHARED=${SHARED})
step(build-library ${CMAKE_COMMAND} --build ${lib_build} --parallel 2 --target megamoe)
step(install-library ${CMAKE_COMMAND} --install ${lib_build} --prefix ${prefix})
if(SHARED AND NOT EXISTS ${prefix}/lib/libmegamoe.so AND NOT EXISTS ${prefix}/lib64/libmegamoe.so)
  file(GLOB_RECURSE _so ${prefix}/*libmegamoe.so)
  if(NOT _so)
    message(FATAL_ERROR "[install test] SHARED=ON but no libmegamoe.so was installed under ${prefix}")
  endif()
endif()
step(configure-downstream ${CMAKE_COMMAND} -S ${DOWNSTREAM_DIR} -B ${ds_build} ${common}
     -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
step(build-downstream ${CMAKE_COMMAND} --build ${ds_build})
file(GLOB _exe ${ds_build}/megamoe_*)
list(FILTER _exe EXCLUDE REGEX "\\.(cmake|txt)$")
list(LENGTH _exe _n)
if(NOT _n EQUAL 1)
  message(FATAL_ERROR "[install test] expected one megamoe_* executable in ${ds_build}, got: ${_exe}")
endif()
step(run-downstream ${_exe})
if(PKG_CONFIG AND NOT SHARED)
  # The same program built from the pkg-config file alone (no CMake package).
  file(GLOB_RECURSE _pc ${prefix}/megamoe.pc)
  get_filename_component(_pcdir "${_pc}" DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} ${_pcdir})
  # No --define-variable: the file finds its prefix itself after `cmake --install --prefix`.
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs --static megamoe
                  OUTPUT_VARIABLE _flags
                  OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "[install test] pkg-config megamoe failed (${rc})")
  endif()
  string(FIND "${_flags}" "${prefix}" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "[install test] pkg-config megamoe flags do not point into ${prefix}: ${_flags}")
  endif()
  separate_arguments(_flags UNIX_COMMAND "${_flags}")
  step(build-pkg-config ${CXX_COMPILER} -std=c++17 ${DOWNSTREAM_DIR}/main.cpp -o ${WORK_DIR}/pc_downstream ${_flags})
  step(run-pkg-config ${WORK_DIR}/pc_downstream)
endif()
