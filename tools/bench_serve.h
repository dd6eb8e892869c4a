// `gcmoe bench serve`: what the service costs on top of its engine, measured from a client.
#pragma once

namespace gcmoe::tools {

int RunBenchServe(int argc, char** argv);

}  // namespace gcmoe::tools
