#include "tools/balance_trace.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/splitmix64.h"

namespace gcmoe::tools {
namespace {

using nlohmann::json;

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("trace " + path + ": cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool Blank(const std::string& line) {
  return line.find_first_not_of(" \t\r") == std::string::npos;
}

Status LineError(const std::string& path, size_t line, const std::string& what) {
  return InvalidArgument("trace " + path + " line " + std::to_string(line + 1) + ": " + what);
}

// Non-negative integer field of a JSONL row.
Result<int64_t> IntField(const json& row, const char* field, const std::string& path,
                         size_t line) {
  auto it = row.find(field);
  if (it == row.end() || !it->is_number_integer() || it->get<int64_t>() < 0) {
    return LineError(path, line, std::string("field \"") + field +
                                     "\" must be a non-negative integer");
  }
  return it->get<int64_t>();
}

Result<std::vector<json>> ParseRows(const std::string& path, const std::string& text) {
  std::vector<json> rows;
  const std::vector<std::string> lines = Lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (Blank(lines[i])) continue;
    json row = json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded() || !row.is_object()) return LineError(path, i, "not a JSON object");
    row["__line"] = i;
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return InvalidArgument("trace " + path + ": no rows");
  return rows;
}

Result<Trace> LoadMixtral(const std::string& path, const std::vector<json>& rows,
                          const TraceOptions& options) {
  // Rows per layer in file order, each a list of expert ids.
  std::map<int64_t, std::vector<std::vector<int64_t>>> by_layer;
  int64_t max_expert = -1;
  size_t top_k = 0;
  for (const json& row : rows) {
    const size_t line = row["__line"].get<size_t>();
    GCMOE_ASSIGN_OR_RETURN(int64_t layer, IntField(row, "layer", path, line));
    auto it = row.find("experts");
    if (it == row.end() || !it->is_array() || it->empty()) {
      return LineError(path, line, "field \"experts\" must be a non-empty array of expert ids");
    }
    std::vector<int64_t> experts;
    for (const json& x : *it) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) {
        return LineError(path, line, "field \"experts\" must hold non-negative integers");
      }
      experts.push_back(x.get<int64_t>());
      max_expert = std::max(max_expert, experts.back());
    }
    top_k = std::max(top_k, experts.size());
    by_layer[layer].push_back(std::move(experts));
  }
  Trace trace;
  trace.format = "mixtral";
  trace.num_experts = static_cast<int>(max_expert + 1);
  trace.top_k = static_cast<int>(top_k);
  const int e_count = trace.num_experts;
  for (const auto& [layer, layer_rows] : by_layer) {
    TraceRecord record;
    record.name = "layer " + std::to_string(layer);
    record.mean_load.assign(e_count, 0.0);
    for (const auto& experts : layer_rows) {
      for (int64_t x : experts) record.mean_load[x] += 1.0;
    }
    for (double& m : record.mean_load) m *= static_cast<double>(options.batch) / layer_rows.size();
    for (size_t start = 0; start + options.batch <= layer_rows.size(); start += options.batch) {
      if (options.steps > 0 && static_cast<int>(record.steps.size()) >= options.steps) break;
      std::vector<int64_t> step(e_count, 0);
      for (int i = 0; i < options.batch; ++i) {
        for (int64_t x : layer_rows[start + i]) ++step[x];
      }
      record.steps.push_back(std::move(step));
    }
    if (!record.steps.empty()) trace.records.push_back(std::move(record));
  }
  if (trace.records.empty()) {
    return InvalidArgument("trace " + path + ": no layer has " + std::to_string(options.batch) +
                           " rows for one step of --batch " + std::to_string(options.batch));
  }
  trace.description = "Mixtral per-token routing; a step = " + std::to_string(options.batch) +
                      " consecutive rows of one layer in file order; placement fitted to each "
                      "layer's mean over the file";
  return trace;
}

Result<Trace> LoadCounts(const std::string& path, const std::vector<json>& rows,
                         const TraceOptions& options) {
  std::vector<int64_t> layer_order;
  std::map<int64_t, TraceRecord> by_layer;
  int e_count = -1;
  for (const json& row : rows) {
    const size_t line = row["__line"].get<size_t>();
    GCMOE_ASSIGN_OR_RETURN(int64_t layer, IntField(row, "layer", path, line));
    auto it = row.find("counts");
    if (it == row.end() || !it->is_array() || it->empty()) {
      return LineError(path, line, "field \"counts\" must be a non-empty array of counts");
    }
    if (e_count < 0) e_count = static_cast<int>(it->size());
    if (static_cast<int>(it->size()) != e_count) {
      return LineError(path, line, "field \"counts\" has " + std::to_string(it->size()) +
                                       " entries, expected " + std::to_string(e_count));
    }
    std::vector<int64_t> step;
    for (const json& x : *it) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) {
        return LineError(path, line, "field \"counts\" must hold non-negative integers");
      }
      step.push_back(x.get<int64_t>());
    }
    if (!by_layer.count(layer)) {
      layer_order.push_back(layer);
      by_layer[layer].name = "layer " + std::to_string(layer);
    }
    TraceRecord& record = by_layer[layer];
    if (options.steps == 0 || static_cast<int>(record.steps.size()) < options.steps) {
      record.steps.push_back(std::move(step));
    }
  }
  Trace trace;
  trace.format = "counts";
  trace.num_experts = e_count;
  for (int64_t layer : layer_order) {
    TraceRecord& record = by_layer[layer];
    record.mean_load.assign(e_count, 0.0);
    for (const auto& step : record.steps) {
      for (int e = 0; e < e_count; ++e) record.mean_load[e] += static_cast<double>(step[e]);
    }
    for (double& m : record.mean_load) m /= record.steps.size();
    trace.records.push_back(std::move(record));
  }
  trace.description = "per-step counts; placement fitted to each layer's mean";
  return trace;
}

Result<Trace> LoadOlmoe(const std::string& path, const json& doc, const TraceOptions& options) {
  auto field_error = [&](const std::string& what) {
    return InvalidArgument("trace " + path + ": " + what);
  };
  auto positive = [&](const char* field) {
    return doc.contains(field) && doc.at(field).is_number_integer() && doc.at(field).get<int>() > 0;
  };
  if (!positive("num_experts")) return field_error("field \"num_experts\" must be a positive integer");
  if (!positive("top_k")) return field_error("field \"top_k\" must be a positive integer");
  const int e_count = doc.at("num_experts").get<int>();
  const int top_k = doc.at("top_k").get<int>();
  if (top_k > e_count) return field_error("field \"top_k\" exceeds num_experts");
  std::vector<int64_t> layer_ids;
  if (doc.contains("layers") && doc.at("layers").is_array()) {
    for (const json& l : doc.at("layers")) layer_ids.push_back(l.is_number_integer() ? l.get<int64_t>() : -1);
  }
  const json& counts = doc.at("counts");
  if (!counts.is_object() || counts.empty()) {
    return field_error("field \"counts\" must be an object of domain: [[counts] per layer]");
  }
  Trace trace;
  trace.format = "olmoe";
  trace.num_experts = e_count;
  trace.top_k = top_k;
  const int steps = options.steps > 0 ? options.steps : 64;
  for (const auto& [domain, layers] : counts.items()) {
    if (!layers.is_array()) return field_error("counts[\"" + domain + "\"] must be an array");
    for (size_t l = 0; l < layers.size(); ++l) {
      const json& row = layers[l];
      const std::string where = "counts[\"" + domain + "\"][" + std::to_string(l) + "]";
      if (!row.is_array() || static_cast<int>(row.size()) != e_count) {
        return field_error(where + " must hold " + std::to_string(e_count) + " counts");
      }
      std::vector<double> c;
      for (const json& x : row) {
        if (!x.is_number() || x.get<double>() < 0) {
          return field_error(where + " must hold non-negative numbers");
        }
        c.push_back(x.get<double>());
      }
      double sum = 0;
      for (double x : c) sum += x;
      if (!(sum > 0)) return field_error(where + " has no counts");
      TraceRecord record;
      const int64_t layer = l < layer_ids.size() ? layer_ids[l] : static_cast<int64_t>(l);
      record.name = domain + " layer " + std::to_string(layer);
      // Fitted to the expected per-step load: B * k tokens spread as the counts.
      for (double x : c) record.mean_load.push_back(x / sum * options.batch * top_k);
      const uint64_t record_index = trace.records.size();
      for (int s = 0; s < steps; ++s) {
        SplitMix64 seeds(options.seed ^ (record_index * 0x100000001B3ull));
        const uint64_t step_seed = seeds.Next() + static_cast<uint64_t>(s);
        record.steps.push_back(SampleStep(c, top_k, options.batch, step_seed));
      }
      trace.records.push_back(std::move(record));
    }
  }
  trace.description = "OLMoE aggregate counts; a step = " + std::to_string(options.batch) +
                      " tokens each drawing top-" + std::to_string(top_k) +
                      " distinct experts without replacement in proportion to the counts, " +
                      std::to_string(steps) + " steps per (domain, layer), seed " +
                      std::to_string(options.seed) + "; placement fitted to the counts";
  return trace;
}

}  // namespace

std::vector<int64_t> SampleStep(std::span<const double> counts, int top_k, int batch,
                                uint64_t seed) {
  const int e_count = static_cast<int>(counts.size());
  std::vector<int64_t> step(e_count, 0);
  std::vector<char> taken(e_count, 0);
  std::vector<int> drawn;
  SplitMix64 rng(seed);
  double all = 0;
  for (double c : counts) all += c;
  for (int token = 0; token < batch; ++token) {
    double remaining = all;
    drawn.clear();
    for (int k = 0; k < top_k && remaining > 0; ++k) {
      const double u = rng.Uniform01();
      const double target = u * remaining;
      int pick = -1;
      double cumulative = 0;
      for (int e = 0; e < e_count; ++e) {
        if (taken[e] || counts[e] <= 0) continue;
        pick = e;  // rounding can leave target just past the last weight: keep the last one
        cumulative += counts[e];
        if (target < cumulative) break;
      }
      if (pick < 0) break;
      taken[pick] = 1;
      drawn.push_back(pick);
      remaining -= counts[pick];
      ++step[pick];
    }
    for (int e : drawn) taken[e] = 0;
  }
  return step;
}

Result<Trace> LoadTrace(const std::string& path, const TraceOptions& options) {
  if (options.batch <= 0) return InvalidArgument("--batch must be positive");
  if (options.steps < 0) return InvalidArgument("--steps must be >= 0");
  GCMOE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::string format = options.format;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return InvalidArgument("trace " + path + ": the file is empty");
  // A whole-file JSON document parses; a JSONL file (several objects) does not.
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (format == "auto") {
    if (!doc.is_discarded() && doc.is_object() && doc.contains("counts") &&
        doc.contains("num_experts")) {
      format = "olmoe";
    } else {
      const std::string line = text.substr(first, text.find('\n', first) - first);
      json row = json::parse(line, nullptr, false);
      if (!row.is_discarded() && row.is_object() && row.contains("experts")) {
        format = "mixtral";
      } else if (!row.is_discarded() && row.is_object() && row.contains("counts")) {
        format = "counts";
      } else {
        return InvalidArgument("trace " + path +
                               ": cannot tell the format (expected Mixtral JSONL rows with "
                               "\"experts\", OLMoE JSON with \"counts\" and \"num_experts\", or "
                               "JSONL rows with \"counts\"); pass --format");
      }
    }
  }
  if (format == "olmoe") {
    if (doc.is_discarded() || !doc.is_object()) {
      return InvalidArgument("trace " + path + ": not a JSON object");
    }
    return LoadOlmoe(path, doc, options);
  }
  if (format != "mixtral" && format != "counts") {
    return InvalidArgument("--format: expected auto, mixtral, olmoe or counts, got \"" + format +
                           "\"");
  }
  GCMOE_ASSIGN_OR_RETURN(std::vector<json> rows, ParseRows(path, text));
  if (format == "mixtral") return LoadMixtral(path, rows, options);
  return LoadCounts(path, rows, options);
}

}  // namespace gcmoe::tools
