#include "server/rank_control_service.h"

#include <spdlog/spdlog.h>

#include "engine/shm_exchange.h"

namespace gcmoe::server {

namespace internal = gcmoe::internal::v1;

namespace {

// The same words for every unauthenticated caller: nothing about the service, not even which
// check failed beyond the proof itself.
constexpr char kNoProof[] =
    "attach refused: no valid proof of the service's attach secret (server.rank_secret_file)";

void SendReject(
    grpc::ServerReaderWriter<internal::CoordinatorMessage, internal::RankMessage>* stream,
    const std::string& reason, bool retryable) {
  internal::CoordinatorMessage reject;
  reject.mutable_reject()->set_reason(reason);
  reject.mutable_reject()->set_retryable(retryable);
  stream->Write(reject);
}

}  // namespace

Status CheckOfferedTransport(const internal::Hello& hello, const AttachPolicy& policy) {
  const std::string& offered = hello.transport_name();
  if (policy.backend == "cuda") {
    // "cuda-ipc:<pid>:<device>:<base>:<bytes>:<handle>" (engine/cuda_ipc.h), exported by the
    // process that says Hello.
    const std::string prefix = "cuda-ipc:" + std::to_string(hello.pid()) + ":";
    if (offered.rfind(prefix, 0) == 0) return Status::Ok();
    return FailedPrecondition("rank " + std::to_string(hello.rank()) +
                              " offers a transport that is not a CUDA IPC region of its own "
                              "process (pid " +
                              std::to_string(hello.pid()) + ")");
  }
  const std::string expected =
      engine::ShmExchange::SegmentName(policy.instance, static_cast<int>(hello.rank()));
  if (offered == expected) return Status::Ok();
  return FailedPrecondition("rank " + std::to_string(hello.rank()) +
                            " offers a transport segment other than the one this service "
                            "assigns it; the ranks and the coordinator must share "
                            "server.rank_secret_file and the model, parallel, engine and "
                            "balancer sections");
}

grpc::Status RankControlService::Attach(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<internal::CoordinatorMessage, internal::RankMessage>* stream) {
  Result<std::string> nonce = RandomBytes(32);
  if (!nonce.ok()) {
    spdlog::error("rank attach from {}: no challenge: {}", context->peer(),
                  nonce.status().message());
    return grpc::Status(grpc::StatusCode::INTERNAL, "the coordinator cannot make a challenge");
  }
  internal::CoordinatorMessage challenge;
  challenge.mutable_challenge()->set_nonce(*nonce);
  if (!stream->Write(challenge)) return grpc::Status::OK;

  // The proof is checked before anything else the caller says is looked at.
  internal::RankMessage first;
  if (!stream->Read(&first)) return grpc::Status::OK;
  if (!first.has_hello() || !policy_.secret.Verify(*nonce, first.hello())) {
    failure_log_->Record(
        StatusCode::kFailedPrecondition, spdlog::level::warn,
        "refused a rank attach from " + context->peer() + ": no valid proof of the attach secret");
    SendReject(stream, kNoProof, /*retryable=*/false);
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kNoProof);
  }
  const internal::Hello& hello = first.hello();
  Status admitted = coordinator_->CheckHello(hello);
  if (admitted.ok()) admitted = CheckOfferedTransport(hello, policy_);
  std::shared_ptr<RankSession> session;
  if (admitted.ok()) {
    session = std::make_shared<RankSession>(context, stream, hello);
    admitted = coordinator_->Register(session);
  }
  if (!admitted.ok()) {
    // Unavailable: the rank's predecessor is still attached, or the coordinator is stopping.
    const bool retryable = admitted.code() == StatusCode::kUnavailable;
    failure_log_->Record(admitted.code(), retryable ? spdlog::level::info : spdlog::level::err,
                         "refusing rank " + std::to_string(hello.rank()) + " (pid " +
                             std::to_string(hello.pid()) + ", " + context->peer() +
                             "): " + admitted.message());
    SendReject(stream, admitted.message(), retryable);
    return grpc::Status(
        retryable ? grpc::StatusCode::UNAVAILABLE : grpc::StatusCode::FAILED_PRECONDITION,
        admitted.message());
  }
  internal::RankMessage message;
  while (stream->Read(&message)) coordinator_->OnMessage(session, message);
  coordinator_->Unregister(session);
  session->Close();
  return grpc::Status::OK;
}

}  // namespace gcmoe::server
