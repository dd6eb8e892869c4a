# The folder layers of DESIGN.md §2, checked on every build: each rule names a folder and the
# include prefixes its sources may not use. A crossing include fails the build, naming the file,
# the line and the rule.
#   cmake -DSOURCE_DIR=<repository root> -P cmake/check_layering.cmake
# Includes are written from the repository root ("engine/weights.h"), so a prefix is a folder.
# The generated protobuf and gRPC headers are "gcmoe/v1/..." and "grpc/health/v1/...".
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "check_layering.cmake: pass -DSOURCE_DIR=<repository root>")
endif()

set(gcmoe_rpc_and_json "gcmoe/;grpc/;grpcpp/;google/protobuf/;nlohmann/;.*\\.pb\\.h$")

# Each rule: a folder, the include patterns (regular expressions, anchored at the start of the
# included path) it may not use, and the rule in words.
set(rules common server client kernels balancer engine)
set(common_forbidden "config/;balancer/;engine/;kernels/;server/;client/;tools/;bench/;tests/")
set(common_text "common/ includes nothing of ours outside common/")
set(server_forbidden "client/;tools/;bench/")
set(server_text "server/ includes nothing from client/, tools/ or bench/")
set(client_forbidden "engine/;kernels/;balancer/;server/;tools/")
set(client_text "client/ includes nothing from engine/, kernels/, balancer/, server/ or tools/")
set(kernels_forbidden
  "config/;balancer/;engine/;server/;client/;tools/;bench/;tests/;proto/;${gcmoe_rpc_and_json}")
set(kernels_text "kernels/ includes no gRPC, protobuf or nlohmann headers and nothing of ours \
outside kernels/ and common/")
set(balancer_forbidden
  "config/;engine/;kernels/;server/;client/;tools/;bench/;tests/;proto/;gcmoe/;.*\\.pb\\.h$")
set(balancer_text "balancer/ includes nothing of ours outside balancer/ and common/")
set(engine_forbidden "server/;client/;tools/")
set(engine_text "engine/ includes nothing from server/, client/ or tools/")

set(violations 0)
foreach(layer IN LISTS rules)
  file(GLOB_RECURSE sources LIST_DIRECTORIES false RELATIVE ${SOURCE_DIR}
    ${SOURCE_DIR}/${layer}/*.h ${SOURCE_DIR}/${layer}/*.cc ${SOURCE_DIR}/${layer}/*.cuh
    ${SOURCE_DIR}/${layer}/*.cu ${SOURCE_DIR}/${layer}/*.hpp ${SOURCE_DIR}/${layer}/*.cpp)
  foreach(source IN LISTS sources)
    file(READ ${SOURCE_DIR}/${source} text)
    # One list element per line: characters that mean something in a CMake list go first.
    string(REPLACE ";" "," text "${text}")
    string(REPLACE "\\" "/" text "${text}")
    string(REGEX REPLACE "[][]" "_" text "${text}")
    string(REPLACE "\n" ";" lines "${text}")
    set(number 0)
    foreach(line IN LISTS lines)
      math(EXPR number "${number} + 1")
      if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"]")
        continue()
      endif()
      set(included "${CMAKE_MATCH_1}")
      foreach(pattern IN LISTS ${layer}_forbidden)
        if(included MATCHES "^${pattern}")
          message("${source}:${number}: error: includes \"${included}\": ${${layer}_text} "
                         "(DESIGN.md §2, cmake/check_layering.cmake)")
          math(EXPR violations "${violations} + 1")
          break()
        endif()
      endforeach()
    endforeach()
  endforeach()
endforeach()

if(violations GREATER 0)
  message(FATAL_ERROR "gcmoe layering: ${violations} include(s) cross a layer line (above)")
endif()
