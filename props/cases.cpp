// SPDX-License-Identifier: Apache-2.0
// Generators, data and runners of the property suite.
#include "cases.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tandem/reference/attention.hpp"
#include "tandem/reference/axial_rope.hpp"
#include "tandem/reference/rope.hpp"
#include "tandem/reference/swiglu.hpp"

namespace tandem::props {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

/// A size: mostly small, often at a SIMD lane edge (4, 8, 16, 32 and their
/// neighbours), sometimes anything up to `max`.
rc::Gen<i64> gen_dim(i64 max) {
  std::vector<i64> edges;
  for (i64 x : {3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33}) {
    if (x <= max) edges.push_back(x);
  }
  return rc::gen::weightedOneOf<i64>({{5, rc::gen::inRange<i64>(1, std::min<i64>(7, max + 1))},
                                      {4, rc::gen::elementOf(edges)},
                                      {1, rc::gen::inRange<i64>(1, max + 1)}});
}

std::uint64_t gen_seed() {
  return *rc::gen::inRange<std::uint64_t>(0, 1000000);
}

template <class T>
std::span<const T> cspan(const std::vector<T>& v) {
  return std::span<const T>(v);
}

}  // namespace

// ================================================================ attention

std::ostream& operator<<(std::ostream& os, const AttentionCase& c) {
  os << AttentionPlan::make(c.params).describe() << " | data seed=" << c.seed
     << " |q|,|k|<=" << c.qk_mag;
  if (c.params.mask == MaskKind::key_padding || c.params.mask == MaskKind::bias) {
    os << " hidden~" << c.hide << (c.masked_rows ? " +fully-masked rows" : "");
  }
  const auto list = [&os](const char* name, const std::vector<i64>& v) {
    if (v.empty()) return;
    os << " " << name << "=[";
    for (std::size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
    os << "]";
  };
  if (c.params.sinks) os << " |sinks|<=" << c.sink_mag;
  if (c.extreme != Extreme::none) {
    os << " extreme=" << to_string(c.extreme);
    if (c.extreme == Extreme::huge_logits || c.extreme == Extreme::equal_logits)
      os << " max|s|=" << c.logit_target;
    if (c.extreme == Extreme::subnormal) {
      os << " x" << c.tiny_scale << " on" << (c.tiny_q ? " q" : "") << (c.tiny_k ? " k" : "")
         << (c.tiny_v ? " v" : "") << (c.tiny_dout ? " dO" : "");
    }
  }
  if (c.params.alibi != AlibiKind::none)
    os << (c.standard_slopes ? " standard" : " random") << " slopes";
  list("q_lens", c.q_lens);
  list("k_slots", c.k_slots);
  list("k_used", c.k_used);
  list("cache_lens", c.cache_lens);
  if (!c.q_lens.empty() || !c.cache_lens.empty()) os << (c.index64 ? " int64" : " int32");
  return os;
}

namespace {

bool draws(Draw d) {
  return d == Draw::always || (d == Draw::sometimes && *rc::gen::element(false, true));
}

/// Packed sequences (SPEC §2.9): 1–4 sequences, some empty, slots with
/// padding past seqused_k sometimes (always with `gaps`).
void gen_varlen(AttentionCase& c, bool gaps) {
  AttentionParams& p = c.params;
  const auto n = static_cast<std::size_t>(*rc::gen::inRange<i64>(1, 5));
  const auto len = [] {
    return *rc::gen::weightedOneOf<i64>(
        {{1, rc::gen::just<i64>(0)}, {5, rc::gen::inRange<i64>(1, 7)}, {2, gen_dim(17)}});
  };
  c.q_lens.resize(n);
  c.k_slots.resize(n);
  for (std::size_t s = 0; s < n; ++s) {
    c.q_lens[s] = len();
    c.k_slots[s] = len();
  }
  if (gaps || *rc::gen::element(false, false, true)) {
    c.k_used.resize(n);
    for (std::size_t s = 0; s < n; ++s) c.k_used[s] = *rc::gen::inRange<i64>(0, c.k_slots[s] + 1);
    if (gaps) {  // at least one padding key
      const auto s = static_cast<std::size_t>(*rc::gen::inRange<std::size_t>(0, n));
      c.k_slots[s] = std::max<i64>(c.k_slots[s], 1);
      c.k_used[s] = std::min(c.k_used[s], c.k_slots[s] - 1);
    }
  }
  // make() wants at least one query row and one key row
  if (std::accumulate(c.q_lens.begin(), c.q_lens.end(), i64(0)) == 0) c.q_lens[0] = 1;
  if (std::accumulate(c.k_slots.begin(), c.k_slots.end(), i64(0)) == 0) {
    c.k_slots[0] = 1;
    if (!c.k_used.empty()) c.k_used[0] = *rc::gen::inRange<i64>(0, 2);
  }
  p.B = 1;
  p.num_seqs = static_cast<i64>(n);
  p.Sq = std::accumulate(c.q_lens.begin(), c.q_lens.end(), i64(0));
  p.Sk = std::accumulate(c.k_slots.begin(), c.k_slots.end(), i64(0));
}

/// A paged cache (SPEC §2.10): blocks of 1–16 keys, caches of 0–17 keys (some
/// empty), spare table entries and unused blocks.
void gen_paged(AttentionCase& c) {
  AttentionParams& p = c.params;
  p.block_size = *rc::gen::element<i64>(1, 2, 3, 4, 4, 8, 16);
  p.Sq =
      *rc::gen::weightedOneOf<i64>({{2, rc::gen::just<i64>(1)}, {1, rc::gen::inRange<i64>(2, 6)}});
  c.cache_lens.resize(static_cast<std::size_t>(p.B));
  i64 longest = 0, used = 0;
  for (i64& len : c.cache_lens) {
    len = *rc::gen::weightedOneOf<i64>({{1, rc::gen::just<i64>(0)}, {6, gen_dim(17)}});
    longest = std::max(longest, len);
    used += (len + p.block_size - 1) / p.block_size;
  }
  p.max_blocks = std::max<i64>(1, (longest + p.block_size - 1) / p.block_size) +
                 *rc::gen::element<i64>(0, 0, 1, 2);
  p.num_blocks = std::max<i64>(1, used) + *rc::gen::element<i64>(0, 1, 3);
  p.Sk = 0;
}

/// Whether a rare draw (one case in `one_in`, at any size) happens; a
/// shrink moves away from it.
bool draws_rarely(Draw d, int one_in) {
  return d == Draw::always || (d == Draw::sometimes &&
                               *rc::gen::weightedElement<bool>({{one_in - 1, false}, {1, true}}));
}

/// A dense shape at the edges of the optimized backend's default geometry,
/// which a case of at most 17 keys and queries never reaches: keys around
/// one and two key blocks of 64, and from the 2048 keys at which a decode
/// step splits its keys (2 chunks of 1024, for heads of up to 2048 floats of
/// K and V rows per key); or queries around one and two tiles of 384 query
/// rows (192 under causal and sliding-window masks) of the G heads of a
/// group. One batch entry and D, Dv <= 16 keep the reference quick.
void gen_long_shape(AttentionParams& p) {
  p.B = 1;
  p.D = std::min<i64>(p.D, 16);
  p.Dv = std::min<i64>(p.Dv, 16);
  if (*rc::gen::arbitrary<bool>()) {  // long keys
    p.Sk = *rc::gen::element<i64>(63, 64, 65, 127, 128, 129, 2047, 2048, 2049);
    p.Sq = *rc::gen::weightedOneOf<i64>({{3, rc::gen::just<i64>(1)}, {1, gen_dim(17)}});
  } else {  // long queries
    const bool banded = p.mask == MaskKind::causal || p.mask == MaskKind::sliding_window;
    const i64 tile = (banded ? 192 : 384) / (p.H / p.Hkv);
    p.Sq = tile + *rc::gen::element<i64>(-1, 0, 1, tile + 1);
    p.Sk = *rc::gen::weightedOneOf<i64>({{3, gen_dim(17)}, {1, rc::gen::element<i64>(63, 64, 65)}});
  }
}

/// The numerical extreme of a dense case (Extreme).
void gen_extreme(AttentionCase& c) {
  std::vector<Extreme> kinds{Extreme::huge_logits, Extreme::subnormal, Extreme::equal_scores,
                             Extreme::equal_logits};
  if (c.params.mask == MaskKind::bias) kinds.push_back(Extreme::far_bias);
  c.extreme = *rc::gen::elementOf(kinds);
  c.logit_target = *rc::gen::element(1e4, 3e3, 300.0);
  if (c.extreme == Extreme::subnormal) {
    c.tiny_scale = *rc::gen::element(0x1p-130, 0x1p-140);
    const int which =  // a non-empty subset of q, k, v, dO
        *rc::gen::element(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    c.tiny_q = (which & 1) != 0;
    c.tiny_k = (which & 2) != 0;
    c.tiny_v = (which & 4) != 0;
    c.tiny_dout = (which & 8) != 0;
  }
}

}  // namespace

const char* to_string(Extreme e) {
  switch (e) {
    case Extreme::none:
      return "none";
    case Extreme::huge_logits:
      return "huge_logits";
    case Extreme::far_bias:
      return "far_bias";
    case Extreme::subnormal:
      return "subnormal";
    case Extreme::equal_scores:
      return "equal_scores";
    case Extreme::equal_logits:
      return "equal_logits";
  }
  return "?";
}

rc::Gen<AttentionCase> gen_attention(AttentionGen g) {
  return rc::gen::exec([g] {
    AttentionCase c;
    AttentionParams& p = c.params;
    p.B = *rc::gen::inRange<i64>(1, 4);
    p.Sq = *rc::gen::weightedOneOf<i64>({{1, rc::gen::just<i64>(1)}, {4, gen_dim(17)}});
    p.Sk = *rc::gen::weightedOneOf<i64>({{1, rc::gen::just<i64>(1)}, {6, gen_dim(17)}});
    const i64 kv = *rc::gen::inRange<i64>(1, 4);
    const i64 group = *rc::gen::element<i64>(1, 1, 2, 3, 4);  // MHA, GQA, MQA (kv = 1)
    p.H = kv * group;
    p.Hkv = kv;
    p.D = *gen_dim(g.max_dim);
    p.Dv = *rc::gen::weightedOneOf<i64>({{1, rc::gen::just<i64>(0)}, {1, gen_dim(g.max_dim)}});
    // the key structure: dense, packed sequences or a paged cache
    const bool mask_by_position =
        g.mask && (*g.mask == MaskKind::key_padding || *g.mask == MaskKind::bias);
    bool varlen = false, paged = false;
    if (!mask_by_position) {
      if (g.varlen == Draw::always) {
        varlen = true;
      } else if (g.paged == Draw::always) {
        paged = true;
      } else {
        const int structure = *rc::gen::inRange(0, 3);
        varlen = structure == 1 && g.varlen == Draw::sometimes;
        paged = structure == 2 && g.paged == Draw::sometimes;
      }
    }
    if (varlen) gen_varlen(c, g.seqused_gaps);
    if (paged) gen_paged(c);
    if (varlen || paged) c.index64 = *rc::gen::arbitrary<bool>();
    p.layout = paged      ? Layout::bshd
               : g.layout ? *g.layout
                          : *rc::gen::element(Layout::bshd, Layout::bhsd);
    if (g.mask) {
      p.mask = *g.mask;
    } else if (varlen || paged) {
      p.mask = *rc::gen::element(MaskKind::none, MaskKind::causal, MaskKind::sliding_window);
    } else {
      p.mask = *rc::gen::element(MaskKind::none, MaskKind::causal, MaskKind::sliding_window,
                                 MaskKind::key_padding, MaskKind::bias);
    }
    const bool dense = !varlen && !paged;
    if (dense && draws_rarely(g.long_shapes, 10)) gen_long_shape(p);
    if (p.mask == MaskKind::sliding_window) {
      const i64 sk = paged ? p.max_blocks * p.block_size : p.Sk;
      p.window = *rc::gen::weightedOneOf<i64>({{2, rc::gen::just<i64>(0)},
                                               {3, rc::gen::inRange<i64>(0, sk + 1)},
                                               {2, rc::gen::inRange<i64>(sk, sk + 4)},
                                               {1, rc::gen::just<i64>(1000)}});
    }
    if (p.mask == MaskKind::bias) {
      p.bias_batch = *rc::gen::element<i64>(1, p.B);
      p.bias_heads = *rc::gen::element<i64>(1, p.H);
    }
    if (p.mask == MaskKind::key_padding || p.mask == MaskKind::bias) {
      c.masked_rows = *rc::gen::element(false, false, true);
      c.hide = *rc::gen::element(0.0, 0.3, 0.7);
    }
    const int scale_kind = *rc::gen::inRange(0, 4);
    if (scale_kind == 2) {  // small, either sign
      p.scale = *rc::gen::element(1.0, -1.0) * *rc::gen::inRange(5, 100) / 100.0;
    } else if (scale_kind == 3) {  // large logits
      p.scale = *rc::gen::inRange(100, 800) / 100.0;
    }
    c.qk_mag = *rc::gen::element(0.5, 1.0, 1.0, 3.0);
    if (g.softcap && *rc::gen::element(false, false, true)) {
      p.softcap = *rc::gen::element(0.5, 2.0, 5.0, 20.0, 50.0);
    }
    if (p.layout == Layout::bshd && g.strides && *rc::gen::element(false, true)) {
      // read out of a wider parent, e.g. a fused QKV row
      p.q_row_stride = p.H * p.D + *rc::gen::inRange<i64>(0, 6);
      const i64 dv = p.Dv == 0 ? p.D : p.Dv;
      p.k_row_stride = kv * p.D + *rc::gen::inRange<i64>(0, 6);
      p.v_row_stride = kv * dv + *rc::gen::inRange<i64>(0, 6);
    }
    if (draws(g.sinks)) {
      p.sinks = true;
      c.sink_mag = *rc::gen::element(0.5, 2.0, 6.0);
    }
    if (draws(g.alibi)) {
      p.alibi = *rc::gen::element(AlibiKind::per_head, AlibiKind::per_batch_head);
      c.standard_slopes = *rc::gen::arbitrary<bool>();
    }
    if (dense && !p.sinks && p.alibi == AlibiKind::none && draws_rarely(g.extremes, 8)) {
      gen_extreme(c);
    }
    c.seed = gen_seed();
    return c;
  });
}

namespace {

/// Offsets [n+1] of the lengths [n].
std::vector<i64> offsets(const std::vector<i64>& lens) {
  std::vector<i64> cu(lens.size() + 1, 0);
  std::partial_sum(lens.begin(), lens.end(), cu.begin() + 1);
  return cu;
}

/// The block table of a paged case: every used entry names a distinct block
/// (in a shuffled order), every spare entry holds junk (−1 or any index).
std::vector<i64> block_table(const AttentionPlan& p, const std::vector<i64>& lens, Rng& r) {
  std::vector<i64> blocks(static_cast<std::size_t>(p.num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  for (std::size_t i = blocks.size(); i > 1; --i) {
    std::swap(blocks[i - 1], blocks[static_cast<std::size_t>(r.index(static_cast<i64>(i)))]);
  }
  std::vector<i64> table(static_cast<std::size_t>(p.B * p.max_blocks));
  std::size_t next = 0;
  for (i64 b = 0; b < p.B; ++b) {
    const i64 used = (lens[b] + p.block_size - 1) / p.block_size;
    for (i64 e = 0; e < p.max_blocks; ++e) {
      table[b * p.max_blocks + e] =
          e < used ? blocks[next++] : (r.coin(0.5) ? -1 : r.index(p.num_blocks + 10) - 5);
    }
  }
  return table;
}

/// Pushes the data of a dense case to its extreme (Extreme).
void apply_extreme(const AttentionCase& c, AttentionData& d, Rng& r) {
  const AttentionPlan& p = d.plan;
  const i64 G = p.group();
  const auto scale_all = [](std::vector<float>& t, double f) {
    for (float& x : t) x = static_cast<float>(double(x) * f);
  };
  if (c.extreme == Extreme::equal_scores || c.extreme == Extreme::equal_logits) {
    for (i64 b = 0; b < p.B; ++b)  // k[b, j, g] = k[b, 0, g]
      for (i64 j = 1; j < p.Sk; ++j)
        std::copy_n(d.k.begin() + b * p.Sk * p.Hkv * p.D, p.Hkv * p.D,
                    d.k.begin() + (b * p.Sk + j) * p.Hkv * p.D);
  }
  if (c.extreme == Extreme::huge_logits || c.extreme == Extreme::equal_logits) {
    double smax = 0;  // max |scale·<q_i, k_j>| over every pair of a kv head
    for (i64 b = 0; b < p.B; ++b)
      for (i64 i = 0; i < p.Sq; ++i)
        for (i64 h = 0; h < p.H; ++h)
          for (i64 j = 0; j < p.Sk; ++j) {
            double dot = 0;
            for (i64 x = 0; x < p.D; ++x)
              dot += double(d.q[((b * p.Sq + i) * p.H + h) * p.D + x]) *
                     d.k[((b * p.Sk + j) * p.Hkv + h / G) * p.D + x];
            smax = std::max(smax, std::abs(p.scale * dot));
          }
    if (smax > 0) {
      const double f = std::sqrt(c.logit_target / smax);
      scale_all(d.q, f);
      scale_all(d.k, f);
    }
  }
  if (c.extreme == Extreme::subnormal) {
    if (c.tiny_q) scale_all(d.q, c.tiny_scale);
    if (c.tiny_k) scale_all(d.k, c.tiny_scale);
    if (c.tiny_v) scale_all(d.v, c.tiny_scale);
    if (c.tiny_dout) scale_all(d.dout, c.tiny_scale);
  }
  if (c.extreme == Extreme::far_bias) {
    // finite, but far below the other scores of a row: their p is 0 in float
    const float far[] = {-1e30f, -std::numeric_limits<float>::max(), -1e4f, -200.0f, -90.0f};
    // Every row keeps one of its finite entries (a row of far entries alone
    // would be a uniform softmax of rounded scores: see logit_bound).
    for (std::size_t row = 0; row < d.mask.size() / static_cast<std::size_t>(p.Sk); ++row) {
      float* x = d.mask.data() + row * p.Sk;
      std::vector<i64> finite;
      for (i64 j = 0; j < p.Sk; ++j)
        if (x[j] != -kInf) finite.push_back(j);
      if (finite.empty()) continue;
      const i64 keep = finite[static_cast<std::size_t>(r.index(static_cast<i64>(finite.size())))];
      for (i64 j : finite)
        if (j != keep && r.coin(0.4)) x[j] = far[r.index(5)];
    }
  }
}

}  // namespace

AttentionData make_data(const AttentionCase& c) {
  AttentionData d;
  d.plan = AttentionPlan::make(c.params);
  const AttentionPlan& p = d.plan;
  Rng r(c.seed);
  d.q = r.values(p.B * p.Sq * p.H * p.D, c.qk_mag);
  d.k = r.values(p.kv_batch() * p.kv_seq() * p.Hkv * p.D, c.qk_mag);
  d.v = r.values(p.kv_batch() * p.kv_seq() * p.Hkv * p.Dv, 1.0);
  d.dout = r.values(p.B * p.Sq * p.H * p.Dv, 1.0);
  if (p.mask == MaskKind::key_padding) {
    d.mask.assign(p.B * p.Sk, 1.0f);
    for (auto& x : d.mask) x = r.coin(c.hide) ? 0.0f : 1.0f;
    if (c.masked_rows) {
      const i64 b = r.index(p.B);
      std::fill(d.mask.begin() + b * p.Sk, d.mask.begin() + (b + 1) * p.Sk, 0.0f);
    }
  } else if (p.mask == MaskKind::bias) {
    d.mask.resize(p.mask_size());
    for (auto& x : d.mask) x = r.coin(c.hide) ? -kInf : static_cast<float>(r.uniform(-2, 2));
    if (c.masked_rows) {
      const i64 row = r.index(p.bias_batch * p.bias_heads * p.Sq);
      std::fill(d.mask.begin() + row * p.Sk, d.mask.begin() + (row + 1) * p.Sk, -kInf);
    }
  }
  if (c.extreme != Extreme::none) apply_extreme(c, d, r);
  if (p.sinks) d.sinks = r.values(static_cast<std::size_t>(p.H), c.sink_mag);
  if (p.alibi != AlibiKind::none) {
    const std::vector<float> standard = alibi_standard_slopes(p.H);
    d.slopes.resize(static_cast<std::size_t>(p.slopes_size()));
    for (std::size_t e = 0; e < d.slopes.size(); ++e) {
      d.slopes[e] =
          c.standard_slopes ? standard[e % standard.size()] : static_cast<float>(r.uniform(0, 1.5));
    }
  }
  if (p.varlen()) {
    d.cu_q = offsets(c.q_lens);
    d.cu_k = offsets(c.k_slots);
    d.used = c.k_used;
  }
  if (p.paged()) {
    d.lens = c.cache_lens;
    d.table = block_table(p, d.lens, r);
  }
  d.index64 = c.index64;
  return d;
}

AttentionData with_plan(const AttentionData& d, const AttentionParams& p) {
  AttentionData e = d;
  e.plan = AttentionPlan::make(p);
  return e;
}

IndexStore::IndexStore(const AttentionData& d) : wide_(d.index64), slopes_(d.slopes) {
  const std::vector<i64>* src[6] = {&d.cu_q, &d.cu_k, &d.used, &d.table, &d.lens, &d.origin};
  for (int w = 0; w < 6; ++w) {
    i64_[w] = *src[w];
    i32_[w].assign(src[w]->begin(), src[w]->end());
  }
}

Indices IndexStore::view(int which) const {
  if (wide_) return Indices(i64_[which]);
  return Indices(i32_[which]);
}

double logit_bound(const AttentionData& d) {
  const AttentionPlan& p = d.plan;
  const auto max_norm = [](const std::vector<float>& t, i64 width) {
    double m = 0;
    for (std::size_t r = 0; r < t.size() / width; ++r) {
      double s = 0;
      for (i64 e = 0; e < width; ++e) s += double(t[r * width + e]) * t[r * width + e];
      m = std::max(m, std::sqrt(s));
    }
    return m;
  };
  double L = std::abs(p.scale) * max_norm(d.q, p.D) * max_norm(d.k, p.D);
  if (p.softcap > 0) L = std::min(L, p.softcap);
  if (p.mask == MaskKind::bias) {
    // A score's rounding error, about ε·|s_ij|, moves the result by about
    // p_ij·ε·|s_ij|. With s_ij = m_i − Δ_ij (m_i the row's largest score,
    // |m_i| <= L + the row's largest finite bias), Σ_j p_ij·|s_ij| <= |m_i| +
    // Σ_j p_ij·Δ_ij <= |m_i| + log Sk: a key far below its row's largest
    // weighs nothing however negative its bias, and each row's bound takes
    // its largest finite bias, not its most negative one.
    double bmax = 0;
    for (std::size_t row = 0; row < d.mask.size() / static_cast<std::size_t>(p.Sk); ++row) {
      double top = -kInf;
      for (i64 j = 0; j < p.Sk; ++j) top = std::max(top, double(d.mask[row * p.Sk + j]));
      if (std::isfinite(top)) bmax = std::max(bmax, std::abs(top));
    }
    L += bmax;
  }
  if (!d.slopes.empty()) {  // ALiBi: at most max|slope|·(Sq + Sk)
    L += max_abs(to_double(d.slopes)) * double(p.Sq + p.Sk);
  }
  if (!d.sinks.empty()) L = std::max(L, max_abs(to_double(d.sinks)));
  return L;
}

namespace {

/// The memory of one call: q, k, v, dout (when the case has one) placed by
/// the plan's strides (junk in every gap), and the feature inputs.
struct Placed {
  std::vector<float> q, k, v, dout;
  IndexStore idx;
  const AttentionData& d;
  explicit Placed(const AttentionData& data)
      : q(place<float, float>(data.plan.q, data.plan.B, data.plan.Sq, data.plan.H, data.plan.D,
                              cspan(data.q))),
        k(place<float, float>(data.plan.k, data.plan.kv_batch(), data.plan.kv_seq(), data.plan.Hkv,
                              data.plan.D, cspan(data.k))),
        v(place<float, float>(data.plan.v, data.plan.kv_batch(), data.plan.kv_seq(), data.plan.Hkv,
                              data.plan.Dv, cspan(data.v))),
        dout(data.dout.empty() ? std::vector<float>{}  // a forward-only case
                               : place<float, float>(data.plan.o, data.plan.B, data.plan.Sq,
                                                     data.plan.H, data.plan.Dv, cspan(data.dout))),
        idx(data),
        d(data) {}
  [[nodiscard]] AttentionInputs<float> in() const {
    AttentionInputs<float> r{cspan(q), cspan(k), cspan(v), cspan(d.mask)};
    r.sinks = cspan(d.sinks);
    idx.attach(r);
    return r;
  }
};

Grads gather_grads(const AttentionPlan& p, const std::vector<float>& dq,
                   const std::vector<float>& dk, const std::vector<float>& dv,
                   std::vector<float> dsinks = {}, std::vector<float> dbias = {}) {
  Grads g;
  g.dbias = std::move(dbias);  // contiguous [Bb, Hb, Sq, Sk] already
  if (!dq.empty()) g.dq = gather<float>(p.dq, p.B, p.Sq, p.H, p.D, cspan(dq));
  if (!dk.empty()) g.dk = gather<float>(p.dk, p.kv_batch(), p.kv_seq(), p.Hkv, p.D, cspan(dk));
  if (!dv.empty()) g.dv = gather<float>(p.dv, p.kv_batch(), p.kv_seq(), p.Hkv, p.Dv, cspan(dv));
  g.dsinks = std::move(dsinks);
  return g;
}

}  // namespace

std::vector<float> run_forward(const Backend& be, const AttentionData& d) {
  const AttentionPlan& p = d.plan;
  const Placed m(d);
  Guarded out(p.o.extent);
  be.attention_forward(p, m.in(), out.view());
  const auto o = out.values();
  return gather<float>(p.o, p.B, p.Sq, p.H, p.Dv, cspan(o));
}

Grads run_backward(const Backend& be, const AttentionData& d, Want want) {
  const AttentionPlan& p = d.plan;
  const Placed m(d);
  want.dsinks = want.dsinks && p.sinks;
  want.dbias = want.dbias && p.mask == MaskKind::bias;
  Guarded dq(want.dq ? p.dq.extent : 0), dk(want.dk ? p.dk.extent : 0),
      dv(want.dv ? p.dv.extent : 0), ds(want.dsinks ? p.H : 0), db(want.dbias ? p.mask_size() : 0);
  be.attention_backward(p, m.in(), cspan(m.dout),
                        {dq.view(), dk.view(), dv.view(), ds.view(), db.view()});
  return gather_grads(p, dq.values(), dk.values(), dv.values(), ds.values(), db.values());
}

Grads run_backward_separate(const Backend& be, const AttentionData& d) {
  const AttentionPlan& p = d.plan;
  const Placed m(d);
  Guarded dq(p.dq.extent), dk(p.dk.extent), dv(p.dv.extent);
  be.attention_backward_dq(p, m.in(), cspan(m.dout), dq.view());
  be.attention_backward_dk(p, m.in(), cspan(m.dout), dk.view());
  be.attention_backward_dv(p, m.in(), cspan(m.dout), dv.view());
  return gather_grads(p, dq.values(), dk.values(), dv.values());
}

Saved run_forward_lse(const Backend& be, const AttentionData& d) {
  const AttentionPlan& p = d.plan;
  const Placed m(d);
  Guarded out(p.o.extent), lse(p.lse_size());
  be.attention_forward_lse(p, m.in(), out.view(), lse.view());
  return {out.values(), lse.values()};
}

Grads run_backward_saved(const Backend& be, const AttentionData& d, const Saved& saved, Want want) {
  const AttentionPlan& p = d.plan;
  const Placed m(d);
  Guarded dq(want.dq ? p.dq.extent : 0), dk(want.dk ? p.dk.extent : 0),
      dv(want.dv ? p.dv.extent : 0), ds(want.dsinks && p.sinks ? p.H : 0),
      db(want.dbias && p.mask == MaskKind::bias ? p.mask_size() : 0);
  be.attention_backward_saved(p, m.in(), {cspan(saved.out), cspan(saved.lse)}, cspan(m.dout),
                              {dq.view(), dk.view(), dv.view(), ds.view(), db.view()});
  return gather_grads(p, dq.values(), dk.values(), dv.values(), ds.values(), db.values());
}

namespace {

template <class T>
std::vector<T> convert(const std::vector<float>& v) {
  return std::vector<T>(v.begin(), v.end());
}

/// The reference's memory of one call at scalar T: placed q, k, v, dout
/// (junk in every gap), sinks, and the feature inputs.
template <class T>
struct PlacedT {
  std::vector<T> q, k, v, dout, sinks;
  IndexStore idx;
  const AttentionData& d;
  PlacedT(const AttentionData& data, std::span<const T> q_, std::span<const T> k_,
          std::span<const T> v_, std::span<const T> sinks_)
      : q(place<T, T>(data.plan.q, data.plan.B, data.plan.Sq, data.plan.H, data.plan.D, q_,
                      T(junk()))),
        k(place<T, T>(data.plan.k, data.plan.kv_batch(), data.plan.kv_seq(), data.plan.Hkv,
                      data.plan.D, k_, T(junk()))),
        v(place<T, T>(data.plan.v, data.plan.kv_batch(), data.plan.kv_seq(), data.plan.Hkv,
                      data.plan.Dv, v_, T(junk()))),
        sinks(sinks_.begin(), sinks_.end()),
        idx(data),
        d(data) {
    const auto dt = convert<T>(data.dout);
    dout = place<T, T>(data.plan.o, data.plan.B, data.plan.Sq, data.plan.H, data.plan.Dv, cspan(dt),
                       T(junk()));
  }
  [[nodiscard]] AttentionInputs<T> in() const {
    AttentionInputs<T> r{cspan(q), cspan(k), cspan(v), cspan(d.mask)};
    r.sinks = cspan(sinks);
    idx.attach(r);
    return r;
  }
};

}  // namespace

std::vector<double> reference_lse(const AttentionData& d) {
  const AttentionPlan& p = d.plan;
  const auto q = to_double(d.q), k = to_double(d.k), v = to_double(d.v), s = to_double(d.sinks);
  const PlacedT<double> m(d, cspan(q), cspan(k), cspan(v), cspan(s));
  std::vector<double> out(p.o.extent), lse(p.lse_size());
  reference::attention_forward_lse<double, double>(p, m.in(), std::span<double>(out),
                                                   std::span<double>(lse));
  return lse;
}

template <class T, class Acc>
std::vector<T> reference_forward(const AttentionData& d, std::span<const T> q, std::span<const T> k,
                                 std::span<const T> v, std::span<const T> sinks,
                                 std::span<const T> bias_step) {
  const AttentionPlan& p = d.plan;
  const PlacedT<T> m(d, q, k, v, sinks);
  std::vector<T> out(p.o.extent);
  reference::attention_forward<T, Acc>(p, m.in(), std::span<T>(out), {}, bias_step);
  return gather<T>(p.o, p.B, p.Sq, p.H, p.Dv, cspan(out));
}
template std::vector<double> reference_forward<double, double>(
    const AttentionData&, std::span<const double>, std::span<const double>, std::span<const double>,
    std::span<const double>, std::span<const double>);
template std::vector<std::complex<double>>
reference_forward<std::complex<double>, std::complex<double>>(
    const AttentionData&, std::span<const std::complex<double>>,
    std::span<const std::complex<double>>, std::span<const std::complex<double>>,
    std::span<const std::complex<double>>, std::span<const std::complex<double>>);

std::vector<double> reference_forward(const AttentionData& d) {
  const auto q = to_double(d.q), k = to_double(d.k), v = to_double(d.v), s = to_double(d.sinks);
  return reference_forward<double, double>(d, cspan(q), cspan(k), cspan(v), cspan(s));
}

std::vector<float> reference_forward_ff(const AttentionData& d) {
  return reference_forward<float, float>(d, cspan(d.q), cspan(d.k), cspan(d.v), cspan(d.sinks));
}

namespace {
template <class T, class Acc>
std::vector<std::vector<T>> reference_backward_t(const AttentionData& d) {
  const AttentionPlan& p = d.plan;
  const auto q = convert<T>(d.q), k = convert<T>(d.k), v = convert<T>(d.v), s = convert<T>(d.sinks);
  const PlacedT<T> m(d, cspan(q), cspan(k), cspan(v), cspan(s));
  std::vector<T> dq(p.dq.extent), dk(p.dk.extent), dv(p.dv.extent), ds(s.size()),
      db(p.mask == MaskKind::bias ? p.mask_size() : 0);
  reference::attention_backward<T, Acc>(p, m.in(), cspan(m.dout),
                                        AttentionGrads<T>{dq, dk, dv, ds, db});
  return {gather<T>(p.dq, p.B, p.Sq, p.H, p.D, cspan(dq)),
          gather<T>(p.dk, p.kv_batch(), p.kv_seq(), p.Hkv, p.D, cspan(dk)),
          gather<T>(p.dv, p.kv_batch(), p.kv_seq(), p.Hkv, p.Dv, cspan(dv)), ds, db};
}
}  // namespace

GradsD reference_backward(const AttentionData& d) {
  auto g = reference_backward_t<double, double>(d);
  return {std::move(g[0]), std::move(g[1]), std::move(g[2]), std::move(g[3]), std::move(g[4])};
}

Grads reference_backward_ff(const AttentionData& d) {
  auto g = reference_backward_t<float, float>(d);
  return {std::move(g[0]), std::move(g[1]), std::move(g[2]), std::move(g[3]), std::move(g[4])};
}

// ===================================================================== rope

std::ostream& operator<<(std::ostream& os, const RopeCase& c) {
  os << RopePlan::make(c.params).describe() << " | data seed=" << c.seed
     << (c.true_tables ? " true cos/sin tables" : " random tables");
  if (c.params.rows == TableRows::position_ids) os << (c.int32_positions ? " int32" : " int64");
  return os;
}

rc::Gen<RopeCase> gen_rope(RopeGen g) {
  return rc::gen::exec([g] {
    RopeCase c;
    RopeParams& p = c.params;
    p.layout = g.layout ? *g.layout
                        : *rc::gen::element(RopeLayout::bshd, RopeLayout::bhsd, RopeLayout::thd);
    p.batch = p.layout == RopeLayout::thd ? 1 : *rc::gen::inRange<i64>(1, 4);
    // Sometimes long and narrow: the optimized bhsd kernel works in blocks of 128 tokens.
    const bool lng =
        *rc::gen::weightedOneOf<bool>({{9, rc::gen::just(false)}, {1, rc::gen::just(true)}});
    p.seq = lng ? *rc::gen::inRange<i64>(120, 300) : *gen_dim(17);
    p.head_dim = *gen_dim(lng ? 9 : 33);
    p.width = p.head_dim * *rc::gen::inRange<i64>(1, lng ? 3 : 4);
    const i64 half = p.head_dim / 2;
    const i64 n_rot =
        g.full_rot ? 2 * half
                   : 2 * *rc::gen::weightedOneOf<i64>({{3, rc::gen::just(half)},
                                                       {1, rc::gen::just<i64>(0)},
                                                       {3, rc::gen::inRange<i64>(0, half + 1)}});
    p.n_rot = n_rot;
    p.style = g.style ? *g.style : *rc::gen::element(RopeStyle::neox, RopeStyle::gptj);
    p.table_stride = n_rot / 2 + *rc::gen::element<i64>(0, 0, 1, 3);
    if (g.rows) {
      p.rows = *g.rows;
    } else if (g.position_ids) {
      p.rows = *rc::gen::element(TableRows::position, TableRows::token, TableRows::position_ids);
    } else {
      p.rows = *rc::gen::element(TableRows::position, TableRows::token);
    }
    switch (p.rows) {
      case TableRows::position:
        p.table_rows = p.seq + *rc::gen::element<i64>(0, 0, 2, 5);
        break;
      case TableRows::token:
        p.table_rows = p.batch * p.seq;
        break;
      case TableRows::position_ids:  // max_position: shorter or longer than S
        p.table_rows = *rc::gen::inRange<i64>(1, 2 * p.seq + 6);
        c.int32_positions = *rc::gen::arbitrary<bool>();
        break;
    }
    if (g.strides && p.layout != RopeLayout::bhsd && *rc::gen::element(false, true)) {
      p.src_row_stride = p.width + *rc::gen::inRange<i64>(1, 6);
    }
    c.true_tables = g.true_tables ? *g.true_tables : *rc::gen::element(false, true);
    c.seed = gen_seed();
    return c;
  });
}

PositionIds PositionIds::of(std::vector<std::int64_t> v, bool int32) {
  PositionIds p;
  p.int32 = int32;
  if (int32) p.values32.assign(v.begin(), v.end());
  p.values = std::move(v);
  return p;
}

Indices PositionIds::view() const {
  if (int32) return Indices(std::span<const std::int32_t>(values32));
  return Indices(std::span<const std::int64_t>(values));
}

RopeData make_data(const RopeCase& c) {
  RopeData d;
  d.params = c.params;
  d.plan = RopePlan::make(c.params);
  const RopePlan& p = d.plan;
  Rng r(c.seed);
  d.x = r.values(p.out_size(), 1.0);
  d.dy = r.values(p.out_size(), 1.0);
  d.cos.resize(p.R * p.T);
  d.sin.resize(p.R * p.T);
  const i64 m = p.n_rot / 2;
  for (i64 row = 0; row < p.R; ++row) {
    const i64 pos = p.rows == TableRows::token ? row % p.S : row;
    for (i64 i = 0; i < p.T; ++i) {
      if (i < m && c.true_tables) {
        const double ang = double(pos) * std::pow(10000.0, -2.0 * double(i) / double(p.n_rot));
        d.cos[row * p.T + i] = static_cast<float>(std::cos(ang));
        d.sin[row * p.T + i] = static_cast<float>(std::sin(ang));
      } else {  // random table entries, and finite filler in the padding
        d.cos[row * p.T + i] = static_cast<float>(r.uniform(-1, 1));
        d.sin[row * p.T + i] = static_cast<float>(r.uniform(-1, 1));
      }
    }
  }
  if (p.rows == TableRows::position_ids) {
    std::vector<std::int64_t> ids(p.B * p.S);
    for (auto& id : ids) id = r.index(p.R);
    d.positions = PositionIds::of(std::move(ids), c.int32_positions);
  }
  return d;
}

std::vector<float> rope_source(const RopePlan& p, std::span<const float> logical) {
  return place<float, float>(p.src, p.B, p.S, p.heads(), p.D, logical);
}

std::vector<float> run_rope(const Backend& be, const RopePlan& p, std::span<const float> x,
                            const RopeTables<float>& t, bool backward) {
  const auto src = rope_source(p, x);
  Guarded out(p.out_size());
  (backward ? be.rope_backward : be.rope_forward)(p, cspan(src), t, out.view());
  const auto o = out.values();
  return gather<float>(p.out, p.B, p.S, p.heads(), p.D, cspan(o));
}

template <class T, class Acc>
std::vector<T> reference_rope(const RopePlan& p, std::span<const float> x,
                              const RopeTables<float>& t, bool backward) {
  const auto src = place<T, float>(p.src, p.B, p.S, p.heads(), p.D, x, T(junk()));
  const std::vector<T> c(t.cos.begin(), t.cos.end()), s(t.sin.begin(), t.sin.end());
  const RopeTables<T> tables{cspan(c), cspan(s), t.positions};
  std::vector<T> out(p.out_size());
  if (backward) {
    reference::rope_backward<T, Acc>(p, cspan(src), tables, std::span<T>(out));
  } else {
    reference::rope_forward<T, Acc>(p, cspan(src), tables, std::span<T>(out));
  }
  return gather<T>(p.out, p.B, p.S, p.heads(), p.D, cspan(out));
}
template std::vector<double> reference_rope<double, double>(const RopePlan&, std::span<const float>,
                                                            const RopeTables<float>&, bool);
template std::vector<float> reference_rope<float, float>(const RopePlan&, std::span<const float>,
                                                         const RopeTables<float>&, bool);

std::ostream& operator<<(std::ostream& os, const RopeQkCase& c) {
  return os << c.q << " | k: " << c.k_heads << " heads, row padding " << c.k_pad;
}

rc::Gen<RopeQkCase> gen_rope_qk() {
  return rc::gen::exec([] {
    RopeQkCase c;
    c.q = *gen_rope();
    c.k_heads = *rc::gen::inRange<i64>(1, 4);
    if (c.q.params.layout != RopeLayout::bhsd && *rc::gen::arbitrary<bool>()) {
      c.k_pad = *rc::gen::inRange<i64>(1, 6);
    }
    return c;
  });
}

RopeQkData make_data(const RopeQkCase& c) {
  RopeQkData d;
  d.q = make_data(c.q);
  RopeQkParams p;
  p.q = c.q.params;
  p.k_width = c.k_heads * p.q.head_dim;
  if (c.k_pad > 0) p.k_src_row_stride = p.k_width + c.k_pad;
  d.plan = RopeQkPlan::make(p);
  Rng r(c.q.seed + 7);
  d.k = r.values(d.plan.k.out_size(), 1.0);
  d.dk = r.values(d.plan.k.out_size(), 1.0);
  return d;
}

std::pair<std::vector<float>, std::vector<float>> run_rope_qk(const Backend& be,
                                                              const RopeQkData& d, bool backward) {
  const RopePlan &pq = d.plan.q, &pk = d.plan.k;
  const auto q = rope_source(pq, backward ? d.q.dy : d.q.x);
  const auto k = rope_source(pk, backward ? d.dk : d.k);
  Guarded q_out(pq.out_size()), k_out(pk.out_size());
  (backward ? be.rope_backward_qk : be.rope_forward_qk)(d.plan, cspan(q), cspan(k), d.q.tables(),
                                                        q_out.view(), k_out.view());
  const auto qo = q_out.values(), ko = k_out.values();
  return {gather<float>(pq.out, pq.B, pq.S, pq.heads(), pq.D, cspan(qo)),
          gather<float>(pk.out, pk.B, pk.S, pk.heads(), pk.D, cspan(ko))};
}

std::ostream& operator<<(std::ostream& os, const AxialCase& c) {
  return os << AxialRopePlan::make(c.params).describe() << " | data seed=" << c.seed;
}

rc::Gen<AxialCase> gen_axial(bool strides) {
  return rc::gen::exec([strides] {
    AxialCase c;
    AxialRopeParams& p = c.params;
    p.batch = *rc::gen::inRange<i64>(1, 4);
    p.num_heads = *rc::gen::inRange<i64>(1, 4);
    p.width = p.num_heads * *rc::gen::element<i64>(4, 8, 12, 16, 20, 32, 36);
    p.end_x = *rc::gen::inRange<i64>(1, 6);
    p.end_y = *rc::gen::inRange<i64>(1, 6);
    p.repeat_factor = *rc::gen::element<i64>(1, 1, 2, 3);
    p.seq = p.repeat_factor * p.end_x * p.end_y;
    p.theta = *rc::gen::element(10000.0, 100.0, 10.0);
    if (strides && *rc::gen::element(false, true)) {
      p.src_row_stride = p.width + *rc::gen::inRange<i64>(1, 6);
    }
    c.seed = gen_seed();
    return c;
  });
}

AxialData make_data(const AxialCase& c) {
  AxialData d;
  d.plan = AxialRopePlan::make(c.params);
  Rng r(c.seed);
  d.x = r.values(d.plan.out_size(), 1.0);
  d.dy = r.values(d.plan.out_size(), 1.0);
  return d;
}

std::vector<float> axial_source(const AxialRopePlan& p, std::span<const float> logical) {
  std::vector<float> mem(p.src_extent(), junk());
  for (i64 row = 0; row < p.B * p.S; ++row) {
    std::copy_n(logical.begin() + row * p.W, p.W, mem.begin() + row * p.src_row_stride);
  }
  return mem;
}

std::vector<float> run_axial(const Backend& be, const AxialRopePlan& p, std::span<const float> x,
                             bool backward) {
  const auto src = axial_source(p, x);
  Guarded out(p.out_size());
  (backward ? be.axial_rope_backward : be.axial_rope_forward)(p, cspan(src), out.view());
  return out.values();
}

template <class T, class Acc>
std::vector<T> reference_axial(const AxialRopePlan& p, std::span<const float> x, bool backward) {
  const auto srcf = axial_source(p, x);
  const std::vector<T> src(srcf.begin(), srcf.end());
  std::vector<T> out(p.out_size());
  if (backward) {
    reference::axial_rope_backward<T, Acc>(p, cspan(src), std::span<T>(out));
  } else {
    reference::axial_rope_forward<T, Acc>(p, cspan(src), std::span<T>(out));
  }
  return out;
}
template std::vector<double> reference_axial<double, double>(const AxialRopePlan&,
                                                             std::span<const float>, bool);
template std::vector<float> reference_axial<float, float>(const AxialRopePlan&,
                                                          std::span<const float>, bool);

// =================================================================== swiglu

std::ostream& operator<<(std::ostream& os, const SwigluCase& c) {
  return os << SwigluPlan::make(c.params).describe() << " | data seed=" << c.seed
            << " |x|<=" << c.mag;
}

rc::Gen<SwigluCase> gen_swiglu() {
  return rc::gen::exec([] {
    SwigluCase c;
    c.params.rows = *gen_dim(9);
    c.params.n = *gen_dim(33);
    c.params.gate_first = *rc::gen::arbitrary<bool>();
    c.mag = *rc::gen::element(1.0, 4.0, 12.0);
    c.seed = gen_seed();
    return c;
  });
}

SwigluData make_data(const SwigluCase& c) {
  SwigluData d;
  d.plan = SwigluPlan::make(c.params);
  Rng r(c.seed);
  d.x = r.values(d.plan.in_size(), c.mag);
  d.dy = r.values(d.plan.out_size(), 1.0);
  return d;
}

std::vector<float> run_swiglu(const Backend& be, const SwigluData& d, bool backward) {
  if (backward) {
    Guarded dx(d.plan.in_size());
    be.swiglu_backward(d.plan, cspan(d.x), cspan(d.dy), dx.view());
    return dx.values();
  }
  Guarded out(d.plan.out_size());
  be.swiglu_forward(d.plan, cspan(d.x), out.view());
  return out.values();
}

template <class T, class Acc>
std::vector<T> reference_swiglu(const SwigluPlan& p, std::span<const T> x, std::span<const T> dy,
                                bool backward) {
  std::vector<T> out(backward ? p.in_size() : p.out_size());
  if (backward) {
    reference::swiglu_backward<T, Acc>(p, x, dy, std::span<T>(out));
  } else {
    reference::swiglu_forward<T, Acc>(p, x, std::span<T>(out));
  }
  return out;
}
template std::vector<double> reference_swiglu<double, double>(const SwigluPlan&,
                                                              std::span<const double>,
                                                              std::span<const double>, bool);
template std::vector<float> reference_swiglu<float, float>(const SwigluPlan&,
                                                           std::span<const float>,
                                                           std::span<const float>, bool);
template std::vector<std::complex<double>>
reference_swiglu<std::complex<double>, std::complex<double>>(const SwigluPlan&,
                                                             std::span<const std::complex<double>>,
                                                             std::span<const std::complex<double>>,
                                                             bool);

// ========================================================== attention block

std::ostream& operator<<(std::ostream& os, const BlockCase& c) {
  return os << AttentionBlockPlan::make(c.params).describe() << " | data seed=" << c.seed;
}

rc::Gen<BlockCase> gen_block() {
  return rc::gen::exec([] {
    BlockCase c;
    AttentionBlockParams& p = c.params;
    p.batch = *rc::gen::inRange<i64>(1, 3);
    p.seq = *gen_dim(9);
    p.heads = *rc::gen::inRange<i64>(1, 4);
    const i64 D = *rc::gen::element<i64>(2, 4, 6, 8);
    p.embed = p.heads * D;
    p.qkv_bias = *rc::gen::arbitrary<bool>();
    p.out_bias = *rc::gen::arbitrary<bool>();
    p.key_padding = *rc::gen::arbitrary<bool>();
    p.rope = *rc::gen::arbitrary<bool>();
    if (p.rope) {
      p.table_rows = p.seq + *rc::gen::element<i64>(0, 2);
      p.table_stride = D / 2 + *rc::gen::element<i64>(0, 1);
    }
    c.seed = gen_seed();
    return c;
  });
}

AttentionBlockInputs<float> BlockData::inputs() const {
  return {cspan(x),     cspan(w_qkv), cspan(b_qkv), cspan(w_out),
          cspan(b_out), cspan(keep),  cspan(cos),   cspan(sin)};
}

BlockData make_data(const BlockCase& c) {
  BlockData d;
  d.plan = AttentionBlockPlan::make(c.params);
  const AttentionBlockPlan& p = d.plan;
  Rng r(c.seed);
  const i64 E = p.E;
  const double w = 1.0 / std::sqrt(double(E));
  d.x = r.values(p.x_size(), 1.0);
  d.w_qkv = r.values(3 * E * E, 2 * w);
  d.w_out = r.values(E * E, w);
  if (p.qkv_bias) d.b_qkv = r.values(3 * E, 0.5);
  if (p.out_bias) d.b_out = r.values(E, 0.5);
  if (p.key_padding) {
    d.keep.resize(p.B * p.S);
    for (auto& k : d.keep) k = r.coin(0.25) ? 0.0f : 1.0f;
  }
  if (p.has_rope) {
    const i64 R = p.rope.R, T = p.rope.T, m = p.D / 2;
    d.cos.resize(R * T);
    d.sin.resize(R * T);
    for (i64 row = 0; row < R; ++row) {
      for (i64 i = 0; i < T; ++i) {
        const double ang = i < m ? double(row) * std::pow(10000.0, -double(i) / double(m)) : 0.3;
        d.cos[row * T + i] = static_cast<float>(std::cos(ang));
        d.sin[row * T + i] = static_cast<float>(std::sin(ang));
      }
    }
  }
  return d;
}

std::vector<float> run_block(const Backend& be, const BlockData& d) {
  Guarded out(d.plan.x_size());
  be.attention_block(d.plan, d.inputs(), out.view());
  return out.values();
}

std::vector<double> reference_block(const BlockData& d) {
  const AttentionBlockPlan& p = d.plan;
  const i64 E = p.E, rows = p.B * p.S;
  std::vector<double> qkv(rows * 3 * E);
  for (i64 r = 0; r < rows; ++r) {
    for (i64 o = 0; o < 3 * E; ++o) {
      double acc = p.qkv_bias ? double(d.b_qkv[o]) : 0.0;
      for (i64 e = 0; e < E; ++e) acc += double(d.x[r * E + e]) * d.w_qkv[o * E + e];
      qkv[r * 3 * E + o] = acc;
    }
  }
  std::vector<double> qr(p.rotated_size()), kr(p.rotated_size());
  const std::vector<double> c(d.cos.begin(), d.cos.end()), s(d.sin.begin(), d.sin.end());
  const RopeTables<double> t{cspan(c), cspan(s)};
  const AttentionInputs<double> in = block_attention_inputs<double>(
      p, cspan(qkv), cspan(d.keep), std::span<double>(qr), std::span<double>(kr),
      [&](const RopePlan& rp, std::span<const double> src, std::span<double> dst) {
        reference::rope_forward<double>(rp, src, t, dst);
      });
  std::vector<double> att(p.attention.o.extent);
  reference::attention_forward<double>(p.attention, in, std::span<double>(att));
  std::vector<double> out(rows * E);
  for (i64 r = 0; r < rows; ++r) {
    for (i64 o = 0; o < E; ++o) {
      double acc = p.out_bias ? double(d.b_out[o]) : 0.0;
      for (i64 e = 0; e < E; ++e) acc += att[r * E + e] * d.w_out[o * E + e];
      out[r * E + o] = acc;
    }
  }
  return out;
}

}  // namespace tandem::props
