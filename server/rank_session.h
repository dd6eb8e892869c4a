// One attached rank process as the coordinator sees it: its control stream and its Hello.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>

#include "gcmoe/internal/v1/rank.grpc.pb.h"

namespace gcmoe::server {

class RankSession {
 public:
  using Stream = grpc::ServerReaderWriter<gcmoe::internal::v1::CoordinatorMessage,
                                          gcmoe::internal::v1::RankMessage>;

  RankSession(grpc::ServerContext* context, Stream* stream, gcmoe::internal::v1::Hello hello)
      : context_(context), stream_(stream), hello_(std::move(hello)) {}

  const gcmoe::internal::v1::Hello& hello() const { return hello_; }
  int rank() const { return static_cast<int>(hello_.rank()); }
  int64_t pid() const { return hello_.pid(); }
  uint64_t incarnation() const { return hello_.incarnation(); }
  const std::string& transport_name() const { return hello_.transport_name(); }
  std::string Describe() const;  // "rank 1 (pid 4242)"

  // Thread-safe. False once the stream is closed or broken.
  bool Send(const gcmoe::internal::v1::CoordinatorMessage& message);
  // Breaks the stream (a rank that stopped answering); its handler then unregisters it.
  void Cancel();
  // Called by the stream's handler before it returns: after this no Send touches the stream.
  void Close();

 private:
  // A Write may block on flow control while a rank is stalled, so writes and state changes take
  // different locks: Cancel() must never wait behind a blocked Write.
  std::mutex write_mu_;
  std::mutex state_mu_;
  bool closed_ = false;  // guarded by state_mu_ (also read under write_mu_ after Close)
  grpc::ServerContext* context_;
  Stream* stream_;
  const gcmoe::internal::v1::Hello hello_;
};

}  // namespace gcmoe::server
