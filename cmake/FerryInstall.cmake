# cmake --install: the libraries, the backend modules, the public headers, ferryrun and ferry-info, a CMake package
# with components (find_package(ferry COMPONENTS parcel amt parcel_mpi)) and one pkg-config file
# per library (ferry, ferry-parcel, ferry-amt, ferry-parcel-mpi). Included from the top level
# once every target exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_ferry_libraries ferry ferry_parcel ferry_amt)
set(FERRY_COMPONENTS parcel amt)
if(TARGET ferry_parcel_mpi)
  list(APPEND _ferry_libraries ferry_parcel_mpi)
  list(APPEND FERRY_COMPONENTS parcel_mpi)
endif()

# The installed tree finds its own libraries wherever it is moved: libraries next to each other,
# programs in ../lib. Build-tree binaries keep their build RPATH.
set_target_properties(${_ferry_libraries} PROPERTIES INSTALL_RPATH "$ORIGIN")
set_target_properties(ferry-info PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")

# The backend modules, in lib/ferry/ beside libferry, which finds them from its own path.
get_property(_ferry_modules GLOBAL PROPERTY FERRY_BACKEND_MODULES)
if(_ferry_modules)
  set_target_properties(${_ferry_modules} PROPERTIES INSTALL_RPATH "$ORIGIN/..")
  install(TARGETS ${_ferry_modules} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/ferry)
endif()

install(TARGETS ${_ferry_libraries} EXPORT ferryTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# ferry/parcel_mpi.hpp declares what libferry_parcel_mpi defines: shipped only with it.
if(TARGET ferry_parcel_mpi)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ferry DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
else()
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ferry DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          PATTERN parcel_mpi.hpp EXCLUDE)
endif()

install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ferryConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ferryConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ferryConfig.cmake ${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)

# pkg-config: the core from its own template, each layer above from one shared template.
# The prefix as seen from the .pc files' folder, however deep the lib directory is
# (lib, lib64, lib/x86_64-linux-gnu), so the installed tree can move.
file(RELATIVE_PATH FERRY_PC_PREFIX_FROM_PCDIR "${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig"
     "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/$" "" FERRY_PC_PREFIX_FROM_PCDIR "${FERRY_PC_PREFIX_FROM_PCDIR}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/ferry.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/ferry.pc @ONLY)
set(_ferry_pc_files ${PROJECT_BINARY_DIR}/pkgconfig/ferry.pc)
function(ferry_layer_pc name lib requires description)
  set(FERRY_PC_NAME ${name})
  set(FERRY_PC_LIB ${lib})
  set(FERRY_PC_REQUIRES ${requires})
  set(FERRY_PC_DESCRIPTION "${description}")
  configure_file(${PROJECT_SOURCE_DIR}/cmake/ferry-layer.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${name}.pc @ONLY)
endfunction()
ferry_layer_pc(ferry-parcel ferry_parcel ferry "ferry's parcel layer: parcelports for AMT runtimes")
ferry_layer_pc(ferry-amt ferry_amt ferry-parcel "ferry's small AMT runtime: actions, futures, termination")
list(APPEND _ferry_pc_files ${PROJECT_BINARY_DIR}/pkgconfig/ferry-parcel.pc ${PROJECT_BINARY_DIR}/pkgconfig/ferry-amt.pc)
if(TARGET ferry_parcel_mpi)
  ferry_layer_pc(ferry-parcel-mpi ferry_parcel_mpi ferry-parcel
                 "ferry's MPI baseline parcelports (HPX's MPI parcelport, over MPICH)")
  list(APPEND _ferry_pc_files ${PROJECT_BINARY_DIR}/pkgconfig/ferry-parcel-mpi.pc)
endif()
install(FILES ${_ferry_pc_files} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
