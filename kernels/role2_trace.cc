#include "kernels/role2_trace.h"

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <map>
#include <vector>

#include "common/percentile.h"

namespace gcmoe::kernels {
namespace {

constexpr const char* kKindNames[4] = {"shared W1", "routed W1", "shared W2", "routed W2"};

double Us(uint64_t from, uint64_t to) {
  return to >= from ? static_cast<double>(to - from) / 1000.0
                    : -static_cast<double>(from - to) / 1000.0;
}

std::string Line(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Line(const char* format, ...) {
  char buffer[256];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  return std::string(buffer) + "\n";
}

std::string Spread(const char* what, std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return Line("    %-6s med %8.1f  p90 %8.1f  max %8.1f us", what,
              NearestRankPercentile<double>(values, 0.5),
              NearestRankPercentile<double>(values, 0.9), values.back());
}

}  // namespace

std::string SummarizeRole2Trace(std::span<const TaskTrace> trace) {
  std::vector<const TaskTrace*> tasks;
  for (const TaskTrace& t : trace) {
    if (t.recorded != 0 && t.kind < 4) tasks.push_back(&t);
  }
  const size_t missing = trace.size() - tasks.size();
  if (tasks.empty()) return Line("role2 trace: no task recorded (%zu expected)", trace.size());

  uint64_t t0 = UINT64_MAX;
  uint64_t end = 0;
  double run_sum = 0;
  std::map<uint32_t, uint64_t> ctas;                  // the CTA's last task done
  std::map<uint32_t, std::pair<int, double>> per_sm;  // tasks, summed run time
  for (const TaskTrace* t : tasks) {
    t0 = std::min(t0, t->claim_ns);
    end = std::max(end, t->done_ns);
    ctas[t->cta] = std::max(ctas[t->cta], t->done_ns);
    auto& sm = per_sm[t->sm];
    sm.first++;
    sm.second += Us(t->start_ns, t->done_ns);
    run_sum += Us(t->start_ns, t->done_ns);
  }
  std::string out = Line(
      "role2 trace: %zu tasks on %zu CTAs and %zu SMs, %.1f us from the first claim "
      "to the last task done",
      tasks.size(), ctas.size(), per_sm.size(), Us(t0, end));
  // The wgmma kernel (BM 64) drops the tasks of merged tail blocks (RingBlock::tail_rows) unrun.
  if (missing > 0)
    out += Line("  %zu tasks not recorded (or merged tails' tasks, dropped)", missing);

  for (uint32_t kind = 0; kind < 4; ++kind) {
    std::vector<double> wait, queue, run;
    double done = 0;
    for (const TaskTrace* t : tasks) {
      if (t->kind != kind) continue;
      wait.push_back(Us(t->claim_ns, t->ready_ns));
      queue.push_back(Us(t->ready_ns, t->start_ns));
      run.push_back(Us(t->start_ns, t->done_ns));
      done = std::max(done, Us(t0, t->done_ns));
    }
    if (run.empty()) continue;
    out += Line("  %s: %zu tasks, the last done at %.1f us", kKindNames[kind], run.size(), done);
    out += Spread("wait", wait);    // claim -> inputs ready
    out += Spread("queue", queue);  // ready -> the CTA's consumers start it
    out += Spread("run", run);      // start -> outputs stored
  }

  std::vector<const TaskTrace*> slowest = tasks;
  const size_t shown = std::min<size_t>(3, slowest.size());
  std::partial_sort(slowest.begin(), slowest.begin() + static_cast<std::ptrdiff_t>(shown),
                    slowest.end(), [](const TaskTrace* a, const TaskTrace* b) {
                      return a->done_ns - a->start_ns > b->done_ns - b->start_ns;
                    });
  for (size_t i = 0; i < shown; ++i) {
    const TaskTrace* t = slowest[i];
    out += Line("  slowest %zu: task %td (%s) on CTA %u, SM %u: ran %.1f us, from %.1f to %.1f us",
                i + 1, t - trace.data(), kKindNames[t->kind], t->cta, t->sm,
                Us(t->start_ns, t->done_ns), Us(t0, t->start_ns), Us(t0, t->done_ns));
  }
  // The tail: when each CTA ran out of tasks, and how much of the CTAs' time (from the first
  // claim to the last task done) went to running tasks.
  std::vector<double> last_done;
  for (const auto& [cta, done] : ctas) last_done.push_back(Us(t0, done));
  std::sort(last_done.begin(), last_done.end());
  out += Line(
      "  CTAs' last task done: first %.1f, median %.1f, last %.1f us; tasks ran %.1f %% of "
      "the CTAs' time",
      last_done.front(), NearestRankPercentile<double>(last_done, 0.5), last_done.back(),
      100.0 * run_sum / (static_cast<double>(last_done.size()) * Us(t0, end)));
  const auto busiest = std::max_element(
      per_sm.begin(), per_sm.end(),
      [](const auto& a, const auto& b) { return a.second.second < b.second.second; });
  out += Line("  busiest SM %u: %d tasks, %.1f us of task run time", busiest->first,
              busiest->second.first, busiest->second.second);
  return out;
}

}  // namespace gcmoe::kernels
