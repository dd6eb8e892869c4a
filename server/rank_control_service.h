// gcmoe.internal.v1.RankControl: where rank processes attach to the coordinator.
#pragma once

#include "gcmoe/internal/v1/rank.grpc.pb.h"
#include "server/coordinator.h"

namespace gcmoe::server {

class RankControlService final : public gcmoe::internal::v1::RankControl::Service {
 public:
  explicit RankControlService(Coordinator* coordinator) : coordinator_(coordinator) {}

  // Held open for the rank's whole life; its end is how the coordinator learns the rank is gone.
  grpc::Status Attach(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<gcmoe::internal::v1::CoordinatorMessage,
                                               gcmoe::internal::v1::RankMessage>* stream) override;

 private:
  Coordinator* coordinator_;
};

}  // namespace gcmoe::server
