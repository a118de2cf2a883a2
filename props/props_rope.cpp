// SPDX-License-Identifier: Apache-2.0
// RoPE and axial RoPE properties: agreement, transpose, layout, semantics.
#include <algorithm>
#include <cmath>

#include "checks.hpp"

namespace tandem::props {
namespace {

double dot(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}
double abs_dot(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += std::abs(double(a[i]) * b[i]);
  return s;
}
double xmax(const std::vector<float>& x) {
  return max_abs(to_double(x));
}

std::vector<float> fwd(const Backend& be, const RopeData& d, const RopePlan& p,
                       const std::vector<float>& x) {
  return run_rope(be, p, x, d.cos, d.sin, false);
}
std::vector<float> bwd(const Backend& be, const RopeData& d, const RopePlan& p,
                       const std::vector<float>& x) {
  return run_rope(be, p, x, d.cos, d.sin, true);
}

// ---------------------------------------------------------------- agreement

void agree_rope(const Backend& be) {
  const RopeData d = make_data(*gen_rope());
  const RopePlan& p = d.plan;
  TANDEM_REQUIRE_EMPTY(rope_close("rope out", fwd(be, d, p, d.x),
                                  reference_rope<double, double>(p, d.x, d.cos, d.sin, false),
                                  xmax(d.x)));
  TANDEM_REQUIRE_EMPTY(rope_close("rope_backward dx", bwd(be, d, p, d.dy),
                                  reference_rope<double, double>(p, d.dy, d.cos, d.sin, true),
                                  xmax(d.dy)));
}

void agree_axial(const Backend& be) {
  const AxialData d = make_data(*gen_axial());
  TANDEM_REQUIRE_EMPTY(rope_close("axial out", run_axial(be, d.plan, d.x, false),
                                  reference_axial<double, double>(d.plan, d.x, false), xmax(d.x)));
  TANDEM_REQUIRE_EMPTY(rope_close("axial_backward dx", run_axial(be, d.plan, d.dy, true),
                                  reference_axial<double, double>(d.plan, d.dy, true), xmax(d.dy)));
}

// ---------------------------------------------------------------- transpose

std::string adjoint(const std::string& what, const std::vector<float>& x,
                    const std::vector<float>& y, const std::vector<float>& fx,
                    const std::vector<float>& bty) {
  const double lhs = dot(fx, y), rhs = dot(x, bty);
  const double tol = 32 * kEps * (abs_dot(fx, y) + abs_dot(x, bty));
  if (std::abs(lhs - rhs) <= tol) return {};
  return what + ": <f(x), y> = " + std::to_string(lhs) +
         " but <x, f_backward(y)> = " + std::to_string(rhs) + " (tolerance " + std::to_string(tol) +
         ")";
}

void rope_adjoint(const Backend& be) {
  const RopeData d = make_data(*gen_rope());
  TANDEM_REQUIRE_EMPTY(
      adjoint("rope", d.x, d.dy, fwd(be, d, d.plan, d.x), bwd(be, d, d.plan, d.dy)));
}

void axial_adjoint(const Backend& be) {
  const AxialData d = make_data(*gen_axial());
  TANDEM_REQUIRE_EMPTY(adjoint("axial rope", d.x, d.dy, run_axial(be, d.plan, d.x, false),
                               run_axial(be, d.plan, d.dy, true)));
}

/// rope_backward(rope(x)) = x for true cos/sin tables; the same for axial RoPE.
void rope_inverse(const Backend& be) {
  if (*rc::gen::arbitrary<bool>()) {
    const RopeData d = make_data(*gen_rope(RopeGen{}.with_true_tables()));
    RopePlan pc = d.plan;
    pc.src_row_stride = pc.W;  // the output of the forward is contiguous
    const auto back = bwd(be, d, pc, fwd(be, d, d.plan, d.x));
    TANDEM_REQUIRE_EMPTY(rope_close("rope_backward(rope(x))", back, to_double(d.x), xmax(d.x)));
  } else {
    const AxialData d = make_data(*gen_axial());
    AxialRopePlan pc = d.plan;
    pc.src_row_stride = pc.W;
    const auto back = run_axial(be, pc, run_axial(be, d.plan, d.x, false), true);
    TANDEM_REQUIRE_EMPTY(rope_close("axial_backward(axial(x))", back, to_double(d.x), xmax(d.x)));
  }
}

// ------------------------------------------------------------------- layout

/// Source rows read out of a wider parent (NaN in the gaps) ≡ contiguous rows.
void strided_rows(const Backend& be) {
  const i64 pad = *rc::gen::inRange<i64>(1, 6);
  if (*rc::gen::arbitrary<bool>()) {
    const RopeData d = make_data(*gen_rope(RopeGen{}.no_strides()));
    RopePlan ps = d.plan;
    ps.src_row_stride = ps.W + pad;
    for (bool back : {false, true}) {
      const auto& x = back ? d.dy : d.x;
      const auto a = run_rope(be, ps, x, d.cos, d.sin, back);
      const auto b = run_rope(be, d.plan, x, d.cos, d.sin, back);
      TANDEM_REQUIRE_EMPTY(
          rope_close(back ? "strided rope_backward" : "strided rope", a, to_double(b), xmax(x)));
    }
  } else {
    const AxialData d = make_data(*gen_axial(false));
    AxialRopePlan ps = d.plan;
    ps.src_row_stride = ps.W + pad;
    for (bool back : {false, true}) {
      const auto& x = back ? d.dy : d.x;
      const auto a = run_axial(be, ps, x, back), b = run_axial(be, d.plan, x, back);
      TANDEM_REQUIRE_EMPTY(
          rope_close(back ? "strided axial_backward" : "strided axial", a, to_double(b), xmax(x)));
    }
  }
}

/// NaN in the table padding (columns >= n_rot/2, rows past S) never changes a result.
void table_junk(const Backend& be) {
  RopeCase c = *gen_rope();
  const i64 m = c.params.n_rot.value() / 2;
  c.params.table_stride = m + *rc::gen::inRange<i64>(1, 4);
  if (c.params.rows == TableRows::position)
    c.params.table_rows = c.params.seq + *rc::gen::inRange<i64>(0, 4);
  const RopeData d = make_data(c);
  const RopePlan& p = d.plan;
  RopeData j = d;
  for (i64 r = 0; r < p.R; ++r)
    for (i64 i = 0; i < p.T; ++i)
      if (i >= m || (p.rows == TableRows::position && r >= p.S)) {
        j.cos[r * p.T + i] = junk();
        j.sin[r * p.T + i] = junk();
      }
  TANDEM_REQUIRE_EMPTY(
      bit_mismatch("rope with NaN table padding", fwd(be, j, p, d.x), fwd(be, d, p, d.x)));
  TANDEM_REQUIRE_EMPTY(bit_mismatch("rope_backward with NaN table padding", bwd(be, j, p, d.dy),
                                    bwd(be, d, p, d.dy)));
}

/// A per-token table whose row b'·S + s repeats position row s ≡ the per-position table.
void token_equals_position(const Backend& be) {
  const RopeData d = make_data(*gen_rope(RopeGen{}.with_rows(TableRows::position)));
  const RopePlan& p = d.plan;
  RopeParams pt;
  pt.batch = p.B;
  pt.seq = p.S;
  pt.width = p.W;
  pt.head_dim = p.D;
  pt.n_rot = p.n_rot;
  pt.style = p.style;
  pt.table_rows = p.B * p.S;
  pt.table_stride = p.T;
  pt.rows = TableRows::token;
  pt.src_row_stride = p.src_row_stride;
  RopeData t = d;
  t.plan = RopePlan::make(pt);
  t.cos.resize(pt.table_rows * p.T);
  t.sin.resize(pt.table_rows * p.T);
  for (i64 b = 0; b < p.B; ++b)
    for (i64 s = 0; s < p.S; ++s)
      for (i64 i = 0; i < p.T; ++i) {
        t.cos[(b * p.S + s) * p.T + i] = d.cos[s * p.T + i];
        t.sin[(b * p.S + s) * p.T + i] = d.sin[s * p.T + i];
      }
  TANDEM_REQUIRE_EMPTY(rope_close("token-table rope", fwd(be, t, t.plan, d.x),
                                  to_double(fwd(be, d, p, d.x)), xmax(d.x)));
  TANDEM_REQUIRE_EMPTY(rope_close("token-table rope_backward", bwd(be, t, t.plan, d.dy),
                                  to_double(bwd(be, d, p, d.dy)), xmax(d.dy)));
}

/// RoPE of x [B, H, S, D] (rank 4, from shapes) ≡ RoPE of every [S, D] head alone.
void rank4_equals_per_head(const Backend& be) {
  const RopeCase c = *gen_rope(RopeGen{}.no_strides().with_rows(TableRows::position));
  const i64 B = *rc::gen::inRange<i64>(1, 3), H = *rc::gen::inRange<i64>(1, 4);
  const i64 S = c.params.seq, D = c.params.head_dim;
  RopeCase c1 = c;
  c1.params.batch = B * H;
  c1.params.width = D;
  c1.params.table_stride = std::max<i64>(
      c1.params.n_rot.value() / 2 +
          (c1.params.table_stride > 0 ? c1.params.table_stride - c1.params.n_rot.value() / 2 : 0),
      1);
  const RopeData d = make_data(c1);
  const Shape table{d.plan.R, d.plan.T};
  RopeAttrs a4;
  a4.n_rot = d.plan.n_rot;
  a4.style = d.plan.style;
  a4.table_rows = TableRows::position;
  const RopePlan p4 = RopePlan::from_shapes({B, H, S, D}, table, table, a4);
  RopeAttrs a2 = a4;
  a2.head_dim = D;
  const RopePlan p2 = RopePlan::from_shapes({S, D}, table, table, a2);
  for (bool back : {false, true}) {
    const auto& x = back ? d.dy : d.x;
    const auto whole = run_rope(be, p4, x, d.cos, d.sin, back);
    std::vector<float> heads;
    for (i64 bh = 0; bh < B * H; ++bh) {
      const std::span<const float> slice(x.data() + bh * S * D, S * D);
      const auto y = run_rope(be, p2, slice, d.cos, d.sin, back);
      heads.insert(heads.end(), y.begin(), y.end());
    }
    TANDEM_REQUIRE_EMPTY(
        rope_close(back ? "[B,H,S,D] rope_backward vs per head" : "[B,H,S,D] rope vs per head",
                   whole, to_double(heads), xmax(x)));
  }
}

// ---------------------------------------------------------------- semantics

/// With true tables, <rope_m(a), rope_n(b)> depends only on m − n, and every
/// head keeps its norm.
void relative_position(const Backend& be) {
  const RopeCase c = *gen_rope(RopeGen{}.with_true_tables());
  const RopeData d = make_data(c);
  const RopePlan& p = d.plan;
  const auto y = fwd(be, d, p, d.x);
  for (i64 r = 0; r < p.B * p.S; ++r)
    for (i64 h = 0; h < p.W / p.D; ++h) {
      const std::span<const float> xs(d.x.data() + r * p.W + h * p.D, p.D),
          ys(y.data() + r * p.W + h * p.D, p.D);
      const double nx = std::sqrt(dot(xs, xs)), ny = std::sqrt(dot(ys, ys));
      if (!(std::abs(nx - ny) <= 16 * kEps * nx + 1e-30)) {
        RC_FAIL("row " + std::to_string(r) + " head " + std::to_string(h) +
                ": |rope(x)| = " + std::to_string(ny) + " but |x| = " + std::to_string(nx));
      }
    }
  if (p.S < 2) return;
  Rng rng(c.seed + 11);
  const i64 m = rng.index(p.S - 1), n = rng.index(p.S - 1);
  const i64 t = 1 + rng.index(p.S - 1 - std::max(m, n));
  const auto a = rng.values(p.D, 1.0), b = rng.values(p.D, 1.0);
  const auto at = [&](const std::vector<float>& u, const std::vector<float>& v, i64 pu, i64 pv) {
    std::vector<float> x = d.x;
    std::copy(u.begin(), u.end(), x.begin() + pu * p.W);
    std::copy(v.begin(), v.end(), x.begin() + pv * p.W);
    const auto yy = fwd(be, d, p, x);
    return dot(std::span<const float>(yy.data() + pu * p.W, p.D),
               std::span<const float>(yy.data() + pv * p.W, p.D));
  };
  const double d1 = at(a, b, m, n), d2 = at(a, b, m + t, n + t);
  const double tol = 64 * kEps * std::sqrt(dot(a, a) * dot(b, b));
  if (!(std::abs(d1 - d2) <= tol)) {
    RC_FAIL("<rope_" + std::to_string(m) + "(a), rope_" + std::to_string(n) +
            "(b)> = " + std::to_string(d1) + " but shifted by " + std::to_string(t) + " it is " +
            std::to_string(d2));
  }
}

/// NeoX ≡ GPT-J under the pair permutation: gptj(P x) = P neox(x), with
/// (P x)[2i] = x[i], (P x)[2i+1] = x[i + n_rot/2] in every head.
void neox_equals_gptj(const Backend& be) {
  const RopeData d = make_data(*gen_rope(RopeGen{}.with_style(RopeStyle::neox)));
  const RopePlan& p = d.plan;
  RopePlan pg = p;
  pg.style = RopeStyle::gptj;
  const i64 m = p.n_rot / 2;
  const auto perm = [&](const std::vector<float>& x) {
    std::vector<float> out = x;
    for (i64 r = 0; r < p.B * p.S; ++r)
      for (i64 h = 0; h < p.W / p.D; ++h) {
        const i64 o = r * p.W + h * p.D;
        for (i64 i = 0; i < m; ++i) {
          out[o + 2 * i] = x[o + i];
          out[o + 2 * i + 1] = x[o + i + m];
        }
      }
    return out;
  };
  TANDEM_REQUIRE_EMPTY(rope_close("gptj(P x) vs P neox(x)", fwd(be, d, pg, perm(d.x)),
                                  to_double(perm(fwd(be, d, p, d.x))), xmax(d.x)));
  TANDEM_REQUIRE_EMPTY(rope_close("gptj_backward(P y) vs P neox_backward(y)",
                                  bwd(be, d, pg, perm(d.dy)), to_double(perm(bwd(be, d, p, d.dy))),
                                  xmax(d.dy)));
}

template <void (*F)(const Backend&)>
std::function<void(const Subject&)> on_backend() {
  return [](const Subject& s) { F(s.backend); };
}

}  // namespace

void register_rope_properties(std::vector<Property>& v) {
  v.push_back({"agree_rope", "agreement", 300, on_backend<agree_rope>()});
  v.push_back({"agree_axial_rope", "agreement", 200, on_backend<agree_axial>()});
  v.push_back({"rope_adjoint", "transpose", 200, on_backend<rope_adjoint>()});
  v.push_back({"axial_rope_adjoint", "transpose", 200, on_backend<axial_adjoint>()});
  v.push_back({"rope_backward_inverts_forward", "transpose", 200, on_backend<rope_inverse>()});
  v.push_back({"rope_strided_rows_equal_contiguous", "layout", 200, on_backend<strided_rows>()});
  v.push_back({"rope_table_junk_ignored", "layout", 200, on_backend<table_junk>()});
  v.push_back({"rope_token_table_equals_position_table", "layout", 200,
               on_backend<token_equals_position>()});
  v.push_back({"rope_rank4_equals_per_head", "layout", 200, on_backend<rank4_equals_per_head>()});
  v.push_back(
      {"rope_relative_position_and_norm", "semantic", 200, on_backend<relative_position>()});
  v.push_back({"rope_neox_equals_permuted_gptj", "semantic", 200, on_backend<neox_equals_gptj>()});
}

}  // namespace tandem::props
