// SPDX-License-Identifier: Apache-2.0
// RoPE and axial RoPE properties: agreement (one tensor, and q and k in one
// call), transpose, layouts and position ids, semantics, bad position ids.
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
  return run_rope(be, p, x, d.tables(), false);
}
std::vector<float> bwd(const Backend& be, const RopeData& d, const RopePlan& p,
                       const std::vector<float>& x) {
  return run_rope(be, p, x, d.tables(), true);
}

// ---------------------------------------------------------------- agreement

void agree_rope(const Backend& be) {
  const RopeData d = make_data(*gen_rope());
  const RopePlan& p = d.plan;
  TANDEM_REQUIRE_EMPTY(rope_close("rope out", fwd(be, d, p, d.x),
                                  reference_rope<double, double>(p, d.x, d.tables(), false),
                                  xmax(d.x)));
  TANDEM_REQUIRE_EMPTY(rope_close("rope_backward dx", bwd(be, d, p, d.dy),
                                  reference_rope<double, double>(p, d.dy, d.tables(), true),
                                  xmax(d.dy)));
}

/// rope_forward_qk / rope_backward_qk: q's and k's outputs each as reference<double>'s
/// single-tensor RoPE with the shared tables and positions (skipped for a
/// backend without the pair).
void agree_rope_qk(const Backend& be) {
  if (!be.rope_forward_qk || !be.rope_backward_qk) return;
  const RopeQkCase c = *gen_rope_qk();
  const RopeQkData d = make_data(c);
  const RopeTables<float> t = d.q.tables();
  for (const bool back : {false, true}) {
    const auto& q = back ? d.q.dy : d.q.x;
    const auto& k = back ? d.dk : d.k;
    const auto [q_out, k_out] = run_rope_qk(be, d, back);
    TANDEM_REQUIRE_EMPTY(rope_close(back ? "rope_backward_qk dq" : "rope_forward_qk q_out", q_out,
                                    reference_rope<double, double>(d.plan.q, q, t, back), xmax(q)));
    TANDEM_REQUIRE_EMPTY(rope_close(back ? "rope_backward_qk dk" : "rope_forward_qk k_out", k_out,
                                    reference_rope<double, double>(d.plan.k, k, t, back), xmax(k)));
  }
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
    const auto back = bwd(be, d, d.plan, fwd(be, d, d.plan, d.x));
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
    const RopeLayout layout = *rc::gen::element(RopeLayout::bshd, RopeLayout::thd);
    const RopeData d = make_data(*gen_rope(RopeGen{}.no_strides().with_layout(layout)));
    RopeParams strided = d.params;
    strided.src_row_stride = d.plan.W + pad;
    const RopePlan ps = RopePlan::make(strided);
    for (bool back : {false, true}) {
      const auto& x = back ? d.dy : d.x;
      const auto a = run_rope(be, ps, x, d.tables(), back);
      const auto b = run_rope(be, d.plan, x, d.tables(), back);
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

/// NaN in the table padding (columns >= n_rot/2) and in every row no token
/// reads (past S, or not among the position ids) never changes a result.
void table_junk(const Backend& be) {
  RopeCase c = *gen_rope();
  const i64 m = c.params.n_rot.value() / 2;
  c.params.table_stride = m + *rc::gen::inRange<i64>(1, 4);
  if (c.params.rows == TableRows::position)
    c.params.table_rows = c.params.seq + *rc::gen::inRange<i64>(0, 4);
  const RopeData d = make_data(c);
  const RopePlan& p = d.plan;
  std::vector<bool> read(p.R, false);
  for (i64 b = 0; b < p.B; ++b)
    for (i64 s = 0; s < p.S; ++s) read[p.table_row(b, s, d.positions.view())] = true;
  RopeData j = d;
  for (i64 r = 0; r < p.R; ++r)
    for (i64 i = 0; i < p.T; ++i)
      if (i >= m || !read[r]) {
        j.cos[r * p.T + i] = junk();
        j.sin[r * p.T + i] = junk();
      }
  TANDEM_REQUIRE_EMPTY(
      bit_mismatch("rope with NaN table padding", fwd(be, j, p, d.x), fwd(be, d, p, d.x)));
  TANDEM_REQUIRE_EMPTY(bit_mismatch("rope_backward with NaN table padding", bwd(be, j, p, d.dy),
                                    bwd(be, d, p, d.dy)));
}

/// d's call with a per-token table: row b·S + s is the row token (b, s) reads in d.
RopeData gathered_token_table(const RopeData& d) {
  const RopePlan& p = d.plan;
  RopeParams pt = d.params;
  pt.table_rows = p.B * p.S;
  pt.rows = TableRows::token;
  RopeData t = d;
  t.plan = RopePlan::make(pt);
  t.positions = {};
  t.cos.resize(pt.table_rows * p.T);
  t.sin.resize(pt.table_rows * p.T);
  for (i64 b = 0; b < p.B; ++b)
    for (i64 s = 0; s < p.S; ++s) {
      const i64 row = p.table_row(b, s, d.positions.view());
      std::copy_n(d.cos.begin() + row * p.T, p.T, t.cos.begin() + (b * p.S + s) * p.T);
      std::copy_n(d.sin.begin() + row * p.T, p.T, t.sin.begin() + (b * p.S + s) * p.T);
    }
  return t;
}

/// A per-token table whose row b·S + s repeats position row s ≡ the per-position table.
void token_equals_position(const Backend& be) {
  const RopeData d = make_data(*gen_rope(RopeGen{}.with_rows(TableRows::position)));
  const RopeData t = gathered_token_table(d);
  TANDEM_REQUIRE_EMPTY(rope_close("token-table rope", fwd(be, t, t.plan, d.x),
                                  to_double(fwd(be, d, d.plan, d.x)), xmax(d.x)));
  TANDEM_REQUIRE_EMPTY(rope_close("token-table rope_backward", bwd(be, t, t.plan, d.dy),
                                  to_double(bwd(be, d, d.plan, d.dy)), xmax(d.dy)));
}

/// Position ids ≡ a per-token table of the rows they select: row b·S + s of
/// the gathered table is row positions[b·S + s] of the cache (identical bits).
void positions_equal_token_table(const Backend& be) {
  const RopeData d = make_data(*gen_rope(RopeGen{}.with_rows(TableRows::position_ids)));
  const RopeData t = gathered_token_table(d);
  TANDEM_REQUIRE_EMPTY(bit_mismatch("rope by position ids vs gathered table",
                                    fwd(be, d, d.plan, d.x), fwd(be, t, t.plan, d.x)));
  TANDEM_REQUIRE_EMPTY(bit_mismatch("rope_backward by position ids vs gathered table",
                                    bwd(be, d, d.plan, d.dy), bwd(be, t, t.plan, d.dy)));
}

/// The layouts only decide where heads live: the same logical tensor as bshd
/// `[B, S, H, D]`, as bhsd `[B, H, S, D]` and as thd `[B·S, H, D]` (whose
/// token b·S + s reads, through position ids, the row token (b, s) reads)
/// gives identical bits.
void layouts_equivalent(const Backend& be) {
  const RopeData d = make_data(*gen_rope(RopeGen{}.no_strides().with_layout(RopeLayout::bshd)));
  const RopePlan& p = d.plan;
  RopeParams ph = d.params;
  ph.layout = RopeLayout::bhsd;
  RopeData h = d;
  h.plan = RopePlan::make(ph);
  RopeParams pt = d.params;  // one sequence of B·S tokens, each at its own row
  pt.layout = RopeLayout::thd;
  pt.batch = 1;
  pt.seq = p.B * p.S;
  pt.rows = TableRows::position_ids;
  RopeData t = d;
  t.plan = RopePlan::make(pt);
  std::vector<std::int64_t> rows(p.B * p.S);
  for (i64 b = 0; b < p.B; ++b)
    for (i64 s = 0; s < p.S; ++s) rows[b * p.S + s] = p.table_row(b, s, d.positions.view());
  t.positions = PositionIds::of(std::move(rows), *rc::gen::arbitrary<bool>());
  for (bool back : {false, true}) {
    const auto& x = back ? d.dy : d.x;
    const auto ref = run_rope(be, p, x, d.tables(), back);
    TANDEM_REQUIRE_EMPTY(bit_mismatch(back ? "bhsd vs bshd rope_backward" : "bhsd vs bshd rope",
                                      run_rope(be, h.plan, x, h.tables(), back), ref));
    TANDEM_REQUIRE_EMPTY(bit_mismatch(back ? "thd vs bshd rope_backward" : "thd vs bshd rope",
                                      run_rope(be, t.plan, x, t.tables(), back), ref));
  }
}

/// RoPE of x [B, H, S, D] (rank 4, layout bhsd from shapes) ≡ RoPE of every [S, D] head alone.
void rank4_equals_per_head(const Backend& be) {
  const RopeCase c = *gen_rope(
      RopeGen{}.no_strides().with_rows(TableRows::position).with_layout(RopeLayout::bshd));
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
  a4.layout = RopeLayout::bhsd;
  a4.n_rot = d.plan.n_rot;
  a4.style = d.plan.style;
  a4.table_rows = TableRows::position;
  const RopePlan p4 = RopePlan::from_shapes({B, H, S, D}, table, table, a4);
  RopeAttrs a2 = a4;
  a2.layout.reset();
  a2.head_dim = D;
  const RopePlan p2 = RopePlan::from_shapes({S, D}, table, table, a2);
  for (bool back : {false, true}) {
    // x as [B·H, S, D] memory is the bhsd tensor; p4 reads it as logical [B, S, H, D].
    const auto& x = back ? d.dy : d.x;
    const std::vector<float> mem(x.begin(), x.end());
    Guarded out(p4.out_size());
    (back ? be.rope_backward : be.rope_forward)(p4, std::span<const float>(mem), d.tables(),
                                                out.view());
    const auto whole = out.values();
    std::vector<float> heads;
    for (i64 bh = 0; bh < B * H; ++bh) {
      const std::span<const float> slice(x.data() + bh * S * D, S * D);
      const auto y = run_rope(be, p2, slice, d.tables(), back);
      heads.insert(heads.end(), y.begin(), y.end());
    }
    TANDEM_REQUIRE_EMPTY(
        rope_close(back ? "[B,H,S,D] rope_backward vs per head" : "[B,H,S,D] rope vs per head",
                   whole, to_double(heads), xmax(x)));
  }
}

/// Position ids outside [0, max_position) — negative or too large — are an
/// Error naming positions, the index and the value, thrown before anything
/// is written: every output (and its guards) still holds the sentinel.
void bad_positions_rejected(const Backend& be) {
  const bool qk = *rc::gen::arbitrary<bool>() && be.rope_forward_qk && be.rope_backward_qk;
  RopeQkCase c = *gen_rope_qk();
  c.q.params.rows = TableRows::position_ids;
  c.q.params.table_rows = *rc::gen::inRange<i64>(1, 2 * c.q.params.seq + 6);
  RopeQkData d = make_data(c);
  const RopePlan& p = d.plan.q;
  const i64 at = *rc::gen::inRange<i64>(0, p.B * p.S);
  const i64 bad = *rc::gen::element<i64>(-1, p.R, p.R + 7, -p.R - 3, std::int64_t{1} << 40);
  auto ids = d.q.positions.values;
  ids[at] = bad;
  const bool int32 = d.q.positions.int32 && bad == static_cast<std::int32_t>(bad);
  d.q.positions = PositionIds::of(std::move(ids), int32);
  const bool back = *rc::gen::arbitrary<bool>();
  const auto q = rope_source(p, back ? d.q.dy : d.q.x);
  const auto k = rope_source(d.plan.k, back ? d.dk : d.k);
  Guarded q_out(p.out_size()), k_out(d.plan.k.out_size());
  const std::string expected =
      "positions[" + std::to_string(at) + "] = " + std::to_string(bad) + " must be in [0, ";
  try {
    if (qk) {
      (back ? be.rope_backward_qk : be.rope_forward_qk)(d.plan, std::span<const float>(q),
                                                        std::span<const float>(k), d.q.tables(),
                                                        q_out.view(), k_out.view());
    } else {
      (back ? be.rope_backward : be.rope_forward)(p, std::span<const float>(q), d.q.tables(),
                                                  q_out.view());
    }
    RC_FAIL("no error for positions[" + std::to_string(at) + "] = " + std::to_string(bad));
  } catch (const Error& e) {
    RC_ASSERT(e.parameter() == std::string("positions"));
    const std::string what = e.what();
    if (what.rfind(expected, 0) != 0)
      RC_FAIL("message '" + what + "' should start '" + expected + "'");
  }
  for (const Guarded* g : {&q_out, &k_out}) {
    for (float v : g->values()) {
      if (!is_sentinel(v)) RC_FAIL("an output was written before the error");
    }
    TANDEM_REQUIRE_EMPTY(g->guard_damage());
  }
}

// ---------------------------------------------------------------- semantics

/// With true tables, <rope_m(a), rope_n(b)> depends only on m − n, and every
/// head keeps its norm.
void relative_position(const Backend& be) {
  const RopeCase c = *gen_rope(RopeGen{}.with_true_tables().no_position_ids());
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
  RopeParams gptj = d.params;
  gptj.style = RopeStyle::gptj;
  const RopePlan pg = RopePlan::make(gptj);
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
  const std::size_t first = v.size();
  v.push_back({"agree_rope", "agreement", 300, on_backend<agree_rope>()});
  v.push_back({"agree_rope_qk", "agreement", 200, on_backend<agree_rope_qk>()});
  v.push_back({"agree_axial_rope", "agreement", 200, on_backend<agree_axial>()});
  v.push_back({"rope_adjoint", "transpose", 200, on_backend<rope_adjoint>()});
  v.push_back({"axial_rope_adjoint", "transpose", 200, on_backend<axial_adjoint>()});
  v.push_back({"rope_backward_inverts_forward", "transpose", 200, on_backend<rope_inverse>()});
  v.push_back({"rope_strided_rows_equal_contiguous", "layout", 200, on_backend<strided_rows>()});
  v.push_back({"rope_table_junk_ignored", "layout", 200, on_backend<table_junk>()});
  v.push_back({"rope_token_table_equals_position_table", "layout", 200,
               on_backend<token_equals_position>()});
  v.push_back({"rope_positions_equal_token_table", "layout", 200,
               on_backend<positions_equal_token_table>()});
  v.push_back({"rope_layouts_equivalent", "layout", 200, on_backend<layouts_equivalent>()});
  v.push_back({"rope_rank4_equals_per_head", "layout", 200, on_backend<rank4_equals_per_head>()});
  v.push_back({"rope_bad_positions_rejected", "memory", 200, on_backend<bad_positions_rejected>()});
  v.push_back(
      {"rope_relative_position_and_norm", "semantic", 200, on_backend<relative_position>()});
  v.push_back({"rope_neox_equals_permuted_gptj", "semantic", 200, on_backend<neox_equals_gptj>()});
  for (std::size_t i = first; i < v.size(); ++i) v[i].calls_attention = false;
}

}  // namespace tandem::props
