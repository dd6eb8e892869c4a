# Writes a C++ source that holds a text file as a string constant.
#   cmake -DINPUT=file.json -DOUTPUT=file.cc -DSYMBOL=kName -DNAMESPACE=gcmoe::config -P embed_text.cmake
# Run as a build step (not at configure time) so that editing the file rebuilds the constant.
file(READ "${INPUT}" text)
set(delimiter "gcmoe_embedded")
string(FIND "${text}" ")${delimiter}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter )${delimiter}\"")
endif()
get_filename_component(name "${INPUT}" NAME)
file(WRITE "${OUTPUT}"
  "// Generated from ${name} by embed_text.cmake; edit the JSON file, not this one.\n"
  "namespace ${NAMESPACE} {\n"
  "extern const char ${SYMBOL}[];\n"
  "const char ${SYMBOL}[] = R\"${delimiter}(${text})${delimiter}\";\n"
  "}  // namespace ${NAMESPACE}\n")
