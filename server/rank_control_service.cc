#include "server/rank_control_service.h"

#include <spdlog/spdlog.h>

namespace gcmoe::server {

namespace internal = gcmoe::internal::v1;

grpc::Status RankControlService::Attach(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<internal::CoordinatorMessage, internal::RankMessage>* stream) {
  internal::RankMessage first;
  if (!stream->Read(&first)) return grpc::Status::OK;
  if (!first.has_hello()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first message of an Attach stream must be Hello");
  }
  auto session = std::make_shared<RankSession>(context, stream, first.hello());
  const Status registered = coordinator_->Register(session);
  if (!registered.ok()) {
    spdlog::error("refusing rank {} (pid {}): {}", first.hello().rank(), first.hello().pid(),
                  registered.message());
    internal::CoordinatorMessage reject;
    reject.mutable_reject()->set_reason(registered.message());
    stream->Write(reject);
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, registered.message());
  }
  internal::RankMessage message;
  while (stream->Read(&message)) coordinator_->OnMessage(session, message);
  coordinator_->Unregister(session);
  session->Close();
  return grpc::Status::OK;
}

}  // namespace gcmoe::server
