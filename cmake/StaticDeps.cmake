# Static Abseil, protobuf and GoogleTest from Debian's packages.
#
# Debian's Abseil CMake config imports the shared libraries; the static archives sit beside
# them. We link every libabsl_*.a inside one --start-group/--end-group so the linker pulls
# exactly the objects needed, whatever the inter-library order.

set(KILN_LIBDIR /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
if(NOT CMAKE_LIBRARY_ARCHITECTURE)
  set(KILN_LIBDIR /usr/lib/x86_64-linux-gnu)
endif()

file(GLOB KILN_ABSL_ARCHIVES ${KILN_LIBDIR}/libabsl_*.a)
if(NOT KILN_ABSL_ARCHIVES)
  message(FATAL_ERROR "No static Abseil archives in ${KILN_LIBDIR}: run scripts/setup.sh (installs libabsl-dev)")
endif()
find_library(KILN_PROTOBUF_A NAMES libprotobuf.a PATHS ${KILN_LIBDIR} NO_DEFAULT_PATH REQUIRED)
find_library(KILN_ZLIB_A NAMES libz.a PATHS ${KILN_LIBDIR} NO_DEFAULT_PATH REQUIRED)
find_library(KILN_GTEST_A NAMES libgtest.a PATHS ${KILN_LIBDIR} NO_DEFAULT_PATH REQUIRED)
find_library(KILN_GTEST_MAIN_A NAMES libgtest_main.a PATHS ${KILN_LIBDIR} NO_DEFAULT_PATH REQUIRED)
find_library(KILN_GMOCK_A NAMES libgmock.a PATHS ${KILN_LIBDIR} NO_DEFAULT_PATH REQUIRED)
find_program(KILN_PROTOC protoc REQUIRED)
find_package(Threads REQUIRED)

add_library(kiln_static_deps INTERFACE)
target_link_libraries(kiln_static_deps INTERFACE
  -Wl,--start-group ${KILN_PROTOBUF_A} ${KILN_ABSL_ARCHIVES} -Wl,--end-group
  ${KILN_ZLIB_A} Threads::Threads -static-libstdc++ -static-libgcc)

add_library(kiln_gtest INTERFACE)
target_link_libraries(kiln_gtest INTERFACE ${KILN_GTEST_MAIN_A} ${KILN_GMOCK_A} ${KILN_GTEST_A} kiln_static_deps)
