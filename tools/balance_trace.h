// Routing traces for `gcmoe balance replay` (and the balancer's attainment tests): reading the
// files, and turning them into per-step expert counts. File formats and batching rules are in
// the comments of LoadTrace; the data itself is described in data/routing/README.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::tools {

// One routing ensemble with its own placement: a Mixtral layer, an OLMoE (domain, layer), or a
// layer of a counts file. Aggregates over records are record-major (mean of per-record means).
struct TraceRecord {
  std::string name;                         // "layer 3", "arxiv layer 7"
  std::vector<double> mean_load;            // [E] the load the placement is fitted to
  std::vector<std::vector<int64_t>> steps;  // [steps][E] assignments per expert in one step
};

struct Trace {
  std::string format;       // "mixtral", "olmoe" or "counts"
  std::string description;  // how steps were formed, for reports
  int num_experts = 0;
  int top_k = 0;            // 0 when the format does not say
  std::vector<TraceRecord> records;
};

struct TraceOptions {
  std::string format = "auto";  // auto | mixtral | olmoe | counts
  int batch = 64;               // B: tokens per step (mixtral, olmoe)
  int steps = 0;                // per record: mixtral/counts keep the first N (0 = all);
                                // olmoe samples N (0 = 64)
  uint64_t seed = 1;            // olmoe sampling
};

// Formats:
//  mixtral  JSONL, one row per (problem, layer, token): {"layer": L, "experts": [a, b], ...}.
//           E = the largest expert id + 1. A step of batch B at layer L is B consecutive rows of
//           that layer in file order; a layer's last, incomplete batch is dropped. Each layer is
//           a record whose mean load is its per-step mean over the whole file (in-sample fit).
//  olmoe    JSON {"num_experts": E, "top_k": k, "layers": [...],
//           "counts": {domain: [[E counts] per layer]}}: aggregate counts, not steps. Each
//           (domain, layer) is a record fitted to its counts; a step is B tokens, each drawing
//           k distinct experts one after another without replacement, with probability
//           proportional to the counts of the experts not yet drawn (SampleStep), seeded by
//           (seed, record, step).
//  counts   JSONL of per-step counts: {"layer": L, "counts": [E non-negative ints]} per line;
//           lines of one layer, in file order, are that layer's steps. Records in order of
//           first appearance; each fitted to its layer's mean.
// "auto" picks olmoe for a JSON object with "counts" and "num_experts", mixtral for JSONL rows
// with "experts", counts for JSONL rows with "counts". Errors name the file, line and field.
Result<Trace> LoadTrace(const std::string& path, const TraceOptions& options);

// One sampled step (see olmoe above): [E] assignments per expert, summing to batch * top_k
// when at least top_k experts have positive counts. Deterministic in (counts, seed): the
// generator is SplitMix64 and the uniform draw is its top 53 bits.
std::vector<int64_t> SampleStep(std::span<const double> counts, int top_k, int batch,
                                uint64_t seed);

}  // namespace gcmoe::tools
