// `gcmoe bench ep --config F --ranks P`
//
// Expert parallelism over P GPUs of this host, the way the service runs it: P rank processes
// (this command re-executes itself once per rank; rank r on parallel.devices[r], else device
// r), each with its own CUDA backend. In one run it measures, per token count T per rank, the
// layer with the fused GC-MoE exchange (peer memory, one graph replay) and with the NCCL
// all-to-all baseline (the same grouped GEMM between two NCCL rounds), each with the balancer
// off (placement packed by mean load, one copy per expert) and on (the same packing, the
// replicas_per_rank heaviest experts of every rank replicated on its ring neighbour, Relief
// splitting them every step).
//
// Routing is skewed: expert popularity follows 1 / (rank + 1)^skew over a seeded permutation,
// and each token takes k distinct experts drawn by popularity. Every rank generates the whole
// batch identically and keeps its shard. Per configuration and T: one Step, then `replays`
// timed replays after `warmup` (CUDA events on each rank; the replays of all ranks meet at
// the exchange, so they run in lockstep); the table shows the slowest rank's median. Every
// configuration's outputs must be bit-identical (the split moves work, never changes a
// result), which the run checks.
#include "tools/bench_ep.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "balancer/balancer.h"
#include "balancer/placement.h"
#include "balancer/relief.h"
#include "balancer/topology.h"
#include "common/flags.h"
#include "config/config.h"
#include "engine/nccl_comm.h"
#include "engine/numerics.h"
#include "engine/step_plan.h"
#include "server/command_config.h"
#include "server/engine_config.h"
#include "tools/bench_random_weights.h"
#include "tools/bench_rendezvous.h"
#include "tools/bench_util.h"

#if GCMOE_HAVE_CUDA
#include "engine/cuda_backend.h"
#endif

namespace gcmoe::tools {
namespace {

struct Options {
  std::string config_path;
  std::vector<std::string> overrides;  // --set key=value
  int ranks = 2;
  std::string tokens_text = "1,2,4,8,16,32,64,128,256";
  std::string exchanges = "gcmoe,nccl";
  std::string balancers = "off,on";
  double skew = 1.0;
  int replicas = -1;
  int passes = 12;
  int warmup = 10;
  int replays = 100;
  int seed = 1;
  int dispatch_sms = -1;
  int bm = 0;
  int repeat = 0;
  int check_cpu = 0;
  int rank = -1;  // -1: the launcher
  std::string rendezvous;
};

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const size_t end = comma == std::string::npos ? text.size() : comma;
    if (end > start) items.push_back(text.substr(start, end - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

// Whether every item of a comma-separated flag value is `a` or `b`; says which is not.
bool ListsOnly(const char* flag, const std::string& list, const char* a, const char* b) {
  for (const std::string& item : SplitList(list)) {
    if (item != a && item != b) {
      std::fprintf(stderr, "gcmoe bench ep: %s lists %s and %s, not %s\n", flag, a, b,
                   item.c_str());
      return false;
    }
  }
  return true;
}

// Starts one rank process per GPU (this executable, the same flags plus --rank and
// --rendezvous) and waits for all; the first failure's exit code is the result.
int Launch(int argc, char** argv, const Options& o) {
  char dir_template[] = "/tmp/gcmoe-bench-ep-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) {
    std::perror("gcmoe bench ep: mkdtemp");
    return 1;
  }
  std::fprintf(stderr, "gcmoe bench ep: starting %d rank processes (rendezvous %s)\n", o.ranks,
               dir);
  std::vector<pid_t> children;
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("gcmoe bench ep: fork");
      return 1;
    }
    if (pid == 0) {
      std::vector<std::string> args = {"gcmoe", "bench"};
      for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
      args.insert(args.end(), {"--rank", std::to_string(r), "--rendezvous", dir});
      std::vector<char*> c_args;
      for (std::string& a : args) c_args.push_back(a.data());
      c_args.push_back(nullptr);
      execv("/proc/self/exe", c_args.data());
      std::perror("gcmoe bench ep: exec");
      _exit(127);
    }
    children.push_back(pid);
  }
  int result = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && result == 0) result = code;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return result;
}

#if GCMOE_HAVE_CUDA

// The whole batch of one token count, identical on every rank.
struct Batch {
  int per_rank = 0;
  std::vector<int32_t> ids;      // [P * T, k]
  std::vector<float> weights;    // [P * T, k]
  std::vector<uint16_t> hidden;  // [P * T, H] BF16
  std::vector<int64_t> counts;   // [P, E]
  std::vector<int64_t> totals;   // [E]
};

std::vector<double> Popularity(int experts, double skew, uint64_t seed) {
  std::vector<int> order(experts);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed * 31 + 7);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<double> p(experts);
  for (int i = 0; i < experts; ++i) p[order[i]] = 1.0 / std::pow(i + 1.0, skew);
  const double sum = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& v : p) v /= sum;
  return p;
}

Batch MakeBatch(const engine::ModelSpec& spec, int world, int per_rank,
                const std::vector<double>& popularity, uint64_t seed) {
  const int T = world * per_rank;
  const int k = spec.top_k;
  const int E = spec.num_experts;
  Batch b;
  b.per_rank = per_rank;
  b.ids.resize(static_cast<size_t>(T) * k);
  b.weights.resize(b.ids.size());
  b.hidden.resize(static_cast<size_t>(T) * spec.hidden);
  b.counts.assign(static_cast<size_t>(world) * E, 0);
  b.totals.assign(E, 0);
  // Seeded by the batch size, so P ranks x T tokens and one rank x P*T tokens see one batch.
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(T));
  std::discrete_distribution<int> pick(popularity.begin(), popularity.end());
  std::uniform_real_distribution<float> uniform(0.05f, 0.5f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int t = 0; t < T; ++t) {
    int32_t* row = &b.ids[static_cast<size_t>(t) * k];
    for (int j = 0; j < k; ++j) {
      int e;
      do {
        e = pick(rng);
      } while (std::find(row, row + j, e) != row + j);
      row[j] = e;
      b.weights[static_cast<size_t>(t) * k + j] = uniform(rng);
      ++b.counts[static_cast<size_t>(t / per_rank) * E + e];
      ++b.totals[e];
    }
  }
  for (uint16_t& h : b.hidden) h = numerics::FloatToBF16(normal(rng));
  return b;
}

uint64_t Fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

struct Cell {
  double median_us = 0;  // slowest rank's
  double peak_over_mean = 0;
};

int RunRank(const Options& o) {
  auto fail = [&](const std::string& what, const Status& s) {
    std::fprintf(stderr, "gcmoe bench ep: rank %d: %s: %s\n", o.rank, what.c_str(),
                 s.ToString().c_str());
    return 1;
  };
  auto config = config::LoadConfigFile(o.config_path, o.overrides, server::HfCheckpointReader());
  if (!config.ok()) return fail("loading the config", config.status());
  auto tokens = ParseTokenList(o.tokens_text);
  if (!tokens.ok()) return fail("--tokens-per-rank", tokens.status());
  engine::ModelSpec spec = server::ModelSpecFromConfig(*config);
  spec.num_layers = 1;
  const int P = o.ranks;
  const int E = spec.num_experts;
  const int H = spec.hidden;
  const int k = spec.top_k;
  const int me = o.rank;
  const int replicas = o.replicas >= 0 ? o.replicas : config->balancer.replicas_per_rank;
  const int max_tokens = *std::max_element(tokens->begin(), tokens->end());
  FileRendezvous meet(o.rendezvous, me, P, 600000);

  const std::vector<double> popularity = Popularity(E, o.skew, static_cast<uint64_t>(o.seed));
  std::vector<double> mean_load(E);
  for (int e = 0; e < E; ++e) mean_load[e] = popularity[e] * k;
  std::map<std::string, balancer::Placement> placements;
  for (const std::string& b : SplitList(o.balancers)) {
    if (P == 1) {  // one rank holds every expert; nothing to balance
      placements[b] = balancer::ContiguousPlacement(1, E);
      continue;
    }
    auto ring = balancer::MakeRing(P);
    if (!ring.ok()) return fail("the ring topology", ring.status());
    auto fitted = balancer::FitPlacement(mean_load, *ring, b == "on" ? replicas : 0);
    if (!fitted.ok()) return fail("fitting the placement", fitted.status());
    placements[b] = *fitted;
  }
  RandomCodeWeightSource weights(spec, static_cast<uint64_t>(o.seed));

  // --check-cpu T: for token counts up to T, the whole batch through the CPU backend on one
  // rank (the same codes; its BF16 outputs equal the GPU's bit for bit on one GPU), and each
  // rank's GPU outputs compared with its shard of it.
  std::unique_ptr<engine::Backend> cpu;
  std::map<int, std::vector<uint8_t>> cpu_out;  // per T: this rank's shard of the CPU result
  if (o.check_cpu > 0) {
    engine::BackendOptions c;
    c.model = spec;
    c.world_size = 1;
    c.max_tokens_per_rank = P * o.check_cpu;
    c.instance = "bench-ep-cpu-" + std::to_string(getpid());
    auto created = engine::CreateCpuBackend(c);
    if (!created.ok()) return fail("the CPU backend", created.status());
    cpu = std::move(created).value();
    std::vector<int> all(E);
    std::iota(all.begin(), all.end(), 0);
    if (Status s = cpu->LoadExperts(weights, all); !s.ok()) return fail("CPU experts", s);
    if (Status s = cpu->ConnectPeers(engine::PeerSetup{1, {cpu->transport_name()}, ""}); !s.ok()) {
      return fail("CPU connect", s);
    }
    const balancer::Placement one = balancer::ContiguousPlacement(1, E);
    engine::StepPlan plan;
    for (int T : *tokens) {
      if (T > o.check_cpu) continue;
      const Batch batch = MakeBatch(spec, P, T, popularity, static_cast<uint64_t>(o.seed));
      balancer::Split split;
      split.home_tokens = batch.totals;
      const int all_tokens[1] = {P * T};
      if (Status s = engine::BuildStepPlan(all_tokens, batch.totals, E, one, split, &plan);
          !s.ok()) {
        return fail("CPU plan", s);
      }
      engine::StepContext ctx;
      ctx.generation = static_cast<uint64_t>(T);
      ctx.num_tokens = P * T;
      ctx.hidden.dtype = engine::DType::kBF16;
      ctx.hidden.data = batch.hidden.data();
      ctx.topk_ids = batch.ids.data();
      ctx.topk_weights = batch.weights.data();
      ctx.plan = &plan;
      engine::StepOutput out;
      if (Status s = cpu->Step(ctx, &out); !s.ok()) return fail("CPU step", s);
      const size_t shard = static_cast<size_t>(T) * H * 2;
      cpu_out[T].assign(out.output.begin() + me * shard, out.output.begin() + (me + 1) * shard);
    }
    if (me == 0) std::fprintf(stderr, "CPU reference computed for T <= %d\n", o.check_cpu);
  }
  // A GPU output against the CPU reference's shard, where there is one.
  auto check_cpu = [&](int T, const std::vector<uint8_t>& gpu_out, const std::string& what) {
    const auto it = cpu_out.find(T);
    if (it == cpu_out.end()) return;
    const Bf16Difference d = CompareBf16(gpu_out, it->second);
    if (d.values > 0) {
      std::fprintf(stderr, "rank %d: %s: differs from the CPU backend: %s\n", me, what.c_str(),
                   d.Describe(H).c_str());
    }
  };

  std::vector<std::string> configs;
  std::map<std::string, std::map<int, Cell>> cells;
  std::map<int, std::vector<std::string>> hashes;  // per T, per configuration (this rank)
  for (const std::string& exchange : SplitList(o.exchanges)) {
    for (const std::string& b : SplitList(o.balancers)) {
      const std::string name = exchange + (b == "on" ? "+relief" : "");
      configs.push_back(name);
      const balancer::Placement& placement = placements[b];
      engine::BackendOptions options;
      options.model = spec;
      options.rank = me;
      options.world_size = P;
      options.max_tokens_per_rank = std::max(max_tokens, config->engine.max_tokens_per_rank);
      options.device = server::DeviceOfRank(*config, me);
      options.dispatch_sms = o.dispatch_sms >= 0 ? o.dispatch_sms : config->engine.dispatch_sms;
      options.exchange = exchange;
      options.cuda = server::EngineOptionsFromConfig(*config, me, "bench-ep").backend.cuda;
      options.instance = "bench-ep";
      auto created = engine::CudaBackend::Create(options);
      if (!created.ok()) return fail(name + ": creating the CUDA backend", created.status());
      std::unique_ptr<engine::CudaBackend> gpu = std::move(created).value();
      if (Status s = gpu->ForceBlockRows(o.bm); !s.ok()) return fail("--bm", s);
      const std::vector<int> held = placement.ExpertsOnRank(me);
      if (Status s = gpu->LoadExperts(weights, held); !s.ok()) return fail(name + ": loading", s);
      engine::PeerSetup setup;
      setup.epoch = 1;
      std::string id;
      if (gpu->needs_nccl() && me == 0) {
        auto made = engine::NewNcclUniqueId();
        if (!made.ok()) return fail(name + ": the NCCL unique id", made.status());
        id = *made;
      }
      auto ids = meet.AllGather("nccl-" + name, id);
      if (!ids.ok()) return fail(name, ids.status());
      setup.nccl_unique_id = (*ids)[0];
      auto names = meet.AllGather("names-" + name, gpu->transport_name());
      if (!names.ok()) return fail(name, names.status());
      setup.peer_names = *names;
      if (Status s = gpu->ConnectPeers(setup); !s.ok()) return fail(name + ": connecting", s);
      if (me == 0) {
        std::fprintf(stderr, "%s: %zu experts per rank 0, connected%s\n", name.c_str(), held.size(),
                     gpu->needs_nccl() ? (" (" + engine::NcclVersionText() + ")").c_str() : "");
      }
      std::unique_ptr<balancer::Balancer> relief;
      if (b == "on" && P > 1) {
        auto r = balancer::CreateReliefBalancer({.passes = o.passes});
        if (!r.ok()) return fail("creating Relief", r.status());
        relief = std::move(r).value();
        if (Status s = relief->SetPlacement(placement); !s.ok()) return fail("placement", s);
      }
      engine::StepPlan plan;
      uint64_t generation = 0;
      for (int T : *tokens) {
        const Batch batch = MakeBatch(spec, P, T, popularity, static_cast<uint64_t>(o.seed));
        balancer::Split split;
        if (relief != nullptr) {
          if (Status s = relief->Solve(batch.totals, &split); !s.ok()) return fail("Solve", s);
        } else {
          split.home_tokens = batch.totals;
        }
        const std::vector<int> shards(P, T);
        if (Status s = engine::BuildStepPlan(shards, batch.counts, E, placement, split, &plan);
            !s.ok()) {
          return fail("building the step plan", s);
        }
        engine::StepContext ctx;
        ctx.generation = ++generation;
        ctx.num_tokens = T;
        ctx.hidden.dtype = engine::DType::kBF16;
        ctx.hidden.data = batch.hidden.data() + static_cast<size_t>(me) * T * H;
        ctx.topk_ids = batch.ids.data() + static_cast<size_t>(me) * T * k;
        ctx.topk_weights = batch.weights.data() + static_cast<size_t>(me) * T * k;
        ctx.plan = &plan;
        engine::StepOutput out;
        const std::string step_key = name + "-" + std::to_string(T);
        if (auto go = meet.AllGather("go-" + step_key, ""); !go.ok())
          return fail(name, go.status());
        if (Status s = gpu->Step(ctx, &out); !s.ok()) return fail(step_key + ": step", s);
        hashes[T].push_back(std::to_string(Fnv1a(out.output)));
        check_cpu(T, out.output, step_key);
        // The same step again must give the same bits.
        for (int again = 0; again < o.repeat; ++again) {
          ctx.generation = ++generation;
          engine::StepOutput out2;
          if (Status s = gpu->Step(ctx, &out2); !s.ok()) return fail(step_key + ": step", s);
          const std::string repeat = step_key + ": repeat " + std::to_string(again + 1);
          check_cpu(T, out2.output, repeat);
          if (out2.output != out.output) {
            std::fprintf(stderr, "rank %d: %s of the same step differs: %s\n", me, repeat.c_str(),
                         CompareBf16(out.output, out2.output).Describe(H).c_str());
          }
        }
        auto times = gpu->TimeReplays(o.warmup, o.replays);
        if (!times.ok()) return fail(step_key + ": timing", times.status());
        char median[32];
        std::snprintf(median, sizeof(median), "%.3f", Percentile(*times, 0.5));
        auto medians = meet.AllGather("t-" + step_key, median);
        if (!medians.ok()) return fail(name, medians.status());
        Cell& cell = cells[name][T];
        for (const std::string& m : *medians)
          cell.median_us = std::max(cell.median_us, std::atof(m.c_str()));
        const int64_t peak = *std::max_element(plan.load.begin(), plan.load.end());
        const double mean =
            std::accumulate(plan.load.begin(), plan.load.end(), 0.0) / static_cast<double>(P);
        cell.peak_over_mean = mean > 0 ? peak / mean : 1.0;
        if (me == 0) {
          std::string per_rank;
          for (const std::string& m : *medians) per_rank += " " + m;
          std::fprintf(stderr, "  %-14s T %4d: %8.1f us (ranks:%s; BM %d; peak/mean load %.2f)\n",
                       name.c_str(), T, cell.median_us, per_rank.c_str(), gpu->last_block_rows(),
                       cell.peak_over_mean);
        }
      }
    }
  }

  // Every configuration computed the same outputs on every rank.
  bool identical = true;
  for (const auto& [T, list] : hashes) {
    for (size_t c = 0; c < list.size(); ++c) {
      if (list[c] != list[0]) {
        identical = false;
        std::fprintf(stderr, "rank %d, T %d: the outputs of %s differ from those of %s\n", me, T,
                     configs[c].c_str(), configs[0].c_str());
      }
    }
  }
  auto verdicts = meet.AllGather("identical", identical ? "1" : "0");
  if (!verdicts.ok()) return fail("comparing outputs", verdicts.status());
  for (const std::string& v : *verdicts) identical = identical && v == "1";
  if (me != 0) return identical ? 0 : 1;

  std::printf("gcmoe bench ep: %s on %d GPUs (H %d, I %d, %d experts, top-%d, shared I %d)\n",
              o.config_path.c_str(), P, H, spec.intermediate, E, k, spec.shared_intermediate);
  std::printf(
      "routing skew %.2f (popularity 1/(rank+1)^skew); relief: %d replicas per rank on a ring, "
      "%d passes; %d warm-up + %d timed replays; slowest rank's median, microseconds\n",
      o.skew, replicas, o.passes, o.warmup, o.replays);
  std::printf("%6s", "T/rank");
  for (const std::string& c : configs) std::printf(" %14s", c.c_str());
  for (const std::string& c : configs) std::printf(" %14s", ("load:" + c).c_str());
  std::printf("\n");
  for (int T : *tokens) {
    std::printf("%6d", T);
    for (const std::string& c : configs) std::printf(" %14.1f", cells[c][T].median_us);
    for (const std::string& c : configs) std::printf(" %14.2f", cells[c][T].peak_over_mean);
    std::printf("\n");
  }
  std::printf("load: the busiest rank's routed assignments over the mean\n");
  std::printf("outputs of all %zu configurations bit-identical at every T: %s\n", configs.size(),
              identical ? "yes" : "NO");
  return identical ? 0 : 1;
}

#endif  // GCMOE_HAVE_CUDA

}  // namespace

int RunBenchEp(int argc, char** argv) {
  Options o;
  Flags flags("gcmoe bench ep",
              "Times one MoE layer over P GPUs of this host (one rank process per GPU): the fused "
              "GC-MoE exchange against the NCCL all-to-all baseline, balancer off and on, on "
              "skewed routing.");
  flags.String("config", &o.config_path, "config file (model = the whole layer)");
  flags.Repeated("set", &o.overrides, "override a config key, key.path=value (repeatable)");
  flags.Int("ranks", &o.ranks, "GPUs, one rank process each (1..8)");
  flags.String("tokens-per-rank", &o.tokens_text, "token counts per rank, comma-separated");
  flags.String("exchange", &o.exchanges, "exchanges to measure: gcmoe, nccl or gcmoe,nccl");
  flags.String("balancer", &o.balancers, "balancer settings to measure: off, on or off,on");
  flags.Double("skew", &o.skew, "routing skew s: expert popularity 1/(rank+1)^s");
  flags.Int("replicas", &o.replicas,
            "replicated experts per rank with the balancer on (-1 = balancer.replicas_per_rank)");
  flags.Int("passes", &o.passes, "Relief passes per step");
  flags.Int("warmup", &o.warmup, "untimed replays per row");
  flags.Int("replays", &o.replays, "timed replays per row (the median is reported)");
  flags.Int("seed", &o.seed, "seed of the routing, activations and random weights");
  flags.Int("dispatch-sms", &o.dispatch_sms,
            "SMs requested for the dispatch partition (-1 = the config's)");
  flags.Int("bm", &o.bm, "pin the GEMM block size (8, 16, 32, 64; 0 = the heuristic)");
  flags.Int("repeat", &o.repeat, "run every step this many more times and check the bits repeat");
  flags.Int("check-cpu", &o.check_cpu,
            "compare every output of T <= this with the CPU backend (0 = off; slow above ~8)");
  flags.Int("rank", &o.rank, "internal: this process's rank (set by the launcher)");
  flags.String("rendezvous", &o.rendezvous, "internal: the launcher's rendezvous directory");
  if (const int rc = flags.ParseOrExit(argc, argv, 1); rc >= 0) return rc;
  if (o.config_path.empty()) {
    std::fprintf(stderr, "gcmoe bench ep: --config is required\n");
    return 2;
  }
  if (o.ranks < 1 || o.ranks > 8) {
    std::fprintf(stderr, "gcmoe bench ep: --ranks must be 1..8\n");
    return 2;
  }
  if (!ListsOnly("--exchange", o.exchanges, "gcmoe", "nccl") ||
      !ListsOnly("--balancer", o.balancers, "off", "on")) {
    return 2;
  }
  if (o.replays < 1 || o.warmup < 0) {
    std::fprintf(stderr, "gcmoe bench ep: --replays must be >= 1 and --warmup >= 0\n");
    return 2;
  }
  if (o.rank < 0) return Launch(argc, argv, o);
  if (o.rank >= o.ranks || o.rendezvous.empty()) {
    std::fprintf(stderr, "gcmoe bench ep: --rank needs --rendezvous and a rank below --ranks\n");
    return 2;
  }
#if GCMOE_HAVE_CUDA
  return RunRank(o);
#else
  std::fprintf(stderr, "gcmoe bench ep: this gcmoe was built without CUDA\n");
  return 1;
#endif
}

}  // namespace gcmoe::tools
