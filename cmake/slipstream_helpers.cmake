# slipstream_library(NAME ALIAS SOURCES...): a static library with our
# warnings; with SLIPSTREAM_UNITY_BUILD its C++ sources are compiled eight
# (SLIPSTREAM_UNITY_BATCH) to a translation unit, so that the Torch templates
# they share are instantiated and optimised once a batch rather than once a
# file. That asks each file's helpers in unnamed namespaces to have names of
# their own.
function(slipstream_library name alias)
  add_library(${name} STATIC ${ARGN})
  add_library(${alias} ALIAS ${name})
  target_compile_options(${name} PRIVATE ${SLIPSTREAM_WARNINGS})
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(SLIPSTREAM_UNITY_BUILD)
    set_target_properties(${name} PROPERTIES UNITY_BUILD ON
      UNITY_BUILD_BATCH_SIZE ${SLIPSTREAM_UNITY_BATCH})
  endif()
endfunction()

# slipstream_test(FILE [LIBS...]): one GoogleTest executable per test file,
# named after it. Tests whose name ends in _CUDA need a GPU; the CTest entry
# filters them out when none is present (as LibTorch's own C++ tests do),
# and scripts/gpu_check.sh runs them on a GPU machine.
function(slipstream_test file)
  get_filename_component(name ${file} NAME_WE)
  add_executable(${name} ${file})
  target_link_libraries(${name} PRIVATE ${ARGN} GTest::gtest GTest::gtest_main)
  target_compile_options(${name} PRIVATE ${SLIPSTREAM_WARNINGS})
  target_precompile_headers(${name} REUSE_FROM slipstream_test_pch)
  add_test(NAME ${name} COMMAND ${name})
  # _CUDA tests need a GPU; they skip themselves where none is present.
  set_tests_properties(${name} PROPERTIES TIMEOUT 900
    ENVIRONMENT "SLIPSTREAM_BIN=$<$<TARGET_EXISTS:slipstream>:$<TARGET_FILE:slipstream>>")
endfunction()
