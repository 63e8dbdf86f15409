# LibTorch for the torch layer, the Python package and the tools built on them. Found, in order:
#  - a LibTorch directory or torch wheel the user names (-DCMAKE_PREFIX_PATH=<libtorch> as
#    LibTorch's own docs say, or -DTorch_DIR=...);
#  - the torch of the Python that builds chorus_torch: the project's environment (.venv, made by
#    scripts/install-deps.sh), else -DPython3_EXECUTABLE, else the active virtual environment or
#    the first python3 (its torch.utils.cmake_prefix_path).
# chorus is built and tested on torch 2.13 and asks for it: the torch layer and the backend follow
# 2.13's C++ API (optimizer state keyed by TensorImpl, c10d::Backend's coalescing and splitting
# virtuals), which earlier 2.x releases lack in part. torch 1.13 is no longer supported.
set(CHORUS_MIN_TORCH 2.13)
find_package(Torch ${CHORUS_MIN_TORCH} CONFIG QUIET)
if(NOT Torch_FOUND)
  if(NOT CHORUS_PYTHON)
    message(FATAL_ERROR "chorus: no LibTorch ${CHORUS_MIN_TORCH} or newer found. Run scripts/install-deps.sh (it "
                        "puts torch 2.13 in .venv), pass -DCMAKE_PREFIX_PATH=<libtorch directory> or "
                        "-DPython3_EXECUTABLE=<a python with torch>, or build the core alone with "
                        "-DCHORUS_BUILD_TORCH=OFF")
  endif()
  execute_process(COMMAND "${CHORUS_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE python_torch_cmake OUTPUT_STRIP_TRAILING_WHITESPACE)
  find_package(Torch ${CHORUS_MIN_TORCH} CONFIG REQUIRED HINTS "${python_torch_cmake}/Torch" NO_DEFAULT_PATH)
endif()
message(STATUS "chorus: LibTorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX}")
