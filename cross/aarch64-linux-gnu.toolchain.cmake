# CMake toolchain file: Debian's aarch64-linux-gnu cross gcc (gcc-aarch64-linux-gnu).
# Baseline -march is cached (armv8-a: runs on Orin's Cortex-A78AE and every Armv8 core);
# never -march=native.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CUVIL_CROSS_PREFIX "aarch64-linux-gnu-" CACHE STRING "cross compiler prefix")
set(CMAKE_C_COMPILER "${CUVIL_CROSS_PREFIX}gcc")
set(CMAKE_CXX_COMPILER "${CUVIL_CROSS_PREFIX}g++")
set(CUVIL_BASELINE_MARCH "armv8-a" CACHE STRING "baseline -march of the library")

if(NOT DEFINED CMAKE_SYSROOT AND DEFINED ENV{CUVIL_SYSROOT})
  set(CMAKE_SYSROOT "$ENV{CUVIL_SYSROOT}")
endif()
set(CMAKE_FIND_ROOT_PATH "/usr/aarch64-linux-gnu")
if(NOT CMAKE_FIND_ROOT_PATH_MODE_PROGRAM)
  set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
endif()
if(NOT CMAKE_FIND_ROOT_PATH_MODE_LIBRARY)
  set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
endif()
if(NOT CMAKE_FIND_ROOT_PATH_MODE_INCLUDE)
  set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
endif()
if(NOT CMAKE_FIND_ROOT_PATH_MODE_PACKAGE)
  set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
endif()
