# ctest driver (cmake -P): the CUDA architectures a plain configure picks. With
# MEGAMOE_CUDA_ARCHITECTURES=auto (the default) only the GPUs present are built for, and
# without a GPU the CUDA backend is left out, so that the main job and `pip install .` on a
# machine without a GPU never compile device code nothing can run. nvidia-smi is replaced
# by a script on PATH that reports the GPUs of each case.
# Variables: MEGAMOE_SOURCE_DIR, WORK_DIR, GENERATOR, MAKE_PROGRAM (optional).
foreach(v MEGAMOE_SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "cuda_architectures.cmake: ${v} is not set")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR}/nogpu ${WORK_DIR}/gpus)
file(WRITE ${WORK_DIR}/nogpu/nvidia-smi "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
file(WRITE ${WORK_DIR}/gpus/nvidia-smi "#!/bin/sh\nprintf '9.0\\n9.0\\n10.0\\n'\n")
foreach(d nogpu gpus)
  file(CHMOD ${WORK_DIR}/${d}/nvidia-smi PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
endforeach()
set(common -G ${GENERATOR} -DMEGAMOE_BUILD_TESTS=OFF -DMEGAMOE_BUILD_TOOLS=OFF -DMEGAMOE_BUILD_PYTHON=OFF)
if(MAKE_PROGRAM)
  list(APPEND common -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()

# The status line of a configure with nvidia-smi from @p smi_dir and the extra arguments.
function(configure_line out name smi_dir)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env "PATH=${WORK_DIR}/${smi_dir}:$ENV{PATH}"
            ${CMAKE_COMMAND} -S ${MEGAMOE_SOURCE_DIR} -B ${WORK_DIR}/${name} ${common} ${ARGN}
    OUTPUT_VARIABLE text ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "[cuda architectures] ${name}: configure failed (${rc}):\n${text}\n${err}")
  endif()
  string(REGEX MATCH "megamoe: CUDA backend [^\n]*" line "${text}")
  message(STATUS "[cuda architectures] ${name}: ${line}")
  set(${out} "${line}" PARENT_SCOPE)
endfunction()

configure_line(explicit explicit nogpu -DMEGAMOE_CUDA_ARCHITECTURES=89)
if(explicit STREQUAL "megamoe: CUDA backend OFF")
  message(STATUS "SKIPPED: no CUDA compiler here, nothing to choose architectures for")
  return()
endif()
function(expect name got want)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "[cuda architectures] ${name}: expected '${want}', got '${got}'")
  endif()
endfunction()
expect(explicit "${explicit}" "megamoe: CUDA backend ON, architectures 89")
configure_line(nogpu nogpu nogpu)
expect(nogpu "${nogpu}" "megamoe: CUDA backend OFF")
configure_line(gpus gpus gpus)
expect(gpus "${gpus}" "megamoe: CUDA backend ON, architectures 90;100")
configure_line(forced forced nogpu -DMEGAMOE_ENABLE_CUDA=ON)
expect(forced "${forced}" "megamoe: CUDA backend ON, architectures 80;89;90;100")
