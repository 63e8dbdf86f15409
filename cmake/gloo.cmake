# chorus's private gloo: built from source into chorus::core, every symbol hidden.
#
# Note [One gloo per process]
# torch's wheel compiles its own gloo into libtorch_cpu.so and exports it: `nm -D --defined-only
# libtorch_cpu.so` lists about 440 gloo:: symbols (gloo::allreduce, gloo::Context::Context,
# gloo::transport::tcp::...), and libtorch_cpu.so itself calls them through its PLT. A second
# gloo that is also exported (Debian's libgloo.so.0, say) puts two definitions of each name in one
# process: every call, torch's own included, binds to whichever copy the loader finds first, and
# the two gloo versions disagree on their classes' layouts (Horovod's memory corruption). So
# chorus links no shared gloo. It builds gloo from source as objects of chorus::core, compiled
# with hidden visibility, as is chorus's own code that includes gloo's headers
# (core/src/engine/gloo_engine.cc): chorus's calls bind to its copy when chorus is linked, and no
# chorus library or program exports a gloo symbol for torch's calls to find. A torch gloo group
# and chorus's gloo engine then work side by side in one process (tests/two_gloos.sh checks the
# exports and runs both at once, also under AddressSanitizer).
#
# The source: gloo's tree as Horovod 0.28.1 ships it in its source distribution on PyPI (gloo
# publishes no releases of its own), checked by its SHA-256. -DCHORUS_GLOO_SOURCE_DIR=<gloo tree>
# builds another; -DCHORUS_GLOO=OFF builds without the gloo engine.
option(CHORUS_GLOO "Build the gloo engine (cross-host groups over TCP) with chorus's own gloo" ON)
set(CHORUS_GLOO_SOURCE_DIR "" CACHE PATH "A gloo source tree (the directory holding gloo/); empty: download it")
set(CHORUS_GLOO_ARCHIVE_URL
    "https://files.pythonhosted.org/packages/e4/86/da559fcc1620ac7831a16ccb2ad3acb477a8da8a631f75a83b6410507210/horovod-0.28.1.tar.gz")
set(CHORUS_GLOO_ARCHIVE_SHA256 "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0")
set(CHORUS_HAVE_GLOO OFF)

function(chorus_fetch_gloo out_dir)
  set(archive "${CMAKE_BINARY_DIR}/_deps/horovod-0.28.1.tar.gz")
  set(tree "${CMAKE_BINARY_DIR}/_deps/horovod-0.28.1/third_party/gloo")
  if(NOT EXISTS "${tree}/gloo/context.h")
    # The hash is checked after the status: with EXPECTED_HASH, a download that fails (no network)
    # is a fatal "HASH mismatch" instead of the warning below.
    file(DOWNLOAD "${CHORUS_GLOO_ARCHIVE_URL}" "${archive}" STATUS status TLS_VERIFY ON)
    list(GET status 0 code)
    if(NOT code EQUAL 0)
      list(GET status 1 why)
      message(WARNING "chorus: could not download gloo's source (${why}) from ${CHORUS_GLOO_ARCHIVE_URL}; "
                      "building without the gloo engine (pass -DCHORUS_GLOO_SOURCE_DIR=<gloo tree>)")
      file(REMOVE "${archive}")
      return()
    endif()
    file(SHA256 "${archive}" got)
    if(NOT got STREQUAL CHORUS_GLOO_ARCHIVE_SHA256)
      file(REMOVE "${archive}")
      message(FATAL_ERROR "chorus: ${CHORUS_GLOO_ARCHIVE_URL} has SHA-256 ${got}, not the expected "
                          "${CHORUS_GLOO_ARCHIVE_SHA256}; pass -DCHORUS_GLOO_SOURCE_DIR=<gloo tree> or -DCHORUS_GLOO=OFF")
    endif()
    file(ARCHIVE_EXTRACT INPUT "${archive}" DESTINATION "${CMAKE_BINARY_DIR}/_deps"
         PATTERNS "horovod-0.28.1/third_party/gloo/gloo")
  endif()
  set(${out_dir} "${tree}" PARENT_SCOPE)
endfunction()

if(CHORUS_GLOO)
  set(gloo_root "${CHORUS_GLOO_SOURCE_DIR}")
  if(NOT gloo_root)
    chorus_fetch_gloo(gloo_root)
  endif()
endif()

if(CHORUS_GLOO AND gloo_root)
  set(g "${gloo_root}/gloo")
  add_library(chorus_gloo OBJECT
    ${g}/algorithm.cc ${g}/allgather.cc ${g}/allgatherv.cc ${g}/allreduce.cc ${g}/allreduce_local.cc
    ${g}/alltoall.cc ${g}/alltoallv.cc ${g}/barrier.cc ${g}/broadcast.cc ${g}/context.cc ${g}/gather.cc
    ${g}/gatherv.cc ${g}/reduce.cc ${g}/scatter.cc ${g}/types.cc
    ${g}/common/logging.cc ${g}/common/linux.cc
    ${g}/rendezvous/context.cc ${g}/rendezvous/file_store.cc ${g}/rendezvous/hash_store.cc
    ${g}/rendezvous/prefix_store.cc ${g}/rendezvous/store.cc
    ${g}/transport/address.cc ${g}/transport/buffer.cc ${g}/transport/context.cc ${g}/transport/device.cc
    ${g}/transport/pair.cc ${g}/transport/unbound_buffer.cc
    ${g}/transport/tcp/address.cc ${g}/transport/tcp/buffer.cc ${g}/transport/tcp/context.cc
    ${g}/transport/tcp/device.cc ${g}/transport/tcp/error.cc ${g}/transport/tcp/loop.cc ${g}/transport/tcp/pair.cc
    ${g}/transport/tcp/socket.cc ${g}/transport/tcp/unbound_buffer.cc)
  # gloo's config.h: the TCP transport only.
  set(GLOO_VERSION_MAJOR 0)
  set(GLOO_VERSION_MINOR 5)
  set(GLOO_VERSION_PATCH 0)
  foreach(flag GLOO_USE_CUDA GLOO_USE_NCCL GLOO_USE_ROCM GLOO_USE_RCCL GLOO_USE_REDIS GLOO_USE_IBVERBS GLOO_USE_MPI
               GLOO_USE_AVX GLOO_USE_LIBUV GLOO_HAVE_TRANSPORT_TCP_TLS GLOO_HAVE_TRANSPORT_IBVERBS
               GLOO_HAVE_TRANSPORT_UV)
    set(${flag} 0)
  endforeach()
  set(GLOO_HAVE_TRANSPORT_TCP 1)
  configure_file(${g}/config.h.in ${CMAKE_BINARY_DIR}/gloo_config/gloo/config.h)
  target_include_directories(chorus_gloo SYSTEM PUBLIC ${gloo_root} ${CMAKE_BINARY_DIR}/gloo_config)
  set_target_properties(chorus_gloo PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
                                               POSITION_INDEPENDENT_CODE ON)
  # Third-party code: its warnings are not ours to fix.
  target_compile_options(chorus_gloo PRIVATE -w)
  set(CHORUS_HAVE_GLOO ON)
endif()
