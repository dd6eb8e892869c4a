// The KServe v2 front door (inference.GRPCInferenceService) of a running service, called through
// stubs generated from proto/inference/grpc_predict_v2.proto: ModelInfer gives Forward's bytes
// for raw and typed inputs, readiness follows the ranks, and every malformed request is refused
// with INVALID_ARGUMENT or NOT_FOUND and a message naming the input or parameter. Over TLS with
// a tokens file, ModelInfer needs the token and the protocol's health calls stay open.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "tests/server/service_harness.h"
#include "tests/server/test_pki.h"

namespace gcmoe::server::testing {
namespace {

using inference::ModelInferRequest;
using inference::ModelInferResponse;

std::unique_ptr<inference::GRPCInferenceService::Stub> ConnectKServe(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
      address, credentials ? credentials : grpc::InsecureChannelCredentials(), args));
}

const char* DatatypeOf(gcmoe::v1::DType dtype) {
  return dtype == gcmoe::v1::BF16 ? "BF16" : dtype == gcmoe::v1::FP32 ? "FP32" : "INT32";
}

// The ModelInfer request that carries exactly `forward`, as raw bytes or typed contents.
ModelInferRequest ToInfer(const gcmoe::v1::ForwardRequest& forward, bool raw) {
  ModelInferRequest request;
  request.set_model_name("gcmoe");
  request.set_id(forward.request_id());
  (*request.mutable_parameters())["layer"].set_int64_param(forward.layer());
  (*request.mutable_parameters())["output_datatype"].set_string_param(
      DatatypeOf(forward.output_dtype()));
  const std::pair<const char*, const gcmoe::v1::Tensor*> inputs[] = {
      {"hidden", &forward.hidden()},
      {"topk_ids", &forward.topk_ids()},
      {"topk_weights", &forward.topk_weights()}};
  for (const auto& [name, tensor] : inputs) {
    auto* input = request.add_inputs();
    input->set_name(name);
    input->set_datatype(DatatypeOf(tensor->dtype()));
    input->mutable_shape()->CopyFrom(tensor->shape());
    if (raw) {
      request.add_raw_input_contents(tensor->data());
    } else if (tensor->dtype() == gcmoe::v1::INT32) {
      auto* values = input->mutable_contents()->mutable_int_contents();
      values->Resize(static_cast<int>(tensor->data().size() / 4), 0);
      std::memcpy(values->mutable_data(), tensor->data().data(), tensor->data().size());
    } else {
      auto* values = input->mutable_contents()->mutable_fp32_contents();
      values->Resize(static_cast<int>(tensor->data().size() / 4), 0.0f);
      std::memcpy(values->mutable_data(), tensor->data().data(), tensor->data().size());
    }
  }
  return request;
}

grpc::Status Infer(const std::string& address, const ModelInferRequest& request,
                   ModelInferResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return ConnectKServe(address)->ModelInfer(&context, request, response);
}

bool ServerReady(const std::string& address) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  inference::ServerReadyResponse response;
  const grpc::Status status =
      ConnectKServe(address)->ServerReady(&context, inference::ServerReadyRequest(), &response);
  return status.ok() && response.ready();
}

// ModelReady of model "gcmoe": OK and ready, OK and not ready, or the call's failure.
grpc::Status ModelReady(inference::GRPCInferenceService::Stub* stub, bool* ready) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  inference::ModelReadyRequest request;
  request.set_name("gcmoe");
  inference::ModelReadyResponse response;
  const grpc::Status status = stub->ModelReady(&context, request, &response);
  *ready = response.ready();
  return status;
}

class KServeServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto started = StartServe({}, "kserve", milliseconds(60000));
    if (started) service_ = new Service(std::move(*started));
  }
  static void TearDownTestSuite() {
    delete service_;
    service_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(service_, nullptr) << "gcmoe serve did not start"; }

  static Service* service_;
};
Service* KServeServiceTest::service_ = nullptr;

TEST_F(KServeServiceTest, ModelInferRawAndContentsGiveForwardsBytes) {
  const engine::ModelSpec spec = DefaultModel();
  for (auto [hidden, output] :
       {std::pair{gcmoe::v1::FP32, gcmoe::v1::FP32}, std::pair{gcmoe::v1::FP32, gcmoe::v1::BF16},
        std::pair{gcmoe::v1::BF16, gcmoe::v1::BF16}}) {
    RequestSpec r;
    r.num_tokens = 24;
    r.layer = 1;
    r.dtype = hidden;
    r.output_dtype = output;
    r.unused_every = 5;
    r.seed = 11;
    const gcmoe::v1::ForwardRequest forward = MakeForwardRequest(spec, r);
    gcmoe::v1::ForwardResponse expected;
    {
      grpc::ClientContext context;
      const grpc::Status status = Connect(service_->address)->Forward(&context, forward, &expected);
      ASSERT_TRUE(status.ok()) << status.error_message();
    }
    for (bool raw : {true, false}) {
      if (!raw && hidden == gcmoe::v1::BF16) continue;  // BF16 travels raw only
      SCOPED_TRACE(std::string(DatatypeOf(hidden)) + " -> " + DatatypeOf(output) +
                   (raw ? ", raw_input_contents" : ", contents"));
      ModelInferResponse response;
      const grpc::Status status = Infer(service_->address, ToInfer(forward, raw), &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(response.model_name(), "gcmoe");
      EXPECT_EQ(response.id(), forward.request_id());
      ASSERT_EQ(response.outputs_size(), 1);
      EXPECT_EQ(response.outputs(0).name(), "output");
      EXPECT_EQ(response.outputs(0).datatype(), DatatypeOf(output));
      ASSERT_EQ(response.outputs(0).shape_size(), 2);
      EXPECT_EQ(response.outputs(0).shape(0), 24);
      EXPECT_EQ(response.outputs(0).shape(1), spec.hidden);
      ASSERT_EQ(response.raw_output_contents_size(), 1);
      EXPECT_EQ(response.raw_output_contents(0), expected.output().data());
    }
  }
}

TEST_F(KServeServiceTest, MetadataAndReadiness) {
  auto stub = ConnectKServe(service_->address);
  {
    grpc::ClientContext context;
    inference::ServerLiveResponse live;
    ASSERT_TRUE(stub->ServerLive(&context, inference::ServerLiveRequest(), &live).ok());
    EXPECT_TRUE(live.live());
  }
  EXPECT_TRUE(ServerReady(service_->address));
  bool model_ready = false;
  ASSERT_TRUE(ModelReady(stub.get(), &model_ready).ok());
  EXPECT_TRUE(model_ready);
  {
    grpc::ClientContext context;
    inference::ServerMetadataResponse metadata;
    ASSERT_TRUE(stub->ServerMetadata(&context, inference::ServerMetadataRequest(), &metadata).ok());
    EXPECT_EQ(metadata.name(), "gcmoe");
    grpc::ClientContext info_context;
    gcmoe::v1::ModelInfo info;
    ASSERT_TRUE(Connect(service_->address)
                    ->GetModelInfo(&info_context, gcmoe::v1::GetModelInfoRequest(), &info)
                    .ok());
    EXPECT_EQ(metadata.version(), info.version());
  }
  {
    grpc::ClientContext context;
    inference::ModelMetadataRequest request;
    request.set_name("gcmoe");
    inference::ModelMetadataResponse metadata;
    ASSERT_TRUE(stub->ModelMetadata(&context, request, &metadata).ok());
    const engine::ModelSpec spec = DefaultModel();
    ASSERT_EQ(metadata.inputs_size(), 3);
    EXPECT_EQ(metadata.inputs(0).name(), "hidden");
    EXPECT_EQ(metadata.inputs(0).shape(1), spec.hidden);
    EXPECT_EQ(metadata.inputs(1).name(), "topk_ids");
    EXPECT_EQ(metadata.inputs(1).datatype(), "INT32");
    EXPECT_EQ(metadata.inputs(1).shape(1), spec.top_k);
    ASSERT_EQ(metadata.outputs_size(), 1);
    EXPECT_EQ(metadata.outputs(0).name(), "output");
  }
  {
    grpc::ClientContext context;
    inference::ModelMetadataRequest request;
    request.set_name("llama");
    inference::ModelMetadataResponse metadata;
    const grpc::Status status = stub->ModelMetadata(&context, request, &metadata);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(status.error_message().find("'llama'"), std::string::npos);
  }
}

struct Malformed {
  std::string name;
  std::function<void(ModelInferRequest*)> mutate;
  grpc::StatusCode code;
  std::string message_contains;
};

TEST_F(KServeServiceTest, MalformedRequestsNameTheInput) {
  RequestSpec r;
  r.num_tokens = 4;
  const ModelInferRequest base = ToInfer(MakeForwardRequest(DefaultModel(), r), true);
  auto input = [](ModelInferRequest* q, const std::string& name) {
    for (auto& in : *q->mutable_inputs()) {
      if (in.name() == name) return &in;
    }
    return static_cast<ModelInferRequest::InferInputTensor*>(nullptr);
  };
  using grpc::StatusCode;
  const std::vector<Malformed> cases = {
      {"wrong datatype string",
       [&](ModelInferRequest* q) { input(q, "topk_ids")->set_datatype("INT64"); },
       StatusCode::INVALID_ARGUMENT, "input 'topk_ids': datatype 'INT64', expected INT32"},
      {"unknown datatype string",
       [&](ModelInferRequest* q) { input(q, "hidden")->set_datatype("float32"); },
       StatusCode::INVALID_ARGUMENT, "input 'hidden': datatype 'float32'"},
      {"shape disagrees with the raw bytes",
       [&](ModelInferRequest* q) { input(q, "topk_weights")->set_shape(0, 3); },
       StatusCode::INVALID_ARGUMENT, "input 'topk_weights': shape [3, "},
      {"shape disagrees with the model",
       [&](ModelInferRequest* q) {
         input(q, "hidden")->set_shape(0, 2);
         input(q, "hidden")->set_shape(1, 2 * input(q, "hidden")->shape(1));
       },
       StatusCode::INVALID_ARGUMENT, "hidden.shape[1]"},
      {"missing input",
       [&](ModelInferRequest* q) {
         q->mutable_inputs()->DeleteSubrange(1, 1);
         q->mutable_raw_input_contents()->DeleteSubrange(1, 1);
       },
       StatusCode::INVALID_ARGUMENT, "input 'topk_ids': missing"},
      {"unknown input",
       [&](ModelInferRequest* q) { input(q, "topk_weights")->set_name("weights"); },
       StatusCode::INVALID_ARGUMENT, "inputs[2]: 'weights' is not an input"},
      {"input given twice",
       [&](ModelInferRequest* q) {
         *q->add_inputs() = q->inputs(0);
         q->add_raw_input_contents(q->raw_input_contents(0));
       },
       StatusCode::INVALID_ARGUMENT, "input 'hidden': given twice"},
      {"unknown model", [](ModelInferRequest* q) { q->set_model_name("llama"); },
       StatusCode::NOT_FOUND, "model_name: 'llama'"},
      {"unknown model version", [](ModelInferRequest* q) { q->set_model_version("7"); },
       StatusCode::NOT_FOUND, "version '7'"},
      {"unknown parameter",
       [](ModelInferRequest* q) { (*q->mutable_parameters())["temperature"].set_double_param(1); },
       StatusCode::INVALID_ARGUMENT, "parameters['temperature']: unknown parameter"},
      {"unknown input parameter",
       [&](ModelInferRequest* q) {
         (*input(q, "hidden")->mutable_parameters())["scale"].set_int64_param(2);
       },
       StatusCode::INVALID_ARGUMENT, "input 'hidden': unknown parameter 'scale'"},
      {"layer as a string",
       [](ModelInferRequest* q) { (*q->mutable_parameters())["layer"].set_string_param("1"); },
       StatusCode::INVALID_ARGUMENT, "parameters['layer']"},
      {"layer past the model",
       [](ModelInferRequest* q) { (*q->mutable_parameters())["layer"].set_int64_param(99); },
       StatusCode::NOT_FOUND, "layer: 99"},
      {"bad output datatype",
       [](ModelInferRequest* q) {
         (*q->mutable_parameters())["output_datatype"].set_string_param("FP16");
       },
       StatusCode::INVALID_ARGUMENT, "parameters['output_datatype']: 'FP16'"},
      {"unknown requested output", [](ModelInferRequest* q) { q->add_outputs()->set_name("y"); },
       StatusCode::INVALID_ARGUMENT, "outputs[0]: 'y' is not an output"},
      {"raw and typed contents together",
       [&](ModelInferRequest* q) {
         input(q, "topk_weights")->mutable_contents()->add_fp32_contents(1.0f);
       },
       StatusCode::INVALID_ARGUMENT, "input 'topk_weights': has contents and raw_input_contents"},
      {"raw contents for some inputs only",
       [](ModelInferRequest* q) { q->mutable_raw_input_contents()->RemoveLast(); },
       StatusCode::INVALID_ARGUMENT, "raw_input_contents: 2 entries, expected one per input (3)"},
      {"typed contents of the wrong count",
       [](ModelInferRequest* q) {
         q->clear_raw_input_contents();
         for (auto& in : *q->mutable_inputs()) {
           const int64_t n = in.shape(0) * in.shape(1);
           for (int64_t i = 0; i < n; ++i) {
             if (in.datatype() == "INT32") {
               in.mutable_contents()->add_int_contents(static_cast<int32_t>(i % 4));
             } else {
               in.mutable_contents()->add_fp32_contents(0.5f);
             }
           }
         }
         q->mutable_inputs(0)->mutable_contents()->add_fp32_contents(0.5f);
       },
       StatusCode::INVALID_ARGUMENT, "input 'hidden': contents.fp32_contents has"},
      {"BF16 as typed contents",
       [&](ModelInferRequest* q) {
         q->clear_raw_input_contents();
         input(q, "hidden")->set_datatype("BF16");
       },
       StatusCode::INVALID_ARGUMENT, "input 'hidden': BF16 has no typed contents"},
      {"FP32 values in the wrong typed field",
       [](ModelInferRequest* q) {
         q->clear_raw_input_contents();
         q->mutable_inputs(0)->mutable_contents()->add_fp64_contents(0.5);
       },
       StatusCode::INVALID_ARGUMENT,
       "input 'hidden': FP32 values belong in contents.fp32_contents"},
      {"expert id out of range",
       [](ModelInferRequest* q) {
         std::string& ids = *q->mutable_raw_input_contents(1);
         const int32_t bad = 1000;
         std::memcpy(ids.data(), &bad, 4);
       },
       StatusCode::INVALID_ARGUMENT, "topk_ids"},
  };
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.name);
    ModelInferRequest request = base;
    c.mutate(&request);
    ModelInferResponse response;
    const grpc::Status status = Infer(service_->address, request, &response);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_NE(status.error_message().find(c.message_contains), std::string::npos)
        << "message: " << status.error_message() << "\nexpected to contain: " << c.message_contains;
  }
  // The service is unharmed.
  ModelInferResponse response;
  const grpc::Status status = Infer(service_->address, base, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// A coordinator with separately started ranks: a killed rank stays down until started again.
TEST(KServeReadinessTest, ServerReadyIsFalseWhileARankIsDown) {
  const std::string address_file = TempPath("kserve_ready.coordinator.address");
  // An earlier run's files, as in StartServe: its address file names a port nobody serves.
  for (const char* stale : {"kserve_ready.coordinator.address", "kserve_ready.coordinator.log",
                            "kserve_ready.rank0.log", "kserve_ready.rank1.log"}) {
    std::remove(TempPath(stale).c_str());
  }
  const std::string secret = "server.rank_secret_file=" + WriteSecretFile("kserve_ready");
  auto coordinator = Process::Start({"coordinator", "--listen", "127.0.0.1:0", "--rank-listen",
                                     "127.0.0.1:0", "--address-file", address_file, "--set",
                                     "server.metrics_listen=", "--set", secret},
                                    TempPath("kserve_ready.coordinator.log"));
  auto lines = WaitForFile(address_file, milliseconds(20000));
  ASSERT_TRUE(lines && lines->size() >= 2) << coordinator->Log();
  const std::string address = (*lines)[0];
  auto start_rank = [&](int r) {
    return Process::Start(
        {"rank", "--rank", std::to_string(r), "--coordinator", (*lines)[1], "--set", secret},
        TempPath("kserve_ready.rank" + std::to_string(r) + ".log"));
  };
  EXPECT_FALSE(ServerReady(address)) << "ready before any rank attached";
  auto rank0 = start_rank(0);
  auto rank1 = start_rank(1);
  ASSERT_TRUE(WaitForHealth(address, "SERVING", milliseconds(60000))) << coordinator->Log();
  EXPECT_TRUE(ServerReady(address));

  rank1->Signal(SIGKILL);
  ASSERT_TRUE(rank1->Wait(milliseconds(5000)).has_value());
  ASSERT_TRUE(WaitForHealth(address, "NOT_SERVING", milliseconds(2000))) << coordinator->Log();
  EXPECT_FALSE(ServerReady(address));
  {
    bool model_ready = true;
    ASSERT_TRUE(ModelReady(ConnectKServe(address).get(), &model_ready).ok());
    EXPECT_FALSE(model_ready);
    grpc::ClientContext live_context;
    inference::ServerLiveResponse live;
    ASSERT_TRUE(ConnectKServe(address)
                    ->ServerLive(&live_context, inference::ServerLiveRequest(), &live)
                    .ok());
    EXPECT_TRUE(live.live());
  }
  RequestSpec r;
  ModelInferResponse response;
  const grpc::Status status =
      Infer(address, ToInfer(MakeForwardRequest(DefaultModel(), r), true), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();

  rank1 = start_rank(1);
  ASSERT_TRUE(WaitForHealth(address, "SERVING", milliseconds(30000))) << coordinator->Log();
  EXPECT_TRUE(ServerReady(address));
}

// TLS with a tokens file (no client certificate asked). ModelInfer with the token gives
// Forward's bytes; without it, or with a wrong one, ModelInfer and the metadata calls are
// UNAUTHENTICATED with the server's message, a malformed request included (the token is checked
// before the request is read); ServerLive, ServerReady and ModelReady answer without a token,
// as grpc.health.v1 does; a plaintext client cannot connect.
TEST(KServeTlsTest, ModelInferOverTlsNeedsTheTokenAndHealthStaysOpen) {
  const auto pki = MakeTestPki("kserve_tls");
  ASSERT_TRUE(pki.has_value());
  const auto credentials = pki->Credentials(/*client_cert=*/false);
  auto service =
      StartServe(pki->ServeArgs(/*mtls=*/false), "kserve_tls", milliseconds(60000), credentials);
  ASSERT_TRUE(service.has_value());
  auto kserve = ConnectKServe(service->address, credentials);
  const std::string bearer = "Bearer " + pki->token;
  const auto call_deadline = [] {
    return std::chrono::system_clock::now() + std::chrono::seconds(30);
  };

  RequestSpec r;
  r.num_tokens = 16;
  r.layer = 1;
  r.output_dtype = gcmoe::v1::BF16;
  r.unused_every = 4;
  r.seed = 23;
  const gcmoe::v1::ForwardRequest forward = MakeForwardRequest(DefaultModel(), r);
  gcmoe::v1::ForwardResponse expected;
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", bearer);
    const grpc::Status status =
        Connect(service->address, credentials)->Forward(&context, forward, &expected);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  for (bool raw : {true, false}) {
    SCOPED_TRACE(raw ? "raw_input_contents" : "contents");
    grpc::ClientContext context;
    context.set_deadline(call_deadline());
    context.AddMetadata("authorization", bearer);
    ModelInferResponse response;
    const grpc::Status status = kserve->ModelInfer(&context, ToInfer(forward, raw), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.raw_output_contents_size(), 1);
    EXPECT_EQ(response.raw_output_contents(0), expected.output().data());
  }

  ModelInferRequest malformed = ToInfer(forward, true);
  malformed.set_model_name("llama");
  const struct {
    std::string what;
    std::string authorization;  // empty: none sent
    ModelInferRequest request;
    std::string message_contains;
  } refused[] = {
      {"no token", "", ToInfer(forward, true), "no \"authorization: Bearer TOKEN\" metadata"},
      {"a wrong token", "Bearer not-" + pki->token, ToInfer(forward, true),
       "not one of server.auth.tokens_file's"},
      {"the token without its scheme", pki->token, ToInfer(forward, true), "not \"Bearer TOKEN\""},
      {"no token, unknown model", "", malformed, "no \"authorization"},
  };
  for (const auto& c : refused) {
    SCOPED_TRACE(c.what);
    grpc::ClientContext context;
    context.set_deadline(call_deadline());
    if (!c.authorization.empty()) context.AddMetadata("authorization", c.authorization);
    ModelInferResponse response;
    const grpc::Status status = kserve->ModelInfer(&context, c.request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
    EXPECT_NE(status.error_message().find(c.message_contains), std::string::npos)
        << status.error_message();
    EXPECT_EQ(response.outputs_size(), 0);
  }

  // Metadata describes the model as GetModelInfo does: the token guards it too.
  for (bool with_token : {false, true}) {
    SCOPED_TRACE(with_token ? "metadata with the token" : "metadata without a token");
    const grpc::StatusCode want =
        with_token ? grpc::StatusCode::OK : grpc::StatusCode::UNAUTHENTICATED;
    grpc::ClientContext server_context;
    grpc::ClientContext model_context;
    if (with_token) {
      server_context.AddMetadata("authorization", bearer);
      model_context.AddMetadata("authorization", bearer);
    }
    inference::ServerMetadataResponse server_metadata;
    EXPECT_EQ(
        kserve
            ->ServerMetadata(&server_context, inference::ServerMetadataRequest(), &server_metadata)
            .error_code(),
        want);
    inference::ModelMetadataRequest request;
    request.set_name("gcmoe");
    inference::ModelMetadataResponse model_metadata;
    EXPECT_EQ(kserve->ModelMetadata(&model_context, request, &model_metadata).error_code(), want);
    EXPECT_EQ(model_metadata.inputs_size(), with_token ? 3 : 0);
  }

  // The health calls, without a token.
  {
    grpc::ClientContext live_context;
    inference::ServerLiveResponse live;
    ASSERT_TRUE(kserve->ServerLive(&live_context, inference::ServerLiveRequest(), &live).ok());
    EXPECT_TRUE(live.live());
    grpc::ClientContext ready_context;
    inference::ServerReadyResponse ready;
    ASSERT_TRUE(kserve->ServerReady(&ready_context, inference::ServerReadyRequest(), &ready).ok());
    EXPECT_TRUE(ready.ready());
    bool model_ready = false;
    ASSERT_TRUE(ModelReady(kserve.get(), &model_ready).ok());
    EXPECT_TRUE(model_ready);
  }

  // Plaintext reaches no service on a TLS port, token or not.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  context.AddMetadata("authorization", bearer);
  ModelInferResponse response;
  EXPECT_EQ(ConnectKServe(service->address)
                ->ModelInfer(&context, ToInfer(forward, true), &response)
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace gcmoe::server::testing
