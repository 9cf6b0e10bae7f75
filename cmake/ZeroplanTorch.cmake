# libtorch from the pinned PyPI wheel in .venv, as imported targets of our own.
#
# Why not find_package(Torch): for the CUDA wheel, TorchConfig links the local toolkit's nvrtc/cudart
# (13.0 in /usr/local/cuda) while libtorch itself loads the wheel's nvidia-*-cu13 libraries (13.2);
# a process must hold one CUDA runtime. So zeroplan links the wheel's libraries, compiles its CUDA,
# NCCL and CUPTI code against the wheel's headers (nvidia/cu13/include, nvidia/nccl/include), and puts
# the wheel's library folders first in RPATH. The local toolkit is what gates the CUDA code paths.
#
# Defines: zeroplan::torch (CPU libtorch + c10d Gloo), and when CUDA is on, zeroplan::torch_cuda
# (libtorch_cuda, c10_cuda, cudart), zeroplan::nccl, zeroplan::cupti.
set(_zp_tl "${ZEROPLAN_TORCH_DIR}/lib")
set(_zp_nv "${ZEROPLAN_SITE_PACKAGES}/nvidia")
foreach(lib torch torch_cpu c10)
  if(NOT EXISTS "${_zp_tl}/lib${lib}.so")
    message(FATAL_ERROR "zeroplan: ${_zp_tl}/lib${lib}.so missing; reinstall with scripts/setup.sh")
  endif()
endforeach()

add_library(zeroplan_torch INTERFACE)
add_library(zeroplan::torch ALIAS zeroplan_torch)
target_include_directories(zeroplan_torch SYSTEM INTERFACE
  "${ZEROPLAN_TORCH_DIR}/include" "${ZEROPLAN_TORCH_DIR}/include/torch/csrc/api/include")
# torch/include carries fmt 12 headers, which shadow Debian's fmt 9 in every torch translation unit;
# header-only mode makes those TUs self-contained (the torch-free libraries keep linking libfmt 9; the
# two live in different inline namespaces, fmt::v9 and fmt::v12).
target_compile_definitions(zeroplan_torch INTERFACE USE_DISTRIBUTED USE_C10D_GLOO _GLIBCXX_USE_CXX11_ABI=1 FMT_HEADER_ONLY=1)
target_link_libraries(zeroplan_torch INTERFACE
  "-Wl,--no-as-needed" "${_zp_tl}/libtorch_cpu.so" "${_zp_tl}/libtorch.so" "-Wl,--as-needed"
  "${_zp_tl}/libc10.so" Threads::Threads)
set(ZEROPLAN_RPATH "${_zp_tl}")

# CUDA, NCCL, CUPTI: AUTO turns each on when the wheel is a CUDA build and the toolkit is present.
set(_zp_want_cuda OFF)
if(ZEROPLAN_WITH_CUDA STREQUAL "ON" OR (ZEROPLAN_WITH_CUDA STREQUAL "AUTO" AND ZEROPLAN_TORCH_CUDA))
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    if(ZEROPLAN_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "zeroplan: ZEROPLAN_WITH_CUDA=ON but no CUDA toolkit was found: install the CUDA ${ZEROPLAN_TORCH_CUDA} toolkit (nvcc, in /usr/local/cuda) or configure with -DZEROPLAN_WITH_CUDA=OFF")
    endif()
  elseif(NOT ZEROPLAN_TORCH_CUDA)
    if(ZEROPLAN_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "zeroplan: ZEROPLAN_WITH_CUDA=ON but torch ${ZEROPLAN_TORCH_VERSION} in .venv is a CPU-only build: install the CUDA wheel pinned in requirements.txt")
    endif()
  else()
    string(REGEX MATCH "^[0-9]+" _zp_tk_major "${CUDAToolkit_VERSION}")
    string(REGEX MATCH "^[0-9]+" _zp_wh_major "${ZEROPLAN_TORCH_CUDA}")
    if(NOT _zp_tk_major STREQUAL _zp_wh_major)
      message(WARNING "zeroplan: CUDA toolkit ${CUDAToolkit_VERSION} and torch's CUDA ${ZEROPLAN_TORCH_CUDA} differ in major version; zeroplan still compiles against the wheel's headers and loads the wheel's runtime")
    endif()
    set(_zp_want_cuda ON)
  endif()
endif()

if(_zp_want_cuda)
  # Where the torch's CUDA runtime and CUPTI live: the cu13 wheels' nvidia/cu13; the cu12 wheels'
  # nvidia/cuda_runtime and nvidia/cuda_cupti (a torch installed by someone else, ZEROPLAN_TORCH_FROM);
  # else the local toolkit's (a torch that links the system CUDA).
  set(_zp_cu "${_zp_nv}/cu${_zp_wh_major}")
  set(_zp_cupti_dir "${_zp_cu}")
  if(NOT EXISTS "${_zp_cu}/include/cuda_runtime_api.h" AND EXISTS "${_zp_nv}/cuda_runtime/include/cuda_runtime_api.h")
    set(_zp_cu "${_zp_nv}/cuda_runtime")
    set(_zp_cupti_dir "${_zp_nv}/cuda_cupti")
  elseif(NOT EXISTS "${_zp_cu}/include/cuda_runtime_api.h" AND ZEROPLAN_TORCH_FROM)
    get_filename_component(_zp_cu "${CUDAToolkit_LIBRARY_DIR}" DIRECTORY)
    set(_zp_cupti_dir "${_zp_cu}/extras/CUPTI")
    message(STATUS "zeroplan: torch carries no CUDA runtime of its own; using the toolkit's in ${_zp_cu}")
  endif()
  find_library(ZEROPLAN_CUDART cudart NAMES libcudart.so.${_zp_wh_major} PATHS "${_zp_cu}/lib" "${_zp_cu}/lib64" NO_DEFAULT_PATH)
  if(NOT ZEROPLAN_CUDART OR NOT EXISTS "${_zp_cu}/include/cuda_runtime_api.h")
    message(FATAL_ERROR "zeroplan: the torch wheel's CUDA runtime (${_zp_cu}) is incomplete; reinstall with scripts/setup.sh")
  endif()
  add_library(zeroplan_torch_cuda INTERFACE)
  add_library(zeroplan::torch_cuda ALIAS zeroplan_torch_cuda)
  target_include_directories(zeroplan_torch_cuda SYSTEM INTERFACE "${_zp_cu}/include")
  # Some torch installs' runtime wheel carries cuda_runtime.h without the crt/ headers it includes (torch
  # 2.11's nvidia/cu13 on the lent GPU machines: "crt/host_config.h: No such file"); the local toolkit's
  # come after the wheel's then, so the wheel's runtime headers still win.
  if(NOT EXISTS "${_zp_cu}/include/crt/host_config.h")
    foreach(_zp_dir ${CUDAToolkit_INCLUDE_DIRS})
      if(EXISTS "${_zp_dir}/crt/host_config.h")
        target_include_directories(zeroplan_torch_cuda SYSTEM INTERFACE "${_zp_dir}")
        message(STATUS "zeroplan: ${_zp_cu}/include has no crt/ headers; taking them from the toolkit's ${_zp_dir}")
      endif()
    endforeach()
  endif()
  target_link_libraries(zeroplan_torch_cuda INTERFACE zeroplan_torch
    "-Wl,--no-as-needed" "${_zp_tl}/libtorch_cuda.so" "-Wl,--as-needed" "${_zp_tl}/libc10_cuda.so" "${ZEROPLAN_CUDART}")
  set(ZEROPLAN_HAVE_CUDA 1)
  list(PREPEND ZEROPLAN_RPATH "${_zp_cu}/lib")

  if(NOT ZEROPLAN_WITH_NCCL STREQUAL "OFF")
    find_library(ZEROPLAN_NCCL_LIB NAMES libnccl.so.2 nccl PATHS "${_zp_nv}/nccl/lib" NO_DEFAULT_PATH)
    if(ZEROPLAN_NCCL_LIB AND EXISTS "${_zp_nv}/nccl/include/nccl.h")
      add_library(zeroplan_nccl INTERFACE)
      add_library(zeroplan::nccl ALIAS zeroplan_nccl)
      target_include_directories(zeroplan_nccl SYSTEM INTERFACE "${_zp_nv}/nccl/include")
      target_link_libraries(zeroplan_nccl INTERFACE zeroplan_torch_cuda "${ZEROPLAN_NCCL_LIB}")
      target_compile_definitions(zeroplan_nccl INTERFACE USE_C10D_NCCL)
      set(ZEROPLAN_HAVE_NCCL 1)
      list(PREPEND ZEROPLAN_RPATH "${_zp_nv}/nccl/lib")
    elseif(ZEROPLAN_WITH_NCCL STREQUAL "ON")
      message(FATAL_ERROR "zeroplan: ZEROPLAN_WITH_NCCL=ON but the torch wheel carries no NCCL (nvidia-nccl-cu${_zp_wh_major}); reinstall with scripts/setup.sh")
    endif()
  endif()
  if(NOT ZEROPLAN_WITH_CUPTI STREQUAL "OFF")
    find_library(ZEROPLAN_CUPTI_LIB NAMES libcupti.so.${_zp_wh_major} cupti PATHS "${_zp_cupti_dir}/lib" "${_zp_cupti_dir}/lib64" NO_DEFAULT_PATH)
    if(ZEROPLAN_CUPTI_LIB AND EXISTS "${_zp_cupti_dir}/include/cupti.h")
      add_library(zeroplan_cupti INTERFACE)
      add_library(zeroplan::cupti ALIAS zeroplan_cupti)
      target_include_directories(zeroplan_cupti SYSTEM INTERFACE "${_zp_cupti_dir}/include")
      target_link_libraries(zeroplan_cupti INTERFACE zeroplan_torch_cuda "${ZEROPLAN_CUPTI_LIB}")
      set(ZEROPLAN_HAVE_CUPTI 1)
    elseif(ZEROPLAN_WITH_CUPTI STREQUAL "ON")
      message(FATAL_ERROR "zeroplan: ZEROPLAN_WITH_CUPTI=ON but the torch wheel carries no CUPTI (nvidia-cuda-cupti); reinstall with scripts/setup.sh")
    endif()
  endif()
else()
  foreach(opt NCCL CUPTI)
    if(ZEROPLAN_WITH_${opt} STREQUAL "ON")
      message(FATAL_ERROR "zeroplan: ZEROPLAN_WITH_${opt}=ON needs the CUDA code paths: install the CUDA toolkit (nvcc in /usr/local/cuda) and the CUDA torch wheel pinned in requirements.txt")
    endif()
  endforeach()
endif()

# The wheel's folders first, so the process loads the one runtime libtorch was built against.
set(CMAKE_BUILD_RPATH "${ZEROPLAN_RPATH}")
set(CMAKE_INSTALL_RPATH "${ZEROPLAN_RPATH}")
message(STATUS "zeroplan: torch ${ZEROPLAN_TORCH_VERSION} (CUDA '${ZEROPLAN_TORCH_CUDA}') from ${ZEROPLAN_TORCH_DIR}; CUDA=${ZEROPLAN_HAVE_CUDA} NCCL=${ZEROPLAN_HAVE_NCCL} CUPTI=${ZEROPLAN_HAVE_CUPTI}")

# zeroplan_torch_sources(target BATCH n): build settings for a target whose translation units include
# torch. torch/torch.h precompiled is ~900 MB and loading it costs ~11 s per translation unit on the
# 2-core machine, so (1) every torch target reuses ONE precompiled header, zeroplan_profiles' (a PCH
# is valid wherever the consumer defines at least the macros it was built with: exec's USE_C10D_NCCL
# and the tests' extra defines are fine), and (2) its sources compile as unity batches of n files, so
# the header is loaded once per batch. Issue #6 asks for a full build under 15 minutes.
function(zeroplan_torch_sources target)
  cmake_parse_arguments(ARG "" "BATCH" "" ${ARGN})
  if(NOT target STREQUAL "zeroplan_profiles")
    target_precompile_headers(${target} REUSE_FROM zeroplan_profiles)
  endif()
  if(ARG_BATCH)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${ARG_BATCH})
  endif()
endfunction()
