#include "balancer/lp_oracle.h"

#include <glpk.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

namespace gcmoe::balancer {
namespace {

struct ProblemDeleter {
  void operator()(glp_prob* p) const { glp_delete_prob(p); }
};

// glp_term_out is process-wide state: restore what the caller had.
class QuietGlpk {
 public:
  QuietGlpk() : previous_(glp_term_out(GLP_OFF)) {}
  ~QuietGlpk() { glp_term_out(previous_); }
  QuietGlpk(const QuietGlpk&) = delete;
  QuietGlpk& operator=(const QuietGlpk&) = delete;

 private:
  int previous_;
};

}  // namespace

Result<LpSplit> SolveMinMaxLp(const Placement& placement, std::span<const int64_t> expert_tokens) {
  GCMOE_RETURN_IF_ERROR(placement.Validate());
  const int g = placement.num_ranks;
  const int num_experts = placement.num_experts;
  if (static_cast<int>(expert_tokens.size()) != num_experts) {
    return InvalidArgument("lp: expected " + std::to_string(num_experts) +
                           " expert totals, got " + std::to_string(expert_tokens.size()));
  }
  const auto start = std::chrono::steady_clock::now();
  QuietGlpk quiet;

  // Rows: one per rank, L_i(x) - z <= 0 moved into the form
  //   sum_home n x - sum_host n x - z <= -(fixed_i + sum_host n).
  std::vector<double> rhs(g, 0.0);
  std::vector<int> column_of(num_experts, 0);  // GLPK column of each replicated expert
  int columns = 1;                             // column 1 is z
  for (int e = 0; e < num_experts; ++e) {
    const double n = static_cast<double>(expert_tokens[e]);
    if (expert_tokens[e] < 0) {
      return InvalidArgument("lp: expert_tokens[" + std::to_string(e) + "] < 0");
    }
    if (placement.replicated(e)) {
      column_of[e] = ++columns;
      rhs[placement.host[e]] -= n;
    } else {
      rhs[placement.home[e]] -= n;
    }
  }

  std::unique_ptr<glp_prob, ProblemDeleter> lp(glp_create_prob());
  glp_set_obj_dir(lp.get(), GLP_MIN);
  glp_add_rows(lp.get(), g);
  glp_add_cols(lp.get(), columns);
  for (int i = 0; i < g; ++i) glp_set_row_bnds(lp.get(), i + 1, GLP_UP, 0.0, rhs[i]);
  glp_set_col_bnds(lp.get(), 1, GLP_LO, 0.0, 0.0);
  glp_set_obj_coef(lp.get(), 1, 1.0);
  for (int c = 2; c <= columns; ++c) glp_set_col_bnds(lp.get(), c, GLP_DB, 0.0, 1.0);

  // GLPK's triplet arrays are 1-based; index 0 is unused.
  std::vector<int> ia(1), ja(1);
  std::vector<double> ar(1);
  for (int i = 0; i < g; ++i) {
    ia.push_back(i + 1);
    ja.push_back(1);
    ar.push_back(-1.0);
  }
  for (int e = 0; e < num_experts; ++e) {
    if (column_of[e] == 0 || expert_tokens[e] == 0) continue;
    const double n = static_cast<double>(expert_tokens[e]);
    ia.push_back(placement.home[e] + 1);
    ja.push_back(column_of[e]);
    ar.push_back(n);
    ia.push_back(placement.host[e] + 1);
    ja.push_back(column_of[e]);
    ar.push_back(-n);
  }
  glp_load_matrix(lp.get(), static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());

  glp_smcp params;
  glp_init_smcp(&params);
  params.msg_lev = GLP_MSG_OFF;
  params.presolve = GLP_OFF;
  const int rc = glp_simplex(lp.get(), &params);
  if (rc != 0 || glp_get_status(lp.get()) != GLP_OPT) {
    return Internal("lp: GLPK simplex failed (return code " + std::to_string(rc) + ", status " +
                    std::to_string(glp_get_status(lp.get())) + ")");
  }

  LpSplit out;
  out.max_load = glp_get_col_prim(lp.get(), 1);
  out.home_fraction.assign(num_experts, 1.0);
  out.loads.assign(g, 0.0);
  for (int e = 0; e < num_experts; ++e) {
    const double n = static_cast<double>(expert_tokens[e]);
    if (column_of[e] == 0) {
      out.loads[placement.home[e]] += n;
      continue;
    }
    const double x = std::clamp(glp_get_col_prim(lp.get(), column_of[e]), 0.0, 1.0);
    out.home_fraction[e] = x;
    out.loads[placement.home[e]] += n * x;
    out.loads[placement.host[e]] += n * (1.0 - x);
  }
  out.solve_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count();
  return out;
}

}  // namespace gcmoe::balancer
