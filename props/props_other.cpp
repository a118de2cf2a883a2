// SPDX-License-Identifier: Apache-2.0
// SwiGLU and attention block properties, and the properties that span every
// op: memory guards, determinism, accuracy.
#include <algorithm>
#include <cmath>
#include <complex>
#include <sstream>

#include "checks.hpp"
#include "tandem/reference/attention.hpp"

namespace tandem::props {
namespace {

template <class T>
std::span<const T> cspan(const std::vector<T>& v) {
  return std::span<const T>(v);
}

// ------------------------------------------------------------------- swiglu

void agree_swiglu(const Backend& be) {
  const SwigluData d = make_data(*gen_swiglu());
  const auto x = to_double(d.x), dy = to_double(d.dy);
  TANDEM_REQUIRE_EMPTY(
      swiglu_close("swiglu out", run_swiglu(be, d, false),
                   reference_swiglu<double, double>(d.plan, cspan(x), cspan(dy), false)));
  TANDEM_REQUIRE_EMPTY(
      swiglu_close("swiglu_backward dx", run_swiglu(be, d, true),
                   reference_swiglu<double, double>(d.plan, cspan(x), cspan(dy), true)));
}

/// <dx, u> of the backend and of reference<double> against the complex-step
/// derivative d/dt <dy, swiglu(x + t·u)> of reference<complex<double>>.
void swiglu_gradient(const Backend& be) {
  const SwigluCase c = *gen_swiglu();
  const SwigluData d = make_data(c);
  using C = std::complex<double>;
  const double h = 1e-20;
  Rng r(c.seed + 9);
  const auto u = r.values(d.x.size(), 1.0);
  std::vector<C> x(d.x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = C(d.x[i], h * u[i]);
  const std::vector<C> dyc(d.dy.begin(), d.dy.end());
  const auto y = reference_swiglu<C, C>(d.plan, cspan(x), cspan(dyc), false);
  double deriv = 0;
  for (std::size_t i = 0; i < y.size(); ++i) deriv += double(d.dy[i]) * y[i].imag() / h;
  const auto xd = to_double(d.x), dyd = to_double(d.dy);
  const auto gd = reference_swiglu<double, double>(d.plan, cspan(xd), cspan(dyd), true);
  const auto gb = run_swiglu(be, d, true);
  double pb = 0, pd = 0, mag = 0;
  for (std::size_t i = 0; i < u.size(); ++i) {
    pb += double(gb[i]) * u[i];
    pd += gd[i] * u[i];
    mag += std::abs(gd[i] * u[i]);
  }
  if (!(std::abs(pd - deriv) <= 1e-10 * mag + 1e-300)) {
    RC_FAIL("reference<double> <dx, u> = " + std::to_string(pd) +
            " but the complex-step derivative is " + std::to_string(deriv));
  }
  if (!(std::abs(pb - deriv) <= 64 * kEps * mag + 1e-300)) {
    RC_FAIL("<dx, u> = " + std::to_string(pb) + " but the complex-step derivative is " +
            std::to_string(deriv));
  }
}

// ---------------------------------------------------------- attention block

void agree_block(const Backend& be) {
  const BlockData d = make_data(*gen_block());
  TANDEM_REQUIRE_EMPTY(block_close("attention_block out", run_block(be, d), reference_block(d)));
}

/// attention_block ≡ projection, the backend's own rope and attention, projection.
void block_equals_composition(const Backend& be) {
  const BlockData d = make_data(*gen_block());
  const AttentionBlockPlan& p = d.plan;
  const i64 E = p.E, rows = p.B * p.S;
  std::vector<float> q(rows * E), k(rows * E), v(rows * E);
  for (i64 r = 0; r < rows; ++r)
    for (i64 o = 0; o < 3 * E; ++o) {
      double acc = p.qkv_bias ? double(d.b_qkv[o]) : 0.0;
      for (i64 e = 0; e < E; ++e) acc += double(d.x[r * E + e]) * d.w_qkv[o * E + e];
      (o < E ? q : o < 2 * E ? k : v)[r * E + o % E] = static_cast<float>(acc);
    }
  AttentionData a;
  a.plan = p.attention;
  if (p.has_rope) {
    const RopeTables<float> t{d.cos, d.sin};
    a.q = run_rope(be, p.rope, q, t, false);
    a.k = run_rope(be, p.rope, k, t, false);
  } else {
    a.q = q;
    a.k = k;
  }
  a.v = v;
  a.mask = d.keep;
  const auto att = run_forward(be, a);
  std::vector<double> out(rows * E);
  for (i64 r = 0; r < rows; ++r)
    for (i64 o = 0; o < E; ++o) {
      double acc = p.out_bias ? double(d.b_out[o]) : 0.0;
      for (i64 e = 0; e < E; ++e) acc += double(att[r * E + e]) * d.w_out[o * E + e];
      out[r * E + o] = acc;
    }
  TANDEM_REQUIRE_EMPTY(block_close("attention_block vs its composed ops", run_block(be, d), out));
}

// ------------------------------------------------------------ every op, once

enum Op {
  kAttnFwd,
  kAttnBwd,
  kAttnDq,
  kAttnDk,
  kAttnDv,
  kAttnFwdLse,
  kAttnBwdSaved,
  kRopeFwd,
  kRopeBwd,
  kRopeQkFwd,
  kRopeQkBwd,
  kAxialFwd,
  kAxialBwd,
  kSwigluFwd,
  kSwigluBwd,
  kBlock,
  kOps
};
const char* op_name(int op) {
  static const char* names[] = {
      "attention_forward",        "attention_backward",    "attention_backward_dq",
      "attention_backward_dk",    "attention_backward_dv", "attention_forward_lse",
      "attention_backward_saved", "rope_forward",          "rope_backward",
      "rope_forward_qk",          "rope_backward_qk",      "axial_rope_forward",
      "axial_rope_backward",      "swiglu_forward",        "swiglu_backward",
      "attention_block"};
  return names[op];
}

/// Whether `be` has the entry point of `op` (the saved-state pair and the
/// q-and-k RoPE pair are optional for a user's backend).
bool has_op(const Backend& be, int op) {
  if (op == kAttnFwdLse) return static_cast<bool>(be.attention_forward_lse);
  if (op == kRopeQkFwd) return static_cast<bool>(be.rope_forward_qk);
  if (op == kRopeQkBwd) return static_cast<bool>(be.rope_backward_qk);
  if (op == kAttnBwdSaved) return static_cast<bool>(be.attention_backward_saved);
  return true;
}

/// Input memory of a call, kept to prove it was not written.
struct Inputs {
  std::vector<std::vector<float>> bufs;
  std::vector<std::vector<float>> copies;
  std::span<const float> add(std::vector<float> v) {
    copies.push_back(v);
    bufs.push_back(std::move(v));
    return bufs.back();
  }
  std::string damage() const {
    for (std::size_t i = 0; i < bufs.size(); ++i) {
      std::string m =
          bit_mismatch("input " + std::to_string(i) + " (gaps included)", bufs[i], copies[i]);
      if (!m.empty()) return m;
    }
    return {};
  }
};

/// Runs one generated call of `op` on `be` with guarded outputs; returns the
/// outputs and, in `memory`, what went wrong with guards, unwritten elements or inputs.
std::vector<std::vector<float>> call(const Backend& be, int op, std::string* memory) {
  Inputs in;
  in.bufs.reserve(16);
  std::vector<Guarded> outs;
  outs.reserve(3);
  if (op <= kAttnBwdSaved) {
    const AttentionCase c = *gen_attention();
    RC_LOG() << c << "\n";
    const AttentionData d = make_data(c);
    const AttentionPlan& p = d.plan;
    const auto q = in.add(place<float, float>(p.q, p.B, p.Sq, p.H, p.D, cspan(d.q)));
    const auto k = in.add(place<float, float>(p.k, p.B, p.Sk, p.Hkv, p.D, cspan(d.k)));
    const auto v = in.add(place<float, float>(p.v, p.B, p.Sk, p.Hkv, p.Dv, cspan(d.v)));
    const auto mask = in.add(d.mask);
    const AttentionInputs<float> ai{q, k, v, mask};
    if (op == kAttnFwd) {
      outs.emplace_back(p.o.extent);
      be.attention_forward(p, ai, outs[0].view());
    } else if (op == kAttnFwdLse) {
      outs.emplace_back(p.o.extent);
      outs.emplace_back(p.lse_size());
      be.attention_forward_lse(p, ai, outs[0].view(), outs[1].view());
    } else {
      const auto dout = in.add(place<float, float>(p.o, p.B, p.Sq, p.H, p.Dv, cspan(d.dout)));
      if (op == kAttnBwd || op == kAttnBwdSaved) {
        outs.emplace_back(p.dq.extent);
        outs.emplace_back(p.dk.extent);
        outs.emplace_back(p.dv.extent);
        const AttentionGrads<float> g{outs[0].view(), outs[1].view(), outs[2].view()};
        if (op == kAttnBwd) {
          be.attention_backward(p, ai, dout, g);
        } else {
          // the state the reference's forward saves
          std::vector<float> o(p.o.extent), lse(p.lse_size());
          reference::attention_forward_lse<float>(p, ai, std::span<float>(o),
                                                  std::span<float>(lse));
          be.attention_backward_saved(p, ai, {in.add(std::move(o)), in.add(std::move(lse))}, dout,
                                      g);
        }
      } else if (op == kAttnDq) {
        outs.emplace_back(p.dq.extent);
        be.attention_backward_dq(p, ai, dout, outs[0].view());
      } else if (op == kAttnDk) {
        outs.emplace_back(p.dk.extent);
        be.attention_backward_dk(p, ai, dout, outs[0].view());
      } else {
        outs.emplace_back(p.dv.extent);
        be.attention_backward_dv(p, ai, dout, outs[0].view());
      }
    }
  } else if (op <= kRopeBwd) {
    const RopeCase c = *gen_rope();
    RC_LOG() << c << "\n";
    const RopeData d = make_data(c);
    const auto src = in.add(rope_source(d.plan, op == kRopeFwd ? d.x : d.dy));
    const auto cs = in.add(d.cos), sn = in.add(d.sin);
    outs.emplace_back(d.plan.out_size());
    (op == kRopeFwd ? be.rope_forward : be.rope_backward)(d.plan, src, {cs, sn, d.positions.view()},
                                                          outs[0].view());
  } else if (op <= kRopeQkBwd) {
    const RopeQkCase c = *gen_rope_qk();
    RC_LOG() << c << "\n";
    const RopeQkData d = make_data(c);
    const bool fwd = op == kRopeQkFwd;
    const auto q = in.add(rope_source(d.plan.q, fwd ? d.q.x : d.q.dy));
    const auto k = in.add(rope_source(d.plan.k, fwd ? d.k : d.dk));
    const auto cs = in.add(d.q.cos), sn = in.add(d.q.sin);
    outs.emplace_back(d.plan.q.out_size());
    outs.emplace_back(d.plan.k.out_size());
    (fwd ? be.rope_forward_qk : be.rope_backward_qk)(d.plan, q, k, {cs, sn, d.q.positions.view()},
                                                     outs[0].view(), outs[1].view());
  } else if (op <= kAxialBwd) {
    const AxialCase c = *gen_axial();
    RC_LOG() << c << "\n";
    const AxialData d = make_data(c);
    const auto src = in.add(axial_source(d.plan, op == kAxialFwd ? d.x : d.dy));
    outs.emplace_back(d.plan.out_size());
    (op == kAxialFwd ? be.axial_rope_forward : be.axial_rope_backward)(d.plan, src, outs[0].view());
  } else if (op <= kSwigluBwd) {
    const SwigluCase c = *gen_swiglu();
    RC_LOG() << c << "\n";
    const SwigluData d = make_data(c);
    const auto x = in.add(d.x);
    if (op == kSwigluFwd) {
      outs.emplace_back(d.plan.out_size());
      be.swiglu_forward(d.plan, x, outs[0].view());
    } else {
      const auto dy = in.add(d.dy);
      outs.emplace_back(d.plan.in_size());
      be.swiglu_backward(d.plan, x, dy, outs[0].view());
    }
  } else {
    const BlockCase c = *gen_block();
    RC_LOG() << c << "\n";
    const BlockData d = make_data(c);
    AttentionBlockInputs<float> bi;
    bi.x = in.add(d.x);
    bi.w_qkv = in.add(d.w_qkv);
    bi.b_qkv = in.add(d.b_qkv);
    bi.w_out = in.add(d.w_out);
    bi.b_out = in.add(d.b_out);
    bi.keep = in.add(d.keep);
    bi.cos = in.add(d.cos);
    bi.sin = in.add(d.sin);
    outs.emplace_back(d.plan.x_size());
    be.attention_block(d.plan, bi, outs[0].view());
  }
  std::vector<std::vector<float>> result;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (memory != nullptr && memory->empty()) {
      std::string m = outs[i].guard_damage();
      if (m.empty()) m = outs[i].unwritten();
      if (!m.empty())
        *memory = std::string(op_name(op)) + " output " + std::to_string(i) + ": " + m;
    }
    result.push_back(outs[i].values());
  }
  if (memory != nullptr && memory->empty()) {
    const std::string m = in.damage();
    if (!m.empty()) *memory = std::string(op_name(op)) + ": " + m;
  }
  return result;
}

/// An op for call(): any, or one that calls attention for an attention-only
/// subject.
int draw_op(const Subject& s) {
  if (s.attention_only) {
    return *rc::gen::element<int>(kAttnFwd, kAttnBwd, kAttnDq, kAttnDk, kAttnDv, kAttnFwdLse,
                                  kAttnBwdSaved, kBlock);
  }
  return *rc::gen::inRange(0, int(kOps));
}

/// Guard regions around every output are never written, every output element
/// is written, and inputs (their stride gaps included) are never written.
void memory_guards(const Subject& s) {
  const Backend& be = s.backend;
  const int op = draw_op(s);
  RC_TAG(op_name(op));
  if (!has_op(be, op)) return;
  std::string memory;
  call(be, op, &memory);
  TANDEM_REQUIRE_EMPTY(memory);
}

/// Bitwise-identical results across repeated calls and every thread variant.
void determinism(const Subject& s) {
  const int op = draw_op(s);
  RC_TAG(op_name(op));
  if (!has_op(s.backend, op)) return;
  // One generated case, replayed: the generators run inside call(), so draw
  // the case once via a fixed sub-seed and rerun it by re-seeding.
  const std::uint64_t seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
  const auto replay = [&](const Backend& be) {
    return rc::gen::exec([&, op] { return call(be, op, nullptr); })(rc::Random(seed), 30).value();
  };
  TANDEM_REQUIRE_EMPTY(same_bits_on_every_run(s, replay, op_name(op)));
}

/// The backend's max error against reference<double> is at most twice that of
/// reference<float, float> (pure single precision) on the same inputs, plus
/// a floor of 2·ε·(1 + L)·max(M, N) — 2 ulp of the tensor's scale, times the
/// conditioning of the softmax for attention (L the logit bound, 0 for other
/// ops) — for cases where single precision happens to be exact (one key:
/// p = 1 whatever the score, while a backend that recomputes p from a stored
/// log-sum-exp rounds the score) — and twice the subnormal rounding of
/// attention (AttentionScales::underflow), where two chains that round
/// differently are each off by that much.
void accuracy(const Subject& s) {
  const Backend& be = s.backend;
  const int op = s.attention_only
                     ? *rc::gen::element<int>(kAttnFwd, kAttnBwd)
                     : *rc::gen::element<int>(kAttnFwd, kAttnBwd, kRopeFwd, kRopeBwd, kAxialFwd,
                                              kAxialBwd, kSwigluFwd, kSwigluBwd);
  RC_TAG(op_name(op));
  struct T {
    std::string name;
    std::vector<double> got, single, exact;
    double nat;
    double L = 0;
    double underflow = 0;  ///< attention: AttentionScales::underflow
  };
  std::vector<T> ts;
  if (op == kAttnFwd) {
    const AttentionData d = make_data(*gen_attention());
    const AttentionScales sc = scales(d);
    ts.push_back({"out", to_double(run_forward(be, d)), to_double(reference_forward_ff(d)),
                  reference_forward(d), sc.out, sc.L, sc.underflow});
  } else if (op == kAttnBwd) {
    const AttentionData d = make_data(*gen_attention());
    const AttentionScales sc = scales(d);
    const Grads g = run_backward(be, d), f = reference_backward_ff(d);
    const GradsD e = reference_backward(d);
    ts.push_back({"dq", to_double(g.dq), to_double(f.dq), e.dq, sc.dq, sc.L, sc.underflow});
    ts.push_back({"dk", to_double(g.dk), to_double(f.dk), e.dk, sc.dk, sc.L, sc.underflow});
    ts.push_back({"dv", to_double(g.dv), to_double(f.dv), e.dv, sc.dv, sc.L, sc.underflow});
  } else if (op <= kRopeBwd) {
    const RopeData d = make_data(*gen_rope());
    const bool back = op == kRopeBwd;
    const auto& x = back ? d.dy : d.x;
    ts.push_back({"rope", to_double(run_rope(be, d.plan, x, d.tables(), back)),
                  to_double(reference_rope<float, float>(d.plan, x, d.tables(), back)),
                  reference_rope<double, double>(d.plan, x, d.tables(), back), 0.0});
  } else if (op <= kAxialBwd) {
    const AxialData d = make_data(*gen_axial());
    const bool back = op == kAxialBwd;
    const auto& x = back ? d.dy : d.x;
    ts.push_back({"axial", to_double(run_axial(be, d.plan, x, back)),
                  to_double(reference_axial<float, float>(d.plan, x, back)),
                  reference_axial<double, double>(d.plan, x, back), 0.0});
  } else {
    const SwigluData d = make_data(*gen_swiglu());
    const bool back = op == kSwigluBwd;
    const auto xd = to_double(d.x), dyd = to_double(d.dy);
    ts.push_back({"swiglu", to_double(run_swiglu(be, d, back)),
                  to_double(reference_swiglu<float, float>(d.plan, cspan(d.x), cspan(d.dy), back)),
                  reference_swiglu<double, double>(d.plan, cspan(xd), cspan(dyd), back), 0.0});
  }
  for (const T& t : ts) {
    const double eb = max_err(t.got, t.exact), ef = max_err(t.single, t.exact);
    const double floor = 2 * kEps * (1 + t.L) * std::max(max_abs(t.exact), t.nat) + 2 * t.underflow;
    if (!(eb <= 2 * ef + floor)) {
      std::ostringstream os;
      os.precision(3);
      os << op_name(op) << " " << t.name << ": max error " << eb
         << " > 2 × reference<float,float>'s " << ef << " + floor " << floor;
      RC_FAIL(os.str());
    }
  }
}

template <void (*F)(const Backend&)>
std::function<void(const Subject&)> on_backend() {
  return [](const Subject& s) { F(s.backend); };
}

}  // namespace

void register_other_properties(std::vector<Property>& v) {
  const std::size_t first = v.size();
  v.push_back({"agree_swiglu", "agreement", 300, on_backend<agree_swiglu>()});
  v.push_back({"swiglu_gradient_complex_step", "gradient", 300, on_backend<swiglu_gradient>()});
  for (std::size_t i = first; i < v.size(); ++i) v[i].calls_attention = false;  // SwiGLU alone
  v.push_back({"agree_attention_block", "agreement", 100, on_backend<agree_block>()});
  v.push_back({"attention_block_equals_composition", "semantic", 100,
               on_backend<block_equals_composition>()});
  v.push_back({"memory_guards_and_inputs_untouched", "memory", 300, memory_guards});
  v.push_back({"deterministic_across_calls_and_threads", "determinism", 150, determinism});
  v.push_back({"accuracy_within_2x_single_precision", "accuracy", 300, accuracy});
}

}  // namespace tandem::props
