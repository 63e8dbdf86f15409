# LibTorch for the torch layer, the Python package and the tools built on them. Found, in order:
#  - a LibTorch directory or torch wheel the user names (-DCMAKE_PREFIX_PATH=<libtorch> as
#    LibTorch's own docs say, or -DTorch_DIR=...);
#  - the torch of the Python that builds chorus_torch: the project's environment (.venv, made by
#    scripts/install-deps.sh), else -DPython3_EXECUTABLE, else the active virtual environment or
#    the first python3 (its torch.utils.cmake_prefix_path).
# chorus is built and tested on torch 2.13 and 2.14, and asks for 2.13 or newer: the torch layer
# and the backend follow the C++ API of those releases (optimizer state keyed by TensorImpl,
# c10d::Backend's coalescing and splitting virtuals), which earlier 2.x releases lack in part.
# A CUDA build of torch is used through its CPU libraries alone (Note [torch's CPU libraries] in
# cmake/torch_cpu.cmake): chorus needs no CUDA toolkit.
set(CHORUS_MIN_TORCH 2.13)
include(${CMAKE_CURRENT_LIST_DIR}/torch_cpu.cmake)

# The torch installation's root (the directory holding include/, lib/ and share/cmake/Torch).
set(torch_root "")
if(Torch_DIR)
  get_filename_component(torch_root "${Torch_DIR}/../../.." ABSOLUTE)
else()
  find_path(torch_root_found share/cmake/Torch/TorchConfig.cmake PATHS ${CMAKE_PREFIX_PATH} NO_DEFAULT_PATH
            NO_CACHE)
  if(torch_root_found)
    set(torch_root "${torch_root_found}")
  elseif(CHORUS_PYTHON)
    execute_process(COMMAND "${CHORUS_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                    OUTPUT_VARIABLE python_torch_cmake OUTPUT_STRIP_TRAILING_WHITESPACE)
    get_filename_component(torch_root "${python_torch_cmake}/../.." ABSOLUTE)
  endif()
endif()
if(NOT torch_root)
  message(FATAL_ERROR "chorus: no LibTorch ${CHORUS_MIN_TORCH} or newer found. Run scripts/install-deps.sh (it "
                      "puts torch in .venv), pass -DCMAKE_PREFIX_PATH=<libtorch directory> or "
                      "-DPython3_EXECUTABLE=<a python with torch>, or build the core alone with "
                      "-DCHORUS_BUILD_TORCH=OFF")
endif()

chorus_torch_is_cuda("${torch_root}" CHORUS_TORCH_CPU_VIEW)
if(CHORUS_TORCH_CPU_VIEW)
  chorus_torch_cpu_target("${torch_root}")
  if(Torch_VERSION VERSION_LESS CHORUS_MIN_TORCH)
    message(FATAL_ERROR "chorus: needs torch ${CHORUS_MIN_TORCH} or newer; ${torch_root} holds ${Torch_VERSION}")
  endif()
  set(Torch_FOUND TRUE)
  message(STATUS "chorus: LibTorch ${Torch_VERSION} (a CUDA build, its CPU libraries) from ${TORCH_INSTALL_PREFIX}")
else()
  find_package(Torch ${CHORUS_MIN_TORCH} CONFIG REQUIRED HINTS "${torch_root}/share/cmake/Torch" NO_DEFAULT_PATH)
  message(STATUS "chorus: LibTorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX}")
endif()
