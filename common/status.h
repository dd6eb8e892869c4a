// Status and Result<T>: the one error style of the engine, balancer and config layers.
// Errors travel as values; server/ converts them to grpc::Status once, at the RPC edge.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace gcmoe {

// Codes mirror the gRPC codes the API promises (DESIGN.md §3) so the edge mapping is 1:1.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kResourceExhausted,
  kUnavailable,
  kDeadlineExceeded,
  kFailedPrecondition,
  kAborted,
  kDataLoss,
  kUnimplemented,
  kAlreadyExists,
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: hidden.shape[1] is 100, expected 256"
  std::string ToString() const;

  // Prefixes context to the message, keeping the code: "loading layer 3: " + message.
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status that explains its absence.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace gcmoe

#define GCMOE_CONCAT_INNER(a, b) a##b
#define GCMOE_CONCAT(a, b) GCMOE_CONCAT_INNER(a, b)

#define GCMOE_RETURN_IF_ERROR(expr)              \
  do {                                           \
    ::gcmoe::Status gcmoe_status_ = (expr);      \
    if (!gcmoe_status_.ok()) return gcmoe_status_; \
  } while (0)

#define GCMOE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

// GCMOE_ASSIGN_OR_RETURN(auto weights, LoadWeights(path));
#define GCMOE_ASSIGN_OR_RETURN(lhs, expr) \
  GCMOE_ASSIGN_OR_RETURN_IMPL(GCMOE_CONCAT(gcmoe_result_, __LINE__), lhs, expr)
