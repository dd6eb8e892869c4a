// Forward called from Python (Debian's python3-grpcio with the stubs generated at build time)
// against a running `gcmoe serve`; the output is checked against the float64 references.
#include <sys/wait.h>

#include <cstdlib>

#include <gtest/gtest.h>

#include "client/npy.h"
#include "engine/numerics.h"
#include "engine/reference_layer.h"
#include "engine/weights.h"
#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

std::vector<float> Floats(const std::string& path) {
  auto array = client::ReadNpy(path);
  EXPECT_TRUE(array.ok()) << array.status().ToString();
  if (!array.ok()) return {};
  auto values = client::NpyToFloat(*array, path);
  EXPECT_TRUE(values.ok()) << values.status().ToString();
  return values.ok() ? *values : std::vector<float>{};
}

TEST(PythonClientTest, ForwardFromPythonMatchesTheReferences) {
  auto service = StartServe({}, "python", milliseconds(60000));
  ASSERT_TRUE(service.has_value());
  const std::string out = TempPath("python_out");
  const std::string command = std::string("/usr/bin/python3 ") + GCMOE_PYTHON_DRIVER +
                              " --addr " + service->address + " --stubs " +
                              GCMOE_PYTHON_STUBS + " --out " + out + " --tokens 40 --layer 1";
  const int rc = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << command;

  const std::vector<float> hidden = Floats(out + "/hidden.npy");
  const std::vector<float> weights = Floats(out + "/topk_weights.npy");
  const std::vector<float> output = Floats(out + "/output.npy");
  auto ids_array = client::ReadNpy(out + "/topk_ids.npy");
  ASSERT_TRUE(ids_array.ok());
  auto ids = client::NpyToInt32(*ids_array, "topk_ids");
  ASSERT_TRUE(ids.ok());
  const engine::ModelSpec spec = DefaultModel();
  ASSERT_EQ(hidden.size(), 40u * spec.hidden);
  ASSERT_EQ(output.size(), hidden.size());
  ASSERT_EQ(ids->size(), 40u * spec.top_k);
  EXPECT_NE(std::find(ids->begin(), ids->end(), -1), ids->end());

  auto source = engine::WeightSource::Open(spec);
  ASSERT_TRUE(source.ok());
  engine::ReferenceInput input;
  input.num_tokens = 40;
  input.hidden = hidden.data();
  input.topk_ids = ids->data();
  input.topk_weights = weights.data();
  const std::vector<double> y(output.begin(), output.end());
  auto quantized = engine::ReferenceLayer(**source, 1, input,
                                          engine::ReferenceMode::kQuantizationAware);
  auto exact = engine::ReferenceLayer(**source, 1, input, engine::ReferenceMode::kUnquantized);
  ASSERT_TRUE(quantized.ok() && exact.ok());
  EXPECT_LT(numerics::CalcDiff(y.data(), quantized->data(), y.size()), 1e-4);
  EXPECT_LT(numerics::CalcDiff(y.data(), exact->data(), y.size()), 0.02);
  EXPECT_GE(numerics::Cosine(y.data(), exact->data(), y.size()), 0.97);
}

}  // namespace
}  // namespace gcmoe::server::testing
