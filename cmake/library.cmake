# chorus_library(<target> EXPORT_NAME <name> [OUTPUT_NAME <file name>] SOURCES <files...>): one of
# chorus's libraries, as chorus::<name> here and in find_package(chorus), with its public headers
# in include/ and its private ones in src/ beside the CMakeLists.txt that declares it.
function(chorus_library target)
  cmake_parse_arguments(ARG "" "EXPORT_NAME;OUTPUT_NAME" "SOURCES" ${ARGN})
  add_library(${target} ${ARG_SOURCES})
  add_library(chorus::${ARG_EXPORT_NAME} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${ARG_EXPORT_NAME})
  if(ARG_OUTPUT_NAME)
    set_target_properties(${target} PROPERTIES OUTPUT_NAME ${ARG_OUTPUT_NAME})
  endif()
  target_include_directories(${target}
    PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:include>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endfunction()
