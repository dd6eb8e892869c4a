// The rank engine: the public face of engine/ for the rank process. It owns this rank's weights,
// its balancer and its backend; each step it turns the count matrix into a split and a plan
// (identically on every rank) and runs the backend.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "balancer/balancer.h"
#include "common/status.h"
#include "engine/backend.h"
#include "engine/model_spec.h"
#include "engine/step_plan.h"
#include "engine/weights.h"

namespace gcmoe::engine {

struct EngineOptions {
  BackendOptions backend;            // model, rank, world size, capacity, threads, ...
  std::string backend_kind = "cpu";  // "cpu" | "cuda"
};

struct StepRequest {
  uint64_t generation = 0;
  int layer = 0;
  std::span<const int> tokens_per_rank;  // [P]
  std::span<const int64_t> counts;       // [P, E] C[src][expert]
  HiddenView hidden;                     // this rank's shard [T_r, H]
  const int32_t* topk_ids = nullptr;     // [T_r, k]
  const float* topk_weights = nullptr;   // [T_r, k]
  bool output_fp32 = false;
  int relief_passes = 0;  // passes the balancer runs this step; 0: its default
  std::span<const DeviceRows> device_rows;  // StepContext::device_rows
};

struct StepStats {
  std::vector<int64_t> load_before;  // [P]
  std::vector<int64_t> load_after;   // [P]
  int passes = 0;
  int64_t solve_ns = 0;
  // This rank's whole step, solve included: from Launch, or from the previous step's Finish when
  // this one was launched before it, to Finish.
  int64_t engine_ns = 0;
  int64_t assignments_computed = 0;
  // engine_ns's parts: the host work (split, plan, step tables) and the backend's stages. The
  // CUDA backend's h2d runs from the activations' upload, which overlaps the host work, to the
  // layer's start; host_ns is what is left of engine_ns.
  int64_t host_ns = 0;
  int64_t h2d_ns = 0;
  int64_t device_ns = 0;
  int64_t d2h_ns = 0;
};

class Engine {
 public:
  // Opens and checks the weights, creates the backend, installs `placement` in the balancer and
  // loads every expert this rank holds a copy of.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                std::unique_ptr<balancer::Balancer> balancer,
                                                const balancer::Placement& placement);

  std::string transport_name() const { return backend_->transport_name(); }
  const std::string& backend_name() const { return backend_name_; }
  const std::vector<int>& held_experts() const { return held_experts_; }

  // Maps the peers' exchange memory for a new epoch (no step in flight anywhere).
  Status Connect(const PeerSetup& setup);
  bool needs_nccl() const { return backend_->needs_nccl(); }

  // Installs another placement (between steps): loads the weights of every expert this rank
  // now holds a copy of. A no-op when the placement is the one installed.
  Status SetPlacement(const balancer::Placement& placement);
  const balancer::Placement& placement() const { return balancer_->placement(); }

  Status Step(const StepRequest& request, StepOutput* output, StepStats* stats);

  // The same step in two halves (Backend::Launch, Backend::Finish): Launch does the host work
  // and enqueues the device's, Finish waits for it and completes `output` and `stats`. With
  // pipelines(), the next step may be launched before this one finishes, so that its host work
  // runs while this one is on the device; at most two are unfinished, finished in launch order,
  // with `output`, `stats` and what `request` points to kept until then. Done(generation): Finish
  // would not wait.
  bool pipelines() const { return backend_->pipelines(); }
  Status Launch(const StepRequest& request, StepOutput* output, StepStats* stats);
  bool Done(uint64_t generation) { return backend_->Done(generation); }
  Status Finish(uint64_t generation, StepOutput* output, StepStats* stats);

  // Host memory that steps read from and write to (StepOutput::destination); see Backend.
  Status RegisterHostMemory(void* data, size_t bytes) {
    return backend_->RegisterHostMemory(data, bytes);
  }
  void UnregisterHostMemory(void* data) { backend_->UnregisterHostMemory(data); }
  // Another process's GPU memory for steps' activations and outputs; see Backend.
  Result<std::shared_ptr<ImportedMemory>> ImportDeviceMemory(const std::string& ipc_handle,
                                                             int device, uint64_t offset,
                                                             uint64_t bytes) {
    return backend_->ImportDeviceMemory(ipc_handle, device, offset, bytes);
  }
  bool QueryDeviceMemory(DeviceMemory* memory) const {
    return backend_->QueryDeviceMemory(memory);
  }

  // Empty while steps can run; why not, once the backend's device is lost for this process
  // (Backend::device_lost). Thread-safe.
  std::string device_lost() const { return backend_->device_lost(); }

  // Thread-safe: the step of this generation (or earlier) gives up as soon as it can.
  void Abort(uint64_t generation) { backend_->Abort(generation); }

 private:
  Engine() = default;
  Status LoadHeldExperts();

  EngineOptions options_;
  std::string backend_name_;
  std::unique_ptr<balancer::Balancer> balancer_;
  std::unique_ptr<WeightSource> weights_;
  std::unique_ptr<Backend> backend_;
  std::vector<int> held_experts_;
  // When each unfinished step was launched, oldest first, and when the last one finished.
  std::deque<std::pair<uint64_t, std::chrono::steady_clock::time_point>> launched_;
  std::chrono::steady_clock::time_point finished_{};
  // Reused per step.
  std::vector<int64_t> expert_totals_;
  balancer::Split split_;
  StepPlan plan_;
};

}  // namespace gcmoe::engine
