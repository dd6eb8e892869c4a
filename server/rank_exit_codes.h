// The exit codes of `gcmoe rank`, as its supervisor (`gcmoe serve`'s RankSupervisor, systemd,
// Kubernetes) reads them.
#pragma once

namespace gcmoe::server {

// 1-3: the rank could not start; a restart would fail the same way.
inline constexpr int kExitStartFailed = 1;  // its config, credentials or weights
inline constexpr int kExitUsage = 2;        // its command line or coordinator address
inline constexpr int kExitRefused = 3;      // the coordinator refused it for good
inline constexpr int kExitStartFailedFirst = kExitStartFailed;
inline constexpr int kExitStartFailedLast = kExitRefused;
// Its GPU became unusable for the process (engine::Engine::device_lost): only a new process
// computes again, so the supervisor restarts it.
inline constexpr int kExitDeviceLost = 4;

}  // namespace gcmoe::server
