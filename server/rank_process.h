// A rank process: it loads its engine, attaches to the coordinator, and serves Setup and Step
// messages until told to stop. A worker thread runs steps while the stream reader stays free to
// take an Abort at any moment.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "config/config.h"
#include "engine/engine.h"
#include "gcmoe/internal/v1/rank.grpc.pb.h"
#include "server/attach_secret.h"
#include "server/rank_exit_codes.h"
#include "server/rank_io.h"

namespace gcmoe::server {

struct RankProcessOptions {
  config::Config config;
  int rank = 0;
  std::string coordinator;  // address to dial
  // serve's children: exit when the coordinator goes away instead of waiting for it to return.
  bool exit_with_coordinator = false;
};

class RankProcess {
 public:
  // Reads the attach secret (server.rank_secret_file) and builds the engine: loads and checks this
  // rank's weights (the slow part of start-up). The exchange segment's name is derived from the
  // secret (AttachSecret::InstanceName), as the coordinator expects it.
  static Result<std::unique_ptr<RankProcess>> Create(const RankProcessOptions& options);
  ~RankProcess();

  // Attaches and serves until Stop(), a Shutdown message, a final Reject (kExitRefused), the loss
  // of its GPU (kExitDeviceLost, once the failed step is answered), or the loss of the
  // coordinator with exit_with_coordinator. A retryable Reject (the rank's predecessor still
  // attached) dials again. Returns the process exit code.
  int Run();
  // Thread-safe, callable from a signal watcher.
  void Stop();

 private:
  using Stream = grpc::ClientReaderWriter<gcmoe::internal::v1::RankMessage,
                                          gcmoe::internal::v1::CoordinatorMessage>;
  explicit RankProcess(AttachSecret secret) : secret_(std::move(secret)) {}
  // A message from the coordinator and when it arrived (the host's monotonic clock).
  struct Received {
    gcmoe::internal::v1::CoordinatorMessage message;
    int64_t received_ns = 0;
    bool doorbell = false;  // came through the I/O region: the result goes back that way
  };

  // A step the worker launched on the engine and has not answered yet, with what the engine
  // reads and writes until it finishes (Engine::Launch): two alternate, so that the next step
  // can be launched while this one is on the device.
  struct StepInFlight {
    Received received;
    Status status;          // the launch's; not OK: nothing to finish, the reply says why
    bool launched = false;  // the engine holds it until Finish
    std::vector<int> tokens_per_rank;
    engine::StepRequest request;
    // Calls' activations or outputs in a client's GPU memory, open until the step is over.
    std::vector<std::shared_ptr<engine::ImportedMemory>> held;
    std::vector<engine::DeviceRows> device_rows;
    engine::StepOutput output;  // storage reused
    engine::StepStats stats;
  };

  // One attached session; returns true to reconnect, false to exit with *exit_code.
  bool Session(int* exit_code, bool* ever_attached);
  void WorkerLoop(Stream* stream);
  void HandleSetup(const gcmoe::internal::v1::Setup& setup, Stream* stream);
  // Builds the step's request from its message and launches it on the engine (worker only).
  void LaunchStep(Received received, StepInFlight* step);
  // Finishes the oldest step in flight and answers it (worker only).
  void FinishStep(Stream* stream);
  // With a step in flight: waits until the device is done with it or the next message comes,
  // and says whether that message is a step to launch behind it first.
  bool NextStepFirst();
  // Opens a client's GPU memory (RegisterMemory's cuda_ipc) for later steps. Worker only.
  Status OpenRegion(const gcmoe::internal::v1::DeviceRegion& region);
  // The opened region `span` names, checked against its bytes ("<field>" in errors), and where
  // in it the span starts.
  Result<std::pair<std::shared_ptr<engine::ImportedMemory>, uint8_t*>> ResolveSpan(
      const std::string& field, const gcmoe::internal::v1::DeviceSpan& span) const;
  // Maps the I/O region Setup names (or unmaps it when it names none); the error, if any.
  std::string MapIo(const gcmoe::internal::v1::Setup& setup);
  void UnmapIo();
  // Fills *memory with the GPU's memory when the backend has a GPU and the last sample is older
  // than kMemorySampleInterval (always with force); false otherwise. Worker only.
  bool SampleGpuMemory(bool force, gcmoe::v1::GpuMemory* memory);
  // Takes steps from the I/O region's doorbell into the worker's queue until doorbell_stop_.
  void DoorbellLoop();

  RankProcessOptions options_;
  // Declared before the engine so that it is unmapped after the engine (which pins it) is gone.
  std::unique_ptr<RankIo> io_;
  std::thread doorbell_;  // DoorbellLoop, while io_ is mapped
  std::atomic<bool> doorbell_stop_{false};
  const AttachSecret secret_;
  std::unique_ptr<engine::Engine> engine_;
  StepInFlight steps_[2];
  std::deque<StepInFlight*> in_flight_;  // launched and not answered, oldest first (worker only)
  // Clients' GPU memory opened for this session, by DeviceRegion id (worker only; released
  // before the engine goes).
  std::map<uint64_t, std::shared_ptr<engine::ImportedMemory>> device_regions_;
  std::chrono::steady_clock::time_point memory_sampled_;  // worker only
  uint64_t placement_version_ = 0;  // of the placement installed by the last Setup (worker only)
  int failed_connects_ = 0;         // consecutive sessions that could not connect (Run only)

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Received> queue_;  // Setup/Step for the worker
  std::chrono::microseconds spin_{0};  // from server.spin_wait (HotPathSpinBudget)
  std::atomic<bool> queued_{false};  // queue_ is not empty (set and cleared under mu_)
  bool session_over_ = false;
  uint64_t running_generation_ = 0;  // the newest step in flight (0: none)
  std::atomic<bool> stop_{false};
  std::atomic<int> fatal_exit_code_{0};  // set with stop_ when the rank must not go on
  grpc::ClientContext* context_ = nullptr;  // the live session's, guarded by mu_
};

}  // namespace gcmoe::server
