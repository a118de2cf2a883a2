// SPDX-License-Identifier: Apache-2.0
// The fixture's low-precision entry points (SPEC §10): attention at bf16 and
// f16 storage computed as a float32 kernel would (scores, weights and sums in
// float, rounded to T at SPEC §10.2's points), the quantized cache (§10.4) at
// f32, bf16 and f16, and RoPE, axial RoPE and SwiGLU at bf16 and f16 as the
// float fixture's result rounded once. Each low-precision bug of Bug is
// planted here; the correct version follows the spec's formulas line by line.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "broken.hpp"
#include "tandem/tandem.hpp"

namespace tandem::props::broken {
namespace {

using i64 = std::int64_t;
constexpr float kLog2e = 1.44269504088896340736f;
constexpr float kLn2 = 0.69314718055994530942f;

/// The value of T next to x towards zero (x itself when it is 0 or not finite).
template <class T>
T toward_zero(T x) {
  if ((x.bits & 0x7FFF) == 0) return x;
  x.bits = static_cast<std::uint16_t>(x.bits - 1);
  return x;
}

/// y stored as T: RN_T, or truncated towards zero with Bug::store_truncates.
template <class T>
T store(double y, Bug bug) {
  T r(y);
  if constexpr (!std::is_same_v<T, float>) {
    if (bug == Bug::store_truncates && std::isfinite(y) &&
        std::abs(static_cast<double>(r)) > std::abs(y)) {
      r = toward_zero(r);
    }
  }
  return r;
}

/// RN_T(x) as a float (T = float: x).
template <class T>
float round_t(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return static_cast<float>(T(static_cast<double>(x)));
  }
}

/// x rounded to 3 fraction bits (an e4m3's precision without its range).
float three_bits(float x) {
  if (x == 0.0f || !std::isfinite(x)) return x;
  int e = 0;
  const float f = std::frexp(x, &e);  // x = f·2^e, 0.5 <= |f| < 1
  return std::ldexp(std::nearbyint(f * 16.0f) / 16.0f, e);
}

/// SPEC §2's visibility of key j of sequence s to its query i (head h): the
/// causal and window masks aligned per sequence at q_offset (SPEC §2.9).
bool sees(const AttentionPlan& p, std::span<const float> mask, const AttentionSeq& s, i64 h, i64 i,
          i64 j) {
  const i64 a = s.q_offset() + i;
  switch (p.mask) {
    case MaskKind::none:
      return true;
    case MaskKind::causal:
      return j <= a;
    case MaskKind::sliding_window:
      return j <= a && j >= a - p.window;
    case MaskKind::key_padding:
      return mask[s.b * p.Sk + j] != 0.0f;
    case MaskKind::bias:
      return mask[p.mask_row(s.b, h, i) + j] != -std::numeric_limits<float>::infinity();
  }
  return false;
}

/// Where key j of s lives (SPEC §2.10), with Bug::paged_blocks_reversed_bf16
/// planted at bf16: the sequence's row of the block table read back to front.
template <class T>
KeyRow key_row(const AttentionPlan& p, const AttentionSeq& s, i64 j, Bug bug) {
  if (std::is_same_v<T, bfloat16> && bug == Bug::paged_blocks_reversed_bf16 && p.paged()) {
    const i64 used = (s.Sk + p.block_size - 1) / p.block_size;
    return {s.blocks[static_cast<std::size_t>(used - 1 - j / p.block_size)], j % p.block_size};
  }
  return s.key_row(j);
}

/// How one call reads its keys and values: plain rows of T, or codes and scales.
template <class T>
struct KeyValues {
  const AttentionPlan& p;
  const AttentionInputs<T>& in;
  const QuantizedKv* kv = nullptr;
  Bug bug;

  [[nodiscard]] float code(std::span<const std::uint8_t> c, i64 at) const {
    if (p.kv_cache == KvCache::int8) return static_cast<float>(static_cast<std::int8_t>(c[at]));
    return static_cast<float>(float8_e4m3::from_bits(c[at]));
  }
  /// <q_i, k_j> in float, with k_j's scale (query i of s, head h, key j at `key`).
  [[nodiscard]] float dot(const AttentionSeq& s, i64 i, i64 h, const KeyRow& key) const {
    const i64 g = p.kv_head(h), qa = p.q.at(s.b, s.q_row(i), h);
    const i64 ka = p.k.at(key.batch, key.seq, g);
    float acc = 0.0f;
    for (i64 d = 0; d < p.D; ++d) {
      const float kd = kv ? code(kv->k, ka + d) : static_cast<float>(in.k[ka + d]);
      acc += static_cast<float>(in.q[qa + d]) * kd;
    }
    return kv ? acc * kv->k_scale[p.kv_scale_at(key.batch, key.seq, g)] : acc;
  }
  /// The scale that multiplies key j's weight (1 for plain values).
  [[nodiscard]] float v_scale(const KeyRow& key, i64 h) const {
    if (!kv || bug == Bug::decode_drops_v_scale) return 1.0f;
    return kv->v_scale[p.kv_scale_at(key.batch, key.seq, p.kv_head(h))];
  }
  [[nodiscard]] float value(const KeyRow& key, i64 h, i64 d) const {
    const i64 at = p.v.at(key.batch, key.seq, p.kv_head(h)) + d;
    return kv ? code(kv->v, at) : static_cast<float>(in.v[at]);
  }
};

/// Query i of sequence s at head h, in float32: s_j = c·tanh(scale·<q_i, k_j>/c)
/// − slope·|i + Sk − Sq − j| + bias_ij (SPEC §2, §2.8) for the keys it sees,
/// cap_j = 1 − tanh²(·) (1 without a softcap), and m = the largest s_j and the sink.
struct ScoreRow {
  std::vector<float> s, cap;
  std::vector<KeyRow> key;
  std::vector<char> vis;
  i64 n = 0;
  float m = -INFINITY;
};
template <class T>
ScoreRow scores(const KeyValues<T>& kvs, const AttentionSeq& s, i64 h, i64 i) {
  const AttentionPlan& p = kvs.p;
  ScoreRow r;
  r.s.assign(s.Sk, 0.0f);
  r.cap.assign(s.Sk, 1.0f);
  r.key.resize(s.Sk);
  r.vis.assign(s.Sk, 0);
  if (p.sinks) r.m = static_cast<float>(kvs.in.sinks[h]);
  for (i64 j = 0; j < s.Sk; ++j) {
    if (!sees(p, kvs.in.mask, s, h, i, j)) continue;
    r.vis[j] = 1;
    ++r.n;
    r.key[j] = key_row<T>(p, s, j, kvs.bug);
    float x = static_cast<float>(p.scale) * kvs.dot(s, i, h, r.key[j]);
    if (p.softcap > 0) {
      const float t = std::tanh(x / static_cast<float>(p.softcap));
      x = static_cast<float>(p.softcap) * t;
      r.cap[j] = 1 - t * t;
    }
    if (p.alibi != AlibiKind::none) {
      const float slope = kvs.in.alibi_slopes[p.slope_at(s.n, h)];
      x -= slope * static_cast<float>(std::abs(i + s.alibi_shift() - j));
    }
    if (p.mask == MaskKind::bias) x += kvs.in.mask[p.mask_row(s.b, h, i) + j];
    r.s[j] = x;
    r.m = std::max(r.m, x);
  }
  return r;
}

/// SPEC §10.2's forward for one plan (every sequence, block table, sink and
/// ALiBi slope): μ_i = ⌈m_i·log2 e⌉, e_ij = 2^(x_ij − μ_i), w_ij = RN_T(e_ij)
/// (operands), l_i = 2^(sink·log2 e − μ_i) + Σ_j e_ij, o_i = RN_T(Σ_j w_ij v_j / l_i),
/// every sum in float32.
template <class T>
void forward(const KeyValues<T>& kvs, std::span<T> out, std::span<stat_t<T>> lse) {
  const AttentionPlan& p = kvs.p;
  const Bug bug = kvs.bug;
  const bool operands = is_low_precision_v<T> && p.rounding.operands;
  std::vector<float> acc(p.Dv);
  for (i64 n = 0; n < p.sequences(); ++n) {
    const AttentionSeq s = p.sequence(kvs.in, n);
    for (i64 h = 0; h < p.H; ++h) {
      for (i64 i = 0; i < s.Sq; ++i) {
        const ScoreRow r = scores(kvs, s, h, i);
        const i64 o_at = p.o.at(s.b, s.q_row(i), h), lse_at = p.lse_at(s.b, h, s.q_row(i));
        if (!lse.empty()) lse[lse_at] = -INFINITY;
        if (r.n == 0 && !p.sinks) {
          for (i64 d = 0; d < p.Dv; ++d) out[o_at + d] = T(0.0);
          continue;
        }
        // Bug::weights_non_integer_max: the running max itself, not a whole power of two
        const float mu =
            bug == Bug::weights_non_integer_max ? r.m * kLog2e : std::ceil(r.m * kLog2e);
        float l = 0.0f;
        if (p.sinks) {
          l = std::exp2(static_cast<float>(kvs.in.sinks[h]) * kLog2e - mu);
          if (bug == Bug::sink_weight_rounded && operands) l = round_t<T>(l);
        }
        // Bug::exact_rounds_masked_rows: a row that hides a key takes the rounded weights
        const bool round_w = operands || (bug == Bug::exact_rounds_masked_rows &&
                                          is_low_precision_v<T> && r.n < s.Sk);
        std::vector<float> w(s.Sk, 0.0f);
        for (i64 j = 0; j < s.Sk; ++j) {
          if (!r.vis[j]) continue;
          const float e = std::exp2(r.s[j] * kLog2e - mu);
          l += e;
          w[j] = round_w ? round_t<T>(e) : e;
          if (bug == Bug::weights_three_bits) w[j] = three_bits(e);
          w[j] *= kvs.v_scale(r.key[j], h);
        }
        if (bug == Bug::weights_rounded_twice && operands) {  // P = RN_T(RN_T(e) / l), o = P·V
          for (i64 j = 0; j < s.Sk; ++j) w[j] = r.vis[j] ? round_t<T>(w[j] / l) * l : 0.0f;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (i64 j = 0; j < s.Sk; ++j) {
          if (!r.vis[j]) continue;
          for (i64 d = 0; d < p.Dv; ++d) {
            acc[d] += w[j] * kvs.value(r.key[j], h, d);
            if (bug == Bug::output_accumulated_in_t) acc[d] = round_t<T>(acc[d]);
          }
        }
        for (i64 d = 0; d < p.Dv; ++d) out[o_at + d] = store<T>(acc[d] / l, bug);
        if (!lse.empty()) lse[lse_at] = mu * kLn2 + std::log(l);
      }
    }
  }
}

/// What the fixture implements at low precision: every feature, the pytorch
/// and exact profiles.
void require_supported(const AttentionPlan& p, bool low_precision) {
  require(!low_precision || !p.rounding.output_accumulator, "rounding",
          std::string(p.rounding.name), "is not implemented (pytorch and exact are)");
}

template <class T>
void attention_forward_t(const AttentionPlan& p, const AttentionInputs<T>& in, std::span<T> out,
                         std::span<stat_t<T>> lse, Bug bug) {
  if (bug == Bug::quantized_plan_unchecked && p.kv_cache != KvCache::plain) {
    std::fill(out.begin(), out.end(), T(0.0));  // writes, then validates
  }
  check_inputs(p, in);
  require_supported(p, true);
  require_size(out.size(), p.o.extent, "out");
  if (!lse.empty()) require_size(lse.size(), p.lse_size(), "lse");
  forward<T>(KeyValues<T>{p, in, nullptr, bug}, out, lse);
}

template <class T>
void attention_quantized_t(const AttentionPlan& p, const AttentionInputs<T>& in,
                           const QuantizedKv& kv, std::span<T> out, Bug bug) {
  check_inputs(p, in, kv);
  require_supported(p, is_low_precision_v<T>);
  require_size(out.size(), p.o.extent, "out");
  forward<T>(KeyValues<T>{p, in, &kv, bug}, out, {});
}

/// The float32 sums of one backward: dq `[B,Sq,H,D]`, dk `[B',S',Hkv,D]`,
/// dv `[B',S',Hkv,Dv]` (logical, bshd order), dsinks `[H]` and dbias `[Bb,Hb,Sq,Sk]`.
struct BackwardSums {
  std::vector<float> dq, dk, dv;
  std::vector<double> dsinks;
  std::vector<float> dsinks_f;  ///< Bug::dsinks_accumulated_in_t: the sum kept in T
  std::vector<double> dbias;    ///< empty: not asked for
  std::vector<float> dbias_f;   ///< Bug::dbias_accumulated_in_t: the sum kept in T
};

/// Adds query i of sequence s (head h) to the sums: SPEC §10.2's backward
/// (pytorch: RN_T(p_ij) before dV, RN_T(dx_ij) before dQ and dK; exact:
/// neither) from the stored O_i (in T) and lse_i (float32); the sink's
/// −p_sink,i·δ_i to dsinks and ds_ij = p_ij·(dp_ij − δ_i) to dbias.
template <class T>
void backward_row(const KeyValues<T>& kvs, std::span<const T> dout, std::span<const T> o, float lse,
                  const AttentionSeq& s, i64 h, i64 i, Bug bug, BackwardSums& g) {
  const AttentionPlan& p = kvs.p;
  const auto rnd = [&p](float x) { return p.rounding.operands ? round_t<T>(x) : x; };
  const ScoreRow r = scores(kvs, s, h, i);
  const i64 oa = p.o.at(s.b, s.q_row(i), h), qa = p.q.at(s.b, s.q_row(i), h), gk = p.kv_head(h);
  float delta = 0;
  for (i64 e = 0; e < p.Dv; ++e) delta += float(dout[oa + e]) * float(o[oa + e]);
  if (p.sinks) {
    const float term = -std::exp(static_cast<float>(kvs.in.sinks[h]) - lse) * delta;
    g.dsinks[h] += term;
    g.dsinks_f[h] = round_t<T>(g.dsinks_f[h] + term);
  }
  const i64 q_row = (s.b * p.Sq + s.q_row(i)) * p.H + h;
  for (i64 j = 0; j < s.Sk; ++j) {
    if (!r.vis[j]) continue;
    const KeyRow& key = r.key[j];
    const float pij = std::exp(r.s[j] - lse);
    float dp = 0;
    for (i64 e = 0; e < p.Dv; ++e) dp += float(dout[oa + e]) * kvs.value(key, h, e);
    const float ds = pij * (dp - delta), dx = rnd(ds * r.cap[j]);
    if (!g.dbias.empty()) {
      const i64 at = p.mask_row(s.b, h, i) + j;
      g.dbias[at] += ds;
      g.dbias_f[at] = round_t<T>(g.dbias_f[at] + ds);
    }
    // Bug::dv_weights_unrounded: dV from p_ij itself under the pytorch profile
    const float wp = bug == Bug::dv_weights_unrounded ? pij : rnd(pij);
    const i64 kv_row = (key.batch * p.kv_seq() + key.seq) * p.Hkv + gk;
    const i64 ka = p.k.at(key.batch, key.seq, gk);
    for (i64 e = 0; e < p.D; ++e) {
      g.dq[q_row * p.D + e] += dx * float(kvs.in.k[ka + e]);
      g.dk[kv_row * p.D + e] += dx * float(kvs.in.q[qa + e]);
    }
    for (i64 e = 0; e < p.Dv; ++e) g.dv[kv_row * p.Dv + e] += wp * float(dout[oa + e]);
  }
}

/// The backward from the fixture's own forward (lse in float32, O stored in
/// T), every sum in float32 but those of dsinks and dbias (double, rounded
/// once; with Bug::dsinks_accumulated_in_t, Bug::dbias_accumulated_in_t
/// rounded to T after every term).
template <class T>
void attention_backward_t(const AttentionPlan& p, const AttentionInputs<T>& in,
                          std::span<const T> dout, const AttentionGrads<T>& g, Bug bug) {
  check_inputs(p, in);
  require_supported(p, true);
  check_grads(p, g);
  std::vector<T> o(static_cast<std::size_t>(p.o.extent));
  std::vector<float> lse(static_cast<std::size_t>(p.lse_size()));
  const KeyValues<T> kvs{p, in, nullptr, Bug::none};
  forward<T>(kvs, o, lse);
  const i64 kv_rows = p.kv_batch() * p.kv_seq() * p.Hkv;
  BackwardSums sums{std::vector<float>(p.B * p.Sq * p.H * p.D),
                    std::vector<float>(kv_rows * p.D),
                    std::vector<float>(kv_rows * p.Dv),
                    std::vector<double>(p.sinks ? p.H : 0),
                    std::vector<float>(p.sinks ? p.H : 0),
                    std::vector<double>(g.dbias.empty() ? 0 : p.mask_size()),
                    std::vector<float>(g.dbias.empty() ? 0 : p.mask_size())};
  for (i64 n = 0; n < p.sequences(); ++n) {
    const AttentionSeq s = p.sequence(in, n);
    for (i64 h = 0; h < p.H; ++h)
      for (i64 i = 0; i < s.Sq; ++i) {
        const float l = lse[p.lse_at(s.b, h, s.q_row(i))];
        if (l == -INFINITY) continue;
        backward_row<T>(kvs, dout, o, l, s, h, i, bug, sums);
      }
  }
  const float scale = static_cast<float>(p.scale);
  for (i64 b = 0; b < p.B; ++b)
    for (i64 i = 0; i < p.Sq; ++i)
      for (i64 h = 0; h < p.H; ++h)
        for (i64 e = 0; e < p.D && !g.dq.empty(); ++e)
          g.dq[p.dq.at(b, i, h) + e] =
              store<T>(scale * sums.dq[((b * p.Sq + i) * p.H + h) * p.D + e], bug);
  for (i64 b = 0; b < p.kv_batch(); ++b)
    for (i64 j = 0; j < p.kv_seq(); ++j)
      for (i64 gk = 0; gk < p.Hkv; ++gk) {
        const i64 kv_row = (b * p.kv_seq() + j) * p.Hkv + gk;
        for (i64 e = 0; e < p.D && !g.dk.empty(); ++e)
          g.dk[p.dk.at(b, j, gk) + e] = store<T>(scale * sums.dk[kv_row * p.D + e], bug);
        for (i64 e = 0; e < p.Dv && !g.dv.empty(); ++e)
          g.dv[p.dv.at(b, j, gk) + e] = store<T>(sums.dv[kv_row * p.Dv + e], bug);
      }
  for (std::size_t h = 0; h < g.dsinks.size(); ++h) {
    g.dsinks[h] = bug == Bug::dsinks_accumulated_in_t ? T(static_cast<double>(sums.dsinks_f[h]))
                                                      : store<T>(sums.dsinks[h], bug);
  }
  for (std::size_t n = 0; n < g.dbias.size(); ++n) {
    g.dbias[n] = bug == Bug::dbias_accumulated_in_t ? T(static_cast<double>(sums.dbias_f[n]))
                                                    : store<T>(sums.dbias[n], bug);
  }
}

/// round_even(y) clamped to ±127, or (Bug::quantize_truncates) truncated.
std::uint8_t int8_code(float y, Bug bug) {
  const float r = bug == Bug::quantize_truncates ? std::trunc(y) : std::nearbyint(y);
  return static_cast<std::uint8_t>(static_cast<std::int8_t>(std::clamp(r, -127.0f, 127.0f)));
}
std::uint8_t e4m3_code(float y, Bug bug) {
  float8_e4m3 c(static_cast<double>(y));
  if (bug == Bug::quantize_truncates && std::abs(static_cast<double>(c)) > std::abs(y) &&
      (c.bits & 0x7F) != 0) {
    c.bits = static_cast<std::uint8_t>(c.bits - 1);
  }
  return c.bits;
}

/// SPEC §10.4: the codes and scales of one of k, v (width W, through st).
template <class T>
void quantize_one(const AttentionPlan& p, const Strides& st, i64 W, std::span<const T> x,
                  std::span<std::uint8_t> codes, std::span<float> scales, Bug bug) {
  const bool e4m3 = p.kv_cache == KvCache::e4m3;
  const float top = e4m3 ? 448.0f : 127.0f;
  std::fill(scales.begin(), scales.end(), 0.0f);
  for (i64 b = 0; b < p.kv_batch(); ++b)
    for (i64 s = 0; s < p.kv_seq(); ++s)
      for (i64 g = 0; g < p.Hkv; ++g)
        for (i64 d = 0; d < W; ++d) {
          float& sc = scales[p.kv_scale_at(b, s, g)];
          sc = std::max(sc, std::abs(static_cast<float>(x[st.at(b, s, g) + d])));
        }
  for (float& sc : scales) sc /= top;  // RN_f32(max / top)
  for (i64 b = 0; b < p.kv_batch(); ++b)
    for (i64 s = 0; s < p.kv_seq(); ++s)
      for (i64 g = 0; g < p.Hkv; ++g) {
        const float sc = scales[p.kv_scale_at(b, s, g)];
        for (i64 d = 0; d < W; ++d) {
          const i64 at = st.at(b, s, g) + d;
          const float y = sc == 0.0f ? 0.0f : static_cast<float>(x[at]) / sc;
          codes[at] = e4m3 ? e4m3_code(y, bug) : int8_code(y, bug);
        }
      }
}

template <class T>
void quantize_kv_t(const AttentionPlan& p, std::span<const T> k, std::span<const T> v,
                   const QuantizedKvOut& out, Bug bug) {
  check_quantize(p, k, v, out);
  quantize_one<T>(p, p.k, p.D, k, out.k, out.k_scale, bug);
  quantize_one<T>(p, p.v, p.Dv, v, out.v, out.v_scale, bug);
}

template <class T>
std::vector<float> widen(std::span<const T> x) {
  std::vector<float> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = static_cast<float>(x[i]);
  return r;
}
template <class T>
void narrow(const std::vector<float>& y, std::span<T> out, Bug bug) {
  for (std::size_t i = 0; i < y.size(); ++i) out[i] = store<T>(y[i], bug);
}

/// RoPE, axial RoPE and SwiGLU at T: the float fixture's result (every
/// element from the exact inputs, sums in double) rounded once.
template <class T>
void elementwise_ops(Kernels<T>& kt, const Backend& f, Bug bug) {
  const auto tables = [](const RopeTables<T>& t, std::vector<float>& c, std::vector<float>& s) {
    c = widen<T>(t.cos);
    s = widen<T>(t.sin);
    return RopeTables<float>{c, s, t.positions};
  };
  const auto rope = [bug, tables](const Kernels<float>::Rope& fn) {
    return [fn, bug, tables](const RopePlan& p, std::span<const T> src, const RopeTables<T>& t,
                             std::span<T> dst) {
      std::vector<float> c, s, y(dst.size());
      fn(p, widen<T>(src), tables(t, c, s), y);
      narrow<T>(y, dst, bug);
    };
  };
  kt.rope_forward = rope(f.rope_forward);
  kt.rope_backward = rope(f.rope_backward);
  const auto axial = [bug](const Kernels<float>::AxialRope& fn) {
    return [fn, bug](const AxialRopePlan& p, std::span<const T> src, std::span<T> dst) {
      std::vector<float> y(dst.size());
      fn(p, widen<T>(src), y);
      narrow<T>(y, dst, bug);
    };
  };
  kt.axial_rope_forward = axial(f.axial_rope_forward);
  kt.axial_rope_backward = axial(f.axial_rope_backward);
  kt.swiglu_forward = [fn = f.swiglu_forward, bug](const SwigluPlan& p, std::span<const T> x,
                                                   std::span<T> out) {
    std::vector<float> y(out.size());
    fn(p, widen<T>(x), y);
    narrow<T>(y, out, bug);
  };
  kt.swiglu_backward = [fn = f.swiglu_backward, bug](const SwigluPlan& p, std::span<const T> x,
                                                     std::span<const T> dy, std::span<T> dx) {
    std::vector<float> y(dx.size());
    fn(p, widen<T>(x), widen<T>(dy), y);
    narrow<T>(y, dx, bug);
  };
}

template <class T>
void quantized_entries(Kernels<T>& kt, Bug bug) {
  kt.attention_forward_quantized = [bug](const AttentionPlan& p, const AttentionInputs<T>& in,
                                         const QuantizedKv& kv, std::span<T> out) {
    attention_quantized_t<T>(p, in, kv, out, bug);
  };
  kt.quantize_kv = [bug](const AttentionPlan& p, std::span<const T> k, std::span<const T> v,
                         const QuantizedKvOut& out) { quantize_kv_t<T>(p, k, v, out, bug); };
}

/// b[o] + Σ_e a[r·K + e]·w[o·K + e] in double, for o < N, of each row r < M,
/// stored to T (RN_T, or the store bug).
template <class T>
std::vector<T> project(std::span<const T> a, std::span<const T> w, std::span<const T> b, i64 M,
                       i64 N, i64 K, Bug bug) {
  std::vector<T> c(M * N);
  for (i64 r = 0; r < M; ++r) {
    for (i64 o = 0; o < N; ++o) {
      double acc = b.empty() ? 0.0 : static_cast<double>(b[o]);
      for (i64 e = 0; e < K; ++e) {
        acc += static_cast<double>(a[r * K + e]) * static_cast<double>(w[o * K + e]);
      }
      c[r * N + o] = store<T>(acc, bug);
    }
  }
  return c;
}

/// The block at T (SPEC §10.2): qkv = RN_T(projection), kt's rope and attention on it,
/// out = RN_T(projection); with Bug::block_qkv_unrounded the float fixture's block
/// on the widened inputs, its output rounded once.
template <class T>
void block_t(const Kernels<T>& kt, const Kernels<float>& f, const AttentionBlockPlan& p,
             const AttentionBlockInputs<T>& in, std::span<T> out, Bug bug) {
  check_views(p, in, out.size());
  const i64 E = p.E, rows = p.B * p.S;
  if (bug == Bug::block_qkv_unrounded) {
    const auto x = widen<T>(in.x), wq = widen<T>(in.w_qkv), bq = widen<T>(in.b_qkv);
    const auto wo = widen<T>(in.w_out), bo = widen<T>(in.b_out);
    const auto c = widen<T>(in.cos), s = widen<T>(in.sin);
    std::vector<float> y(out.size());
    f.attention_block(p, {x, wq, bq, wo, bo, in.keep, c, s}, y);
    narrow<T>(y, out, Bug::none);
    return;
  }
  const std::vector<T> qkv = project<T>(in.x, in.w_qkv, in.b_qkv, rows, 3 * E, E, bug);
  std::vector<T> qr(p.rotated_size()), kr(p.rotated_size());
  const RopeTables<T> t{in.cos, in.sin};
  const AttentionInputs<T> ai = block_attention_inputs<T>(
      p, std::span<const T>(qkv), in.keep, std::span<T>(qr), std::span<T>(kr),
      [&](const RopePlan& rp, std::span<const T> src, std::span<T> dst) {
        kt.rope_forward(rp, src, t, dst);
      });
  std::vector<T> att(p.attention.o.extent);
  kt.attention_forward(p.attention, ai, att);
  const std::vector<T> y = project<T>(att, in.w_out, in.b_out, rows, E, E, bug);
  std::copy(y.begin(), y.end(), out.begin());
}

template <class T>
Kernels<T> low_precision_kernels(const Backend& f, Bug bug) {
  Kernels<T> kt;
  kt.attention_forward = [bug](const AttentionPlan& p, const AttentionInputs<T>& in,
                               std::span<T> out) { attention_forward_t<T>(p, in, out, {}, bug); };
  kt.attention_forward_lse = [bug](const AttentionPlan& p, const AttentionInputs<T>& in,
                                   std::span<T> out, std::span<float> lse) {
    require_size(lse.size(), p.lse_size(), "lse");
    attention_forward_t<T>(p, in, out, lse, bug);
  };
  kt.attention_backward = [bug](const AttentionPlan& p, const AttentionInputs<T>& in,
                                std::span<const T> dout, const AttentionGrads<T>& g) {
    attention_backward_t<T>(p, in, dout, g, bug);
  };
  quantized_entries<T>(kt, bug);
  elementwise_ops<T>(kt, f, bug);
  // (parts of the block: copies of kt's rope and attention as bound above)
  kt.attention_block = [parts = kt, fk = static_cast<const Kernels<float>&>(f), bug](
                           const AttentionBlockPlan& p, const AttentionBlockInputs<T>& in,
                           std::span<T> out) { block_t<T>(parts, fk, p, in, out, bug); };
  return kt;
}

}  // namespace

void attach_low_precision(Backend& be, Bug bug) {
  quantized_entries<float>(be, bug);
  be.bf16 = low_precision_kernels<bfloat16>(be, bug);
  be.f16 = low_precision_kernels<float16>(be, bug);
}

}  // namespace tandem::props::broken
