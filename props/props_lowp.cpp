// SPDX-License-Identifier: Apache-2.0
// Properties of low-precision storage and quantized KV caches (SPEC §10):
// every backend-under-test that offers an entry point at bf16 or f16
// (`backend.kernels<T>()`, a non-empty member) agrees with SPEC §10.2's
// rounding at float32-accumulation tolerance, is within twice the naive
// computation's error of exact arithmetic, rounds once under the exact
// profile, quantizes bitwise as §10.4 says, composes its attention block of
// its own parts (§10.5), and rejects what it does not take before it writes.
// Oracles: lowp.hpp.
#include <cmath>
#include <cstring>
#include <sstream>
#include <tuple>

#include "lowp.hpp"

namespace tandem::props {
namespace {

template <class T>
std::span<const T> cspan(const std::vector<T>& v) {
  return std::span<const T>(v);
}

/// What the dense low-precision attention properties draw: every mask, GQA,
/// Dv ≠ D, softcap, strides, the default geometry's edges; the extremes of
/// the float suite only where said.
AttentionGen lowp_gen() {
  return AttentionGen{}.with(&AttentionGen::extremes, Draw::never);
}

/// What the low-precision feature properties draw: the float suite's
/// feature cases (props_features.cpp's generator: sinks, ALiBi, packed
/// sequences, paged caches, each with the masks it takes, GQA, Dv ≠ D,
/// softcap and scales; the index inputs as int32 or int64). `paged` is
/// never for the backward (a paged cache has none).
AttentionGen lowp_features_gen(Draw paged = Draw::sometimes) {
  return lowp_gen().with_features().with(&AttentionGen::paged, paged);
}

/// Runs F<bfloat16> or F<float16> (drawn) on s when the subject offers what `has` asks.
template <template <class> class F>
void on_storage(const Subject& s) {
  if (*rc::gen::arbitrary<bool>()) {
    F<bfloat16>::run(s);
  } else {
    F<float16>::run(s);
  }
}

/// The drawn rounding profile of a bf16/f16 call: pytorch or exact (SPEC §10.2).
Rounding gen_profile() {
  return *rc::gen::element(kRoundingPytorch, kRoundingExact);
}

std::string fmt(double x) {
  std::ostringstream os;
  os.precision(9);
  os << x;
  return os.str();
}

/// got[n] ∈ [RN_T(y_n − tol_n), RN_T(y_n + tol_n)] for the exact y: the
/// float32 result (within tol of y) rounded once to T (RN_T is monotone).
template <class T>
std::string rounded_once(const std::string& what, const std::vector<double>& got,
                         const std::vector<double>& y, const std::vector<double>& tol) {
  for (std::size_t n = 0; n < got.size(); ++n) {
    if (std::isnan(y[n]) || std::isnan(got[n])) {
      if (std::isnan(y[n]) != std::isnan(got[n])) return what + "[" + std::to_string(n) + "] NaN";
      continue;
    }
    const double lo = rn<T>(y[n] - tol[n]), hi = rn<T>(y[n] + tol[n]);
    if (!(got[n] >= lo && got[n] <= hi)) {
      return what + "[" + std::to_string(n) + "] = " + fmt(got[n]) + ", not the float32 result " +
             fmt(y[n]) + " ± " + fmt(tol[n]) + " rounded once: [" + fmt(lo) + ", " + fmt(hi) + "]";
    }
  }
  return {};
}

/// The float32 attention tolerance of each element of exp (checks.hpp).
std::vector<double> f32_tolerance(const std::vector<double>& exp, const AttentionScales& sc) {
  const double M = std::max(max_abs(exp), sc.out), r = 64 * kEps * (1 + sc.L);
  std::vector<double> t(exp.size());
  for (std::size_t n = 0; n < t.size(); ++n) t[n] = r * (M + std::abs(exp[n])) + sc.underflow;
  return t;
}

// --------------------------------------------------------- 1. forward + lse

/// SPEC §10.5: |o − o*| ≤ ulp_T(o*)/2 + ε_i + flip_i against §10.2's rounding
/// at the drawn profile, on forward and forward_lse; lse within the f32 bound.
template <class T>
struct AgreeForward {
  static void run(const Subject& s) { check(s, lowp_gen()); }
  static void check(const Subject& s, const AttentionGen& gen) {
    const Kernels<T>& kt = s.backend.kernels<T>();
    if (!kt.attention_forward) return;
    AttentionCase c = *gen_attention(gen);
    c.params.rounding = gen_profile();
    const AttentionData d = stored_as<T>(make_data(c));
    const AttentionScales sc = scales(d);
    const auto q = to_double(d.q), k = to_double(d.k), v = to_double(d.v);
    const RoundedForward o = rounded_forward<T>(d, d.plan.rounding, q, k, v, weight_rel_delta(sc));
    // the reference's bound (reference/rounding_bound.hpp) and this suite's must both hold
    const RoundedForward r = reference_rounding<T>(d, weight_rel_delta(sc));
    const auto got = run_forward_t(kt, d);
    TANDEM_REQUIRE_EMPTY(rounded_close<T>("out", got, o, sc));
    TANDEM_REQUIRE_EMPTY(rounded_close<T>("out (the reference's bound)", got, r, sc));
    if (!kt.attention_forward_lse) return;
    std::vector<double> lse;
    const auto out = run_forward_t(kt, d, &lse);
    TANDEM_REQUIRE_EMPTY(rounded_close<T>("forward_lse out", out, o, sc));
    TANDEM_REQUIRE_EMPTY(rounded_close<T>("forward_lse out (the reference's bound)", out, r, sc));
    const double lse_scale = 1 + sc.L + std::log(double(d.plan.Sk));
    TANDEM_REQUIRE_EMPTY(attention_close("lse", lse, o.lse, lse_scale, sc));
  }
};

/// AgreeForward on the feature cases (SPEC §2.7–2.10 at T).
template <class T>
struct AgreeFeaturesForward {
  static void run(const Subject& s) { AgreeForward<T>::check(s, lowp_features_gen()); }
};

// ------------------------------------------------------------- 2. backward

/// SPEC §10.2's backward at the drawn profile (lowp.hpp's rounded_backward):
/// dq, dk, dv (and dsinks) of the one-call backward, each within
/// ulp_T(g*)/2 + ε + the effect of the weights that float32 arithmetic may
/// round either way (dsinks: of the stored O_i that may round either way, SPEC §10.5).
template <class T>
struct AgreeBackward {
  static void run(const Subject& s) { check(s, lowp_gen()); }
  /// broadcast_bias: the drawn bias (gen draws one) is shared by every batch
  /// entry and head, so that dbias sums B·H terms per element.
  static void check(const Subject& s, const AttentionGen& gen, bool broadcast_bias = false) {
    const Kernels<T>& kt = s.backend.kernels<T>();
    if (!kt.attention_backward) return;
    AttentionCase c = *gen_attention(gen);
    if (broadcast_bias) c.params.bias_batch = c.params.bias_heads = 1;
    c.params.rounding = gen_profile();
    const AttentionData d = stored_as<T>(make_data(c));
    const AttentionScales sc = scales(d);
    TANDEM_REQUIRE_EMPTY(
        rounded_grads_close<T>(run_backward_t(kt, d), rounded_backward<T>(d, sc), sc));
  }
};

/// AgreeBackward with a bias broadcast over batch and heads: the one case
/// where a dbias summed in T (rounded after every (b, h) term, not once,
/// SPEC §10.2) differs from the contract, which the drawn masks reach too
/// rarely to show.
template <class T>
struct AgreeBackwardBroadcastBias {
  static void run(const Subject& s) {
    AgreeBackward<T>::check(s, lowp_gen().with_mask(MaskKind::bias), true);
  }
};

/// AgreeBackward on the feature cases but paged ones, dsinks included.
template <class T>
struct AgreeFeaturesBackward {
  static void run(const Subject& s) { AgreeBackward<T>::check(s, lowp_features_gen(Draw::never)); }
};

// ------------------------------------------------- 3. error against exact

/// FlashAttention's rule with SPEC §10.5's bound (pytorch profile): against
/// the exact attention o of the stored inputs, |ô − o| ≤ 2·max|naive − o| +
/// u_T·|o| + u_T·Σ_j p_ij|v_j| + ε, the naive computation in T (lowp.hpp).
template <class T>
struct WithinNaive {
  static void run(const Subject& s) {
    const Kernels<T>& kt = s.backend.kernels<T>();
    if (!kt.attention_forward) return;
    AttentionCase c = *gen_attention(lowp_gen());
    c.params.rounding = kRoundingPytorch;
    const AttentionData d = stored_as<T>(make_data(c));
    const AttentionScales sc = scales(d);
    const auto exact = reference_forward(d);
    AttentionData a = d;  // Σ_j p_ij |v_j|: the exact attention of |v|
    for (float& x : a.v) x = std::abs(x);
    const auto pv = reference_forward(a);
    const auto naive = naive_forward<T>(d);
    const auto got = run_forward_t(kt, d);
    const double naive_err = max_err(naive, exact);
    const double u = storage_traits<T>::unit_roundoff;
    const auto eps = f32_tolerance(exact, sc);
    for (std::size_t n = 0; n < got.size(); ++n) {
      const double bound = 2 * naive_err + u * std::abs(exact[n]) + u * pv[n] + eps[n];
      if (!(std::abs(got[n] - exact[n]) <= bound)) {
        RC_FAIL("out[" + std::to_string(n) + "] = " + fmt(got[n]) + ", exact " + fmt(exact[n]) +
                ": error " + fmt(std::abs(got[n] - exact[n])) + " > 2·naive error " +
                fmt(naive_err) + " + §10.5 bound " + fmt(bound - 2 * naive_err));
      }
    }
  }
};

// ------------------------------------------- 4. exact profile rounds once

/// SPEC §10.5: with the exact profile and inputs exactly representable in
/// bf16, the output is the float32 result (the subject's own float kernel)
/// rounded once to T.
template <class T>
struct ExactRoundsOnce {
  static void run(const Subject& s) {
    const Kernels<T>& kt = s.backend.kernels<T>();
    if (!kt.attention_forward) return;
    AttentionCase c = *gen_attention(lowp_gen());
    c.params.rounding = kRoundingExact;
    const AttentionData d = stored_as<T>(stored_as<bfloat16>(make_data(c)));
    const AttentionScales sc = scales(d);
    const auto f32 = to_double(run_forward(s.backend, d));
    auto tol = f32_tolerance(reference_forward(d), sc);
    for (double& t : tol) t *= 2;  // float32 result and the T kernel's sums: each within ε
    TANDEM_REQUIRE_EMPTY(rounded_once<T>("out", run_forward_t(kt, d), f32, tol));
  }
};

// --------------------------------------------------- 5. quantized caches

/// The drawn quantized case at storage T ∈ {f32, bf16, f16}: k and v stored
/// in T; `plain` is the same call with plain k and v (what the oracles take).
struct QuantizedCase {
  AttentionData quant, plain;
};
template <class T>
QuantizedCase quantized_data(const AttentionGen& gen = lowp_gen()) {
  AttentionCase c = *gen_attention(gen);
  c.params.rounding = gen_profile();
  const AttentionData plain = stored_as<T>(make_data(c));
  c.params.kv_cache = *rc::gen::element(KvCache::int8, KvCache::e4m3);
  return {with_plan(plain, c.params), plain};
}

/// SPEC §10.4: quantize_kv is bitwise the spec's codes and scales, and the
/// round trip loses at most σ/2 (int8) or 2^−4·|k| + σ·2^−10 (e4m3).
template <class T>
struct QuantizeBitwise {
  static void run(const Subject& s) {
    const Kernels<T>& kt = s.backend.kernels<T>();
    if (!kt.quantize_kv) return;
    const AttentionData d = quantized_data<T>().quant;
    const Codes want = quantize_oracle(d);
    const Codes got = run_quantize_t(kt, d);
    const auto bits = [](const std::vector<float>& x) {
      std::vector<std::uint32_t> b(x.size());
      std::memcpy(b.data(), x.data(), x.size() * sizeof(float));
      return b;
    };
    if (bits(got.k_scale) != bits(want.k_scale)) RC_FAIL("k_scale differs from SPEC §10.4");
    if (bits(got.v_scale) != bits(want.v_scale)) RC_FAIL("v_scale differs from SPEC §10.4");
    for (std::size_t n = 0; n < want.k.size(); ++n) {
      if (got.k[n] != want.k[n]) {
        RC_FAIL("k code at " + std::to_string(n) + " = " + std::to_string(got.k[n]) +
                ", SPEC §10.4 gives " + std::to_string(want.k[n]));
      }
    }
    if (got.v != want.v) RC_FAIL("v codes differ from SPEC §10.4");
    // the round trip of the codes the backend wrote
    const auto [kq, vq] = dequantize(d.plan, got);
    const auto one = [&](const std::vector<float>& x, const std::vector<double>& xq,
                         const std::vector<float>& scales, i64 W, const char* name) {
      const AttentionPlan& p = d.plan;
      for (std::size_t n = 0; n < x.size(); ++n) {
        const i64 row = static_cast<i64>(n) / W;  // (b, s, g) of logical [B', S', Hkv, W]
        const i64 g = row % p.Hkv, bs = row / p.Hkv;
        const double sigma = scales[p.kv_scale_at(bs / p.kv_seq(), bs % p.kv_seq(), g)];
        const double bound = p.kv_cache == KvCache::int8
                                 ? sigma * (0.5 + 0x1p-16)
                                 : 0x1p-4 * (1 + 0x1p-16) * std::abs(x[n]) + sigma * 0x1p-10;
        if (!(std::abs(x[n] - xq[n]) <= bound)) {
          RC_FAIL(std::string(name) + "[" + std::to_string(n) + "] = " + fmt(x[n]) +
                  " comes back as " + fmt(xq[n]) + ": more than " + fmt(bound) + " lost");
        }
      }
    };
    one(d.k, kq, got.k_scale, d.plan.D, "k");
    one(d.v, vq, got.v_scale, d.plan.Dv, "v");
  }
};

/// SPEC §10.5 on a quantized cache: attention_forward_quantized agrees with
/// §10.2's rounding of the dequantized keys and values σ·c (exact in double).
template <class T>
struct QuantizedAgree {
  static void run(const Subject& s) { check(s, lowp_gen()); }
  static void check(const Subject& s, const AttentionGen& gen) {
    const Kernels<T>& kt = s.backend.kernels<T>();
    if (!kt.attention_forward_quantized) return;
    const auto [d, plain] = quantized_data<T>(gen);
    const Codes codes = quantize_oracle(d);
    const auto [k, v] = dequantize(d.plan, codes);
    AttentionData dq = plain;  // the scales of the dequantized data (L, max|v|)
    dq.k.assign(k.begin(), k.end());
    dq.v.assign(v.begin(), v.end());
    const AttentionScales sc = scales(dq);
    const auto q = to_double(d.q);
    const RoundedForward o =
        rounded_forward<T>(plain, d.plan.rounding, q, k, v, weight_rel_delta(sc));
    const auto got = run_quantized_t(kt, d, codes);
    TANDEM_REQUIRE_EMPTY(rounded_close<T>("quantized out", got, o, sc));
    const RoundedForward r = reference_rounding<T>(d, weight_rel_delta(sc), &codes);
    TANDEM_REQUIRE_EMPTY(rounded_close<T>("quantized out (the reference's bound)", got, r, sc));
  }
};

/// QuantizedAgree on the feature cases: decode and chunked prefill from a
/// quantized paged cache, packed sequences, sinks and ALiBi.
template <class T>
struct QuantizedFeaturesAgree {
  static void run(const Subject& s) { QuantizedAgree<T>::check(s, lowp_features_gen()); }
};

/// T ∈ {f32, bf16, f16} for the quantized properties.
template <template <class> class F>
void on_quantized_storage(const Subject& s) {
  switch (*rc::gen::inRange(0, 3)) {
    case 0:
      F<float>::run(s);
      break;
    case 1:
      F<bfloat16>::run(s);
      break;
    default:
      F<float16>::run(s);
  }
}

// ----------------------------------------- 6. RoPE, axial RoPE, SwiGLU in T

/// A float Backend whose RoPE, axial RoPE and SwiGLU call kt at T: inputs
/// converted to T (exact for values of T), outputs widened back, so the
/// float suite's runners (layouts, guards) serve T unchanged.
template <class T>
Backend through(const Kernels<T>& kt) {
  const auto narrow = [](std::span<const float> x) {
    std::vector<T> r(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) r[i] = T(static_cast<double>(x[i]));
    return r;
  };
  const auto widen_into = [](const std::vector<T>& y, std::span<float> out) {
    for (std::size_t i = 0; i < y.size(); ++i) out[i] = static_cast<float>(y[i]);
  };
  Backend be;
  const auto rope = [=](const typename Kernels<T>::Rope& fn) {
    return [=](const RopePlan& p, std::span<const float> src, const RopeTables<float>& t,
               std::span<float> dst) {
      const auto x = narrow(src), c = narrow(t.cos), s = narrow(t.sin);
      std::vector<T> y = narrow(dst);
      fn(p, cspan(x), RopeTables<T>{cspan(c), cspan(s), t.positions}, std::span<T>(y));
      widen_into(y, dst);
    };
  };
  if (kt.rope_forward) be.rope_forward = rope(kt.rope_forward);
  if (kt.rope_backward) be.rope_backward = rope(kt.rope_backward);
  const auto axial = [=](const typename Kernels<T>::AxialRope& fn) {
    return [=](const AxialRopePlan& p, std::span<const float> src, std::span<float> dst) {
      const auto x = narrow(src);
      std::vector<T> y = narrow(dst);
      fn(p, cspan(x), std::span<T>(y));
      widen_into(y, dst);
    };
  };
  if (kt.axial_rope_forward) be.axial_rope_forward = axial(kt.axial_rope_forward);
  if (kt.axial_rope_backward) be.axial_rope_backward = axial(kt.axial_rope_backward);
  if (kt.swiglu_forward) {
    be.swiglu_forward = [=, fn = kt.swiglu_forward](const SwigluPlan& p, std::span<const float> x,
                                                    std::span<float> out) {
      const auto xt = narrow(x);
      std::vector<T> y = narrow(out);
      fn(p, cspan(xt), std::span<T>(y));
      widen_into(y, out);
    };
  }
  if (kt.swiglu_backward) {
    be.swiglu_backward = [=, fn = kt.swiglu_backward](const SwigluPlan& p, std::span<const float> x,
                                                      std::span<const float> dy,
                                                      std::span<float> dx) {
      const auto xt = narrow(x), dyt = narrow(dy);
      std::vector<T> y = narrow(dx);
      fn(p, cspan(xt), cspan(dyt), std::span<T>(y));
      widen_into(y, dx);
    };
  }
  return be;
}

template <class T>
std::vector<float> rounded(std::vector<float> x) {
  for (float& v : x) v = static_cast<float>(rn<T>(v));
  return x;
}

std::vector<double> tolerance(const std::vector<double>& y, double atol, double rtol) {
  std::vector<double> t(y.size());
  for (std::size_t n = 0; n < y.size(); ++n) t[n] = atol + rtol * std::abs(y[n]);
  return t;
}

/// RoPE (SPEC §10.2): RN_T of the float32 result from the stored x and tables, forward and
/// backward.
template <class T>
struct AgreeRope {
  static void run(const Subject& s) {
    const Kernels<T>& kt = s.backend.kernels<T>();
    if (!kt.rope_forward || !kt.rope_backward) return;
    RopeData d = make_data(*gen_rope());
    d.x = rounded<T>(d.x);
    d.dy = rounded<T>(d.dy);
    d.cos = rounded<T>(d.cos);
    d.sin = rounded<T>(d.sin);
    const Backend be = through(kt);
    for (const bool back : {false, true}) {
      const auto& x = back ? d.dy : d.x;
      const auto y = reference_rope<double, double>(d.plan, cspan(x), d.tables(), back);
      const double xmax = max_abs(to_double(x));
      const auto got = to_double(run_rope(be, d.plan, cspan(x), d.tables(), back));
      TANDEM_REQUIRE_EMPTY(rounded_once<T>(back ? "rope_backward dx" : "rope out", got, y,
                                           tolerance(y, 32 * kEps * xmax, 32 * kEps)));
    }
  }
};

template <class T>
struct AgreeAxial {
  static void run(const Subject& s) {
    const Kernels<T>& kt = s.backend.kernels<T>();
    if (!kt.axial_rope_forward || !kt.axial_rope_backward) return;
    AxialData d = make_data(*gen_axial());
    d.x = rounded<T>(d.x);
    d.dy = rounded<T>(d.dy);
    const Backend be = through(kt);
    for (const bool back : {false, true}) {
      const auto& x = back ? d.dy : d.x;
      const auto y = reference_axial<double, double>(d.plan, cspan(x), back);
      const double xmax = max_abs(to_double(x));
      const auto got = to_double(run_axial(be, d.plan, cspan(x), back));
      TANDEM_REQUIRE_EMPTY(rounded_once<T>(back ? "axial_rope_backward dx" : "axial_rope out", got,
                                           y, tolerance(y, 32 * kEps * xmax, 32 * kEps)));
    }
  }
};

template <class T>
struct AgreeSwiglu {
  static void run(const Subject& s) {
    const Kernels<T>& kt = s.backend.kernels<T>();
    if (!kt.swiglu_forward || !kt.swiglu_backward) return;
    SwigluData d = make_data(*gen_swiglu());
    d.x = rounded<T>(d.x);
    d.dy = rounded<T>(d.dy);
    const Backend be = through(kt);
    const auto x = to_double(d.x), dy = to_double(d.dy);
    for (const bool back : {false, true}) {
      const auto y = reference_swiglu<double, double>(d.plan, cspan(x), cspan(dy), back);
      const auto got = to_double(run_swiglu(be, d, back));
      TANDEM_REQUIRE_EMPTY(rounded_once<T>(back ? "swiglu_backward dx" : "swiglu out", got, y,
                                           tolerance(y, 32 * kEps * max_abs(y), 64 * kEps)));
    }
  }
};

// ------------------------------------------ 7. rejected before any write

/// Empty when call() throws a tandem::Error whose parameter or message
/// names `word` and leaves `out` untouched.
template <class T, class F>
std::string rejected(F&& call, const GuardedT<T>& out, const std::string& what,
                     const std::string& word) {
  try {
    call();
  } catch (const Error& e) {
    if (e.parameter().find(word) == std::string::npos &&
        std::string(e.what()).find(word) == std::string::npos) {
      return what + ": the Error names neither " + word + ": " + e.what();
    }
    return out.untouched() ? std::string() : what + ": rejected after writing out";
  }
  return what + " was accepted";
}

/// A quantized plan passed to attention_forward, a plain plan passed to
/// attention_forward_quantized, and (the optimized backend: SPEC §10.2) the
/// ggml profile are Errors naming kv_cache or rounding, with out untouched.
template <class T>
struct RejectedBeforeWrites {
  static void run(const Subject& s) {
    const Kernels<T>& kt = s.backend.kernels<T>();
    if (!kt.attention_forward) return;
    AttentionCase c = *gen_attention(lowp_gen());
    const AttentionData plain = stored_as<T>(make_data(c));
    c.params.kv_cache = *rc::gen::element(KvCache::int8, KvCache::e4m3);
    const AttentionData quant = stored_as<T>(make_data(c));
    const auto inputs = [](const AttentionData& d) {
      std::vector<T> q, k, v;
      const auto place_t = [](const Strides& st, i64 B, i64 S, i64 Hh, i64 W,
                              const std::vector<float>& x) {
        return place<T, float>(st, B, S, Hh, W, cspan(x), T(0.0));
      };
      const AttentionPlan& p = d.plan;
      q = place_t(p.q, p.B, p.Sq, p.H, p.D, d.q);
      k = place_t(p.k, p.kv_batch(), p.kv_seq(), p.Hkv, p.D, d.k);
      v = place_t(p.v, p.kv_batch(), p.kv_seq(), p.Hkv, p.Dv, d.v);
      return std::tuple{q, k, v};
    };
    {
      const auto [q, k, v] = inputs(quant);
      GuardedT<T> out(quant.plan.o.extent);
      const AttentionInputs<T> in{cspan(q), cspan(k), cspan(v), cspan(quant.mask)};
      TANDEM_REQUIRE_EMPTY(rejected<T>([&] { kt.attention_forward(quant.plan, in, out.view()); },
                                       out, "a quantized plan to attention_forward", "kv_cache"));
    }
    if (kt.attention_forward_quantized) {
      const auto [q, k, v] = inputs(plain);
      GuardedT<T> out(plain.plan.o.extent);
      const AttentionInputs<T> in{cspan(q), {}, {}, cspan(plain.mask)};
      const std::vector<std::uint8_t> kc(plain.plan.k.extent), vc(plain.plan.v.extent);
      const QuantizedKv kv{kc, vc, {}, {}};
      TANDEM_REQUIRE_EMPTY(
          rejected<T>([&] { kt.attention_forward_quantized(plain.plan, in, kv, out.view()); }, out,
                      "a plain plan to attention_forward_quantized", "kv_cache"));
    }
    if (s.name.rfind("optimized", 0) == 0) {  // SPEC §10.2: the optimized backend rejects ggml
      AttentionParams pg = c.params;
      pg.kv_cache = KvCache::plain;
      pg.rounding = kRoundingGgml;
      const AttentionData g = with_plan(plain, pg);
      const auto [q, k, v] = inputs(g);
      GuardedT<T> out(g.plan.o.extent);
      const AttentionInputs<T> in{cspan(q), cspan(k), cspan(v), cspan(g.mask)};
      TANDEM_REQUIRE_EMPTY(rejected<T>([&] { kt.attention_forward(g.plan, in, out.view()); }, out,
                                       "the ggml profile", "rounding"));
    }
  }
};

// ------------------------------------------------------ 8. attention block

/// SPEC §10.5, the attention block against its own parts: on inputs whose qkv
/// projection is exact in float32 (block_on_qkv_grid), the block at the drawn
/// profile gives RN_T of the exact out projection of the backend's own rope and
/// attention on RN_T(qkv), within float32 summation's γ_{E+1} (lowp.hpp).
template <class T>
struct BlockEqualsComposition {
  static void run(const Subject& s) {
    const Kernels<T>& kt = s.backend.kernels<T>();
    if (!kt.attention_block || !kt.attention_forward || !kt.rope_forward) return;
    BlockCase c = *gen_block();
    c.params.rounding = gen_profile();
    const BlockData d = block_on_qkv_grid<T>(make_data(c));
    const BlockOracle o = block_from_parts<T>(kt, d);
    TANDEM_REQUIRE_EMPTY(rounded_once<T>("attention_block out", run_block_t<T>(kt, d), o.y, o.tol));
  }
};

template <template <class> class F>
std::function<void(const Subject&)> lowp() {
  return [](const Subject& s) { on_storage<F>(s); };
}

}  // namespace

void register_lowp_properties(std::vector<Property>& v) {
  v.push_back({"lowp_agree_attention_forward", "agreement", 200, lowp<AgreeForward>()});
  v.push_back({"lowp_agree_attention_backward", "agreement", 150, lowp<AgreeBackward>()});
  v.push_back({"lowp_agree_attention_backward_broadcast_bias", "agreement", 60,
               lowp<AgreeBackwardBroadcastBias>()});
  v.push_back({"lowp_error_within_2x_naive", "accuracy", 150, lowp<WithinNaive>()});
  v.push_back({"lowp_exact_profile_rounds_once", "agreement", 150, lowp<ExactRoundsOnce>()});
  v.push_back({"lowp_quantize_kv_bitwise", "agreement", 150,
               [](const Subject& s) { on_quantized_storage<QuantizeBitwise>(s); }});
  v.push_back({"lowp_agree_attention_quantized", "agreement", 150,
               [](const Subject& s) { on_quantized_storage<QuantizedAgree>(s); }});
  v.push_back({"lowp_invalid_rejected_before_writes", "memory", 100, lowp<RejectedBeforeWrites>()});
  // the features of SPEC §2.7–2.10 at bf16 and f16: subjects that have them
  v.push_back({"lowp_agree_attention_features_forward", "agreement (features)", 100,
               lowp<AgreeFeaturesForward>(), true});
  v.push_back({"lowp_agree_attention_features_backward", "agreement (features)", 100,
               lowp<AgreeFeaturesBackward>(), true});
  v.push_back({"lowp_agree_attention_features_quantized", "agreement (features)", 80,
               [](const Subject& s) { on_quantized_storage<QuantizedFeaturesAgree>(s); }, true});
  v.push_back({"lowp_block_equals_composition", "semantic", 100, lowp<BlockEqualsComposition>()});
  const std::size_t first = v.size();
  v.push_back({"lowp_agree_rope", "agreement", 150, lowp<AgreeRope>()});
  v.push_back({"lowp_agree_axial_rope", "agreement", 100, lowp<AgreeAxial>()});
  v.push_back({"lowp_agree_swiglu", "agreement", 150, lowp<AgreeSwiglu>()});
  for (std::size_t i = first; i < v.size(); ++i) v[i].calls_attention = false;
}

}  // namespace tandem::props
