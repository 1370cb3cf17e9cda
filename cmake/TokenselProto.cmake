# tokensel_proto_library(<name> ROOT <dir> PROTOS <path relative to ROOT>...)
#
# The one protoc rule: a static library <name> of the C++ messages and gRPC
# stubs generated from PROTOS. Each <path>/x.proto becomes
# ${CMAKE_CURRENT_BINARY_DIR}/gen/<path>/x{.pb,.grpc.pb}.{h,cc}, and the gen
# directory is the library's (SYSTEM) include directory, so code includes
# "<path>/x.grpc.pb.h": the include path is the proto's path under ROOT.
function(tokensel_proto_library name)
  cmake_parse_arguments(ARG "" "ROOT" "PROTOS" ${ARGN})
  set(_out "${CMAKE_CURRENT_BINARY_DIR}/gen")
  set(_gen "")
  set(_abs "")
  foreach(_p ${ARG_PROTOS})
    string(REGEX REPLACE "\\.proto$" "" _stem "${_p}")
    list(APPEND _gen "${_out}/${_stem}.pb.cc" "${_out}/${_stem}.pb.h"
                     "${_out}/${_stem}.grpc.pb.cc" "${_out}/${_stem}.grpc.pb.h")
    list(APPEND _abs "${ARG_ROOT}/${_p}")
  endforeach()
  add_custom_command(
    OUTPUT ${_gen}
    COMMAND ${CMAKE_COMMAND} -E make_directory "${_out}"
    COMMAND protobuf::protoc --proto_path=${ARG_ROOT} --cpp_out=${_out} --grpc_out=${_out}
      --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>
      ${_abs}
    DEPENDS ${_abs} protobuf::protoc gRPC::grpc_cpp_plugin
    COMMENT "Generating C++ for ${ARG_PROTOS}"
    VERBATIM)
  add_library(${name} STATIC ${_gen})
  target_include_directories(${name} SYSTEM PUBLIC $<BUILD_INTERFACE:${_out}>)
  target_link_libraries(${name} PUBLIC protobuf::libprotobuf gRPC::grpc++)
endfunction()
