# Note [torch's CPU libraries]: chorus uses no CUDA, but most torch wheels are CUDA builds, and
# their CMake config (TorchConfig.cmake, through Caffe2Config.cmake) refuses to load without a
# CUDA toolkit: it looks for nvcc's libraries (cudart, nvrtc, ...), which a machine without a GPU
# rarely has complete, and fails ("Your installed Caffe2 version uses CUDA but I cannot find the
# CUDA libraries"). The wheel's CPU side is the same as a CPU wheel's: headers under include/,
# libtorch_cpu.so and libc10.so under lib/ (which find the CUDA runtime they load themselves
# through their own run path, from the wheel's nvidia-* packages). So for such a torch chorus
# makes the target `torch` itself from those files, with the compile definitions torch's own
# export gives torch_cpu (Caffe2Targets.cmake), and never reads the CUDA part of the config.
#
# chorus_torch_cpu_target(<torch root>): defines the imported target `torch` (global) over the
# CPU libraries of the torch installed at <torch root> (a wheel's torch/ directory or a LibTorch
# download), and sets Torch_VERSION and TORCH_INSTALL_PREFIX in the caller's scope.
function(chorus_torch_cpu_target root)
  set(targets "${root}/share/cmake/Caffe2/Caffe2Targets.cmake")
  set(version_file "${root}/share/cmake/Torch/TorchConfigVersion.cmake")
  foreach(f "${targets}" "${version_file}" "${root}/lib/libtorch_cpu.so" "${root}/lib/libc10.so")
    if(NOT EXISTS "${f}")
      message(FATAL_ERROR "chorus: ${root} is not a torch installation: ${f} is missing")
    endif()
  endforeach()
  # torch_cpu's compile definitions, as torch exported them (USE_DISTRIBUTED, USE_C10D_GLOO, ...).
  file(READ "${targets}" text)
  string(REGEX MATCH "set_target_properties\\(torch_cpu PROPERTIES[^)]*INTERFACE_COMPILE_DEFINITIONS \"([^\"]*)\"" _
               "${text}")
  set(definitions "${CMAKE_MATCH_1}")
  file(STRINGS "${version_file}" version_line REGEX "set\\(PACKAGE_VERSION \"")
  string(REGEX MATCH "\"([^\"]+)\"" _ "${version_line}")
  set(version "${CMAKE_MATCH_1}")
  if(NOT TARGET torch)
    add_library(torch INTERFACE IMPORTED GLOBAL)
    set_target_properties(torch PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${root}/include;${root}/include/torch/csrc/api/include"
      INTERFACE_LINK_LIBRARIES "${root}/lib/libtorch_cpu.so;${root}/lib/libc10.so"
      INTERFACE_COMPILE_DEFINITIONS "${definitions}")
  endif()
  set(Torch_VERSION "${version}" PARENT_SCOPE)
  set(TORCH_INSTALL_PREFIX "${root}" PARENT_SCOPE)
endfunction()

# Whether the torch at <root> is a CUDA build (its config would ask for the CUDA toolkit).
function(chorus_torch_is_cuda root out)
  if(EXISTS "${root}/lib/libtorch_cuda.so")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()
