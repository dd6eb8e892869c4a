// The gcmoe Python package (clients/python), installed into a fresh virtual environment made
// from Debian's /usr/bin/python3, against a real `gcmoe serve`: FP32, BF16 and FP8 activations
// through the blocking and the asyncio client match the float64 references, ForwardStream through
// both gives unary Forward's bytes and outlives bad requests, the same over TLS and mTLS with a
// bearer token (wrong or missing tokens refused with the typed error), and the package's FP8
// encoder agrees bit for bit with the server's quantizer on every E4M3 code boundary.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include <gtest/gtest.h>

#include "client/npy.h"
#include "common/number_formats.h"
#include "engine/numerics.h"
#include "engine/reference_layer.h"
#include "engine/weights.h"
#include "tests/server/service_harness.h"
#include "tests/server/test_pki.h"

namespace gcmoe::server::testing {
namespace {

int RunShell(const std::string& command) {
  const int rc = std::system(command.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

template <typename T>
std::vector<T> Load(const std::string& path) {
  auto array = client::ReadNpy(path);
  EXPECT_TRUE(array.ok()) << array.status().ToString();
  if (!array.ok()) return {};
  if constexpr (std::is_same_v<T, float>) {
    auto values = client::NpyToFloat(*array, path);
    EXPECT_TRUE(values.ok()) << values.status().ToString();
    return values.ok() ? *values : std::vector<T>{};
  } else {
    auto values = client::NpyToInt32(*array, path);
    EXPECT_TRUE(values.ok()) << values.status().ToString();
    return values.ok() ? *values : std::vector<T>{};
  }
}

class PythonPackageTest : public ::testing::Test {
 protected:
  // A fresh virtual environment with the package installed the way a user installs it:
  // Debian's pip, no index, no dependencies (grpcio, protobuf and numpy are Debian's).
  static void SetUpTestSuite() {
    venv_ = new std::string(TempPath("python_package_venv"));
    const std::string log = TempPath("python_package_install.log");
    const std::string install =
        "rm -rf " + *venv_ + " && /usr/bin/python3 -m venv --system-site-packages --without-pip " +
        *venv_ + " > " + log + " 2>&1 && /usr/bin/python3 -m pip --python " + *venv_ +
        "/bin/python install --no-deps --no-index --no-cache-dir " GCMOE_PYTHON_PACKAGE " >> " +
        log + " 2>&1";
    installed_ = RunShell(install) == 0;
    if (!installed_) ADD_FAILURE() << "installing the package failed: " << install;
  }
  static void TearDownTestSuite() {
    delete venv_;
    venv_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(installed_); }

 public:
  // Runs the driver with the venv's interpreter, from a folder outside the source tree so that
  // `import gcmoe` can only find the installed package.
  static int Driver(const std::string& args) {
    return RunShell("cd " + ::testing::TempDir() + " && " + *venv_ +
                    "/bin/python " GCMOE_PYTHON_DRIVER " " + args);
  }

 protected:
  static std::string* venv_;
  static bool installed_;
};
std::string* PythonPackageTest::venv_ = nullptr;
bool PythonPackageTest::installed_ = false;

// The inputs and the outputs of the driver's forward mode (saved in `out`) against the float64
// references: sync and asyncio alike, within the quantization-aware and the exact tolerances.
void ExpectOutputsMatchTheReferences(const std::string& out, int tokens, int layer) {
  const engine::ModelSpec spec = DefaultModel();
  const std::vector<float> hidden = Load<float>(out + "/hidden.npy");
  const std::vector<float> hidden_bf16 = Load<float>(out + "/hidden_bf16.npy");
  const std::vector<float> weights = Load<float>(out + "/topk_weights.npy");
  const std::vector<int32_t> ids = Load<int32_t>(out + "/topk_ids.npy");
  ASSERT_EQ(hidden.size(), static_cast<size_t>(tokens) * spec.hidden);
  ASSERT_EQ(ids.size(), static_cast<size_t>(tokens) * spec.top_k);
  EXPECT_NE(std::find(ids.begin(), ids.end(), -1), ids.end());

  auto source = engine::WeightSource::Open(spec);
  ASSERT_TRUE(source.ok());
  for (const std::string dtype : {"fp32", "bf16", "fp8"}) {
    SCOPED_TRACE(dtype);
    // What the service computed on: BF16 rounds the activations; FP8 quantizes them with the
    // quantizer the quantization-aware reference also applies (bit-equal, see the test below).
    engine::ReferenceInput input;
    input.num_tokens = tokens;
    input.hidden = dtype == "bf16" ? hidden_bf16.data() : hidden.data();
    input.topk_ids = ids.data();
    input.topk_weights = weights.data();
    auto quantized =
        engine::ReferenceLayer(**source, layer, input, engine::ReferenceMode::kQuantizationAware);
    auto exact =
        engine::ReferenceLayer(**source, layer, input, engine::ReferenceMode::kUnquantized);
    ASSERT_TRUE(quantized.ok() && exact.ok());
    const std::vector<float> sync = Load<float>(out + "/output_" + dtype + "_sync.npy");
    const std::vector<float> async = Load<float>(out + "/output_" + dtype + "_async.npy");
    ASSERT_EQ(sync.size(), hidden.size());
    EXPECT_EQ(sync, async) << "the asyncio client got a different output";
    const std::vector<double> y(sync.begin(), sync.end());
    EXPECT_LT(numerics::CalcDiff(y.data(), quantized->data(), y.size()), 1e-4);
    EXPECT_LT(numerics::CalcDiff(y.data(), exact->data(), y.size()), 0.02);
    EXPECT_GE(numerics::Cosine(y.data(), exact->data(), y.size()), 0.97);
  }
}

std::string ForwardArgs(const std::string& address, const std::string& out, int tokens, int layer) {
  return "forward --addr " + address + " --out " + out + " --tokens " + std::to_string(tokens) +
         " --layer " + std::to_string(layer);
}

TEST_F(PythonPackageTest, SyncAndAsyncForwardMatchTheReferences) {
  auto service = StartServe({}, "python_package", milliseconds(60000));
  ASSERT_TRUE(service.has_value());
  const std::string out = TempPath("python_package_out");
  ASSERT_EQ(Driver(ForwardArgs(service->address, out, 40, 1)), 0);
  ExpectOutputsMatchTheReferences(out, 40, 1);
}

// The forward and auth modes of the driver against a service on TLS (server certificate signed by
// a CA the test makes) with a tokens file, and client certificates required when `mtls`.
void CheckOverTls(bool mtls, const std::string& name, int layer) {
  const auto pki = MakeTestPki(name);
  ASSERT_TRUE(pki.has_value());
  auto service = StartServe(pki->ServeArgs(mtls), name, milliseconds(60000),
                            pki->Credentials(/*client_cert=*/mtls));
  ASSERT_TRUE(service.has_value());
  std::string tls = " --tls-ca " + pki->ca_cert + " --token-file " + pki->tokens_file;
  if (mtls) tls += " --tls-cert " + pki->client_cert + " --tls-key " + pki->client_key;
  const std::string out = TempPath(name + "_out");
  ASSERT_EQ(PythonPackageTest::Driver(ForwardArgs(service->address, out, 24, layer) + tls), 0);
  ExpectOutputsMatchTheReferences(out, 24, layer);
  EXPECT_EQ(PythonPackageTest::Driver("auth --addr " + service->address + tls), 0);
}

// TLS with a token: the clients given gcmoe.TLS(ca=...) and the token get the float64
// references' outputs; calls without the token or with a wrong one raise
// gcmoe.UnauthenticatedError with the server's message; plaintext, the system's roots or a wrong
// server name cannot connect, and a server name the certificate carries can.
TEST_F(PythonPackageTest, TlsAndTokenForwardMatchesTheReferences) {
  CheckOverTls(/*mtls=*/false, "python_package_tls", 1);
}

// The same with client certificates required (server.tls.client_ca): the clients present theirs
// through gcmoe.TLS(cert=..., key=...); without one they cannot connect.
TEST_F(PythonPackageTest, MutualTlsWithAClientCertificate) {
  CheckOverTls(/*mtls=*/true, "python_package_mtls", 0);
}

// The driver sends requests of several sizes, layers and dtypes through the ForwardStream of the
// blocking and the asyncio client: one at a time, pipelined, and from threads or tasks sharing
// the stream, with a bad layer and a bad expert id in the middle. It requires every output byte
// for byte equal to unary Forward's for the same request, each bad request its typed error
// (NOT_FOUND, INVALID_ARGUMENT) naming the field, and the requests after it answered.
TEST_F(PythonPackageTest, StreamGivesUnaryBytesAndOutlivesBadRequests) {
  auto service = StartServe({}, "python_package_stream", milliseconds(60000));
  ASSERT_TRUE(service.has_value());
  EXPECT_EQ(Driver("stream --addr " + service->address + " --tokens 40 --layer 1"), 0);
  EXPECT_EQ(HealthStatus(service->address), "SERVING");
}

// Every boundary of the E4M3 grid: each finite code, each midpoint between neighbouring codes
// (where round-to-nearest-even decides) and the floats just below and above it, both signs, at
// block scales across the UE8M0 range; plus blocks whose largest value sits on a scale boundary,
// saturating blocks, blocks under the 1e-4 amax floor and float32 subnormals.
std::vector<float> BoundaryBlocks() {
  std::vector<float> magnitudes;  // in units of the block scale
  for (int code = 0; code <= 0x7E; ++code) {
    const float value = numerics::DecodeE4M3(static_cast<uint8_t>(code));
    magnitudes.push_back(value);
    if (code == 0x7E) break;
    const float midpoint = 0.5f * (value + numerics::DecodeE4M3(static_cast<uint8_t>(code + 1)));
    magnitudes.push_back(midpoint);
    magnitudes.push_back(std::nextafter(midpoint, 0.0f));
    magnitudes.push_back(std::nextafter(midpoint, 1000.0f));
  }
  std::vector<float> values;
  auto add_blocks = [&](float amax, float unit) {
    // Each block leads with amax (fixing its scale), then 31 boundary values times `unit`.
    std::vector<float> signed_values;
    for (float m : magnitudes) {
      signed_values.push_back(m * unit);
      signed_values.push_back(-m * unit);
    }
    for (size_t i = 0; i < signed_values.size(); i += 31) {
      values.push_back(i % 2 == 0 ? amax : -amax);
      for (size_t j = i; j < i + 31; ++j) {
        values.push_back(j < signed_values.size() ? signed_values[j] : 0.0f);
      }
    }
  };
  for (int e : {-120, -60, -20, -9, -4, -1, 0, 1, 3, 8, 20, 60, 118}) {
    const float unit = std::ldexp(1.0f, e);
    add_blocks(448.0f * unit, unit);                         // scale exactly 2^e
    add_blocks(std::nextafter(448.0f * unit, 0.0f), unit);   // just under: still 2^e
    add_blocks(std::nextafter(448.0f * unit, 1e38f), unit);  // just over: 2^(e+1)
  }
  add_blocks(std::numeric_limits<float>::max(),
             std::ldexp(1.0f, 119));  // scale clamped, saturating
  add_blocks(1e-5f, 1e-5f / 448.0f);  // under the amax floor
  add_blocks(std::numeric_limits<float>::denorm_min() * 64,
             std::numeric_limits<float>::denorm_min());
  return values;
}

TEST_F(PythonPackageTest, Fp8EncoderMatchesTheServersQuantizerBitForBit) {
  const std::vector<float> values = BoundaryBlocks();
  ASSERT_EQ(values.size() % 32, 0u);
  const int64_t rows = static_cast<int64_t>(values.size() / 32);
  const std::string input = TempPath("fp8_boundaries.npy");
  ASSERT_TRUE(client::WriteNpyFloat32(input, {rows, 32}, values).ok());
  const std::string out = TempPath("fp8_encoded");
  ASSERT_EQ(Driver("fp8 --input " + input + " --out " + out), 0);
  const std::vector<int32_t> codes = Load<int32_t>(out + "/codes.npy");
  const std::vector<int32_t> scales = Load<int32_t>(out + "/scales.npy");
  ASSERT_EQ(codes.size(), values.size());
  ASSERT_EQ(scales.size(), static_cast<size_t>(rows));

  std::vector<uint8_t> want_codes(values.size());
  std::vector<uint8_t> want_scales(static_cast<size_t>(rows));
  numerics::QuantizeE4M3K32(values.data(), static_cast<int>(values.size()), want_codes.data(),
                            want_scales.data());
  int code_mismatches = 0;
  int scale_mismatches = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (codes[i] != want_codes[i] && code_mismatches++ < 5) {
      ADD_FAILURE() << "value " << values[i] << " (block " << i / 32 << "): Python code "
                    << codes[i] << ", server " << int{want_codes[i]};
    }
  }
  for (int64_t b = 0; b < rows; ++b) {
    if (scales[b] != want_scales[b] && scale_mismatches++ < 5) {
      ADD_FAILURE() << "block " << b << " (amax " << values[b * 32] << "): Python scale "
                    << scales[b] << ", server " << int{want_scales[b]};
    }
  }
  EXPECT_EQ(code_mismatches, 0) << "of " << values.size() << " values";
  EXPECT_EQ(scale_mismatches, 0) << "of " << rows << " blocks";
  // The boundaries reach every code: each finite E4M3 code of both signs is produced.
  std::vector<bool> seen(256, false);
  for (uint8_t c : want_codes) seen[c] = true;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // the NaN codes
    EXPECT_TRUE(seen[c]) << "code " << c << " never produced";
  }
}

// The README's registered-memory example, run as written by the installed package against a
// service with server.allow_registered_memory on: region inputs and an output region give the
// bytes of the same call inline, and the example leaves no shared-memory object behind.
TEST_F(PythonPackageTest, ReadmeRegisteredMemoryExampleRuns) {
  auto service = StartServe({"--set", "server.allow_registered_memory=true"},
                            "python_package_regmem", milliseconds(60000));
  ASSERT_TRUE(service.has_value());
  EXPECT_EQ(Driver("readme-registered-memory --addr " + service->address +
                   " --readme " GCMOE_README),
            0);
}

}  // namespace
}  // namespace gcmoe::server::testing
