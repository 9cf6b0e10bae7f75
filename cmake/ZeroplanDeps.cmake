# Every dependency is found here, none is downloaded. scripts/setup.sh installs them.
find_package(nlohmann_json 3.10 REQUIRED)
find_package(fmt REQUIRED)
find_package(Boost 1.74 REQUIRED)  # Boost.Graph is header-only for what the simulator uses
find_package(Threads REQUIRED)
find_package(CLI11 REQUIRED)  # the command line (cli/), torch-free itself
if(ZEROPLAN_BUILD_TESTS)
  find_package(GTest REQUIRED)
  find_package(benchmark REQUIRED)
endif()

# The torch pin lives in requirements.txt; read it so CMake refuses any other libtorch.
file(STRINGS ${PROJECT_SOURCE_DIR}/requirements.txt _zp_torch_pin REGEX "^torch==")
string(REPLACE "torch==" "" ZEROPLAN_TORCH_PIN "${_zp_torch_pin}")

set(ZEROPLAN_HAVE_TORCH 0)
set(ZEROPLAN_HAVE_CUDA 0)
set(ZEROPLAN_HAVE_NCCL 0)
set(ZEROPLAN_HAVE_CUPTI 0)
set(ZEROPLAN_TORCH_VERSION "")

if(ZEROPLAN_WITH_TORCH)
  # ZEROPLAN_TORCH_FROM=<python>: build against the torch already installed in that Python (a GPU machine
  # with a CUDA torch and no network, scripts/gpu-check.sh) instead of the wheel pinned in .venv; the pin
  # is then not enforced, and the torch version goes into zeroplan/config.h and every document's
  # library_versions as always.
  set(ZEROPLAN_TORCH_FROM "" CACHE FILEPATH "A Python whose installed torch to build against instead of the pinned wheel in .venv")
  if(ZEROPLAN_TORCH_FROM)
    set(ZEROPLAN_PYTHON "${ZEROPLAN_TORCH_FROM}" CACHE FILEPATH "Python of the venv holding the torch wheel" FORCE)
    if(NOT EXISTS "${ZEROPLAN_PYTHON}")
      message(FATAL_ERROR "zeroplan: ZEROPLAN_TORCH_FROM=${ZEROPLAN_TORCH_FROM} does not exist; give the path of a Python that can import torch")
    endif()
  endif()
  set(ZEROPLAN_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH "Python of the venv holding the torch wheel")
  if(NOT EXISTS "${ZEROPLAN_PYTHON}")
    message(FATAL_ERROR "zeroplan: no Python at ${ZEROPLAN_PYTHON}; run scripts/setup.sh (it installs torch==${ZEROPLAN_TORCH_PIN} into .venv), or configure with -DZEROPLAN_WITH_TORCH=OFF")
  endif()
  execute_process(COMMAND "${ZEROPLAN_PYTHON}" -W ignore -c "import torch,os;print(torch.__version__.split('+')[0]);print(torch.utils.cmake_prefix_path);print(os.path.dirname(torch.__file__));print(torch.version.cuda or '')"
    OUTPUT_VARIABLE _zp_torch_info RESULT_VARIABLE _zp_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _zp_rc EQUAL 0)
    message(FATAL_ERROR "zeroplan: ${ZEROPLAN_PYTHON} cannot import torch; run scripts/setup.sh")
  endif()
  string(REPLACE "\n" ";" _zp_torch_info "${_zp_torch_info}")
  list(GET _zp_torch_info 0 ZEROPLAN_TORCH_VERSION)
  list(GET _zp_torch_info 1 _zp_torch_prefix)
  list(GET _zp_torch_info 2 ZEROPLAN_TORCH_DIR)
  list(LENGTH _zp_torch_info _zp_n)
  set(ZEROPLAN_TORCH_CUDA "")
  if(_zp_n GREATER 3)
    list(GET _zp_torch_info 3 ZEROPLAN_TORCH_CUDA)
  endif()
  if(NOT ZEROPLAN_TORCH_VERSION STREQUAL ZEROPLAN_TORCH_PIN AND ZEROPLAN_TORCH_FROM)
    message(WARNING "zeroplan: building against torch ${ZEROPLAN_TORCH_VERSION} (CUDA '${ZEROPLAN_TORCH_CUDA}') from ${ZEROPLAN_PYTHON} (ZEROPLAN_TORCH_FROM), not the torch==${ZEROPLAN_TORCH_PIN} pinned in requirements.txt")
  elseif(NOT ZEROPLAN_TORCH_VERSION STREQUAL ZEROPLAN_TORCH_PIN)
    message(FATAL_ERROR "zeroplan: torch ${ZEROPLAN_TORCH_VERSION} in ${ZEROPLAN_PYTHON} but requirements.txt pins ${ZEROPLAN_TORCH_PIN}; run scripts/setup.sh")
  endif()
  get_filename_component(ZEROPLAN_SITE_PACKAGES "${ZEROPLAN_TORCH_DIR}" DIRECTORY)
  include(ZeroplanTorch)
  set(ZEROPLAN_HAVE_TORCH 1)
endif()
