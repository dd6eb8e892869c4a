// `gcmoe weights inspect` and `gcmoe weights convert` (weights_checkpoint.cc): Hugging Face
// checkpoint directories, read by engine/hf_checkpoint.h. argv[1] is the subcommand.
#pragma once

namespace gcmoe::tools {

int RunWeightsInspect(int argc, char** argv);
int RunWeightsConvert(int argc, char** argv);

}  // namespace gcmoe::tools
