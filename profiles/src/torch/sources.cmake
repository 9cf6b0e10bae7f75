# zeroplan_profiles: the torch part of profiles/ (model zoo, profiler, probe). Included from
# profiles/CMakeLists.txt when ZEROPLAN_HAVE_TORCH. Sources listed explicitly, by owner.
add_library(zeroplan_profiles
  # zoo (registry, mlp, gpt, resnet, torchscript)
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/zoo/registry.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/zoo/mlp.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/zoo/gpt.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/zoo/resnet.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/zoo/torchscript.cpp
  # saved-tensor hooks (autograd engine subclass)
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/autograd/saved_tensors.cpp
  # profiler
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/profiler/counting_allocator.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/profiler/flops.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/profiler/profiler.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/profiler/devices.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/profiler/measure.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/profiler/timing.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/profiler/stats.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/profiler/cuda.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/profiler/host_heap.cpp
)
target_include_directories(zeroplan_profiles PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_link_libraries(zeroplan_profiles PUBLIC zeroplan_schema zeroplan::torch zeroplan_config PRIVATE fmt::fmt)
if(ZEROPLAN_HAVE_CUDA)
  target_link_libraries(zeroplan_profiles PUBLIC zeroplan::torch_cuda)
endif()
if(ZEROPLAN_HAVE_CUPTI)
  target_link_libraries(zeroplan_profiles PRIVATE zeroplan::cupti)
endif()
# torch/torch.h costs ~55 s per translation unit on this machine; precompile it once, here, for every
# torch target of the project (zeroplan_torch_sources in cmake/ZeroplanTorch.cmake).
target_precompile_headers(zeroplan_profiles PRIVATE <torch/torch.h>)
zeroplan_torch_sources(zeroplan_profiles BATCH 5)
zeroplan_warnings(zeroplan_profiles)
