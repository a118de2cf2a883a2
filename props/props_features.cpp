// SPDX-License-Identifier: Apache-2.0
// Properties of the attention features (SPEC §2.7–2.10): sinks, ALiBi, packed
// variable-length sequences and paged KV caches. Agreement with the
// reference, complex-step gradients, the equivalence that defines each
// feature (a sink is a key with zero value, ALiBi is a bias, packed is one
// call per sequence, paged is the gathered cache), padding and unused
// blocks never read, memory, validation before any write, determinism.
// They run on subjects with Subject::attention_features set.
#include <algorithm>
#include <complex>
#include <functional>
#include <limits>
#include <numeric>

#include "checks.hpp"
#include "tandem/reference/attention.hpp"

namespace tandem::props {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

AttentionGen features() {
  return AttentionGen{}.with_features();
}

/// Appends rows [first, first + count) of a logical `[rows, width]` tensor.
void append_rows(std::vector<float>& to, const std::vector<float>& t, i64 first, i64 count,
                 i64 width) {
  to.insert(to.end(), t.begin() + first * width, t.begin() + (first + count) * width);
}

/// The parameters of a dense call with d's head shapes and options, `Sq`
/// queries and `Sk` keys in one batch entry, no feature but sinks (and
/// per-head ALiBi when `alibi`).
AttentionParams dense_like(const AttentionPlan& p, i64 Sq, i64 Sk, bool alibi) {
  AttentionParams e;
  e.Sq = Sq;
  e.Sk = Sk;
  e.H = p.H;
  e.Hkv = p.Hkv;
  e.D = p.D;
  e.Dv = p.Dv;
  e.mask = p.mask;
  e.window = p.window;
  e.scale = p.scale;
  e.softcap = p.softcap;
  e.sinks = p.sinks;
  e.alibi = alibi ? AlibiKind::per_head : AlibiKind::none;
  return e;
}

/// The ALiBi slopes `[H]` of sequence n.
std::vector<float> slopes_of(const AttentionData& d, i64 n) {
  std::vector<float> s;
  for (i64 h = 0; h < d.plan.H; ++h) s.push_back(d.slopes[d.plan.slope_at(n, h)]);
  return s;
}

/// A non-empty subset of dq, dk, dv, dsinks (dsinks counts only with sinks).
Want draw_want(const AttentionPlan& p) {
  const int bits = *rc::gen::inRange(1, 16);
  Want w{(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0, (bits & 8) != 0};
  if (!w.dq && !w.dk && !w.dv && !p.sinks) w.dq = true;
  return w;
}

// ---------------------------------------------------------------- agreement

/// Forward and the saved log-sum-exp of every feature combination against reference<double>.
void agree_features_forward(const Backend& be) {
  const AttentionData d = make_data(*gen_attention(features()));
  const AttentionScales sc = scales(d);
  const AttentionPlan& p = d.plan;
  TANDEM_REQUIRE_EMPTY(
      attention_close("out", run_forward(be, d), reference_forward(d), sc.out, sc));
  if (!be.attention_forward_lse) return;
  const Saved saved = run_forward_lse(be, d);
  TANDEM_REQUIRE_EMPTY(
      attention_close("forward_lse out",
                      gather<float>(p.o, p.B, p.Sq, p.H, p.Dv, std::span<const float>(saved.out)),
                      reference_forward(d), sc.out, sc));
  const double lse_scale = 1 + sc.L + std::log(double(p.Sk + 1));
  TANDEM_REQUIRE_EMPTY(
      attention_close("lse", to_double(saved.lse), reference_lse(d), lse_scale, sc));
}

/// The backward (any non-empty subset of dq, dk, dv, dsinks; the separate
/// entries; the saved-state pair) of every non-paged feature combination
/// against reference<double>.
void agree_features_backward(const Backend& be) {
  const AttentionData d =
      make_data(*gen_attention(features().with(&AttentionGen::paged, Draw::never)));
  const AttentionScales sc = scales(d);
  const GradsD exp = reference_backward(d);
  TANDEM_REQUIRE_EMPTY(grads_close("one-call", run_backward(be, d, draw_want(d.plan)), exp, sc));
  TANDEM_REQUIRE_EMPTY(grads_close("separate", run_backward_separate(be, d), exp, sc));
  if (!be.attention_forward_lse || !be.attention_backward_saved) return;
  TANDEM_REQUIRE_EMPTY(
      grads_close("saved-state", run_backward_saved(be, d, run_forward_lse(be, d)), exp, sc));
}

// ----------------------------------------------------------------- gradient

void features_gradient(const Backend& be) {
  TANDEM_REQUIRE_EMPTY(complex_step_mismatch(
      be, *gen_attention(features().with(&AttentionGen::paged, Draw::never).with_max_dim(17))));
}

// ---------------------------------------------------------------- semantics

/// The dense case d (drawn with parameters `c`) rewritten with a bias mask
/// `[B, H, Sq, Sk + extra]`: column j < Sk holds `term(b, h, i, j)` plus d's own
/// bias where key j is visible and −inf where it is hidden; the `extra`
/// columns are left 0 for the caller, and so are k, v and every option but
/// the mask.
AttentionData as_bias(const AttentionCase& c, const AttentionData& d, i64 extra,
                      const std::function<double(i64, i64, i64, i64)>& term) {
  const AttentionPlan& p = d.plan;
  AttentionParams pe = c.params;
  pe.Sk = p.Sk + extra;
  pe.mask = MaskKind::bias;
  pe.window = 0;
  pe.bias_batch = p.B;
  pe.bias_heads = p.H;
  AttentionData e = with_plan(d, pe);
  const i64 W = p.Sk + extra;
  e.mask.assign(static_cast<std::size_t>(p.B * p.H * p.Sq * W), 0.0f);
  for (i64 b = 0; b < p.B; ++b)
    for (i64 h = 0; h < p.H; ++h)
      for (i64 i = 0; i < p.Sq; ++i)
        for (i64 j = 0; j < p.Sk; ++j) {
          const double bias = p.mask == MaskKind::bias ? d.mask[p.mask_row(b, h, i) + j] : 0.0;
          e.mask[((b * p.H + h) * p.Sq + i) * W + j] =
              visible(p, d.mask, b, h, i, j) ? static_cast<float>(bias + term(b, h, i, j)) : -kInf;
        }
  return e;
}

/// A sink ≡ one more key per batch entry, last, with k = 0, v = 0, visible to
/// every query, whose score (a bias column) is sink[h]; the other columns
/// carry the mask as a bias (0 or −inf, plus the bias itself).
void sink_equals_extra_key(const Backend& be) {
  AttentionCase c = *gen_attention(AttentionGen{}.with(&AttentionGen::sinks, Draw::always));
  const AttentionData d = make_data(c);
  const AttentionPlan& p = d.plan;
  c.params.sinks = false;
  AttentionData e = as_bias(c, d, 1, [](i64, i64, i64, i64) { return 0.0; });
  e.sinks.clear();
  const auto extend = [&](const std::vector<float>& t, i64 width) {
    std::vector<float> out;
    for (i64 b = 0; b < p.B; ++b) {
      append_rows(out, t, b * p.Sk, p.Sk, p.Hkv * width);
      out.insert(out.end(), static_cast<std::size_t>(p.Hkv * width), 0.0f);
    }
    return out;
  };
  e.k = extend(d.k, p.D);
  e.v = extend(d.v, p.Dv);
  for (i64 row = 0; row < p.B * p.H * p.Sq; ++row) {
    e.mask[row * (p.Sk + 1) + p.Sk] = d.sinks[(row / p.Sq) % p.H];
  }
  const AttentionScales sc = scales(d);
  TANDEM_REQUIRE_EMPTY(attention_same("out: sinks vs an extra key of value 0", run_forward(be, d),
                                      run_forward(be, e), sc.out, sc));
  const Want no_dsinks{true, true, true, false};
  const Grads gd = run_backward(be, d, no_dsinks), ge = run_backward(be, e, no_dsinks);
  const auto drop_extra = [&](const std::vector<float>& t, i64 width) {
    std::vector<float> out;
    for (i64 b = 0; b < p.B; ++b) append_rows(out, t, b * (p.Sk + 1), p.Sk, p.Hkv * width);
    return out;
  };
  TANDEM_REQUIRE_EMPTY(attention_same("dq: sinks vs extra key", gd.dq, ge.dq, sc.dq, sc));
  TANDEM_REQUIRE_EMPTY(
      attention_same("dk: sinks vs extra key", gd.dk, drop_extra(ge.dk, p.D), sc.dk, sc));
  TANDEM_REQUIRE_EMPTY(
      attention_same("dv: sinks vs extra key", gd.dv, drop_extra(ge.dv, p.Dv), sc.dv, sc));
}

/// ALiBi ≡ the bias −m·abs(i + Sk − Sq − j) (plus the mask as 0 / −inf, plus
/// the bias itself), forward and backward.
void alibi_equals_bias(const Backend& be) {
  AttentionCase c = *gen_attention(AttentionGen{}
                                       .with(&AttentionGen::alibi, Draw::always)
                                       .with(&AttentionGen::sinks, Draw::sometimes));
  const AttentionData d = make_data(c);
  const AttentionPlan& p = d.plan;
  c.params.alibi = AlibiKind::none;
  AttentionData e = as_bias(c, d, 0, [&](i64 b, i64 h, i64 i, i64 j) {
    return -double(d.slopes[p.slope_at(b, h)]) * double(std::abs(i + p.Sk - p.Sq - j));
  });
  e.slopes.clear();
  const AttentionScales sc = scales(d);
  TANDEM_REQUIRE_EMPTY(
      attention_same("out: ALiBi vs its bias", run_forward(be, d), run_forward(be, e), sc.out, sc));
  TANDEM_REQUIRE_EMPTY(
      grads_same("ALiBi vs its bias:", run_backward(be, d), run_backward(be, e), sc));
}

/// Packed sequences ≡ one dense call per sequence (its own alignment, its
/// ALiBi row, the same sinks); padding keys get dk = dv = 0, dsinks add up.
void varlen_equals_per_sequence(const Backend& be) {
  const AttentionData d =
      make_data(*gen_attention(features().with(&AttentionGen::varlen, Draw::always)));
  const AttentionPlan& p = d.plan;
  const AttentionScales sc = scales(d);
  const Sequences seqs(d);
  const i64 qw = p.H * p.Dv, qd = p.H * p.D, kd = p.Hkv * p.D, kv = p.Hkv * p.Dv;
  std::vector<float> out, dq;
  std::vector<float> dk(d.k.size(), 0.0f), dv(d.v.size(), 0.0f);
  std::vector<double> dsinks(d.sinks.size(), 0.0);
  for (i64 n = 0; n < seqs.size(); ++n) {
    const AttentionSeq s = seqs[n];
    if (s.Sq == 0) continue;
    if (s.Sk == 0) {  // no key: out and dq rows are 0
      out.insert(out.end(), static_cast<std::size_t>(s.Sq * qw), 0.0f);
      dq.insert(dq.end(), static_cast<std::size_t>(s.Sq * qd), 0.0f);
      continue;
    }
    AttentionData e;
    e.plan = AttentionPlan::make(dense_like(p, s.Sq, s.Sk, p.alibi != AlibiKind::none));
    append_rows(e.q, d.q, s.q_start, s.Sq, qd);
    append_rows(e.dout, d.dout, s.q_start, s.Sq, qw);
    append_rows(e.k, d.k, s.k_start, s.Sk, kd);
    append_rows(e.v, d.v, s.k_start, s.Sk, kv);
    e.sinks = d.sinks;
    if (p.alibi != AlibiKind::none) e.slopes = slopes_of(d, n);
    const auto o = run_forward(be, e);
    out.insert(out.end(), o.begin(), o.end());
    const Grads g = run_backward(be, e);
    dq.insert(dq.end(), g.dq.begin(), g.dq.end());
    std::copy(g.dk.begin(), g.dk.end(), dk.begin() + s.k_start * kd);
    std::copy(g.dv.begin(), g.dv.end(), dv.begin() + s.k_start * kv);
    for (std::size_t h = 0; h < dsinks.size(); ++h) dsinks[h] += g.dsinks[h];
  }
  TANDEM_REQUIRE_EMPTY(
      attention_same("out: packed vs per sequence", run_forward(be, d), out, sc.out, sc));
  const Grads g = run_backward(be, d);
  TANDEM_REQUIRE_EMPTY(attention_same("dq: packed vs per sequence", g.dq, dq, sc.dq, sc));
  TANDEM_REQUIRE_EMPTY(attention_same("dk: packed vs per sequence", g.dk, dk, sc.dk, sc));
  TANDEM_REQUIRE_EMPTY(attention_same("dv: packed vs per sequence", g.dv, dv, sc.dv, sc));
  TANDEM_REQUIRE_EMPTY(
      attention_close("dsinks: packed vs the sum over sequences", g.dsinks, dsinks, sc.dsinks, sc));
}

/// NaN in the padding keys of every slot (past seqused_k) changes no bit of
/// out, lse or the gradients (row-stride gaps hold NaN in both runs).
void varlen_padding_never_read(const Backend& be) {
  AttentionGen g = features().with(&AttentionGen::varlen, Draw::always);
  g.seqused_gaps = true;
  const AttentionData d = make_data(*gen_attention(g));
  const AttentionPlan& p = d.plan;
  const Sequences seqs(d);
  AttentionData e = d;
  i64 poisoned = 0;
  for (i64 n = 0; n < seqs.size(); ++n) {
    const AttentionSeq s = seqs[n];
    for (i64 j = s.k_start + s.Sk; j < d.cu_k[n + 1]; ++j, ++poisoned) {
      std::fill_n(e.k.begin() + j * p.Hkv * p.D, p.Hkv * p.D, junk());
      std::fill_n(e.v.begin() + j * p.Hkv * p.Dv, p.Hkv * p.Dv, junk());
    }
  }
  RC_ASSERT(poisoned > 0);
  TANDEM_REQUIRE_EMPTY(
      bit_mismatch("out with NaN padding keys", run_forward(be, e), run_forward(be, d)));
  if (be.attention_forward_lse) {
    TANDEM_REQUIRE_EMPTY(bit_mismatch("lse with NaN padding keys", run_forward_lse(be, e).lse,
                                      run_forward_lse(be, d).lse));
  }
  const Grads ge = run_backward(be, e), gd = run_backward(be, d);
  TANDEM_REQUIRE_EMPTY(bit_mismatch("dq with NaN padding keys", ge.dq, gd.dq));
  TANDEM_REQUIRE_EMPTY(bit_mismatch("dk with NaN padding keys", ge.dk, gd.dk));
  TANDEM_REQUIRE_EMPTY(bit_mismatch("dv with NaN padding keys", ge.dv, gd.dv));
  TANDEM_REQUIRE_EMPTY(bit_mismatch("dsinks with NaN padding keys", ge.dsinks, gd.dsinks));
}

/// The keys of batch entry b of a paged case, gathered into `[cache_seqlens[b], Hkv, width]`.
std::vector<float> gathered(const AttentionData& d, const AttentionSeq& s,
                            const std::vector<float>& t, i64 width) {
  const AttentionPlan& p = d.plan;
  std::vector<float> out;
  for (i64 j = 0; j < s.Sk; ++j) {
    const KeyRow r = s.key_row(j);
    append_rows(out, t, r.batch * p.block_size + r.seq, 1, p.Hkv * width);
  }
  return out;
}

/// A paged cache ≡ attention over each batch entry's gathered contiguous
/// cache (its own length and causal alignment, its ALiBi row): out and lse.
void paged_equals_gathered_cache(const Backend& be) {
  const AttentionData d =
      make_data(*gen_attention(features().with(&AttentionGen::paged, Draw::always)));
  const AttentionPlan& p = d.plan;
  const AttentionScales sc = scales(d);
  const Sequences seqs(d);
  std::vector<float> out, lse;
  for (i64 b = 0; b < p.B; ++b) {
    const AttentionSeq s = seqs[b];
    if (s.Sk == 0) {  // an empty cache: out 0, lse = sink (or −inf)
      out.insert(out.end(), static_cast<std::size_t>(p.Sq * p.H * p.Dv), 0.0f);
      for (i64 h = 0; h < p.H; ++h)
        lse.insert(lse.end(), static_cast<std::size_t>(p.Sq), p.sinks ? d.sinks[h] : -kInf);
      continue;
    }
    AttentionData e;
    e.plan = AttentionPlan::make(dense_like(p, p.Sq, s.Sk, p.alibi != AlibiKind::none));
    append_rows(e.q, d.q, b * p.Sq, p.Sq, p.H * p.D);
    append_rows(e.dout, d.dout, b * p.Sq, p.Sq, p.H * p.Dv);
    e.k = gathered(d, s, d.k, p.D);
    e.v = gathered(d, s, d.v, p.Dv);
    e.sinks = d.sinks;
    if (p.alibi != AlibiKind::none) e.slopes = slopes_of(d, b);
    const auto o = run_forward(be, e);
    out.insert(out.end(), o.begin(), o.end());
    if (be.attention_forward_lse) {
      const auto l = run_forward_lse(be, e).lse;
      lse.insert(lse.end(), l.begin(), l.end());
    }
  }
  TANDEM_REQUIRE_EMPTY(
      attention_same("out: paged vs gathered cache", run_forward(be, d), out, sc.out, sc));
  if (!be.attention_forward_lse) return;
  const double lse_scale = 1 + sc.L + std::log(double(p.Sk + 1));
  TANDEM_REQUIRE_EMPTY(attention_same("lse: paged vs gathered cache", run_forward_lse(be, d).lse,
                                      lse, lse_scale, sc));
}

/// NaN in every block no used table entry names, and in the slots past each
/// cache's length, changes no bit of out or lse.
void paged_unused_blocks_never_read(const Backend& be) {
  const AttentionData d =
      make_data(*gen_attention(features().with(&AttentionGen::paged, Draw::always)));
  const AttentionPlan& p = d.plan;
  const Sequences seqs(d);
  std::vector<char> read(static_cast<std::size_t>(p.num_blocks * p.block_size), 0);
  for (i64 b = 0; b < p.B; ++b) {
    const AttentionSeq s = seqs[b];
    for (i64 j = 0; j < s.Sk; ++j) {
      const KeyRow r = s.key_row(j);
      read[r.batch * p.block_size + r.seq] = 1;
    }
  }
  AttentionData e = d;
  i64 poisoned = 0;
  for (i64 slot = 0; slot < p.num_blocks * p.block_size; ++slot) {
    if (read[slot]) continue;
    ++poisoned;
    std::fill_n(e.k.begin() + slot * p.Hkv * p.D, p.Hkv * p.D, junk());
    std::fill_n(e.v.begin() + slot * p.Hkv * p.Dv, p.Hkv * p.Dv, junk());
  }
  RC_CLASSIFY(poisoned == 0, "every slot in use");
  TANDEM_REQUIRE_EMPTY(
      bit_mismatch("out with NaN in unused blocks", run_forward(be, e), run_forward(be, d)));
  if (!be.attention_forward_lse) return;
  TANDEM_REQUIRE_EMPTY(bit_mismatch("lse with NaN in unused blocks", run_forward_lse(be, e).lse,
                                    run_forward_lse(be, d).lse));
}

// ------------------------------------------------------------------- memory

/// The entry points a features case can call (the backward ones not for a paged cache).
enum FeatureOp { kFwd, kFwdLse, kBwd, kBwdSaved, kDq, kDk, kDv, kFeatureOps };
const char* feature_op_name(int op) {
  static const char* names[] = {"attention_forward",     "attention_forward_lse",
                                "attention_backward",    "attention_backward_saved",
                                "attention_backward_dq", "attention_backward_dk",
                                "attention_backward_dv"};
  return names[op];
}

/// The placed memory and guarded outputs of one call of `op` on a features case.
struct FeatureCall {
  const AttentionData& d;
  std::vector<float> q, k, v, dout, out_saved, lse_saved;
  IndexStore idx;
  std::vector<Guarded> outs;

  FeatureCall(const AttentionData& data, int op, Want want)
      : d(data),
        q(place<float, float>(d.plan.q, d.plan.B, d.plan.Sq, d.plan.H, d.plan.D,
                              std::span<const float>(d.q))),
        k(place<float, float>(d.plan.k, d.plan.kv_batch(), d.plan.kv_seq(), d.plan.Hkv, d.plan.D,
                              std::span<const float>(d.k))),
        v(place<float, float>(d.plan.v, d.plan.kv_batch(), d.plan.kv_seq(), d.plan.Hkv, d.plan.Dv,
                              std::span<const float>(d.v))),
        dout(place<float, float>(d.plan.o, d.plan.B, d.plan.Sq, d.plan.H, d.plan.Dv,
                                 std::span<const float>(d.dout))),
        idx(data) {
    const AttentionPlan& p = d.plan;
    outs.reserve(4);
    switch (op) {
      case kFwd:
        outs.emplace_back(p.o.extent);
        break;
      case kFwdLse:
        outs.emplace_back(p.o.extent);
        outs.emplace_back(p.lse_size());
        break;
      case kBwd:
      case kBwdSaved:
        outs.emplace_back(want.dq ? p.dq.extent : 0);
        outs.emplace_back(want.dk ? p.dk.extent : 0);
        outs.emplace_back(want.dv ? p.dv.extent : 0);
        outs.emplace_back(want.dsinks && p.sinks ? p.H : 0);
        break;
      default:
        outs.emplace_back(op == kDq ? p.dq.extent : op == kDk ? p.dk.extent : p.dv.extent);
    }
    if (op == kBwdSaved) {  // the state the reference's forward saves
      out_saved.resize(p.o.extent);
      lse_saved.resize(p.lse_size());
      reference::attention_forward_lse<float>(p, in(), std::span<float>(out_saved),
                                              std::span<float>(lse_saved));
    }
  }
  [[nodiscard]] AttentionInputs<float> in() const {
    AttentionInputs<float> r{q, k, v, d.mask};
    r.sinks = d.sinks;
    idx.attach(r);
    return r;
  }
  void run(const Backend& be, int op, const AttentionInputs<float>& ai) {
    const AttentionPlan& p = d.plan;
    switch (op) {
      case kFwd:
        be.attention_forward(p, ai, outs[0].view());
        break;
      case kFwdLse:
        be.attention_forward_lse(p, ai, outs[0].view(), outs[1].view());
        break;
      case kBwd:
        be.attention_backward(p, ai, dout,
                              {outs[0].view(), outs[1].view(), outs[2].view(), outs[3].view()});
        break;
      case kBwdSaved:
        be.attention_backward_saved(
            p, ai, {out_saved, lse_saved}, dout,
            {outs[0].view(), outs[1].view(), outs[2].view(), outs[3].view()});
        break;
      case kDq:
        be.attention_backward_dq(p, ai, dout, outs[0].view());
        break;
      case kDk:
        be.attention_backward_dk(p, ai, dout, outs[0].view());
        break;
      default:
        be.attention_backward_dv(p, ai, dout, outs[0].view());
    }
  }
};

/// Draws a features case and an entry point it can call on `be`.
std::pair<AttentionData, int> draw_call(const Backend& be, AttentionGen g) {
  AttentionData d = make_data(*gen_attention(g));
  int op = *rc::gen::inRange(0, int(kFeatureOps));
  if (d.plan.paged() && op >= kBwd) op = op % 2;  // a paged cache is forward only
  if ((op == kFwdLse && !be.attention_forward_lse) ||
      (op == kBwdSaved && !(be.attention_forward_lse && be.attention_backward_saved))) {
    op = kFwd;
  }
  return {std::move(d), op};
}

/// Guards around every output untouched, every output element written, the
/// inputs (gaps, sinks, slopes and index inputs included) unchanged.
void features_memory(const Backend& be) {
  const auto [d, op] = draw_call(be, features());
  RC_TAG(feature_op_name(op));
  const AttentionData before = d;
  FeatureCall call(d, op, draw_want(d.plan));
  const auto q = call.q, k = call.k, v = call.v, dout = call.dout;
  call.run(be, op, call.in());
  for (std::size_t i = 0; i < call.outs.size(); ++i) {
    std::string m = call.outs[i].guard_damage();
    if (m.empty()) m = call.outs[i].unwritten();
    if (!m.empty())
      RC_FAIL(std::string(feature_op_name(op)) + " output " + std::to_string(i) + ": " + m);
  }
  TANDEM_REQUIRE_EMPTY(bit_mismatch("q (gaps included)", call.q, q));
  TANDEM_REQUIRE_EMPTY(bit_mismatch("k (gaps included)", call.k, k));
  TANDEM_REQUIRE_EMPTY(bit_mismatch("v (gaps included)", call.v, v));
  TANDEM_REQUIRE_EMPTY(bit_mismatch("dout (gaps included)", call.dout, dout));
  TANDEM_REQUIRE_EMPTY(bit_mismatch("sinks", d.sinks, before.sinks));
  TANDEM_REQUIRE_EMPTY(bit_mismatch("alibi_slopes", d.slopes, before.slopes));
}

/// One invalid feature input of a valid case: the input's name as the Error
/// must give it, after the corruption has been applied to `d`.
std::string corrupt(AttentionData& d) {
  const AttentionPlan& p = d.plan;
  std::vector<std::function<std::string()>> ways;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (p.sinks) {
    ways.emplace_back([&] {
      d.sinks[static_cast<std::size_t>(*rc::gen::inRange<i64>(0, p.H))] =
          *rc::gen::element(nan, kInf, -kInf);
      return std::string("sinks");
    });
    ways.emplace_back([&] {
      d.sinks.pop_back();
      return std::string("sinks.size()");
    });
  }
  if (p.alibi != AlibiKind::none) {
    ways.emplace_back([&] {
      d.slopes[static_cast<std::size_t>(*rc::gen::inRange<i64>(0, p.slopes_size()))] = nan;
      return std::string("alibi_slopes");
    });
  }
  if (p.varlen()) {
    const i64 n = p.num_seqs;
    for (auto* cu : {&d.cu_q, &d.cu_k}) {
      const char* name = cu == &d.cu_q ? "cu_seqlens_q" : "cu_seqlens_k";
      ways.emplace_back([cu, name] {
        (*cu)[0] = 1;  // does not start at 0
        return std::string(name);
      });
      ways.emplace_back([cu, name, n] {
        (*cu)[static_cast<std::size_t>(n)] += 1;  // does not end at the total
        return std::string(name);
      });
      if (n >= 2) {
        ways.emplace_back([cu, name, n] {
          const auto s = static_cast<std::size_t>(*rc::gen::inRange<i64>(1, n));
          (*cu)[s] = (*cu)[s + 1] + 1;  // decreases after s
          return std::string(name);
        });
      }
    }
    ways.emplace_back([&d, n] {
      if (d.used.empty()) {
        d.used.resize(static_cast<std::size_t>(n));
        for (std::size_t s = 0; s < d.used.size(); ++s) d.used[s] = d.cu_k[s + 1] - d.cu_k[s];
      }
      const auto s = static_cast<std::size_t>(*rc::gen::inRange<i64>(0, n));
      d.used[s] = *rc::gen::element<i64>(-1, d.cu_k[s + 1] - d.cu_k[s] + 1);
      return std::string("seqused_k");
    });
  }
  if (p.paged()) {
    ways.emplace_back([&d, &p] {
      const auto b = static_cast<std::size_t>(*rc::gen::inRange<i64>(0, p.B));
      d.lens[b] = *rc::gen::element<i64>(-1, p.Sk + 1);
      return std::string("cache_seqlens");
    });
    i64 used_b = -1;
    for (i64 b = 0; b < p.B; ++b) used_b = d.lens[b] > 0 ? b : used_b;
    if (used_b >= 0) {
      ways.emplace_back([&d, &p, used_b] {
        const i64 used = (d.lens[used_b] + p.block_size - 1) / p.block_size;
        const i64 e = used_b * p.max_blocks + *rc::gen::inRange<i64>(0, used);
        d.table[e] = *rc::gen::element<i64>(-1, p.num_blocks, p.num_blocks + 7);
        return std::string("block_table");
      });
    }
  }
  RC_PRE(!ways.empty());
  return ways[static_cast<std::size_t>(*rc::gen::inRange<std::size_t>(0, ways.size()))]();
}

/// A call with one invalid feature input throws tandem::Error naming that
/// input before anything is written: every output keeps its sentinels.
void features_invalid_rejected(const Backend& be) {
  auto [d, op] = draw_call(be, features().with(&AttentionGen::sinks, Draw::always));
  FeatureCall call(d, op, draw_want(d.plan));  // (built from the valid case)
  const std::string name = corrupt(d);
  RC_TAG(name, feature_op_name(op));
  const IndexStore bad(d);
  AttentionInputs<float> ai = call.in();
  ai.sinks = d.sinks;
  bad.attach(ai);
  std::string thrown;
  try {
    call.run(be, op, ai);
  } catch (const Error& e) {
    thrown = e.parameter();
  }
  if (thrown != name) {
    RC_FAIL(std::string(feature_op_name(op)) + " with a bad " + name + " threw " +
            (thrown.empty() ? "nothing" : "an Error about " + thrown));
  }
  for (std::size_t i = 0; i < call.outs.size(); ++i) {
    const auto values = call.outs[i].values();
    for (std::size_t e = 0; e < values.size(); ++e) {
      if (!is_sentinel(values[e])) {
        RC_FAIL(std::string(feature_op_name(op)) + " wrote output " + std::to_string(i) + "[" +
                std::to_string(e) + "] before rejecting a bad " + name);
      }
    }
  }
}

// -------------------------------------------------------------- determinism

/// Identical bits on a repeated call and at every thread variant.
void features_deterministic(const Subject& s) {
  const std::uint64_t seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
  const auto replay = [&](const Backend& be) {
    return rc::gen::exec([&] {
             const auto [d, op] = draw_call(be, features());
             FeatureCall call(d, op, Want{});
             call.run(be, op, call.in());
             Outputs r;
             for (const Guarded& g : call.outs) r.push_back(g.values());
             return r;
           })(rc::Random(seed), 30)
        .value();
  };
  TANDEM_REQUIRE_EMPTY(same_bits_on_every_run(s, replay, "a features call"));
}

template <void (*F)(const Backend&)>
std::function<void(const Subject&)> on_backend() {
  return [](const Subject& s) { F(s.backend); };
}

}  // namespace

void register_feature_properties(std::vector<Property>& v) {
  const auto add = [&v](const char* name, const char* group, int cases,
                        std::function<void(const Subject&)> body) {
    v.push_back({name, group, cases, std::move(body), true});
  };
  add("agree_attention_features_forward", "agreement", 300, on_backend<agree_features_forward>());
  add("agree_attention_features_backward", "agreement", 200, on_backend<agree_features_backward>());
  add("attention_features_gradient_complex_step", "gradient", 150, on_backend<features_gradient>());
  add("sink_equals_extra_key", "semantic", 100, on_backend<sink_equals_extra_key>());
  add("alibi_equals_bias", "semantic", 100, on_backend<alibi_equals_bias>());
  add("varlen_equals_per_sequence", "semantic", 100, on_backend<varlen_equals_per_sequence>());
  add("varlen_padding_never_read", "semantic", 100, on_backend<varlen_padding_never_read>());
  add("paged_equals_gathered_cache", "semantic", 100, on_backend<paged_equals_gathered_cache>());
  add("paged_unused_blocks_never_read", "semantic", 100,
      on_backend<paged_unused_blocks_never_read>());
  add("attention_features_memory", "memory", 200, on_backend<features_memory>());
  add("attention_features_invalid_rejected_before_writes", "memory", 150,
      on_backend<features_invalid_rejected>());
  add("attention_features_deterministic", "determinism", 100, features_deterministic);
}

}  // namespace tandem::props
