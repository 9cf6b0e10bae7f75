# zeroplan_warnings(target): warnings on and fatal in the project's own code. Third-party headers
# (torch, boost) come in as SYSTEM include directories, so they do not trip -Werror.
# -DZEROPLAN_WERROR=OFF keeps the warnings but not fatal: a machine with a newer compiler than the
# project's (the GPU kit's lent machines have GCC 13) still builds. GCC 13's -Wdangling-reference flags
# every function that returns a reference into an argument while a temporary is passed beside it
# (events_of(trace, "predicted")): a known false positive, off. GCC 12 at -O3 (CMake's Release) warns
# -Wrestrict inside <string>'s own inlined copies (GCC bug 105329, fixed in 13): off on GCC 12.
option(ZEROPLAN_WERROR "Treat the project's warnings as errors" ON)
function(zeroplan_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-error=deprecated-declarations)
  if(ZEROPLAN_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 13)
    target_compile_options(${target} PRIVATE -Wno-dangling-reference)
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
     AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
endfunction()
