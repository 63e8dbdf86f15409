# cmake --install: the libraries, their headers, the tools, and a package config so that
# find_package(chorus CONFIG) works from any other project.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(chorus_libraries chorus_core)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/core/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(CHORUS_BUILD_TORCH)
  list(APPEND chorus_libraries chorus_groups chorus_torch)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/torch/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()
install(TARGETS ${chorus_libraries} EXPORT chorusTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(chorus_config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/chorus)
install(EXPORT chorusTargets NAMESPACE chorus:: DESTINATION ${chorus_config_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/chorusConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/chorusConfig.cmake INSTALL_DESTINATION ${chorus_config_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/chorusConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/chorusConfig.cmake ${PROJECT_BINARY_DIR}/chorusConfigVersion.cmake
        DESTINATION ${chorus_config_dir})
install(FILES ${PROJECT_SOURCE_DIR}/cmake/torch_cpu.cmake DESTINATION ${chorus_config_dir} RENAME chorus_torch_cpu.cmake)

# CI checks that an out-of-tree project builds against the installed package and runs.
if(CHORUS_BUILD_TESTS AND CHORUS_BUILD_TORCH)
  add_test(NAME install_and_find_package
           COMMAND ${PROJECT_SOURCE_DIR}/tests/install_consumer/check.sh ${PROJECT_BINARY_DIR}
                   ${PROJECT_BINARY_DIR}/install-check ${CHORUS_PYTHON})
  set_tests_properties(install_and_find_package PROPERTIES TIMEOUT 600)
endif()
