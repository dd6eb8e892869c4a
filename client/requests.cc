#include "client/requests.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "client/npy.h"

namespace gcmoe::client {

std::vector<double> ExpertPopularity(int experts, double skew, uint64_t popularity_seed) {
  std::vector<int> ranking(experts);
  std::iota(ranking.begin(), ranking.end(), 0);
  std::mt19937_64 rng(popularity_seed);
  std::shuffle(ranking.begin(), ranking.end(), rng);
  std::vector<double> p(experts);
  double total = 0.0;
  for (int r = 0; r < experts; ++r) {
    p[ranking[r]] = 1.0 / std::pow(static_cast<double>(r + 1), skew);
    total += p[ranking[r]];
  }
  for (double& v : p) v /= total;
  return p;
}

RequestArrays RandomRequest(const RandomRequestOptions& o) {
  RequestArrays a;
  a.tokens = o.tokens;
  a.hidden = o.hidden;
  a.top_k = o.top_k;
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  a.hidden_values.resize(static_cast<size_t>(o.tokens) * o.hidden);
  for (float& v : a.hidden_values) v = normal(rng);

  // Gumbel-top-k: the k largest of log(p_e) + Gumbel noise are k draws without replacement
  // with probabilities proportional to p (distinct experts, popularity respected).
  std::vector<double> log_p = ExpertPopularity(o.experts, o.skew, o.popularity_seed);
  for (double& v : log_p) v = std::log(v);
  std::uniform_real_distribution<double> uniform(std::nextafter(0.0, 1.0), 1.0);
  std::vector<std::pair<double, int>> keys(o.experts);
  const int k = std::min(o.top_k, o.experts);
  a.topk_ids.assign(static_cast<size_t>(o.tokens) * o.top_k, -1);
  a.topk_weights.assign(static_cast<size_t>(o.tokens) * o.top_k, 0.0f);
  for (int t = 0; t < o.tokens; ++t) {
    for (int e = 0; e < o.experts; ++e) keys[e] = {log_p[e] - std::log(-std::log(uniform(rng))), e};
    std::partial_sort(keys.begin(), keys.begin() + k, keys.end(),
                      [](const auto& x, const auto& y) { return x.first > y.first; });
    std::vector<float> logits(k);
    float max_logit = -INFINITY;
    for (float& l : logits) {
      l = normal(rng);
      max_logit = std::max(max_logit, l);
    }
    float sum = 0.0f;
    for (float& l : logits) {
      l = std::exp(l - max_logit);
      sum += l;
    }
    for (int s = 0; s < k; ++s) {
      a.topk_ids[static_cast<size_t>(t) * o.top_k + s] = keys[s].second;
      a.topk_weights[static_cast<size_t>(t) * o.top_k + s] = logits[s] / sum;
    }
  }
  return a;
}

Result<RequestArrays> ReadRequestDir(const std::string& dir) {
  const std::string hidden_path = dir + "/hidden.npy";
  const std::string ids_path = dir + "/topk_ids.npy";
  const std::string weights_path = dir + "/topk_weights.npy";
  GCMOE_ASSIGN_OR_RETURN(NpyArray hidden, ReadNpy(hidden_path));
  GCMOE_ASSIGN_OR_RETURN(NpyArray ids, ReadNpy(ids_path));
  GCMOE_ASSIGN_OR_RETURN(NpyArray weights, ReadNpy(weights_path));
  auto shape_text = [](const NpyArray& x) {
    std::string s = "(";
    for (size_t i = 0; i < x.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(x.shape[i]);
    return s + ")";
  };
  if (hidden.shape.size() != 2) {
    return InvalidArgument(hidden_path + ": expected shape (T, H), got " + shape_text(hidden));
  }
  const int64_t tokens = hidden.shape[0];
  if (ids.shape.size() != 2 || ids.shape[0] != tokens) {
    return InvalidArgument(ids_path + ": expected shape (" + std::to_string(tokens) +
                           ", k) to match hidden.npy, got " + shape_text(ids));
  }
  if (weights.shape != ids.shape) {
    return InvalidArgument(weights_path + ": expected the shape of topk_ids.npy " +
                           shape_text(ids) + ", got " + shape_text(weights));
  }
  RequestArrays a;
  a.tokens = static_cast<int>(tokens);
  a.hidden = static_cast<int>(hidden.shape[1]);
  a.top_k = static_cast<int>(ids.shape[1]);
  GCMOE_ASSIGN_OR_RETURN(a.hidden_values, NpyToFloat(hidden, hidden_path));
  GCMOE_ASSIGN_OR_RETURN(a.topk_ids, NpyToInt32(ids, ids_path));
  GCMOE_ASSIGN_OR_RETURN(a.topk_weights, NpyToFloat(weights, weights_path));
  return a;
}

}  // namespace gcmoe::client
