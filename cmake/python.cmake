# The Python with torch that builds chorus_torch and runs the tests that need Python, torchrun or
# torch.load: the project's environment (.venv, made by scripts/install-deps.sh), else
# -DPython3_EXECUTABLE, else the active virtual environment or the first python3.
# Sets CHORUS_PYTHON to it when it imports torch, else to "" (those tests are skipped, and the
# torch layer needs a LibTorch named with -DCMAKE_PREFIX_PATH).
if(NOT DEFINED Python3_EXECUTABLE AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  set(Python3_EXECUTABLE "${PROJECT_SOURCE_DIR}/.venv/bin/python")
endif()
find_package(Python3 COMPONENTS Interpreter)
set(CHORUS_PYTHON "")
if(Python3_Interpreter_FOUND)
  execute_process(COMMAND "${Python3_EXECUTABLE}" -c "import torch" RESULT_VARIABLE no_torch
                  OUTPUT_QUIET ERROR_QUIET)
  if(NOT no_torch)
    set(CHORUS_PYTHON "${Python3_EXECUTABLE}")
  endif()
endif()
