// The exit codes of `gcmoe rank`, as its supervisor (`gcmoe serve`'s RankSupervisor, systemd,
// Kubernetes) reads them.
#pragma once

namespace gcmoe::server {

// 1-3: the rank could not start (config or weights, usage, refused by the coordinator); a
// restart would fail the same way.
inline constexpr int kExitStartFailedFirst = 1;
inline constexpr int kExitStartFailedLast = 3;
// Its GPU became unusable for the process (engine::Engine::device_lost): only a new process
// computes again, so the supervisor restarts it.
inline constexpr int kExitDeviceLost = 4;

}  // namespace gcmoe::server
