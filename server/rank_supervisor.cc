#include "server/rank_supervisor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include <spdlog/spdlog.h>

#include "server/rank_exit_codes.h"
#include "server/signals.h"

namespace gcmoe::server {

std::string SelfExecutable() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "gcmoe";
  path[n] = '\0';
  return path;
}

RankSupervisor::RankSupervisor(std::string executable, std::vector<std::vector<std::string>> args,
                               bool restart, std::chrono::milliseconds restart_backoff)
    : executable_(std::move(executable)),
      args_(std::move(args)),
      restart_(restart),
      backoff_(restart_backoff),
      children_(args_.size()) {}

RankSupervisor::~RankSupervisor() { StopAll(std::chrono::milliseconds(2000)); }

Status RankSupervisor::Spawn(int rank) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(executable_.c_str()));
  for (const std::string& a : args_[rank]) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // systemd's notifications are serve's, not its ranks': the children get the environment
  // without systemd's notify variables (built before fork: the child only calls exec).
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.starts_with("NOTIFY_SOCKET=") || entry.starts_with("WATCHDOG_USEC=") ||
        entry.starts_with("WATCHDOG_PID=")) {
      continue;
    }
    env.push_back(*e);
  }
  env.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return Unavailable(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    UnblockTerminationSignals();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(0);  // the parent died before prctl took effect
    execve(executable_.c_str(), argv.data(), env.data());
    std::fprintf(stderr, "gcmoe serve: exec %s: %s\n", executable_.c_str(), std::strerror(errno));
    _exit(127);
  }
  Child& child = children_[rank];
  child.pid = pid;
  ++child.starts;
  spdlog::info("started rank {} (pid {}){}", rank, pid,
               child.starts > 1 ? " again (restart " + std::to_string(child.starts - 1) + ")"
                                : std::string());
  return Status::Ok();
}

Status RankSupervisor::StartAll() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int r = 0; r < static_cast<int>(args_.size()); ++r) GCMOE_RETURN_IF_ERROR(Spawn(r));
  }
  reaper_ = std::thread([this] { ReapLoop(); });
  return Status::Ok();
}

Status RankSupervisor::fatal() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fatal_;
}

pid_t RankSupervisor::pid(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return children_[rank].pid;
}

void RankSupervisor::StopRestarts() {
  std::lock_guard<std::mutex> lock(mu_);
  restarts_stopped_ = true;
}

void RankSupervisor::ReapLoop() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      for (int r = 0; r < static_cast<int>(children_.size()); ++r) {
        Child& child = children_[r];
        if (child.pid > 0) {
          int status = 0;
          const pid_t done = waitpid(child.pid, &status, WNOHANG);
          if (done != child.pid) continue;
          child.pid = -1;
          if (restarts_stopped_) {
            spdlog::info("rank {} stopped ({})", r,
                         WIFSIGNALED(status) ? std::string("signal ") + strsignal(WTERMSIG(status))
                                             : "exit code " + std::to_string(WEXITSTATUS(status)));
            continue;
          }
          if (WIFSIGNALED(status)) {
            spdlog::error("rank {} was killed by signal {} ({})", r, WTERMSIG(status),
                          strsignal(WTERMSIG(status)));
          } else {
            const int code = WEXITSTATUS(status);
            if (code == 0) {
              spdlog::warn("rank {} exited", r);
            } else if (code == kExitDeviceLost) {
              spdlog::error("rank {} exited with code {}: its GPU failed{}", r, code,
                            restart_ ? "; restarting it" : "");
            } else {
              spdlog::error("rank {} exited with code {}", r, code);
            }
            if (code >= kExitStartFailedFirst && code <= kExitStartFailedLast && fatal_.ok()) {
              fatal_ = FailedPrecondition("rank " + std::to_string(r) +
                                          " could not start (exit code " +
                                          std::to_string(code) + "); its messages say why");
            }
          }
          if (!restart_ || !fatal_.ok()) continue;
          child.restart_at = std::chrono::steady_clock::now() + backoff_;
        } else if (restart_ && !restarts_stopped_ && fatal_.ok() &&
                   child.restart_at.time_since_epoch().count() != 0 &&
                   std::chrono::steady_clock::now() >= child.restart_at) {
          child.restart_at = {};
          if (Status s = Spawn(r); !s.ok()) spdlog::error("restarting rank {}: {}", r, s.message());
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void RankSupervisor::StopAll(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !reaper_.joinable()) return;
    stopping_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (Child& child : children_) {
    if (child.pid > 0) kill(child.pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (int r = 0; r < static_cast<int>(children_.size()); ++r) {
    Child& child = children_[r];
    while (child.pid > 0) {
      int status = 0;
      const pid_t done = waitpid(child.pid, &status, WNOHANG);
      if (done == child.pid || (done < 0 && errno == ECHILD)) {
        child.pid = -1;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        spdlog::warn("rank {} (pid {}) did not stop in time; killing it", r, child.pid);
        kill(child.pid, SIGKILL);
        waitpid(child.pid, &status, 0);
        child.pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace gcmoe::server
