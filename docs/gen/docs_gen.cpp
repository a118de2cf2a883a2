// SPDX-License-Identifier: Apache-2.0
// tandem_docs_gen: writes every number and figure that the documentation
// pages show, computed by tandem itself, so that a page cannot drift from the
// code.
//
//   tandem_docs_gen SOURCE_DIR OUT_DIR     write OUT_DIR/*.md, *.svg, aliases.doxy
//   tandem_docs_gen --check HTML_DIR OUT_DIR
//                                          after Doxygen ran: every generated link
//                                          to a reference line must exist in HTML_DIR
//
// The worked examples are computed twice: step by step here, in double, with
// the formulas of SPEC §2–4, and by the reference backend; the program fails
// (and with it the docs build) when the two disagree. The mask pictures are
// read off the reference backend's output (uniform scores, one-hot values), the
// RoPE pairing pictures off its rotation of unit vectors. Links to reference
// lines are found by searching the sources for the text listed in
// docs/codelinks.txt, so a moved line moves its link and a deleted one fails
// the build.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/reference/attention.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/tandem.hpp"
#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace fs = std::filesystem;
using std::int64_t;
using tandem::Backend;
using Mat = std::vector<std::vector<double>>;

namespace {

// ---------------------------------------------------------------------------
// Small helpers

[[noreturn]] void fail(const std::string& what) {
  std::cerr << "tandem_docs_gen: " << what << "\n";
  std::exit(1);
}

void expect_close(double got, double want, double tol, const std::string& what) {
  if (!(std::fabs(got - want) <= tol * (1.0 + std::fabs(want)))) {
    std::ostringstream s;
    s.precision(10);
    s << what << ": the reference gives " << got << ", the worked example " << want;
    fail(s.str());
  }
}

std::string num(double x, int digits = 4) {
  if (std::isinf(x)) return x > 0 ? "+inf" : "−inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  std::string s = buf;
  if (s.find_first_not_of("-0.") == std::string::npos) return s[0] == '-' ? s.substr(1) : s;
  if (s[0] != '-') return s;
  std::string r = "−";
  r.append(s, 1, std::string::npos);
  return r;
}

std::string vec(const std::vector<double>& v, int digits = 4) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + num(v[i], digits);
  return s + "]";
}

std::vector<float> flat(const Mat& m) {
  std::vector<float> f;
  for (const auto& r : m)
    for (double x : r) f.push_back(static_cast<float>(x));
  return f;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
  if (!f) fail("cannot write " + p.string());
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot read " + p.string());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  const auto b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

// ---------------------------------------------------------------------------
// SVG

std::string xml_escape(const std::string& t) {
  std::string r;
  for (char ch : t) {
    if (ch == '<')
      r += "&lt;";
    else if (ch == '>')
      r += "&gt;";
    else if (ch == '&')
      r += "&amp;";
    else
      r += ch;
  }
  return r;
}

struct Svg {
  double w, h;
  std::ostringstream body;
  Svg(double width, double height) : w(width), h(height) {}
  void rect(double x, double y, double rw, double rh, const std::string& fill,
            const std::string& stroke = "#555", double sw = 1) {
    body << "<rect x='" << x << "' y='" << y << "' width='" << rw << "' height='" << rh
         << "' fill='" << fill << "' stroke='" << stroke << "' stroke-width='" << sw << "'/>\n";
  }
  void text(double x, double y, const std::string& t, int size = 12,
            const std::string& anchor = "middle", const std::string& fill = "#222") {
    body << "<text x='" << x << "' y='" << y << "' font-size='" << size
         << "' font-family='sans-serif' text-anchor='" << anchor << "' fill='" << fill << "'>"
         << xml_escape(t) << "</text>\n";
  }
  void line(double x1, double y1, double x2, double y2, const std::string& stroke = "#222",
            double sw = 1.5) {
    body << "<line x1='" << x1 << "' y1='" << y1 << "' x2='" << x2 << "' y2='" << y2 << "' stroke='"
         << stroke << "' stroke-width='" << sw << "'/>\n";
  }
  void path(const std::string& d, const std::string& stroke, double sw = 1.5) {
    body << "<path d='" << d << "' fill='none' stroke='" << stroke << "' stroke-width='" << sw
         << "'/>\n";
  }
  std::string str() const {
    std::ostringstream s;
    s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h
      << "' viewBox='0 0 " << w << " " << h << "'>\n"
      << "<rect x='0' y='0' width='" << w << "' height='" << h << "' fill='white'/>\n"
      << body.str() << "</svg>\n";
    return s.str();
  }
};

// ---------------------------------------------------------------------------
// Visibility read off the reference backend: with q = k = 0 every visible
// score is 0, so p_ij = 1/n_i over the visible keys; with v_j = e_j
// (Dv = Sk) the output o_i[j] is p_ij. Key j is visible to query i iff
// o_i[j] > 0 (a query with no visible key outputs 0: no key is marked).

using Grid = std::vector<std::vector<bool>>;

Grid visibility(const Backend& be, tandem::AttentionParams p, const std::vector<float>& mask) {
  p.B = 1;
  p.H = 1;
  p.Hkv = 1;
  p.D = 1;
  p.Dv = p.Sk;
  const auto plan = tandem::AttentionPlan::make(p);
  std::vector<float> q(plan.q.extent, 0.0f), k(plan.k.extent, 0.0f), v(plan.v.extent, 0.0f);
  for (int64_t j = 0; j < p.Sk; ++j) v[plan.v.at(0, j, 0) + j] = 1.0f;
  std::vector<float> out(plan.o.extent, -1.0f);
  be.attention_forward(plan, {q, k, v, mask}, out);
  Grid g(p.Sq, std::vector<bool>(p.Sk));
  for (int64_t i = 0; i < p.Sq; ++i)
    for (int64_t j = 0; j < p.Sk; ++j) g[i][j] = out[plan.o.at(0, i, 0) + j] > 0.0f;
  return g;
}

std::string mask_svg(const Grid& g, const std::string& title, const std::string& note) {
  const int64_t Sq = static_cast<int64_t>(g.size()), Sk = static_cast<int64_t>(g[0].size());
  const double c = 26, x0 = 70, y0 = 58;
  Svg s(x0 + Sk * c + 30, y0 + Sq * c + 46);
  s.text(x0 + Sk * c / 2, 18, title, 14);
  s.text(x0 + Sk * c / 2, 38, "key j →", 12);
  s.text(12, y0 + Sq * c / 2, "query i", 12, "start");
  for (int64_t j = 0; j < Sk; ++j) s.text(x0 + j * c + c / 2, y0 - 6, std::to_string(j), 11);
  for (int64_t i = 0; i < Sq; ++i) {
    s.text(x0 - 8, y0 + i * c + c * 0.65, std::to_string(i), 11, "end");
    for (int64_t j = 0; j < Sk; ++j)
      s.rect(x0 + j * c, y0 + i * c, c, c, g[i][j] ? "#3b7dd8" : "#eeeeee", "#999");
  }
  s.text(x0 + Sk * c / 2, y0 + Sq * c + 24, note, 11);
  return s.str();
}

// ---------------------------------------------------------------------------
// Page 1 and 2: a worked attention example, forward and backward.

struct Worked {
  Mat q, k, v, dout;
  double scale = 0;
  int64_t off = 0;
  std::vector<std::vector<bool>> vis;
  Mat x, p, o, dp, ds, dq, dk, dv;
  std::vector<double> m, l, delta;
};

// The forward and backward of one head with a causal mask, step by step in
// double, from SPEC §2–3.
Worked work_attention(const Mat& q, const Mat& k, const Mat& v, const Mat& dout) {
  Worked w;
  w.q = q;
  w.k = k;
  w.v = v;
  w.dout = dout;
  const int64_t Sq = q.size(), Sk = k.size(), D = q[0].size(), Dv = v[0].size();
  w.scale = 1.0 / std::sqrt(static_cast<double>(D));
  w.off = std::max<int64_t>(Sk - Sq, 0);
  w.vis.assign(Sq, std::vector<bool>(Sk));
  w.x.assign(Sq, std::vector<double>(Sk, -std::numeric_limits<double>::infinity()));
  w.p.assign(Sq, std::vector<double>(Sk, 0));
  w.o.assign(Sq, std::vector<double>(Dv, 0));
  w.m.assign(Sq, 0);
  w.l.assign(Sq, 0);
  for (int64_t i = 0; i < Sq; ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < Sk; ++j) {
      w.vis[i][j] = j <= w.off + i;
      if (!w.vis[i][j]) continue;
      w.x[i][j] = w.scale * dot(q[i], k[j]);
      mx = std::max(mx, w.x[i][j]);
    }
    w.m[i] = mx;
    for (int64_t j = 0; j < Sk; ++j)
      if (w.vis[i][j]) w.l[i] += std::exp(w.x[i][j] - mx);
    for (int64_t j = 0; j < Sk; ++j)
      if (w.vis[i][j]) w.p[i][j] = std::exp(w.x[i][j] - mx) / w.l[i];
    for (int64_t d = 0; d < Dv; ++d)
      for (int64_t j = 0; j < Sk; ++j) w.o[i][d] += w.p[i][j] * v[j][d];
  }
  w.dp.assign(Sq, std::vector<double>(Sk, 0));
  w.ds.assign(Sq, std::vector<double>(Sk, 0));
  w.delta.assign(Sq, 0);
  w.dq.assign(Sq, std::vector<double>(D, 0));
  w.dk.assign(Sk, std::vector<double>(D, 0));
  w.dv.assign(Sk, std::vector<double>(Dv, 0));
  for (int64_t i = 0; i < Sq; ++i) {
    w.delta[i] = dot(dout[i], w.o[i]);
    for (int64_t j = 0; j < Sk; ++j) {
      if (!w.vis[i][j]) continue;
      w.dp[i][j] = dot(dout[i], v[j]);
      w.ds[i][j] = w.p[i][j] * (w.dp[i][j] - w.delta[i]);
    }
  }
  for (int64_t i = 0; i < Sq; ++i)
    for (int64_t j = 0; j < Sk; ++j) {
      for (int64_t d = 0; d < D; ++d) {
        w.dq[i][d] += w.scale * w.ds[i][j] * k[j][d];
        w.dk[j][d] += w.scale * w.ds[i][j] * q[i][d];
      }
      for (int64_t d = 0; d < Dv; ++d) w.dv[j][d] += w.p[i][j] * dout[i][d];
    }
  return w;
}

// The loss ⟨dO, O⟩ of the worked example, for a finite-difference check.
double worked_loss(const Mat& q, const Mat& k, const Mat& v, const Mat& dout) {
  const Worked w = work_attention(q, k, v, dout);
  double s = 0;
  for (std::size_t i = 0; i < w.o.size(); ++i) s += dot(dout[i], w.o[i]);
  return s;
}

std::string matrix_md(const std::string& corner, const std::vector<std::string>& cols,
                      const std::vector<std::string>& rows,
                      const std::function<std::string(int64_t, int64_t)>& cell) {
  std::ostringstream s;
  s << "| " << corner << " |";
  for (const auto& c : cols) s << " " << c << " |";
  s << "\n|---|";
  for (std::size_t c = 0; c < cols.size(); ++c) s << "---:|";
  s << "\n";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    s << "| " << rows[r] << " |";
    for (std::size_t c = 0; c < cols.size(); ++c)
      s << " " << cell(static_cast<int64_t>(r), static_cast<int64_t>(c)) << " |";
    s << "\n";
  }
  return s.str();
}

std::vector<std::string> labels(const std::string& p, int64_t n) {
  std::vector<std::string> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(p + std::to_string(i));
  return v;
}

void attention_pages(const Backend& ref, const fs::path& out) {
  // One head, Sq = 2 queries, Sk = 3 keys, D = Dv = 2, causal.
  const Mat q = {{1.0, 0.0}, {0.5, 1.0}};
  const Mat k = {{1.0, 0.0}, {0.0, 1.0}, {1.0, 1.0}};
  const Mat v = {{1.0, 0.0}, {0.0, 2.0}, {3.0, 1.0}};
  const Mat dout = {{1.0, 0.0}, {0.0, 1.0}};
  const Worked w = work_attention(q, k, v, dout);

  // The same call on the reference backend.
  tandem::AttentionAttrs attrs;
  attrs.num_heads = 1;
  attrs.mask = tandem::MaskKind::causal;
  const auto plan = tandem::AttentionPlan::from_shapes({2, 2}, {3, 2}, {3, 2}, std::nullopt, attrs);
  const std::vector<float> qf = flat(q), kf = flat(k), vf = flat(v), df = flat(dout);
  std::vector<float> o(plan.o.extent), dq(plan.dq.extent), dk(plan.dk.extent), dv(plan.dv.extent);
  ref.attention_forward(plan, {qf, kf, vf}, o);
  ref.attention_backward(plan, {qf, kf, vf}, df, {dq, dk, dv});
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t d = 0; d < 2; ++d) {
      expect_close(o[i * 2 + d], w.o[i][d], 1e-6, "o[" + std::to_string(i) + "]");
      expect_close(dq[i * 2 + d], w.dq[i][d], 1e-6, "dq[" + std::to_string(i) + "]");
    }
  for (int64_t j = 0; j < 3; ++j)
    for (int64_t d = 0; d < 2; ++d) {
      expect_close(dk[j * 2 + d], w.dk[j][d], 1e-6, "dk[" + std::to_string(j) + "]");
      expect_close(dv[j * 2 + d], w.dv[j][d], 1e-6, "dv[" + std::to_string(j) + "]");
    }

  const auto S = labels("j=", 3);
  const auto I = labels("i=", 2);
  std::ostringstream f;
  f << "Inputs (one batch, one head, `bshd`; rank 2 `[S, H*D]` with H = 1):\n\n"
    << matrix_md("", {"d=0", "d=1"}, {"q_0", "q_1"},
                 [&](int64_t r, int64_t c) { return num(q[r][c], 1); })
    << "\n"
    << matrix_md("", {"d=0", "d=1"}, {"k_0", "k_1", "k_2"},
                 [&](int64_t r, int64_t c) { return num(k[r][c], 1); })
    << "\n"
    << matrix_md("", {"d=0", "d=1"}, {"v_0", "v_1", "v_2"},
                 [&](int64_t r, int64_t c) { return num(v[r][c], 1); })
    << "\nSq = 2, Sk = 3, D = 2, so scale = 1/√2 = " << num(w.scale) << " and the query offset is "
    << "`off = max(Sk − Sq, 0) = " << w.off
    << "`: query 0 sits at key position a = 1, query 1 at a = 2.\n"
    << "Causal visibility `j <= a` hides key 2 from query 0 and nothing from query 1.\n\n"
    << "**Pass 1: scores** `s_ij = scale·<q_i, k_j>` (hidden keys are not scored at all):\n\n"
    << matrix_md("s", S, I,
                 [&](int64_t r, int64_t c) { return w.vis[r][c] ? num(w.x[r][c]) : "hidden"; })
    << "\n**Pass 2: row maxima** m = " << vec(w.m)
    << "; **pass 3: sums** `l_i = Σ_j exp(s_ij − m_i)` = " << vec(w.l) << ".\n\n"
    << "**Pass 4: probabilities** `p_ij = exp(s_ij − m_i) / l_i` (each row sums to 1 over its "
       "visible keys):\n\n"
    << matrix_md("p", S, I,
                 [&](int64_t r, int64_t c) { return w.vis[r][c] ? num(w.p[r][c]) : "0"; })
    << "\n**Pass 5: outputs** `o_i = Σ_j p_ij v_j`:\n\n"
    << matrix_md("o", {"d=0", "d=1"}, {"o_0", "o_1"},
                 [&](int64_t r, int64_t c) { return num(w.o[r][c]); })
    << "\nThe reference backend, called on these inputs "
    << "(`AttentionPlan::from_shapes({2, 2}, {3, 2}, {3, 2}, std::nullopt, attrs)` with "
    << "`attrs.mask = MaskKind::causal`), returns the same `o` to within 1e-6: the docs build "
    << "fails otherwise.\n";
  write_file(out / "worked_attention.md", f.str());

  // Finite differences of the loss <dO, O> with respect to q_0[0] and k_1[1].
  const double h = 1e-6;
  auto fd = [&](Mat a, Mat b, Mat c, int which, int64_t r, int64_t d) {
    Mat* t = which == 0 ? &a : which == 1 ? &b : &c;
    (*t)[r][d] += h;
    const double up = worked_loss(a, b, c, dout);
    (*t)[r][d] -= 2 * h;
    const double dn = worked_loss(a, b, c, dout);
    return (up - dn) / (2 * h);
  };
  const double fd_q00 = fd(q, k, v, 0, 0, 0), fd_k11 = fd(q, k, v, 1, 1, 1),
               fd_v21 = fd(q, k, v, 2, 2, 1);
  expect_close(fd_q00, w.dq[0][0], 1e-6, "finite difference of dq_0[0]");
  expect_close(fd_k11, w.dk[1][1], 1e-6, "finite difference of dk_1[1]");
  expect_close(fd_v21, w.dv[2][1], 1e-6, "finite difference of dv_2[1]");

  std::ostringstream g;
  g << "The forward of [Attention from scratch](@ref attention_from_scratch) again, now with an "
    << "upstream gradient dO (the gradient of the loss L = ⟨dO, O⟩):\n\n"
    << matrix_md("", {"d=0", "d=1"}, {"dO_0", "dO_1"},
                 [&](int64_t r, int64_t c) { return num(dout[r][c], 1); })
    << "\n**Step 1** `dp_ij = <dO_i, v_j>`:\n\n"
    << matrix_md("dp", S, I,
                 [&](int64_t r, int64_t c) { return w.vis[r][c] ? num(w.dp[r][c]) : "—"; })
    << "\n**Step 2** `delta_i = <dO_i, o_i>` = rowsum(dO ∘ O) = " << vec(w.delta) << ". "
    << "(Check: `Σ_j p_ij dp_ij` gives the same: "
    << num(w.p[0][0] * w.dp[0][0] + w.p[0][1] * w.dp[0][1]) << " and "
    << num(w.p[1][0] * w.dp[1][0] + w.p[1][1] * w.dp[1][1] + w.p[1][2] * w.dp[1][2]) << ".)\n\n"
    << "**Step 3** `ds_ij = p_ij (dp_ij − delta_i)`; every row of ds sums to 0:\n\n"
    << matrix_md("ds", S, I,
                 [&](int64_t r, int64_t c) { return w.vis[r][c] ? num(w.ds[r][c]) : "0"; })
    << "\n**Step 4** (no softcap here, so dx = ds) and the three products:\n\n"
    << matrix_md("", {"d=0", "d=1"}, {"dq_0", "dq_1"},
                 [&](int64_t r, int64_t c) { return num(w.dq[r][c]); })
    << "\n"
    << matrix_md("", {"d=0", "d=1"}, {"dk_0", "dk_1", "dk_2"},
                 [&](int64_t r, int64_t c) { return num(w.dk[r][c]); })
    << "\n"
    << matrix_md("", {"d=0", "d=1"}, {"dv_0", "dv_1", "dv_2"},
                 [&](int64_t r, int64_t c) { return num(w.dv[r][c]); })
    << "\nKey 2 is hidden from query 0, so only query 1 reaches it: `dv_2 = p_12·dO_1`. "
    << "The reference backend's `attention_backward` returns these numbers to within 1e-6, and "
    << "central finite differences of L (step 1e-6, in double) agree: "
    << "∂L/∂q_0[0] ≈ " << num(fd_q00, 6) << ", ∂L/∂k_1[1] ≈ " << num(fd_k11, 6) << ", ∂L/∂v_2[1] ≈ "
    << num(fd_v21, 6) << ". The docs build checks all three.\n";
  write_file(out / "worked_backward.md", g.str());

  // Online softmax over query 1's keys in two blocks, {0, 1} then {2}.
  {
    const int64_t i = 1;
    const double s0 = w.x[i][0], s1 = w.x[i][1], s2 = w.x[i][2];
    const double m1 = std::max(s0, s1);
    const double l1 = std::exp(s0 - m1) + std::exp(s1 - m1);
    std::vector<double> o1(2), o2(2), fin(2);
    for (int d = 0; d < 2; ++d) o1[d] = std::exp(s0 - m1) * v[0][d] + std::exp(s1 - m1) * v[1][d];
    const double m2 = std::max(m1, s2), alpha = std::exp(m1 - m2);
    const double l2 = alpha * l1 + std::exp(s2 - m2);
    for (int d = 0; d < 2; ++d) {
      o2[d] = alpha * o1[d] + std::exp(s2 - m2) * v[2][d];
      fin[d] = o2[d] / l2;
      expect_close(fin[d], w.o[i][d], 1e-12, "online softmax of the worked example");
    }
    std::ostringstream os;
    os << "Query 1 of the worked example in @ref attention_from_scratch, its three keys taken in "
       << "two blocks:\n\n"
       << "| after | running max m | running sum l | unnormalized output O |\n|---|---:|---:|---|\n"
       << "| block {0, 1} | " << num(m1) << " | " << num(l1) << " | " << vec(o1) << " |\n"
       << "| block {2}: rescale by α = exp(m_old − m_new) = " << num(alpha) << ", add key 2 | "
       << num(m2) << " | " << num(l2) << " | " << vec(o2) << " |\n\n"
       << "and `O / l` = " << vec(fin)
       << ", the o_1 of the one-pass softmax (the docs build checks "
       << "they agree to 1e-12).\n";
    write_file(out / "online_softmax.md", os.str());
  }
}

// ---------------------------------------------------------------------------
// Page 3: RoPE.

// Position ids pick a row per token; layouts only move heads: both computed.
void rope_positions_and_layouts(const Backend& ref, const fs::path& out) {
  // Two tokens, one head of D = 2, a cache of 3 rows at 0°, 90°, 180°; positions [2, 0].
  const std::vector<float> cos = {1, 0, -1}, sin = {0, 1, 0}, x = {1, 2, 3, 4};
  const std::vector<std::int64_t> positions = {2, 0};
  tandem::RopeAttrs a;
  a.head_dim = 2;
  const auto plan = tandem::RopePlan::from_shapes({2, 2}, {3, 1}, {3, 1}, tandem::Shape{2}, a);
  std::vector<float> y(4);
  ref.rope_forward(plan, x, {cos, sin, tandem::Indices(positions)}, y);
  const std::vector<double> want = {-1, -2, 3, 4};
  for (std::size_t i = 0; i < 4; ++i) expect_close(y[i], want[i], 0, "rope positions [2, 0]");
  std::ostringstream f;
  f << "x = `[[1, 2], [3, 4]]` (2 tokens, one head of D = 2), a cache of 3 rows at 0°, 90° and "
    << "180° (cos = `[1, 0, −1]`, sin = `[0, 1, 0]`), positions = `[2, 0]`:\n\n"
    << "| token | position | row (cos, sin) | x | rope(x) |\n|---|---|---|---|---|\n";
  for (std::size_t t = 0; t < 2; ++t) {
    const auto r = static_cast<std::size_t>(positions[t]);
    f << "| " << t << " | " << positions[t] << " | (" << num(cos[r]) << ", " << num(sin[r])
      << ") | " << vec({x[2 * t], x[2 * t + 1]}) << " | " << vec({y[2 * t], y[2 * t + 1]})
      << " |\n";
  }
  f << "\nRow 1 is never read. Computed with the reference backend.\n";
  write_file(out / "rope_positions.md", f.str());

  // What from_shapes makes of each shape, and what it refuses.
  std::ostringstream l;
  l << "| x.shape | attrs | layout | B | S | H | D | or the error "
       "|\n|---|---|---|---|---|---|---|---|\n";
  const auto row = [&](const tandem::Shape& xs, const std::string& what,
                       const tandem::RopeAttrs& attrs) {
    l << "| `" << tandem::to_string(xs) << "` | " << what << " | ";
    try {
      const auto p = tandem::RopePlan::from_shapes(xs, {8, 4}, {8, 4}, attrs);
      l << tandem::to_string(p.layout) << " | " << p.B << " | " << p.S << " | " << p.heads()
        << " | " << p.D << " | |\n";
    } catch (const tandem::Error& e) {
      l << "| | | | | " << e.what() << " |\n";
    }
  };
  tandem::RopeAttrs r;
  r.head_dim = 8;
  row({2, 6, 32}, "head_dim 8", r);
  r = {};
  r.layout = tandem::RopeLayout::thd;
  row({6, 4, 8}, "layout thd", r);
  r = {};
  r.num_heads = 4;
  row({2, 6, 4, 8}, "num_heads 4", r);
  row({2, 4, 6, 8}, "num_heads 4", r);
  row({2, 4, 4, 8}, "num_heads 4", r);
  r = {};
  row({2, 6, 4, 8}, "(none)", r);
  r.layout = tandem::RopeLayout::bhsd;
  row({2, 4, 4, 8}, "layout bhsd", r);
  write_file(out / "rope_layouts.md", l.str());
}

std::vector<float> rope_call(const Backend& ref, const tandem::RopePlan& plan,
                             const std::vector<float>& x, const std::vector<float>& cos,
                             const std::vector<float>& sin, bool backward = false) {
  std::vector<float> y(plan.out_size());
  const tandem::RopeTables<float> t{cos, sin};
  if (backward)
    ref.rope_backward(plan, x, t, y);
  else
    ref.rope_forward(plan, x, t, y);
  return y;
}

// Table [R, T] of angles row*theta^(-2i/n_rot), i < n_rot/2, padded to T columns.
void rope_table(int64_t R, int64_t T, int64_t n_rot, std::vector<float>& cos,
                std::vector<float>& sin) {
  cos.assign(R * T, 0.0f);
  sin.assign(R * T, 0.0f);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      const double a = r * std::pow(10000.0, -2.0 * i / n_rot);
      cos[r * T + i] = static_cast<float>(std::cos(a));
      sin[r * T + i] = static_cast<float>(std::sin(a));
    }
}

// Which element each element is paired with, read off the reference: rotate
// e_d by 90° (cos 0, sin 1); the other non-zero output is its partner.
std::vector<int64_t> rope_partners(const Backend& ref, tandem::RopeStyle style, int64_t D,
                                   int64_t n_rot) {
  tandem::RopeParams p;
  p.seq = 1;
  p.width = D;
  p.head_dim = D;
  p.n_rot = n_rot;
  p.style = style;
  p.table_rows = 1;
  const auto plan = tandem::RopePlan::make(p);
  std::vector<float> cos(plan.R * plan.T, 0.0f), sin(plan.R * plan.T, 1.0f);
  std::vector<int64_t> partner(D, -1);
  for (int64_t d = 0; d < D; ++d) {
    std::vector<float> x(D, 0.0f);
    x[d] = 1.0f;
    const auto y = rope_call(ref, plan, x, cos, sin);
    for (int64_t e = 0; e < D; ++e)
      if (e != d && std::fabs(y[e]) > 0.5f) partner[d] = e;
  }
  return partner;
}

std::string pairing_svg(const std::vector<int64_t>& neox, const std::vector<int64_t>& gptj,
                        int64_t n_rot) {
  const int64_t D = static_cast<int64_t>(neox.size());
  const double c = 44, x0 = 90;
  Svg s(x0 + D * c + 20, 290);
  auto row = [&](const std::vector<int64_t>& partner, double y, const std::string& name,
                 bool arcs_up) {
    s.text(x0 - 10, y + c * 0.6, name, 13, "end");
    for (int64_t d = 0; d < D; ++d) {
      s.rect(x0 + d * c, y, c, c, d < n_rot ? "#dce9fb" : "#eeeeee", "#555");
      std::string label = "x";
      label += std::to_string(d);
      s.text(x0 + d * c + c / 2, y + c * 0.62, label, 13);
    }
    const char* colors[] = {"#d62728", "#2ca02c", "#1f77b4", "#9467bd", "#ff7f0e", "#8c564b"};
    int color = 0;
    for (int64_t d = 0; d < D; ++d) {
      const int64_t e = partner[d];
      if (e <= d) continue;
      const double xa = x0 + d * c + c / 2, xb = x0 + e * c + c / 2;
      const double yb = arcs_up ? y : y + c;
      const double bend = (arcs_up ? -1 : 1) * (14 + 9 * static_cast<double>(e - d));
      std::ostringstream dd;
      dd << "M " << xa << " " << yb << " C " << xa << " " << yb + bend << ", " << xb << " "
         << yb + bend << ", " << xb << " " << yb;
      s.path(dd.str(), colors[color++ % 6], 2);
    }
  };
  s.text(x0 + D * c / 2, 18,
         "pairs rotated together (D = " + std::to_string(D) + ", n_rot = " + std::to_string(n_rot) +
             ")",
         14);
  row(neox, 80, "neox", true);
  row(gptj, 190, "gptj", false);
  s.text(x0 + D * c / 2, 150, "grey: dims n_rot..D−1 pass through unchanged", 11);
  return s.str();
}

void rope_page(const Backend& ref, const fs::path& out) {
  // Pairing pictures, from the reference's own rotation.
  const int64_t D = 8, n_rot = 6;
  const auto neox = rope_partners(ref, tandem::RopeStyle::neox, D, n_rot);
  const auto gptj = rope_partners(ref, tandem::RopeStyle::gptj, D, n_rot);
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    if (neox[i] != i + n_rot / 2) fail("neox pairing of the reference is not (i, i + n_rot/2)");
    if (gptj[2 * i] != 2 * i + 1) fail("gptj pairing of the reference is not (2i, 2i + 1)");
  }
  for (int64_t d = n_rot; d < D; ++d)
    if (neox[d] != -1 || gptj[d] != -1) fail("a pass-through dim of the reference moved");
  write_file(out / "rope_pairing.svg", pairing_svg(neox, gptj, n_rot));

  // A worked rotation: one token at position 2, D = 6, n_rot = 4, table T = 3.
  const int64_t Dw = 6, nr = 4, T = 3, R = 4, pos = 2;
  std::vector<float> cos, sin;
  rope_table(R, T, nr, cos, sin);
  std::vector<float> xs(R * Dw, 0.0f);  // four tokens; token `pos` carries the example
  const std::vector<double> x = {1, 2, 3, 4, 5, 6};
  for (int64_t d = 0; d < Dw; ++d) xs[pos * Dw + d] = static_cast<float>(x[d]);
  tandem::RopeParams p;
  p.seq = R;
  p.width = Dw;
  p.head_dim = Dw;
  p.n_rot = nr;
  p.table_rows = R;
  p.table_stride = T;
  std::ostringstream f;
  f << "Token at position s = " << pos << ", D = " << Dw << ", n_rot = " << nr
    << ", tables `[R, T] = [" << R << ", " << T << "]` (T = 3 > n_rot/2 = 2: the third column is "
    << "padding that is never read), angles `s·10000^(−2i/n_rot)`: θ_0 = " << num(pos * 1.0)
    << ", θ_1 = " << num(pos * std::pow(10000.0, -2.0 / nr)) << ".\n\n";
  f << "| style | pairs | x | y = rope(x) |\n|---|---|---|---|\n";
  for (auto style : {tandem::RopeStyle::neox, tandem::RopeStyle::gptj}) {
    p.style = style;
    const auto plan = tandem::RopePlan::make(p);
    const auto y = rope_call(ref, plan, xs, cos, sin);
    std::vector<double> want(x);
    for (int64_t i = 0; i < nr / 2; ++i) {
      const double c = cos[pos * T + i], sn = sin[pos * T + i];
      const int64_t a = style == tandem::RopeStyle::neox ? i : 2 * i;
      const int64_t b = style == tandem::RopeStyle::neox ? i + nr / 2 : 2 * i + 1;
      want[a] = x[a] * c - x[b] * sn;
      want[b] = x[b] * c + x[a] * sn;
    }
    std::vector<double> got;
    for (int64_t d = 0; d < Dw; ++d) {
      expect_close(y[pos * Dw + d], want[d], 1e-6, "rope worked example");
      got.push_back(y[pos * Dw + d]);
    }
    f << "| " << tandem::to_string(style) << " | "
      << (style == tandem::RopeStyle::neox ? "(x0, x2), (x1, x3)" : "(x0, x1), (x2, x3)") << " | "
      << vec(x, 0) << " | " << vec(got) << " |\n";
  }
  f << "\nIn both styles x4 and x5 pass through. The reference backend computes the last column; "
    << "the docs build recomputes it from the formulas of SPEC §4 and fails if they differ.\n";
  write_file(out / "worked_rope.md", f.str());

  // Relative position: <rope(q) at m, rope(k) at n> depends on m − n only.
  const int64_t Dr = 8, Rr = 16;
  std::vector<float> c2, s2;
  rope_table(Rr, Dr / 2, Dr, c2, s2);
  tandem::RopeParams rp;
  rp.seq = Rr;
  rp.width = Dr;
  rp.head_dim = Dr;
  rp.table_rows = Rr;
  const auto rplan = tandem::RopePlan::make(rp);
  const std::vector<float> q0 = {0.3f, -1.2f, 0.8f, 0.5f, -0.4f, 1.1f, 0.2f, -0.7f};
  const std::vector<float> k0 = {1.0f, 0.4f, -0.6f, 0.9f, 0.3f, -0.2f, 1.3f, 0.1f};
  std::vector<float> qs(Rr * Dr), ks(Rr * Dr);
  for (int64_t s = 0; s < Rr; ++s)
    for (int64_t d = 0; d < Dr; ++d) {
      qs[s * Dr + d] = q0[d];
      ks[s * Dr + d] = k0[d];
    }
  const auto qr = rope_call(ref, rplan, qs, c2, s2);
  const auto kr = rope_call(ref, rplan, ks, c2, s2);
  auto score = [&](int64_t m, int64_t n) {
    double sum = 0;
    for (int64_t d = 0; d < Dr; ++d) sum += double(qr[m * Dr + d]) * kr[n * Dr + d];
    return sum;
  };
  std::ostringstream r;
  r << "| query position m | key position n | m − n | ⟨rope(q)_m, rope(k)_n⟩ "
       "|\n|---:|---:|---:|---:|\n";
  const std::vector<std::pair<int64_t, int64_t>> mn = {{3, 1}, {7, 5}, {12, 10}, {3, 2},
                                                       {9, 8}, {0, 0}, {15, 15}};
  for (auto [m, n] : mn)
    r << "| " << m << " | " << n << " | " << m - n << " | " << num(score(m, n), 5) << " |\n";
  expect_close(score(7, 5), score(3, 1), 1e-5, "relative-position property (7,5) vs (3,1)");
  expect_close(score(12, 10), score(3, 1), 1e-5, "relative-position property (12,10) vs (3,1)");
  expect_close(score(9, 8), score(3, 2), 1e-5, "relative-position property (9,8) vs (3,2)");
  expect_close(score(15, 15), score(0, 0), 1e-5, "relative-position property (15,15) vs (0,0)");
  r << "\nq and k are the same two vectors at every position (D = 8, full rotation, NeoX); rows "
       "with "
    << "equal m − n agree to float rounding. Computed with the reference backend.\n";
  write_file(out / "rope_relative.md", r.str());

  // The transpose: <rope(x), y> == <x, rope_backward(y)>.
  std::vector<float> xr(Rr * Dr), yr(Rr * Dr);
  for (int64_t n = 0; n < Rr * Dr; ++n) {
    xr[n] = static_cast<float>(std::sin(0.7 * n + 0.1));
    yr[n] = static_cast<float>(std::cos(1.3 * n));
  }
  const auto fx = rope_call(ref, rplan, xr, c2, s2);
  const auto by = rope_call(ref, rplan, yr, c2, s2, true);
  double lhs = 0, rhs = 0;
  for (int64_t n = 0; n < Rr * Dr; ++n) {
    lhs += double(fx[n]) * yr[n];
    rhs += double(xr[n]) * by[n];
  }
  expect_close(lhs, rhs, 1e-5, "<rope(x), y> == <x, rope_backward(y)>");
  std::ostringstream t;
  t << "For x_n = sin(0.7n + 0.1), y_n = cos(1.3n) over the same 16 × 8 tensor: "
    << "`<rope(x), y>` = " << num(lhs, 6) << " and `<x, rope_backward(y)>` = " << num(rhs, 6)
    << " (reference backend, float32 outputs summed in double).\n";
  write_file(out / "rope_transpose.md", t.str());

  rope_positions_and_layouts(ref, out);
}

// ---------------------------------------------------------------------------
// Page 4: layouts, computed by Strides::of and the shape rules.

void layout_page(const fs::path& out) {
  using tandem::Layout;
  const int64_t B = 2, S = 3, H = 2, D = 4;
  const auto bshd = tandem::Strides::of(Layout::bshd, B, S, H, D, 0, "q");
  const auto bhsd = tandem::Strides::of(Layout::bhsd, B, S, H, D, 0, "q");
  const auto fused = tandem::Strides::of(Layout::bshd, B, S, H, D, 3 * H * D, "q");
  std::ostringstream f;
  f << "q `[B, S, H, D] = [" << B << ", " << S << ", " << H << ", " << D << "]`; the third "
    << "column reads q out of a fused QKV buffer `[B, S, 3·H·D]` (row stride 3·H·D = " << 3 * H * D
    << "), from `tandem::Strides::of`:\n\n"
    << "| | bshd | bhsd | bshd, row stride " << 3 * H * D << " |\n|---|---:|---:|---:|\n"
    << "| stride batch | " << bshd.batch << " | " << bhsd.batch << " | " << fused.batch << " |\n"
    << "| stride seq | " << bshd.seq << " | " << bhsd.seq << " | " << fused.seq << " |\n"
    << "| stride head | " << bshd.head << " | " << bhsd.head << " | " << fused.head << " |\n"
    << "| extent (elements a view must hold) | " << bshd.extent << " | " << bhsd.extent << " | "
    << fused.extent << " |\n";
  for (auto [b, s, h] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 0, 1}, {0, 1, 0}, {1, 2, 1}}) {
    f << "| offset of (b, s, h, d=0) = (" << b << ", " << s << ", " << h << ", 0) | "
      << bshd.at(b, s, h) << " | " << bhsd.at(b, s, h) << " | " << fused.at(b, s, h) << " |\n";
  }
  f << "\n";
  write_file(out / "layout_strides.md", f.str());

  // The errors the shape rules raise, verbatim.
  std::ostringstream e;
  auto attempt = [&](const std::string& call, const std::function<void()>& fn) {
    try {
      fn();
      fail("expected an error from " + call);
    } catch (const tandem::Error& err) {
      e << "| `" << call << "` | `" << err.parameter() << "` | " << err.what() << " |\n";
    }
  };
  e << "| call | parameter() | message |\n|---|---|---|\n";
  tandem::AttentionAttrs a;
  a.num_heads = 4;
  attempt("from_shapes(q {2, 4, 4, 8}, k {2, 4, 4, 8}, ...), num_heads 4", [&] {
    tandem::AttentionPlan::from_shapes({2, 4, 4, 8}, {2, 4, 4, 8}, {2, 4, 4, 8}, std::nullopt, a);
  });
  attempt("from_shapes(q {2, 5, 3, 8}, ...), num_heads 4", [&] {
    tandem::AttentionPlan::from_shapes({2, 5, 3, 8}, {2, 5, 3, 8}, {2, 5, 3, 8}, std::nullopt, a);
  });
  attempt("from_shapes(q {2, 5, 30}, ...), num_heads 4", [&] {
    tandem::AttentionPlan::from_shapes({2, 5, 30}, {2, 5, 30}, {2, 5, 30}, std::nullopt, a);
  });
  attempt("from_shapes(q {2, 5, 32}, k {2, 5, 24}, ...), num_heads 4", [&] {
    tandem::AttentionPlan::from_shapes({2, 5, 32}, {2, 5, 24}, {2, 5, 24}, std::nullopt, a);
  });
  tandem::AttentionParams p;
  p.Sq = p.Sk = 5;
  p.H = 4;
  p.D = 8;
  p.q_row_stride = 24;
  attempt("make(params) with H 4, D 8, q_row_stride 24", [&] { tandem::AttentionPlan::make(p); });
  tandem::RopeAttrs ra;
  ra.head_dim = 4;
  ra.n_rot = 5;
  attempt("RopePlan::from_shapes(x {1, 3, 8}, cos {3, 2}, ...), head_dim 4, n_rot 5", [&] {
    tandem::RopePlan::from_shapes({1, 3, 8}, {3, 2}, {3, 2}, ra);
  });
  write_file(out / "layout_errors.md", e.str());
}

// ---------------------------------------------------------------------------
// Masks and tiling pictures.

void mask_pictures(const Backend& ref, const fs::path& out) {
  using tandem::MaskKind;
  auto params = [](int64_t Sq, int64_t Sk, MaskKind kind, int64_t window = 0) {
    tandem::AttentionParams p;
    p.Sq = Sq;
    p.Sk = Sk;
    p.mask = kind;
    p.window = window;
    return p;
  };
  write_file(out / "mask_causal_square.svg",
             mask_svg(visibility(ref, params(6, 6, MaskKind::causal), {}), "causal, Sq = Sk = 6",
                      "j <= i"));
  write_file(out / "mask_causal_decode.svg",
             mask_svg(visibility(ref, params(3, 7, MaskKind::causal), {}),
                      "causal, Sq = 3 < Sk = 7 (bottom-right)", "off = Sk − Sq = 4: j <= 4 + i"));
  write_file(out / "mask_causal_tall.svg",
             mask_svg(visibility(ref, params(6, 3, MaskKind::causal), {}),
                      "causal, Sq = 6 > Sk = 3", "off = max(Sk − Sq, 0) = 0: j <= i"));
  write_file(
      out / "mask_sliding.svg",
      mask_svg(visibility(ref, params(7, 7, MaskKind::sliding_window, 2), {}),
               "sliding_window(w = 2), Sq = Sk = 7", "a − 2 <= j <= a: at most w + 1 = 3 keys"));
  std::vector<float> keep = {1, 1, 1, 1, 0, 0};
  write_file(
      out / "mask_key_padding.svg",
      mask_svg(visibility(ref, params(4, 6, MaskKind::key_padding), keep),
               "key_padding, keep = [1 1 1 1 0 0]", "padded keys are hidden from every query"));
  // PyTorch's is_causal=True at Sq < Sk: a top-left triangle, built as a bias.
  const int64_t Sq = 3, Sk = 7;
  std::vector<float> bias(Sq * Sk);
  for (int64_t i = 0; i < Sq; ++i)
    for (int64_t j = 0; j < Sk; ++j)
      bias[i * Sk + j] = j <= i ? 0.0f : -std::numeric_limits<float>::infinity();
  write_file(out / "mask_topleft.svg",
             mask_svg(visibility(ref, params(Sq, Sk, MaskKind::bias), bias),
                      "top-left causal (a bias), Sq = 3, Sk = 7", "j <= i: not tandem's causal"));
}

// Tiles of an S × S score matrix (one head, G = 1), classified by the
// visibility rule of the reference: every element visible (no mask work),
// some visible (element-wise mask), none visible (skipped without reading k
// or v). Returns {tiles visited, tiles in all}.
std::pair<int, int> tiling_picture(const fs::path& out, int64_t S, int64_t Br, int64_t Bc,
                                   int64_t window, const std::string& name,
                                   const std::string& source) {
  tandem::AttentionParams p;
  p.Sq = p.Sk = S;
  p.H = 1;
  p.D = 1;
  p.mask = window > 0 ? tandem::MaskKind::sliding_window : tandem::MaskKind::causal;
  p.window = window;
  const auto plan = tandem::AttentionPlan::make(p);
  const int64_t nr = (S + Br - 1) / Br, nc = (S + Bc - 1) / Bc;
  const double c = std::min(40.0, 360.0 / static_cast<double>(std::max(nr, nc)));
  const double x0 = 50, y0 = 56;
  Svg s(x0 + nc * c + 210, y0 + nr * c + 40);
  s.text(x0 + nc * c / 2, 20,
         std::string(window > 0 ? "sliding_window(w = " + std::to_string(window) + ")" : "causal") +
             ", Sq = Sk = " + std::to_string(S) + ", tiles of " + std::to_string(Br) +
             " queries × " + std::to_string(Bc) + " keys",
         13);
  s.text(x0 + nc * c / 2, 40, "key blocks →", 11);
  int full = 0, partial = 0, empty = 0;
  const tandem::AttentionSeq seq = plan.sequence(tandem::AttentionInputs<float>{}, 0);
  for (int64_t ti = 0; ti < nr; ++ti)
    for (int64_t tj = 0; tj < nc; ++tj) {
      int64_t vis = 0, n = 0;
      for (int64_t i = ti * Br; i < std::min(S, (ti + 1) * Br); ++i)
        for (int64_t j = tj * Bc; j < std::min(S, (tj + 1) * Bc); ++j) {
          ++n;
          vis += tandem::reference::key_visible(plan, seq, {}, 0, i, j) ? 1 : 0;
        }
      const std::string fill = vis == n ? "#3b7dd8" : vis > 0 ? "#9cc3f0" : "#f4f4f4";
      (vis == n ? full : vis > 0 ? partial : empty)++;
      s.rect(x0 + tj * c, y0 + ti * c, c, c, fill, "#666", 1);
    }
  // The visible band's edges, in element coordinates.
  const double scale_x = c / Bc, scale_y = c / Br;
  s.line(x0, y0, x0 + S * scale_x, y0 + S * scale_y, "#d62728", 1.5);
  if (window > 0)
    s.line(x0, y0 + window * scale_y, x0 + (S - window) * scale_x, y0 + S * scale_y, "#d62728",
           1.5);
  const double lx = x0 + nc * c + 20;
  s.rect(lx, y0, 14, 14, "#3b7dd8");
  s.text(lx + 20, y0 + 12, "all visible: " + std::to_string(full), 12, "start");
  s.rect(lx, y0 + 24, 14, 14, "#9cc3f0");
  s.text(lx + 20, y0 + 36, "masked inside: " + std::to_string(partial), 12, "start");
  s.rect(lx, y0 + 48, 14, 14, "#f4f4f4");
  s.text(lx + 20, y0 + 60, "skipped: " + std::to_string(empty), 12, "start");
  s.text(lx, y0 + 90, source, 10, "start", "#555");
  write_file(out / name, s.str());
  return {full + partial, full + partial + empty};
}

// ---------------------------------------------------------------------------
// The attention features page: each feature's small example worked here from
// its formula and computed by the reference backend, which must agree.

/// One head, D = 1, q = 0 (every score 0): the softmax is decided by the
/// feature alone. The plan of `p` with Sq queries; v holds the key values.
struct TinyCall {
  tandem::AttentionPlan plan;
  std::vector<float> q, k, v, sinks, slopes;
  std::vector<int32_t> cu_q, cu_k, used, table, lens;
  explicit TinyCall(const tandem::AttentionParams& p)
      : plan(tandem::AttentionPlan::make(p)),
        q(plan.q.extent, 0.0f),
        k(plan.k.extent, 0.0f),
        v(plan.v.extent, 0.0f) {}
  [[nodiscard]] tandem::AttentionInputs<float> in() const {
    tandem::AttentionInputs<float> r{q, k, v};
    r.sinks = sinks;
    r.alibi_slopes = slopes;
    r.cu_seqlens_q = cu_q;
    r.cu_seqlens_k = cu_k;
    r.seqused_k = used;
    r.block_table = table;
    r.cache_seqlens = lens;
    return r;
  }
  std::pair<std::vector<float>, std::vector<float>> run(const Backend& ref) const {
    std::vector<float> o(plan.o.extent), lse(plan.lse_size());
    ref.attention_forward_lse(plan, in(), o, lse);
    return {o, lse};
  }
};

tandem::AttentionParams tiny(int64_t Sq, int64_t Sk) {
  tandem::AttentionParams p;
  p.Sq = Sq;
  p.Sk = Sk;
  p.H = 1;
  p.D = 1;
  return p;
}

std::string features_sinks(const Backend& ref) {
  std::ostringstream f;
  f << "| sink | p_0 = p_1 | p_sink | o = 3·p_0 + 6·p_1 | lse |\n|---:|---:|---:|---:|---:|\n";
  for (double sink : {-2.0, 0.0, std::log(2.0), 3.0}) {
    tandem::AttentionParams p = tiny(1, 2);
    p.sinks = true;
    TinyCall c(p);
    c.v = {3.0f, 6.0f};
    c.sinks = {static_cast<float>(sink)};
    // p_j = e^0 / (e^sink + e^0 + e^0)
    const double z = std::exp(sink) + 2.0, pj = 1.0 / z;
    const auto [o, lse] = c.run(ref);
    expect_close(o[0], 9.0 * pj, 1e-6, "sink " + num(sink) + ": o");
    expect_close(lse[0], std::log(z), 1e-6, "sink " + num(sink) + ": lse");
    f << "| " << num(sink) << " | " << num(pj) << " | " << num(std::exp(sink) / z) << " | "
      << num(9.0 * pj) << " | " << num(std::log(z)) << " |\n";
  }
  return f.str();
}

std::string features_alibi(const Backend& ref) {
  std::ostringstream f;
  f << "| H | tandem::alibi_standard_slopes(H) |\n|---:|---|\n";
  for (int64_t H : {1, 2, 3, 4, 6, 8}) {
    const std::vector<float> s = tandem::alibi_standard_slopes(H);
    int64_t n = 1;
    while (2 * n <= H) n *= 2;
    std::vector<double> d;
    for (int64_t h = 0; h < H; ++h) {
      const double want = h < n ? std::exp2(-8.0 * double(h + 1) / double(n))
                                : std::exp2(-4.0 * double(2 * (h - n) + 1) / double(n));
      expect_close(s[h], want, 1e-7,
                   "standard slope " + std::to_string(h) + " of H = " + std::to_string(H));
      d.push_back(s[h]);
    }
    f << "| " << H << " | " << vec(d, 5) << " |\n";
  }
  // Sq = 3, Sk = 2, m = log 2: query i sits at key position i − 1.
  tandem::AttentionParams p = tiny(3, 2);
  p.alibi = tandem::AlibiKind::per_head;
  TinyCall c(p);
  c.v = {3.0f, 6.0f};
  c.slopes = {static_cast<float>(std::log(2.0))};
  const auto o = c.run(ref).first;
  f << "\nWith Sq = 3 queries, Sk = 2 keys of values 3 and 6, q = 0 and the slope m = log 2, "
       "query i's distances are `|i + Sk − Sq − j| = |i − 1 − j|`:\n\n"
    << "| query | distances to keys 0, 1 | p = softmax(−m·distance) | o |\n|---:|---|---|---:|\n";
  for (int64_t i = 0; i < 3; ++i) {
    const double d0 = std::abs(double(i - 1)), d1 = std::abs(double(i - 2));
    const double e0 = std::pow(0.5, d0), e1 = std::pow(0.5, d1);
    const double p0 = e0 / (e0 + e1), p1 = e1 / (e0 + e1);
    expect_close(o[i], 3 * p0 + 6 * p1, 1e-6, "ALiBi query " + std::to_string(i));
    f << "| " << i << " | " << num(d0, 0) << ", " << num(d1, 0) << " | " << vec({p0, p1}) << " | "
      << num(3 * p0 + 6 * p1) << " |\n";
  }
  return f.str();
}

std::string features_varlen(const Backend& ref) {
  // Two packed sequences, causal: 2 queries over a slot of 3 keys, then 1
  // query over a slot of 3 keys of which seqused_k = 2 are used.
  tandem::AttentionParams p = tiny(3, 6);
  p.mask = tandem::MaskKind::causal;
  p.num_seqs = 2;
  TinyCall c(p);
  c.v = {1, 2, 3, 10, 20, std::numeric_limits<float>::quiet_NaN()};
  c.cu_q = {0, 2, 3};
  c.cu_k = {0, 3, 6};
  c.used = {3, 2};
  const auto o = c.run(ref).first;
  const tandem::AttentionInputs<float> in = c.in();
  std::ostringstream f;
  f << "`cu_seqlens_q = [0, 2, 3]`, `cu_seqlens_k = [0, 3, 6]`, `seqused_k = [3, 2]`, causal. "
       "Rows are the packed query rows, columns the packed key rows; ● visible, · hidden, "
       "`pad` the key past seqused_k (never read, here NaN), blank another sequence's key:\n\n"
    << "| query row | k0 | k1 | k2 | k3 | k4 | k5 | o |\n|---|---|---|---|---|---|---|---:|\n";
  std::vector<double> want;
  for (int64_t n = 0; n < c.plan.sequences(); ++n) {
    const tandem::AttentionSeq seq = c.plan.sequence(in, n);
    for (int64_t i = 0; i < seq.Sq; ++i) {
      f << "| " << seq.q_row(i) << " (sequence " << n << ", i = " << i << ") |";
      double sum = 0;
      int64_t count = 0;
      for (int64_t r = 0; r < 6; ++r) {
        const int64_t j = r - seq.k_start;
        const bool own = j >= 0 && r < c.cu_k[n + 1];
        const bool used = own && j < seq.Sk;
        const bool vis = used && tandem::reference::key_visible(c.plan, seq, {}, 0, i, j);
        if (vis) sum += c.v[r], ++count;
        f << " " << (!own ? "" : !used ? "pad" : vis ? "●" : "·") << " |";
      }
      want.push_back(sum / double(count));
      f << " " << num(o[seq.q_row(i)], 2) << " |\n";
    }
  }
  for (std::size_t r = 0; r < want.size(); ++r) {
    expect_close(o[r], want[r], 1e-6, "varlen row " + std::to_string(r));
  }
  return f.str();
}

std::string features_paged(const Backend& ref) {
  // B = 2, blocks of 2 keys, 4 blocks; entry 0 holds 3 keys in blocks 2, 0;
  // entry 1 holds 2 keys in block 1; spare entries −1; block 3 unused (NaN).
  tandem::AttentionParams p = tiny(1, 0);
  p.B = 2;
  p.num_blocks = 4;
  p.block_size = 2;
  p.max_blocks = 2;
  TinyCall c(p);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  c.v = {3, nan, 7, 9, 1, 2, nan, nan};  // block b, slot s at 2b + s
  c.table = {2, 0, 1, -1};
  c.lens = {3, 2};
  const auto o = c.run(ref).first;
  const tandem::AttentionInputs<float> in = c.in();
  std::ostringstream f;
  f << "`block_size = 2`, `block_table = [[2, 0], [1, −1]]`, `cache_seqlens = [3, 2]`; "
       "block 3 is in no table and holds NaN, as does slot 1 of block 0 (past entry 0's "
       "length):\n\n| entry b | key j | block = block_table[b, j / 2] | slot = j mod 2 | v |\n"
       "|---:|---:|---:|---:|---:|\n";
  for (int64_t b = 0; b < 2; ++b) {
    const tandem::AttentionSeq seq = c.plan.sequence(in, b);
    double sum = 0;
    for (int64_t j = 0; j < seq.Sk; ++j) {
      const tandem::KeyRow r = seq.key_row(j);
      const double vj = c.v[r.batch * 2 + r.seq];
      sum += vj;
      f << "| " << b << " | " << j << " | " << r.batch << " | " << r.seq << " | " << num(vj, 0)
        << " |\n";
    }
    expect_close(o[b], sum / double(seq.Sk), 1e-6, "paged entry " + std::to_string(b));
  }
  f << "\nWith q = 0 each output is the mean of its entry's values: o = " << vec({o[0], o[1]})
    << ", the mean of (1, 2, 3) and of (7, 9), as over the gathered caches.\n";
  return f.str();
}

void features_page(const Backend& ref, const fs::path& out) {
  write_file(out / "features_sinks.md", features_sinks(ref));
  write_file(out / "features_alibi.md", features_alibi(ref));
  write_file(out / "features_varlen.md", features_varlen(ref));
  write_file(out / "features_paged.md", features_paged(ref));
}

// Figures from the performance report (report/report.md, written by
// `make report`), when one exists: its provenance line, its warning if the
// machine was busy, and the rows of its summary table that bear on the
// optimizations of the page — copied, never recomputed. Without a report the
// page keeps a table that points to it.
void report_figures(const fs::path& src, const fs::path& out) {
  const fs::path md = src / "report/report.md";
  std::ostringstream f;
  if (!fs::exists(md)) {
    f << "**No performance report was found when this site was built** (`report/report.md` "
      << "is written by `make report`; rebuild the docs after it to see its figures here).\n\n"
      << "| optimization | figure in the report |\n|---|---|\n"
      << "| tiling, online softmax, SIMD | attention forward and backward GFLOP/s and fraction of "
      << "the FMA peak: see `report/report.md` |\n"
      << "| skipping hidden tiles | causal time ÷ unmasked time: see `report/report.md` |\n"
      << "| threads | speed-up from 1 thread to all: see `report/report.md` |\n"
      << "| never forming `[Sq, Sk]` | extra memory of one call: see `report/report.md` |\n";
    write_file(out / "report_figures.md", f.str());
    return;
  }
  std::istringstream in(read_file(md));
  std::string line, provenance, warning, header;
  std::vector<std::string> rows;
  bool in_summary = false;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (n <= 4 && provenance.empty() && line.find("UTC") != std::string::npos) provenance = line;
    if (line.rfind("**Warning", 0) == 0) warning = line;
    if (line.rfind("## ", 0) == 0) in_summary = line.find("Summary") != std::string::npos;
    if (!in_summary || line.rfind('|', 0) != 0) continue;
    if (header.empty()) {
      header = line;
      continue;
    }
    if (line.rfind("|---", 0) == 0) continue;
    for (const char* key : {"attention forward", "causal forward", "attention backward", "decode",
                            "2 threads", "extra memory"}) {
      if (line.find(key) != std::string::npos) {
        rows.push_back(line);
        break;
      }
    }
  }
  if (header.empty() || rows.empty()) fail("report/report.md has no summary table to quote");
  f << "From `report/report.md` (" << provenance << "), its summary rows for attention, "
    << "copied as they are:\n\n";
  if (!warning.empty()) f << warning << "\n\n";
  f << header << "\n";
  const auto columns = std::count(header.begin(), header.end(), '|') - 1;
  f << "|";
  for (int c = 0; c < columns; ++c) f << "---|";
  f << "\n";
  for (const auto& r : rows) f << r << "\n";
  f << "\nThe whole report (every op, both backends, the peers, the roofline and the plots) is "
    << "`report/report.html`.\n";
  write_file(out / "report_figures.md", f.str());
}

void fast_page(const fs::path& out) {
  std::ostringstream f;
  int64_t Br = 64, Bc = 64;
  std::string source;
#ifdef TANDEM_HAVE_OPTIMIZED
  // The block sizes the optimized backend uses by default, from its exported
  // default geometry, so that the page shows what the code uses.
  const tandem::optimized::Geometry geometry{};
  Br = geometry.rows_per_tile;
  Bc = geometry.key_block;
  source = "block sizes of tandem::optimized::Geometry{}";
  f << "The optimized attention packs `rows_per_tile = " << Br
    << "` query rows per tile (tandem::optimized::Geometry) — `block_q = rows_per_tile / G` "
    << "queries of each of the G = H/Hkv query heads that share a kv head, so a GQA group "
    << "reads its K and V rows once — and walks the keys in blocks of `key_block = " << Bc
    << "`. The pictures use these default sizes with G = 1.\n";
#else
  source = "illustrative block sizes";
  f << "This site was built without the optimized backend; the pictures use illustrative " << Br
    << " × " << Bc << " tiles.\n";
#endif
  const auto [causal_visited, causal_all] =
      tiling_picture(out, 512, Br, Bc, 0, "tiling_causal.svg", source);
  const auto [window_visited, window_all] =
      tiling_picture(out, 512, Br, Bc, 96, "tiling_sliding.svg", source);
  f << "\nAt Sq = Sk = 512 a causal mask leaves " << causal_visited << " of " << causal_all
    << " tiles to compute; a sliding window of 96 keys leaves " << window_visited << " of "
    << window_all << ": the work grows with S·w instead of S².\n";
  write_file(out / "tiling.md", f.str());
}

// The broken fixtures of props/ and the properties that must reject each,
// read from props/broken/broken.hpp (the bug and its comment) and
// props/test_fixtures.cpp (the expectation table the fixture test enforces).
void fixture_table(const fs::path& src, const fs::path& out) {
  const fs::path hpp = src / "props/broken/broken.hpp", cpp = src / "props/test_fixtures.cpp";
  if (!fs::exists(hpp) || !fs::exists(cpp)) {
    write_file(out / "fixtures.md",
               "(The property suite is not part of this tree: no fixture table.)\n");
    return;
  }
  // enum class Bug { name, ///< what it does
  std::map<std::string, std::string> what;
  std::vector<std::string> order;
  {
    std::istringstream in(read_file(hpp));
    std::string line;
    bool in_enum = false;
    while (std::getline(in, line)) {
      if (line.find("enum class Bug") != std::string::npos)
        in_enum = true;
      else if (in_enum && line.find("};") != std::string::npos)
        break;
      else if (in_enum) {
        const auto comma = line.find(',');
        const auto doc = line.find("///<");
        if (comma == std::string::npos || doc == std::string::npos) continue;
        const std::string name = trim(line.substr(0, comma));
        if (name == "none") continue;
        what[name] = trim(line.substr(doc + 4));
        order.push_back(name);
      }
    }
  }
  // {Bug::name, {"property", ...}},
  std::map<std::string, std::vector<std::string>> caught;
  {
    const std::string text = read_file(cpp);
    std::size_t at = 0;
    while ((at = text.find("{Bug::", at)) != std::string::npos) {
      const auto name_end = text.find(',', at);
      const std::string name = trim(text.substr(at + 6, name_end - at - 6));
      const auto open = text.find('{', name_end);
      const auto close = text.find('}', open);
      std::string list = text.substr(open + 1, close - open - 1);
      std::vector<std::string> props;
      std::size_t q = 0;
      while ((q = list.find('"', q)) != std::string::npos) {
        const auto e = list.find('"', q + 1);
        props.push_back(list.substr(q + 1, e - q - 1));
        q = e + 1;
      }
      caught[name] = props;
      at = close;
    }
  }
  if (order.empty() || caught.empty()) fail("could not read the fixture table from props/");
  std::ostringstream f;
  f << "| fixture | planted bug | rejected by |\n|---|---|---|\n";
  for (const auto& name : order) {
    const auto it = caught.find(name);
    if (it == caught.end())
      fail("fixture " + name + " has no expectation in props/test_fixtures.cpp");
    std::string props;
    for (const auto& p : it->second) props += (props.empty() ? "`" : ", `") + p + "`";
    std::string bug = what[name];
    for (std::size_t i = 0; i < bug.size(); ++i) {
      if (bug[i] == '|') bug.replace(i++, 1, "\\|");  // step over the inserted backslash
    }
    f << "| `broken_" << name << "` | " << bug << " | " << props << " |\n";
  }
  f << "\nRead from props/broken/broken.hpp and the expectation table of "
    << "props/test_fixtures.cpp when this site was built (" << order.size() << " fixtures).\n";
  write_file(out / "fixtures.md", f.str());
}

// ---------------------------------------------------------------------------
// Links to reference lines: docs/codelinks.txt holds `name | path | text` (an
// optional fourth field picks the n-th occurrence). Each becomes two
// aliases: \src_<name> (a link to the line in Doxygen's source browser) and
// \code_<name> (the line itself, as code).

std::string doxygen_file_base(const std::string& rel, const std::set<std::string>& ambiguous) {
  std::string name = rel;
  const std::string base = fs::path(rel).filename().string();
  if (!ambiguous.count(base)) name = base;
  std::string r;
  for (char ch : name) {
    if (ch == '/')
      r += "_2";
    else if (ch == '_')
      r += "__";
    else if (ch == '.')
      r += "_8";
    else if (ch == '-')
      r += "-";
    else
      r += ch;
  }
  return r;
}

// The line as a Markdown code span inside a quoted Doxyfile value: Doxygen
// leaves code spans alone; only the quote needs escaping for the Doxyfile.
std::string code_span(const std::string& code) {
  std::string r = "`";
  for (char ch : code) {
    if (ch == '"')
      r += "\\\"";
    else if (ch == '`')
      r += "'";
    else
      r += ch;
  }
  return r + "`";
}

void code_links(const fs::path& src, const fs::path& out) {
  // The files Doxygen reads; a base name that occurs twice gets its path.
  std::map<std::string, int> count;
  for (const char* dir : {"include/tandem", "reference/include/tandem/reference",
                          "optimized/include/tandem/optimized"}) {
    if (!fs::exists(src / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(src / dir))
      if (e.path().extension() == ".hpp") ++count[e.path().filename().string()];
  }
  std::set<std::string> ambiguous;
  for (const auto& [n, c] : count)
    if (c > 1) ambiguous.insert(n);

  std::istringstream in(read_file(src / "docs/codelinks.txt"));
  std::ostringstream aliases, links;
  std::string line, missing;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (trim(line).empty() || trim(line)[0] == '#') continue;
    std::vector<std::string> f;
    std::size_t a = 0, b;
    while ((b = line.find(" | ", a)) != std::string::npos) {
      f.push_back(trim(line.substr(a, b - a)));
      a = b + 3;
    }
    f.push_back(trim(line.substr(a)));
    if (f.size() < 3)
      fail("docs/codelinks.txt:" + std::to_string(lineno) + ": expected name | path | text");
    const int want = f.size() > 3 ? std::atoi(f[3].c_str()) : 1;
    const std::string text = read_file(src / f[1]);
    std::size_t pos = std::string::npos, from = 0;
    for (int n = 0; n < want; ++n) {
      pos = text.find(f[2], from);
      if (pos == std::string::npos) break;
      from = pos + 1;
    }
    if (pos == std::string::npos) {
      missing += "\n  docs/codelinks.txt:" + std::to_string(lineno) + ": \"" + f[2] +
                 "\" not found in " + f[1];
      continue;
    }
    const int64_t at = 1 + std::count(text.begin(), text.begin() + pos, '\n');
    const auto bol = text.rfind('\n', pos);
    const auto eol = text.find('\n', pos);
    const std::string code = trim(text.substr(bol == std::string::npos ? 0 : bol + 1,
                                              eol - (bol == std::string::npos ? 0 : bol + 1)));
    char anchor[32];
    std::snprintf(anchor, sizeof anchor, "l%05lld", static_cast<long long>(at));
    // Doxygen names a source page after the file's base name, or after its
    // path below the repository root when two input files share a base name.
    const std::string target = doxygen_file_base(f[1], ambiguous) + "_source.html#" + anchor;
    const auto inc = f[1].find("include/tandem/");
    const std::string shown =
        (inc == std::string::npos ? f[1] : f[1].substr(inc + 15)) + ":" + std::to_string(at);
    aliases << "ALIASES += \"src_" << f[0] << "=<a href=\\\"" << target << "\\\"><code>" << shown
            << "</code></a>\"\n";
    aliases << "ALIASES += \"code_" << f[0] << "=" << code_span(code) << "\"\n";
    links << target << "\n";
  }
  if (!missing.empty()) fail("reference lines the pages link to have moved:" + missing);
  write_file(out / "aliases.doxy", aliases.str());
  write_file(out / "links.txt", links.str());
}

// The pages as Doxygen reads them: docs/pages/*.md with every line
// `\include{doc} FILE` replaced by the generated FILE. (Doxygen's own
// \include{doc} joins the paragraphs of the included text into one.)
void expand_pages(const fs::path& src, const fs::path& out) {
  const fs::path dir = out / "pages";
  fs::create_directories(dir);
  const std::string directive = "\\include{doc} ";
  for (const auto& e : fs::directory_iterator(src / "docs/pages")) {
    if (e.path().extension() != ".md") continue;
    std::istringstream in(read_file(e.path()));
    std::ostringstream page;
    std::string line;
    while (std::getline(in, line)) {
      const std::string t = trim(line);
      if (t.rfind(directive, 0) == 0) {
        const fs::path part = out / trim(t.substr(directive.size()));
        if (!fs::exists(part)) fail(e.path().string() + ": no generated " + part.string());
        page << read_file(part) << "\n";
      } else {
        page << line << "\n";
      }
    }
    write_file(dir / e.path().filename(), page.str());
  }
}

int check_links(const fs::path& html, const fs::path& out) {
  std::istringstream in(read_file(out / "links.txt"));
  std::string t;
  int bad = 0;
  while (std::getline(in, t)) {
    const auto hash = t.find('#');
    const fs::path page = html / t.substr(0, hash);
    const std::string anchor = t.substr(hash + 1);
    if (!fs::exists(page)) {
      std::cerr << "tandem_docs_gen: link target " << page << " does not exist\n";
      ++bad;
      continue;
    }
    const std::string text = read_file(page);
    if (text.find("name=\"" + anchor + "\"") == std::string::npos &&
        text.find("id=\"" + anchor + "\"") == std::string::npos) {
      std::cerr << "tandem_docs_gen: " << page << " has no anchor " << anchor << "\n";
      ++bad;
    }
  }
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--check") return check_links(argv[2], argv[3]);
  if (argc != 3) {
    std::cerr << "usage: tandem_docs_gen SOURCE_DIR OUT_DIR | --check HTML_DIR OUT_DIR\n";
    return 2;
  }
  const fs::path src = argv[1], out = argv[2];
  fs::create_directories(out);
  const Backend ref = tandem::reference::backend();
  try {
    attention_pages(ref, out);
    features_page(ref, out);
    rope_page(ref, out);
    layout_page(out);
    mask_pictures(ref, out);
    fast_page(out);
    report_figures(src, out);
    fixture_table(src, out);
    code_links(src, out);
    expand_pages(src, out);
  } catch (const std::exception& e) {
    fail(std::string("unexpected error: ") + e.what());
  }
  return 0;
}
