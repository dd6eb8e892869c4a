// `gcmoe balance eplb | replay`: an EPLB-compatible placement from load statistics, and replays
// of real routing traces through every balancing scheme (DESIGN.md §5 Metrics).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "balancer/eplb.h"
#include "common/flags.h"
#include "tools/balance_replay.h"
#include "tools/balance_trace.h"
#include "tools/commands.h"

namespace gcmoe::tools {
namespace {

using nlohmann::json;

void PrintGroupUsage(FILE* out) {
  std::fputs(
      "usage: gcmoe balance COMMAND [flags]   (gcmoe balance COMMAND --help for its flags)\n"
      "\n"
      "Balancer tools.\n"
      "\n"
      "commands:\n"
      "  eplb    an EPLB-compatible placement (DeepSeek EPLB's rebalance_experts) as JSON\n"
      "  replay  replay a routing trace through none / EPLB / Relief / the exact LP and print\n"
      "          spatial utilization, attainment of the LP optimum, solve time and U_eff\n",
      out);
}

int Fail(const std::string& command, const Status& status) {
  std::fprintf(stderr, "gcmoe balance %s: %s\n", command.c_str(), status.message().c_str());
  return 1;
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// W.json: a 2-D array [layers][experts] of finite, non-negative numbers.
Result<std::vector<double>> ReadWeights(const std::string& path, int* num_layers) {
  std::ifstream in(path);
  if (!in) return NotFound("--weights " + path + ": cannot open the file");
  json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return InvalidArgument("--weights " + path + ": not valid JSON");
  if (!doc.is_array() || doc.empty()) {
    return InvalidArgument("--weights " + path + ": expected a 2-D array [layers][experts]");
  }
  std::vector<double> weight;
  size_t experts = 0;
  for (size_t l = 0; l < doc.size(); ++l) {
    const json& row = doc[l];
    if (!row.is_array() || row.empty()) {
      return InvalidArgument("--weights " + path + ": row " + std::to_string(l) +
                             " must be a non-empty array of numbers");
    }
    if (l == 0) experts = row.size();
    if (row.size() != experts) {
      return InvalidArgument("--weights " + path + ": row " + std::to_string(l) + " has " +
                             std::to_string(row.size()) + " entries, expected " +
                             std::to_string(experts));
    }
    for (size_t e = 0; e < row.size(); ++e) {
      if (!row[e].is_number() || !std::isfinite(row[e].get<double>()) || row[e].get<double>() < 0) {
        return InvalidArgument("--weights " + path + ": [" + std::to_string(l) + "][" +
                               std::to_string(e) + "] must be a finite number >= 0");
      }
      weight.push_back(row[e].get<double>());
    }
  }
  *num_layers = static_cast<int>(doc.size());
  return weight;
}

int RunEplb(int argc, char** argv) {
  std::string weights_path;
  int replicas = 0;
  int groups = 1;
  int nodes = 1;
  int gpus = 0;
  Flags flags("gcmoe balance eplb",
              "Prints EPLB's rebalance_experts result as JSON {\"phy2log\": [layers][replicas], "
              "\"log2phy\": [layers][experts][max replicas] (-1 padded), \"logcnt\": "
              "[layers][experts]}. Physical slot p lives on GPU p / (replicas / gpus). The "
              "hierarchical policy runs when groups % nodes == 0, the global one otherwise.");
  flags.String("weights", &weights_path, "JSON file: 2-D array [layers][experts] of loads");
  flags.Int("replicas", &replicas, "physical expert slots, a multiple of --gpus");
  flags.Int("groups", &groups, "expert groups (hierarchical policy)");
  flags.Int("nodes", &nodes, "server nodes (hierarchical policy)");
  flags.Int("gpus", &gpus, "GPUs, a multiple of --nodes");
  if (int rc = flags.ParseOrExit(argc, argv); rc >= 0) return rc;
  if (weights_path.empty()) return Fail("eplb", InvalidArgument("--weights is required"));
  if (gpus <= 0) return Fail("eplb", InvalidArgument("--gpus must be a positive integer"));
  if (replicas <= 0) return Fail("eplb", InvalidArgument("--replicas must be a positive integer"));
  int num_layers = 0;
  Result<std::vector<double>> weights = ReadWeights(weights_path, &num_layers);
  if (!weights.ok()) return Fail("eplb", weights.status());
  Result<balancer::EplbPlacement> placement =
      balancer::RebalanceExperts(*weights, num_layers, replicas, groups, nodes, gpus);
  if (!placement.ok()) return Fail("eplb", placement.status());
  const balancer::EplbPlacement& p = *placement;
  json phy2log = json::array(), log2phy = json::array(), logcnt = json::array();
  for (int l = 0; l < p.num_layers; ++l) {
    json a = json::array(), b = json::array(), c = json::array();
    for (int i = 0; i < p.num_replicas; ++i) a.push_back(p.phy2log_at(l, i));
    for (int e = 0; e < p.num_logical; ++e) {
      json slots = json::array();
      for (int r = 0; r < p.max_replicas; ++r) slots.push_back(p.log2phy_at(l, e, r));
      b.push_back(std::move(slots));
      c.push_back(p.logcnt_at(l, e));
    }
    phy2log.push_back(std::move(a));
    log2phy.push_back(std::move(b));
    logcnt.push_back(std::move(c));
  }
  // Keys in EPLB's return order.
  nlohmann::ordered_json out;
  out["phy2log"] = phy2log;
  out["log2phy"] = log2phy;
  out["logcnt"] = logcnt;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

void PrintTable(const Trace& trace, const ReplayOptions& options, const ReplayResult& r,
                const std::string& trace_path) {
  std::printf("trace      %s (%s, %d records, %d steps, E=%d)\n", trace_path.c_str(),
              trace.format.c_str(), r.records, r.steps, trace.num_experts);
  std::printf("steps      %s\n", trace.description.c_str());
  std::printf("placement  G=%d %s, D=%d replicated per rank (all of a rank's experts when it has "
              "fewer); EPLB %d slots (groups %d, nodes %d)\n",
              options.ranks, r.topology.c_str(), options.replicas_per_rank, r.eplb_replicas,
              options.eplb_groups, options.eplb_nodes);
  std::printf("relief     I=%s, F=%d, kernel %s\n",
              options.passes < 0 ? ("auto (scan 0.." + std::to_string(options.max_passes) +
                                    "; relief rows run I=" + std::to_string(options.max_passes) + ")")
                                       .c_str()
                                 : std::to_string(options.passes).c_str(),
              options.fraction_bits, r.kernel.c_str());
  std::printf("\n%-12s %8s %9s %9s %10s %9s", "scheme", "spatial", "attain%", "worst%", "solve_us",
              "p50_us");
  for (double t : options.t_moe_us) {
    char head[32];
    std::snprintf(head, sizeof(head), "Ueff@%gus", t);
    std::printf(" %11s", head);
  }
  std::printf("\n");
  for (const SchemeResult& s : r.schemes) {
    char worst[16] = "-";
    if (s.passes.empty()) std::snprintf(worst, sizeof(worst), "%.2f", 100.0 * s.worst_attainment);
    std::printf("%-12s %8.4f %9.2f %9s %10.3f %9.3f", s.name.c_str(), s.spatial,
                100.0 * s.attainment, worst, s.solve_us, s.solve_us_p50);
    for (double u : s.u_eff) std::printf(" %11.4f", u);
    if (!s.passes.empty()) {
      std::printf("   I*=");
      for (size_t i = 0; i < s.passes.size(); ++i) std::printf(i ? "/%d" : "%d", s.passes[i]);
    }
    std::printf("\n");
  }
  std::printf("\nattain%% = spatial / spatial of the exact LP (record-major means); worst%% = "
              "lowest per-step ratio;\nsolve_us = mean decision time (what U_eff charges), "
              "p50_us = its median over steps\n");
  std::printf("relief split hash 0x%016llx, rounding fallbacks %d\n",
              static_cast<unsigned long long>(r.relief_split_hash), r.relief_fallbacks);
}

json ResultJson(const Trace& trace, const ReplayOptions& options, const ReplayResult& r) {
  json schemes = json::array();
  for (const SchemeResult& s : r.schemes) {
    json j = {{"scheme", s.name},         {"spatial", s.spatial},
              {"attainment", s.attainment}, {"worst_attainment", s.worst_attainment},
              {"solve_us", s.solve_us},     {"solve_us_p50", s.solve_us_p50},
              {"u_eff", s.u_eff}};
    if (!s.passes.empty()) j["passes"] = s.passes;
    schemes.push_back(std::move(j));
  }
  return {{"format", trace.format},
          {"steps_rule", trace.description},
          {"records", r.records},
          {"steps", r.steps},
          {"ranks", options.ranks},
          {"topology", r.topology},
          {"replicas_per_rank", options.replicas_per_rank},
          {"passes", options.passes},
          {"fraction_bits", options.fraction_bits},
          {"kernel", r.kernel},
          {"t_moe_us", options.t_moe_us},
          {"eplb_replicas", r.eplb_replicas},
          {"relief_split_hash", r.relief_split_hash},
          {"relief_fallbacks", r.relief_fallbacks},
          {"schemes", schemes}};
}

int RunReplayCommand(int argc, char** argv) {
  std::string trace_path;
  std::string passes = "12";
  std::string schemes = "none,eplb,relief,relief-int,lp";
  std::string t_moe = "100,500,2000";
  std::string kernel = "auto";
  ReplayOptions options;
  TraceOptions trace_options;
  int64_t seed = 1;
  bool as_json = false;
  bool quiet = false;
  Flags flags(
      "gcmoe balance replay",
      "Replays routing through the schemes on placements fitted to each record's mean load and "
      "prints, per scheme, the mean spatial utilization, its attainment of the exact LP "
      "optimum, the mean solve time and U_eff = spatial / (1 + T_solve / T_moe).\n"
      "Traces (--format auto tells them apart):\n"
      "  Mixtral JSONL ({\"layer\", \"experts\": [a, b], ...} per token): a step of batch B at "
      "layer l is B consecutive rows of that layer in file order.\n"
      "  OLMoE expert_counts.json (aggregate counts): a step is B tokens, each drawing top_k "
      "distinct experts without replacement in proportion to the counts (seeded by --seed); "
      "--steps per (domain, layer), default 64.\n"
      "  per-step counts JSONL: {\"layer\": L, \"counts\": [E ints]} per line, a layer's lines "
      "in file order being its steps.\n"
      "Schemes: none (contiguous, no replicas), home (Relief placement, all at home), eplb "
      "(EPLB placement with the same extra slots, even split), relief (fixed-point split), "
      "relief-int (the emitted integer split), lp (exact LP, GLPK).");
  flags.String("trace", &trace_path, "trace file (see above)");
  flags.String("format", &trace_options.format, "auto | mixtral | olmoe | counts");
  flags.Int("ranks", &options.ranks, "G: ranks (GPUs) in the expert-parallel group");
  flags.Int("batch", &trace_options.batch, "B: tokens per step (Mixtral and OLMoE traces)");
  flags.Int("steps", &trace_options.steps,
            "steps per record: Mixtral/counts keep the first N (0 = all); OLMoE samples N (0 = 64)");
  flags.Int64("seed", &seed, "OLMoE step sampling seed");
  flags.String("passes", &passes, "Relief passes I, or \"auto\" for I* (Eq. 3) per T_moe");
  flags.Int("max-passes", &options.max_passes, "pass-count scan range for --passes auto");
  flags.Int("fraction-bits", &options.fraction_bits, "F: fixed-point fractional bits");
  flags.Int("replicas-per-rank", &options.replicas_per_rank, "D: experts replicated per rank");
  flags.String("topology", &options.topology, "torus | torus:AxB | cube | ring");
  flags.String("schemes", &schemes, "comma-separated: none,home,eplb,relief,relief-int,lp");
  flags.String("t-moe", &t_moe, "comma-separated layer times T_moe in microseconds");
  flags.Int("eplb-groups", &options.eplb_groups, "EPLB expert groups");
  flags.Int("eplb-nodes", &options.eplb_nodes, "EPLB nodes");
  flags.String("kernel", &kernel, "Relief kernel: auto | scalar | avx2 | avx512");
  flags.Bool("json", &as_json, "print one JSON object instead of the table");
  flags.Bool("quiet", &quiet, "no progress on stderr");
  if (int rc = flags.ParseOrExit(argc, argv); rc >= 0) return rc;

  if (trace_path.empty()) return Fail("replay", InvalidArgument("--trace is required"));
  trace_options.seed = static_cast<uint64_t>(seed);
  if (passes == "auto") {
    options.passes = -1;
  } else {
    char* end = nullptr;
    const long p = std::strtol(passes.c_str(), &end, 10);
    if (passes.empty() || *end != '\0' || p < 0) {
      return Fail("replay", InvalidArgument("--passes: expected a count >= 0 or \"auto\", got \"" +
                                            passes + "\""));
    }
    options.passes = static_cast<int>(p);
  }
  options.schemes = SplitList(schemes);
  if (options.schemes.empty()) return Fail("replay", InvalidArgument("--schemes is empty"));
  options.t_moe_us.clear();
  for (const std::string& t : SplitList(t_moe)) {
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (*end != '\0' || !(v > 0)) {
      return Fail("replay", InvalidArgument("--t-moe: expected positive numbers, got \"" + t + "\""));
    }
    options.t_moe_us.push_back(v);
  }
  if (kernel == "auto") {
    options.kernel = balancer::ReliefKernel::kAuto;
  } else if (kernel == "scalar") {
    options.kernel = balancer::ReliefKernel::kScalar;
  } else if (kernel == "avx2") {
    options.kernel = balancer::ReliefKernel::kAvx2;
  } else if (kernel == "avx512") {
    options.kernel = balancer::ReliefKernel::kAvx512;
  } else {
    return Fail("replay", InvalidArgument("--kernel: expected auto, scalar, avx2 or avx512, got \"" +
                                          kernel + "\""));
  }

  Result<Trace> trace = LoadTrace(trace_path, trace_options);
  if (!trace.ok()) return Fail("replay", trace.status());
  const bool tty = isatty(STDERR_FILENO) != 0;
  auto last = std::chrono::steady_clock::now();
  ReplayProgress progress = [&](int done, int total) {
    if (quiet) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - last < std::chrono::milliseconds(500)) return;
    last = now;
    std::fprintf(stderr, tty ? "\rreplay: %d/%d records" : "replay: %d/%d records\n", done, total);
    if (tty && done == total) std::fputc('\n', stderr);
  };
  Result<ReplayResult> result = RunReplay(*trace, options, progress);
  if (!result.ok()) return Fail("replay", result.status());
  if (as_json) {
    std::printf("%s\n", ResultJson(*trace, options, *result).dump(2).c_str());
  } else {
    PrintTable(*trace, options, *result, trace_path);
  }
  return 0;
}

}  // namespace

int RunBalanceCommand(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    PrintGroupUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "eplb") return RunEplb(argc - 1, argv + 1);
  if (command == "replay") return RunReplayCommand(argc - 1, argv + 1);
  std::fprintf(stderr, "gcmoe balance: unknown command \"%s\"\n\n", command.c_str());
  PrintGroupUsage(stderr);
  return 2;
}

}  // namespace gcmoe::tools
