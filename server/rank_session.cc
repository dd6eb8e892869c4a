#include "server/rank_session.h"

namespace gcmoe::server {

std::string RankSession::Describe() const {
  return "rank " + std::to_string(rank()) + " (pid " + std::to_string(pid()) + ")";
}

bool RankSession::Send(const gcmoe::internal::v1::CoordinatorMessage& message) {
  std::lock_guard<std::mutex> write(write_mu_);
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (closed_) return false;
  }
  return stream_->Write(message);
}

void RankSession::Cancel() {
  std::lock_guard<std::mutex> state(state_mu_);
  if (!closed_) context_->TryCancel();
}

void RankSession::Close() {
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (closed_) return;
    closed_ = true;
    context_->TryCancel();  // unblocks a Write stuck on flow control
  }
  // Wait for a Write in flight to return: after this the stream may be destroyed.
  std::lock_guard<std::mutex> write(write_mu_);
}

}  // namespace gcmoe::server
