#include "server/metrics.h"

#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

namespace gcmoe::server {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

// Latencies from 50 us (a small CPU step) to 10 s (a step near server.step_timeout_ms).
const Histogram::BucketBoundaries& LatencyBuckets() {
  static const Histogram::BucketBoundaries buckets = {
      50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
      50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};
  return buckets;
}

// The balancer's solve runs in microseconds (docs/PERFORMANCE.md).
const Histogram::BucketBoundaries& SolveBuckets() {
  static const Histogram::BucketBoundaries buckets = {1e-6,  2.5e-6, 5e-6,   10e-6, 25e-6,
                                                      50e-6, 100e-6, 250e-6, 1e-3,  10e-3};
  return buckets;
}

prometheus::ClientMetric::Label Label(const std::string& name, const std::string& value) {
  prometheus::ClientMetric::Label label;
  label.name = name;
  label.value = value;
  return label;
}

prometheus::MetricFamily NewFamily(const std::string& name, const std::string& help,
                                   prometheus::MetricType type) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  return family;
}

prometheus::ClientMetric GaugeValue(double value) {
  prometheus::ClientMetric metric;
  metric.gauge.value = value;
  return metric;
}

}  // namespace

// The families recorded at the edge; prometheus-cpp's families and metrics are thread-safe.
class Metrics::Families {
 public:
  Families(prometheus::Registry& registry, int world_size)
      : requests(prometheus::BuildCounter()
                     .Name("gcmoe_requests_total")
                     .Help("Calls of the public API answered, by method and gRPC status code")
                     .Register(registry)),
        request_seconds(prometheus::BuildHistogram()
                            .Name("gcmoe_request_duration_seconds")
                            .Help("Time from a call's arrival to its answer at the API edge "
                                  "(end to end within the coordinator), by method")
                            .Register(registry)),
        queue_seconds(prometheus::BuildHistogram()
                          .Name("gcmoe_forward_queue_seconds")
                          .Help("Time a Forward call waited for earlier steps before its own")
                          .Register(registry)
                          .Add({}, LatencyBuckets())),
        engine_seconds(prometheus::BuildHistogram()
                           .Name("gcmoe_forward_engine_seconds")
                           .Help("Engine time of a Forward step (its slowest rank)")
                           .Register(registry)
                           .Add({}, LatencyBuckets())),
        stage_seconds(prometheus::BuildHistogram()
                          .Name("gcmoe_forward_stage_seconds")
                          .Help("Time of one stage of the Forward data path, by stage")
                          .Register(registry)),
        solve_seconds(prometheus::BuildHistogram()
                          .Name("gcmoe_balancer_solve_seconds")
                          .Help("Time the balancer took to split a step's load (per step)")
                          .Register(registry)
                          .Add({}, SolveBuckets())),
        tokens(prometheus::BuildCounter()
                   .Name("gcmoe_tokens_total")
                   .Help("Tokens of the Forward calls that succeeded")
                   .Register(registry)
                   .Add({})),
        in_flight(prometheus::BuildGauge()
                      .Name("gcmoe_requests_in_flight")
                      .Help("Calls of the public API being handled now (queued or running)")
                      .Register(registry)
                      .Add({})) {
    auto& before = prometheus::BuildCounter()
                       .Name("gcmoe_rank_assignments_unbalanced_total")
                       .Help(
                           "Token-expert assignments each rank would have computed without "
                           "balancing (every assignment at its expert's home copy)")
                       .Register(registry);
    auto& after = prometheus::BuildCounter()
                      .Name("gcmoe_rank_assignments_total")
                      .Help("Token-expert assignments each rank computed, after balancing")
                      .Register(registry);
    for (int r = 0; r < world_size; ++r) {
      const std::string rank = std::to_string(r);
      load_before.push_back(&before.Add({{"rank", rank}}));
      load_after.push_back(&after.Add({{"rank", rank}}));
    }
  }

  // The labeled children, each looked up in its family once: Family::Add builds a label map
  // and a bucket list on every call, which the Forward path should not pay ten times per call.
  Counter& RequestCounter(std::string_view method, std::string_view code) {
    std::lock_guard<std::mutex> lock(mu);
    auto& by_code = request_counters[std::string(method)];
    auto found = by_code.find(code);
    if (found != by_code.end()) return *found->second;
    Counter* counter = &requests.Add({{"method", std::string(method)}, {"code", std::string(code)}});
    by_code.emplace(std::string(code), counter);
    return *counter;
  }
  Histogram& Labeled(Family<Histogram>& family, const char* label,
                     std::map<std::string, Histogram*, std::less<>>& cache,
                     std::string_view value) {
    std::lock_guard<std::mutex> lock(mu);
    auto found = cache.find(value);
    if (found != cache.end()) return *found->second;
    Histogram* histogram = &family.Add({{label, std::string(value)}}, LatencyBuckets());
    cache.emplace(std::string(value), histogram);
    return *histogram;
  }

  Family<Counter>& requests;
  Family<Histogram>& request_seconds;
  Histogram& queue_seconds;
  Histogram& engine_seconds;
  Family<Histogram>& stage_seconds;
  Histogram& solve_seconds;
  Counter& tokens;
  Gauge& in_flight;
  std::vector<Counter*> load_before;  // [P]
  std::vector<Counter*> load_after;   // [P]

  std::mutex mu;  // guards the caches below
  std::map<std::string, std::map<std::string, Counter*, std::less<>>, std::less<>>
      request_counters;                                             // [method][code]
  std::map<std::string, Histogram*, std::less<>> request_histograms;  // [method]
  std::map<std::string, Histogram*, std::less<>> stage_histograms;    // [stage]
};

// Builds the state families at scrape time from the coordinator's answer.
class Metrics::StateCollector : public prometheus::Collectable {
 public:
  void SetSource(std::function<ServiceState()> source) {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = std::move(source);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::function<ServiceState()> source;
    {
      std::lock_guard<std::mutex> lock(mu_);
      source = source_;
    }
    if (!source) return {};
    const ServiceState state = source();
    using prometheus::MetricType;
    auto serving = NewFamily("gcmoe_serving",
                             "1 when every rank is ready and the service answers Forward calls",
                             MetricType::Gauge);
    serving.metric.push_back(GaugeValue(state.serving ? 1 : 0));
    auto queue = NewFamily("gcmoe_queue_depth",
                           "Forward calls waiting behind the step in flight (server.max_queue "
                           "is the limit)",
                           MetricType::Gauge);
    queue.metric.push_back(GaugeValue(state.queue_depth));
    auto ready = NewFamily("gcmoe_rank_ready", "1 when the rank is attached and ready, by rank",
                           MetricType::Gauge);
    auto restarts = NewFamily("gcmoe_rank_restarts_total",
                              "Times a rank attached again after its first attach, by rank",
                              MetricType::Counter);
    for (const gcmoe::v1::RankStats& rank : state.ranks) {
      const std::string r = std::to_string(rank.rank());
      prometheus::ClientMetric ready_metric = GaugeValue(rank.ready() ? 1 : 0);
      ready_metric.label.push_back(Label("rank", r));
      ready.metric.push_back(ready_metric);
      prometheus::ClientMetric restart_metric;
      restart_metric.counter.value = static_cast<double>(rank.restarts());
      restart_metric.label.push_back(Label("rank", r));
      restarts.metric.push_back(restart_metric);
    }
    auto memory_used = NewFamily("gcmoe_gpu_memory_used_bytes",
                                 "Memory in use on the rank's GPU (total - free as the driver "
                                 "reports it, every process on that GPU), by rank",
                                 MetricType::Gauge);
    auto memory_total = NewFamily("gcmoe_gpu_memory_total_bytes",
                                  "Memory of the rank's GPU, by rank", MetricType::Gauge);
    for (const gcmoe::v1::RankStats& rank : state.ranks) {
      if (!rank.has_gpu_memory()) continue;
      const std::string r = std::to_string(rank.rank());
      const std::string device = std::to_string(rank.gpu_memory().device());
      prometheus::ClientMetric used =
          GaugeValue(static_cast<double>(rank.gpu_memory().used_bytes()));
      used.label = {Label("device", device), Label("rank", r)};
      memory_used.metric.push_back(used);
      prometheus::ClientMetric total =
          GaugeValue(static_cast<double>(rank.gpu_memory().total_bytes()));
      total.label = {Label("device", device), Label("rank", r)};
      memory_total.metric.push_back(total);
    }
    std::vector<prometheus::MetricFamily> families = {serving, queue, ready, restarts};
    // Families with no sample (no rank on a GPU) are left out rather than exported empty.
    if (!memory_used.metric.empty()) {
      families.push_back(memory_used);
      families.push_back(memory_total);
    }
    return families;
  }

 private:
  mutable std::mutex mu_;
  std::function<ServiceState()> source_;
};

Result<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen, int world_size) {
  std::unique_ptr<Metrics> metrics(new Metrics());
  metrics->registry_ = std::make_shared<prometheus::Registry>();
  metrics->families_ = std::make_unique<Families>(*metrics->registry_, world_size);
  metrics->state_ = std::make_shared<StateCollector>();
  if (listen.empty()) return metrics;
  try {
    // One serving thread: a scrape is a few kilobytes every few seconds.
    metrics->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return Unavailable("server.metrics_listen: cannot listen on " + listen + " (" + e.what() +
                       "; in use by another process, or not an address of this host)");
  }
  metrics->exposer_->RegisterCollectable(metrics->registry_);
  metrics->exposer_->RegisterCollectable(metrics->state_);
  const std::vector<int> ports = metrics->exposer_->GetListeningPorts();
  const size_t colon = listen.rfind(':');
  metrics->address_ = listen.substr(0, colon) + ":" +
                      (ports.empty() ? listen.substr(colon + 1) : std::to_string(ports.front()));
  return metrics;
}

Metrics::~Metrics() = default;

void Metrics::SetStateSource(std::function<ServiceState()> source) {
  state_->SetSource(std::move(source));
}

void Metrics::RecordCall(std::string_view method, std::string_view code, double seconds) {
  families_->RequestCounter(method, code).Increment();
  families_->Labeled(families_->request_seconds, "method", families_->request_histograms, method)
      .Observe(seconds);
}

void Metrics::RecordStep(const gcmoe::v1::ForwardStats& stats, int num_tokens) {
  families_->queue_seconds.Observe(static_cast<double>(stats.queue_ns()) * 1e-9);
  families_->engine_seconds.Observe(static_cast<double>(stats.engine_ns()) * 1e-9);
  families_->tokens.Increment(num_tokens);
  // The solve time only means something when the balancer ran.
  if (stats.balancer_enabled()) {
    families_->solve_seconds.Observe(static_cast<double>(stats.relief_solve_ns()) * 1e-9);
  }
  const int ranks = static_cast<int>(families_->load_before.size());
  for (int r = 0; r < ranks && r < stats.load_before_size(); ++r) {
    families_->load_before[r]->Increment(static_cast<double>(stats.load_before(r)));
  }
  for (int r = 0; r < ranks && r < stats.load_after_size(); ++r) {
    families_->load_after[r]->Increment(static_cast<double>(stats.load_after(r)));
  }
}

void Metrics::RecordStage(std::string_view stage, double seconds) {
  families_->Labeled(families_->stage_seconds, "stage", families_->stage_histograms, stage)
      .Observe(seconds);
}

void Metrics::CallStarted() { families_->in_flight.Increment(); }
void Metrics::CallFinished() { families_->in_flight.Decrement(); }

}  // namespace gcmoe::server
