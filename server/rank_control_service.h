// gcmoe.internal.v1.RankControl: where rank processes attach to the coordinator, and the gate
// they pass first: a proof of the attach secret, then transport names the coordinator expects,
// then the coordinator's own checks (rank index, config digest, a free slot).
#pragma once

#include <string>

#include "gcmoe/internal/v1/rank.grpc.pb.h"
#include "server/attach_secret.h"
#include "server/coordinator.h"
#include "server/failure_log.h"

namespace gcmoe::server {

struct AttachPolicy {
  AttachSecret secret;
  std::string instance;  // the ranks' exchange segment instance (AttachSecret::InstanceName)
  std::string backend;   // engine.backend: which form of transport name to expect
};

// Ok when `hello` offers the transport this coordinator expects of its rank: on the CPU backend
// exactly the shared-memory segment "/gcmoe-<instance>-r<rank>", on the CUDA backend an IPC
// region exported by the process the Hello names. Peers map what the coordinator hands out, so
// a rank must not be able to point them at any other memory.
Status CheckOfferedTransport(const gcmoe::internal::v1::Hello& hello, const AttachPolicy& policy);

class RankControlService final : public gcmoe::internal::v1::RankControl::Service {
 public:
  RankControlService(Coordinator* coordinator, AttachPolicy policy, FailureLog* failure_log)
      : coordinator_(coordinator), policy_(std::move(policy)), failure_log_(failure_log) {}

  // Held open for the rank's whole life; its end is how the coordinator learns the rank is gone.
  grpc::Status Attach(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<gcmoe::internal::v1::CoordinatorMessage,
                                               gcmoe::internal::v1::RankMessage>* stream) override;

 private:
  Coordinator* coordinator_;
  const AttachPolicy policy_;
  FailureLog* failure_log_;
};

}  // namespace gcmoe::server
