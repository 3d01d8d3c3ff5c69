# Installs normjit from BUILD_DIR into a scratch prefix, then configures, builds and runs
# examples/host_app against that installed package (find_package(normjit CONFIG)).
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/host_app -B ${WORK_DIR}/build -G ${GENERATOR}
    "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix;${PREFIX_PATH}")
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${CMAKE_COMMAND} -E env NORMJIT_CACHE_DIR=${WORK_DIR}/cache ${WORK_DIR}/build/host_app)
