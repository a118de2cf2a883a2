// SPDX-License-Identifier: Apache-2.0
/// @file reference/flex_bound.hpp
/// @brief SPEC §13.5's first-order bound on |float32 FlexAttention −
///        reference|, per output, from a call's sizes and magnitudes: the
///        magnitudes measured in double from the reference's rows, and the
///        mod's constants L, L_T and tau either stated by the caller or
///        measured from the reference evaluating the score_mod and its
///        derivative program at every visible point.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "tandem/flex_plan.hpp"
#include "tandem/reference/flex.hpp"
#include "tandem/reference/flex_mod.hpp"

namespace tandem::reference {

/// The constants of SPEC §13.5 that depend on the score_mod: L ≥ |∂t/∂s|,
/// L_T ≥ |∂t/∂T[e]| and tau ≥ |every real value the score_mod computes|.
struct FlexModConstants {
  double L = 1.0;    ///< bound on |∂t/∂s| (1 without a score_mod)
  double L_T = 1.0;  ///< bound on |∂t/∂T[e]| over the real tensors' elements
  double tau = 0.0;  ///< bound on the real values of the score_mod (beyond |s|)
};

/// Magnitudes of one call measured in double from the reference's rows
/// (flex_row), for SPEC §13.5's bounds: Γ = max |dp_ij − D_i|, C = the
/// largest Σ_i p_ij onto one key, per element e of each real score_mod
/// tensor the sums over its terms dt_ij·∂t/∂T[e] (P = Σ p|∂|, Q = Σ |dt|,
/// A = Σ |dt ∂|, N their count), and the mod's constants as measured at
/// every visible point (i, j).
struct FlexMeasured {
  double gamma = 0;                     ///< Γ = max_ij |<dO_i, v_j> − <dO_i, o_i>|
  double C = 0;                         ///< max_j Σ_i p_ij over a kv head's rows
  std::vector<std::vector<double>> P;   ///< per tensor and element: Σ p_ij |∂t/∂T[e]|
  std::vector<std::vector<double>> Q;   ///< per tensor and element: Σ |dt_ij|
  std::vector<std::vector<double>> A;   ///< per tensor and element: Σ |dt_ij ∂t/∂T[e]|
  std::vector<std::vector<double>> N;   ///< per tensor and element: the number of terms
  FlexModConstants mod{0.0, 0.0, 0.0};  ///< L, L_T and tau, the maxima over visible points
  double lse_max = 0;                   ///< max |lse_i| over the rows that see a key
};

/// Real operations a program computes (its real nodes other than leaves).
inline double flex_real_ops(const ModProgram& p) {
  double n = 0;
  for (const ModNode& x : p.nodes()) {
    const bool leaf = x.op == ModOp::score || x.op == ModOp::constant || x.op == ModOp::load;
    n += x.type == ModType::real && !leaf ? 1 : 0;
  }
  return n;
}

/// The magnitudes of `plan` on inputs `in` (any storage type, read exactly
/// into double) and dout `[B,H,Sq,Dv]`.
template <class T>
FlexMeasured flex_measure(const FlexPlan& plan, const FlexInputs<T>& in, std::span<const T> dout) {
  const FlexParams& p = plan.params();
  const FlexWidened<T, double> w(in);
  const ModGradient& df = plan.score_grad();
  const std::size_t f_nodes = p.score_mod.nodes().size();
  FlexMeasured m;
  if (p.score_mod.empty()) m.mod.L = 1.0;
  for (const ModTensor& t : p.score_mod.tensors()) {
    const auto size = t.type == ModType::real ? static_cast<std::size_t>(t.size()) : 0;
    for (auto* x : {&m.P, &m.Q, &m.A, &m.N}) x->emplace_back(size);
  }
  std::vector<double> col(static_cast<std::size_t>(p.B * p.Hkv * p.Sk));
  std::vector<ModValueAt<double>> val;
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      const std::int64_t g = h / plan.group();
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const auto row = flex_row<double>(plan, w.in, b, h, i);
        if (std::isinf(row.lse)) continue;
        m.lse_max = std::max(m.lse_max, std::abs(row.lse));
        const T* dO = dout.data() + flex_at(b, p.H, h, p.Sq, i, p.Dv);
        double D_i = 0;
        for (std::int64_t e = 0; e < p.Dv; ++e) {
          D_i += static_cast<double>(dO[e]) * row.o[static_cast<std::size_t>(e)];
        }
        for (std::int64_t j = 0; j < p.Sk; ++j) {
          const double t = row.t[static_cast<std::size_t>(j)];
          if (std::isinf(t)) continue;
          const double pij = std::exp(t - row.lse);
          const double* v_j = w.in.v.data() + flex_at(b, p.Hkv, g, p.Sk, j, p.Dv);
          double dp = 0;
          for (std::int64_t e = 0; e < p.Dv; ++e) dp += static_cast<double>(dO[e]) * v_j[e];
          m.gamma = std::max(m.gamma, std::abs(dp - D_i));
          col[static_cast<std::size_t>((b * p.Hkv + g) * p.Sk + j)] += pij;
          if (p.score_mod.empty()) continue;
          evaluate_mod(df.program, w.in.score_tensors,
                       ModPoint<double>{row.s[static_cast<std::size_t>(j)], b, h, i, j}, val);
          for (std::size_t n = 0; n < f_nodes; ++n) {
            if (df.program.nodes()[n].type == ModType::real) {
              m.mod.tau = std::max(m.mod.tau, std::abs(val[n].real));
            }
          }
          if (df.d_score >= 0) {
            m.mod.L = std::max(m.mod.L, std::abs(val[static_cast<std::size_t>(df.d_score)].real));
          }
          const double dt = pij * (dp - D_i);
          for (const ModGradient::Load& l : df.loads) {
            const ModNode& n = df.program.node(l.node);
            const auto t_id = static_cast<std::size_t>(n.tensor);
            const auto e = static_cast<std::size_t>(mod_offset(df.program, n, val));
            const double d = std::abs(val[static_cast<std::size_t>(l.d)].real);
            m.mod.L_T = std::max(m.mod.L_T, d);
            m.P[t_id][e] += pij * d;
            m.Q[t_id][e] += std::abs(dt);
            m.A[t_id][e] += std::abs(dt) * d;
            m.N[t_id][e] += 1;
          }
        }
      }
    }
  }
  for (const double c : col) m.C = std::max(m.C, c);
  return m;
}

/// SPEC §13.5's bounds on |float32 result − reference| for each output of
/// one call (dT per element of each score_mod tensor; empty for integer ones).
struct FlexBounds {
  double out = 0;                       ///< on every element of out
  double lse = 0;                       ///< on every finite lse_i
  double dq = 0;                        ///< on every element of dq
  double dk = 0;                        ///< on every element of dk
  double dv = 0;                        ///< on every element of dv
  std::vector<std::vector<double>> dT;  ///< per tensor and element of d_score_tensors
};

/// max |x| over a span, read in double.
template <class T>
double flex_max_abs(std::span<const T> x) {
  double m = 0;
  for (const T& e : x) m = std::max(m, std::abs(static_cast<double>(e)));
  return m;
}

/// The bounds of SPEC §13.5 for `plan` on `in` and `dout` (u = 2⁻²⁴),
/// with the magnitudes `x` (flex_measure) and the mod's constants `c`.
template <class T>
FlexBounds flex_bounds(const FlexPlan& plan, const FlexInputs<T>& in, std::span<const T> dout,
                       const FlexMeasured& x, const FlexModConstants& c) {
  constexpr double kU = 0x1p-24;  // float32 unit roundoff
  const FlexParams& p = plan.params();
  const auto D = static_cast<double>(p.D), Dv = static_cast<double>(p.Dv);
  const auto Sq = static_cast<double>(p.Sq), Sk = static_cast<double>(p.Sk);
  const double qm = flex_max_abs(in.q), km = flex_max_abs(in.k);
  const double vm = flex_max_abs(in.v), om = flex_max_abs(dout);
  const double sigma = plan.scale() * D * qm * km;  // |s| <= sigma
  const double tau = std::max(sigma, c.tau);        // |reals of the mod|
  const double n = flex_real_ops(p.score_mod);
  const double n_d = p.score_mod.empty() ? 0 : flex_real_ops(plan.score_grad().program) - n;
  const double eps_s = (D + 1) * kU * sigma;            // s: D FMAs and ·scale
  const double eps_t = c.L * eps_s + 4 * n * kU * tau;  // t: ≤ 4 ulp per op
  const double rho = 2 * eps_t + (Sk + 8) * kU;         // p: relative
  FlexBounds b;
  b.out = (rho + (Sk + 2) * kU) * vm;
  b.lse = eps_t + (Sk + 8) * kU * (1 + x.lse_max);
  const double e_dt = (rho + (Dv + 3) * kU) * x.gamma + 2 * Dv * om * b.out;  // |Δdt| / p
  const double e_ds = c.L * e_dt + 4 * n_d * kU * c.L * x.gamma;              // |Δds| / p
  const double R = static_cast<double>(plan.group()) * Sq;                    // terms onto one key
  b.dq = plan.scale() * km * (e_ds + (Sk + 2) * kU * c.L * x.gamma);
  b.dk = plan.scale() * qm * x.C * (e_ds + (R + 2) * kU * c.L * x.gamma);
  b.dv = om * x.C * (rho + (R + 2) * kU);
  for (std::size_t t = 0; t < x.P.size(); ++t) {
    auto& bt = b.dT.emplace_back(x.P[t].size());
    for (std::size_t e = 0; e < bt.size(); ++e) {
      bt[e] =
          e_dt * x.P[t][e] + 4 * n_d * kU * c.L_T * x.Q[t][e] + (x.N[t][e] + 1) * kU * x.A[t][e];
    }
  }
  return b;
}

}  // namespace tandem::reference
