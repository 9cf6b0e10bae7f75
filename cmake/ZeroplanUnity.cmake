# zeroplan_unity(target [BATCH n]): compile the target's sources n at a time (CMake's unity build). Half
# the project's compile time was its torch-free sources parsing the same JSON, CLI11, fmt and GoogleTest
# headers again in every file: a fresh build of the torch-free half took 600 CPU-s one file at a time
# and about 240 in batches of 6 on the 2-core machine. File-local names (anonymous namespaces) must
# therefore differ between the files of one target. The torch targets batch through
# zeroplan_torch_sources (ZeroplanTorch.cmake), which also shares the torch precompiled header.
function(zeroplan_unity target)
  cmake_parse_arguments(ARG "" "BATCH" "" ${ARGN})
  if(NOT ARG_BATCH)
    set(ARG_BATCH 6)
  endif()
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${ARG_BATCH})
endfunction()
