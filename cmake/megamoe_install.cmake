# `cmake --install <build> --prefix P`: the shared library (SONAME libmegamoe.so.<ABI>), the public
# headers, the `megamoe` CLI, pkg-config's megamoe.pc, the CMake package megamoe::megamoe and,
# when built, the Torch adapter. Everything is relative to the prefix, so P may be chosen at
# install time (the .pc file finds its prefix through ${pcfiledir}).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MEGAMOE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/megamoe)

install(TARGETS megamoe EXPORT megamoeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/megamoe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev FILES_MATCHING PATTERN "*.h")
install(TARGETS megamoe_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
if(TARGET megamoe_torch)
  install(TARGETS megamoe_torch LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT torch)
endif()

# CMake package: find_package(megamoe) -> imported target megamoe::megamoe.
install(EXPORT megamoeTargets NAMESPACE megamoe:: DESTINATION ${MEGAMOE_CMAKE_DIR}
        COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/templates/megamoeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/megamoeConfig.cmake
                              INSTALL_DESTINATION ${MEGAMOE_CMAKE_DIR})
# 0.x: a minor release may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/megamoeConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/megamoeConfig.cmake
              ${PROJECT_BINARY_DIR}/megamoeConfigVersion.cmake
        DESTINATION ${MEGAMOE_CMAKE_DIR} COMPONENT dev)

# pkg-config: prefix relative to the .pc file's own directory.
file(RELATIVE_PATH MEGAMOE_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" MEGAMOE_PC_TO_PREFIX "${MEGAMOE_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/templates/megamoe.pc.in
               ${PROJECT_BINARY_DIR}/megamoe.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/megamoe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)
