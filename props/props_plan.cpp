// SPDX-License-Identifier: Apache-2.0
// Properties of the plan layer (include/tandem/): a plan addresses memory as
// SPEC §1 and §4 write the layouts out (checked against formulas written here,
// not against Strides::of), a rank-4 layout is decided by num_heads or refused
// (SPEC §1, §4), and every bound of SPEC §8 holds at its edge: the edge value
// is accepted and gives the reference's result, one past it is refused with
// tandem::Error naming the input before anything is written.
#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "checks.hpp"

namespace tandem::props {
namespace {

// ------------------------------------------------------------ the formulas

/// Where element (b, s, h, d) of a `[B, S, heads, width]` tensor lives by
/// SPEC §1 and §4, written out independently of Strides::of:
/// rows (bshd, thd with B = 1, a paged cache with B = num_blocks):
/// `(b·S + s)·row + h·width + d`, row >= heads·width, extent
/// `(B·S − 1)·row + heads·width`; heads first (bhsd):
/// `((b·heads + h)·S + s)·width + d`, extent `B·heads·S·width`.
struct SpecAddress {
  bool heads_first = false;
  i64 B = 1, S = 1, heads = 1, width = 1, row = 1;

  [[nodiscard]] i64 at(i64 b, i64 s, i64 h) const {
    return heads_first ? ((b * heads + h) * S + s) * width : (b * S + s) * row + h * width;
  }
  [[nodiscard]] i64 extent() const {
    if (heads_first) return B * heads * S * width;
    return B * S == 0 ? 0 : (B * S - 1) * row + heads * width;
  }
};

/// The address of a token-rows tensor (row_stride 0: contiguous rows).
SpecAddress rows_of(i64 B, i64 S, i64 heads, i64 width, i64 row_stride) {
  return {false, B, S, heads, width, row_stride == 0 ? heads * width : row_stride};
}
/// The address of a heads-first (bhsd) tensor.
SpecAddress heads_first_of(i64 B, i64 S, i64 heads, i64 width) {
  return {true, B, S, heads, width, heads * width};
}

/// Empty when `st` puts every (b, s, h) where `a` does and spans a's extent.
std::string strides_follow(const std::string& what, const Strides& st, const SpecAddress& a) {
  if (st.extent != a.extent()) {
    return what + ": extent " + std::to_string(st.extent) + ", SPEC's formula gives " +
           std::to_string(a.extent());
  }
  for (i64 b = 0; b < a.B; ++b) {
    for (i64 s = 0; s < a.S; ++s) {
      for (i64 h = 0; h < a.heads; ++h) {
        if (st.at(b, s, h) == a.at(b, s, h)) continue;
        return what + ": element (" + std::to_string(b) + ", " + std::to_string(s) + ", " +
               std::to_string(h) + ", 0) at " + std::to_string(st.at(b, s, h)) +
               ", SPEC's formula gives " + std::to_string(a.at(b, s, h));
      }
    }
  }
  return {};
}

/// A logical `[B, S, heads, width]` tensor (bshd order) placed by `a`, junk in every gap.
std::vector<float> spec_place(const SpecAddress& a, std::span<const float> logical) {
  std::vector<float> mem(static_cast<std::size_t>(a.extent()), junk());
  for (i64 b = 0; b < a.B; ++b)
    for (i64 s = 0; s < a.S; ++s)
      for (i64 h = 0; h < a.heads; ++h)
        std::copy_n(logical.begin() + ((b * a.S + s) * a.heads + h) * a.width, a.width,
                    mem.begin() + a.at(b, s, h));
  return mem;
}

/// The logical tensor that memory laid out by `a` holds.
std::vector<float> spec_gather(const SpecAddress& a, std::span<const float> mem) {
  std::vector<float> out(static_cast<std::size_t>(a.B * a.S * a.heads * a.width));
  for (i64 b = 0; b < a.B; ++b)
    for (i64 s = 0; s < a.S; ++s)
      for (i64 h = 0; h < a.heads; ++h)
        std::copy_n(mem.begin() + a.at(b, s, h), a.width,
                    out.begin() + ((b * a.S + s) * a.heads + h) * a.width);
  return out;
}

std::span<const float> cs(const std::vector<float>& v) {
  return {v.data(), v.size()};
}

// ---------------------------------------------------------------- attention

/// The addresses SPEC §1, §2.9 and §2.10 give q, k, v, out and the gradients of a call with
/// parameters `p` (whose Hkv and Dv may be 0: the defaults).
struct AttentionAddresses {
  SpecAddress q, k, v, o, dq, dk, dv;
};
AttentionAddresses spec_addresses(const AttentionParams& p) {
  const i64 Hkv = p.Hkv == 0 ? p.H : p.Hkv, Dv = p.Dv == 0 ? p.D : p.Dv;
  const bool paged = p.num_blocks > 0;
  const i64 KB = paged ? p.num_blocks : p.B, KS = paged ? p.block_size : p.Sk;
  const auto addr = [&](i64 B, i64 S, i64 heads, i64 width, i64 row_stride) {
    return p.layout == Layout::bhsd ? heads_first_of(B, S, heads, width)
                                    : rows_of(B, S, heads, width, row_stride);
  };
  return {addr(p.B, p.Sq, p.H, p.D, p.q_row_stride),
          addr(KB, KS, Hkv, p.D, p.k_row_stride),
          addr(KB, KS, Hkv, Dv, p.v_row_stride),
          addr(p.B, p.Sq, p.H, Dv, 0),
          addr(p.B, p.Sq, p.H, p.D, 0),
          addr(KB, KS, Hkv, p.D, 0),
          addr(KB, KS, Hkv, Dv, 0)};
}

/// Empty when every Strides of the plan follows SPEC's formula for `p`.
std::string plan_follows(const AttentionPlan& plan, const AttentionParams& p) {
  const AttentionAddresses a = spec_addresses(p);
  const std::pair<const Strides*, const SpecAddress*> all[] = {
      {&plan.q, &a.q},   {&plan.k, &a.k},   {&plan.v, &a.v},  {&plan.o, &a.o},
      {&plan.dq, &a.dq}, {&plan.dk, &a.dk}, {&plan.dv, &a.dv}};
  const char* names[] = {"q", "k", "v", "out", "dq", "dk", "dv"};
  for (std::size_t i = 0; i < 7; ++i) {
    std::string m = strides_follow(names[i], *all[i].first, *all[i].second);
    if (!m.empty()) return plan.describe() + ": " + m;
  }
  return {};
}

/// The memory of one forward call placed by SPEC's formulas; k and v keep one
/// block of junk past their extent (inside the vector, outside the view), so
/// that a read one block past a paged cache is a wrong result, not a crash.
struct SpecCall {
  AttentionAddresses a;
  std::vector<float> q, k, v;
  IndexStore idx;
  const AttentionData& d;
  SpecCall(const AttentionData& data, const AttentionParams& p)
      : a(spec_addresses(p)),
        q(spec_place(a.q, cs(data.q))),
        k(spec_place(a.k, cs(data.k))),
        v(spec_place(a.v, cs(data.v))),
        idx(data),
        d(data) {
    k.resize(k.size() + static_cast<std::size_t>(a.k.row * a.k.S), junk());
    v.resize(v.size() + static_cast<std::size_t>(a.v.row * a.v.S), junk());
  }
  [[nodiscard]] AttentionInputs<float> in() const {
    AttentionInputs<float> r{cs(q),
                             {k.data(), static_cast<std::size_t>(a.k.extent())},
                             {v.data(), static_cast<std::size_t>(a.v.extent())},
                             cs(d.mask)};
    r.sinks = cs(d.sinks);
    idx.attach(r);
    return r;
  }
};

/// The case's params in the canonical layout: bshd, contiguous rows.
AttentionParams canonical(AttentionParams p) {
  p.layout = Layout::bshd;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = 0;
  return p;
}

/// The backend's forward of `d` under `plan` (memory placed by SPEC's
/// formulas for `p`) against reference<double> of the same logical data in
/// the canonical layout; guards intact and every element written.
std::string forward_follows_spec(const Backend& be, const AttentionData& d,
                                 const AttentionParams& p, const AttentionPlan& plan) {
  const SpecCall call(d, p);
  Guarded out(call.a.o.extent());
  be.attention_forward(plan, call.in(), out.view());
  std::string m = out.guard_damage();
  if (m.empty()) m = out.unwritten();
  if (!m.empty()) return "out: " + m;
  const AttentionData canon = with_plan(d, canonical(p));
  const auto got = spec_gather(call.a.o, cs(out.values()));
  return attention_close("out placed by SPEC §1", got, reference_forward(canon), scales(canon).out,
                         scales(canon));
}

/// A features case (or dense) with at least two query heads and no rare
/// long shapes or extremes (the suite's other properties draw those).
AttentionCase gen_multi_head(AttentionGen g) {
  g.long_shapes = Draw::never;
  g.extremes = Draw::never;
  AttentionCase c = *gen_attention(g);
  AttentionParams& p = c.params;
  if (p.H == 1) {  // H > 1: a plan that mixes up the head and token axes shows
    p.H = 2;
    if (p.q_row_stride != 0) p.q_row_stride += p.D;
  }
  return c;
}

/// Every tensor of an attention plan (bshd with padded rows, bhsd, packed,
/// paged) is where SPEC §1's formula puts it, and a forward on memory placed
/// by the formula (junk in every gap) gives the canonical layout's result.
void attention_addressing(const Subject& s) {
  const AttentionCase c = gen_multi_head(AttentionGen{}.with_features());
  const AttentionData d = make_data(c);
  RC_TAG(to_string(c.params.layout), c.params.num_seqs > 0     ? "packed"
                                     : c.params.num_blocks > 0 ? "paged"
                                                               : "dense");
  TANDEM_REQUIRE_EMPTY(plan_follows(d.plan, c.params));
  TANDEM_REQUIRE_EMPTY(forward_follows_spec(s.backend, d, c.params, d.plan));
}

/// How the two middle dims of a rank-4 q relate to num_heads.
enum class Rank4 { bshd, bhsd, both, neither };
const char* rank4_name(Rank4 r) {
  return r == Rank4::bshd   ? "dim 2 = H"
         : r == Rank4::bhsd ? "dim 1 = H"
         : r == Rank4::both ? "both"
                            : "neither";
}

/// A length other than H (>= 1).
i64 other_than(i64 H) {
  const i64 x = *rc::gen::inRange<i64>(1, 9);
  return x == H ? x + 1 : x;
}

/// Rank-4 q, k, v with num_heads and no layout: the one of dims 1 and 2 that
/// equals num_heads decides the layout (dim 1: bhsd, dim 2: bshd) and the
/// plan has the sizes that layout reads; both or neither is refused with an
/// Error about `layout` (SPEC §1). With a layout attr, it decides. The plan
/// so made computes the canonical result on memory placed by that layout.
void attention_rank4_layout(const Subject& s) {
  const Rank4 r = *rc::gen::element(Rank4::bshd, Rank4::bhsd, Rank4::both, Rank4::neither);
  const bool given = *rc::gen::element(false, false, true);
  AttentionParams e;  // the params the shapes mean
  e.B = *rc::gen::inRange<i64>(1, 4);
  e.Hkv = *rc::gen::inRange<i64>(1, 3);
  e.H = e.Hkv * *rc::gen::inRange<i64>(1, 3);
  e.D = *rc::gen::inRange<i64>(1, 9);
  e.Dv = *rc::gen::inRange<i64>(1, 9);
  e.Sk = *rc::gen::inRange<i64>(1, 9);
  e.mask = *rc::gen::element(MaskKind::none, MaskKind::causal);
  i64 d1 = 0, d2 = 0;  // dims 1 and 2 of q
  switch (r) {
    case Rank4::bshd:
      d1 = other_than(e.H), d2 = e.H;
      break;
    case Rank4::bhsd:
      d1 = e.H, d2 = other_than(e.H);
      break;
    case Rank4::both:
      d1 = d2 = e.H;
      break;
    case Rank4::neither:
      d1 = other_than(e.H), d2 = other_than(e.H);
      break;
  }
  e.layout = given              ? *rc::gen::element(Layout::bshd, Layout::bhsd)
             : r == Rank4::bhsd ? Layout::bhsd
                                : Layout::bshd;
  const bool bhsd = e.layout == Layout::bhsd;
  if (given) (bhsd ? d1 : d2) = e.H;  // the given layout's head axis holds H
  e.Sq = bhsd ? d2 : d1;
  const auto shape = [&](i64 S, i64 heads, i64 width) {
    return bhsd ? Shape{e.B, heads, S, width} : Shape{e.B, S, heads, width};
  };
  AttentionAttrs a;
  a.num_heads = e.H;
  a.mask = e.mask;
  if (given) a.layout = bhsd ? QkvLayout::bhsd : QkvLayout::bshd;
  const Shape q{e.B, d1, d2, e.D};
  RC_TAG(rank4_name(r), given ? "layout given" : "no layout");
  const bool refused = !given && (r == Rank4::both || r == Rank4::neither);
  std::optional<AttentionPlan> plan;
  std::string thrown;
  try {
    plan = AttentionPlan::from_shapes(q, shape(e.Sk, e.Hkv, e.D), shape(e.Sk, e.Hkv, e.Dv),
                                      std::nullopt, a);
  } catch (const Error& err) {
    thrown = err.parameter();
  }
  if (refused) {
    if (thrown != "layout") {
      RC_FAIL("q.shape = " + tandem::to_string(q) + " with num_heads = " + std::to_string(e.H) +
              " and no layout: " +
              (plan ? "accepted as " + plan->describe() : "an Error about " + thrown) +
              ", not an Error about layout");
    }
    return;
  }
  if (!plan) RC_FAIL("q.shape = " + tandem::to_string(q) + " refused (" + thrown + ")");
  const AttentionPlan want = AttentionPlan::make(e);
  if (plan->describe() != want.describe()) {
    RC_FAIL("q.shape = " + tandem::to_string(q) + " gave " + plan->describe() + ", SPEC §1 says " +
            want.describe());
  }
  TANDEM_REQUIRE_EMPTY(plan_follows(*plan, e));
  AttentionCase c;
  c.params = e;
  c.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
  TANDEM_REQUIRE_EMPTY(forward_follows_spec(s.backend, make_data(c), e, *plan));
}

// ------------------------------------------------------------ attention edges

/// One edge of a bound: what it does to a valid case, and the parameter of
/// the Error it must raise (empty: the edge value, accepted).
struct Edge {
  std::string what;
  std::string error;  ///< e.parameter() of the refusal; empty when accepted
  std::function<void(AttentionData&)> apply;
  int short_view = -1;  ///< q, k or v (0, 1, 2) handed over one element short of its extent
};

/// The index-input edges of a packed case (SPEC §2.9, §8).
void packed_edges(const AttentionData& d, std::vector<Edge>& v) {
  const i64 n = d.plan.num_seqs;
  for (int which = 0; which < 2; ++which) {
    const std::string name = which == 0 ? "cu_seqlens_q" : "cu_seqlens_k";
    const auto cu = [which](AttentionData& x) -> std::vector<i64>& {
      return which == 0 ? x.cu_q : x.cu_k;
    };
    const i64 total = which == 0 ? d.plan.Sq : d.plan.Sk;
    v.push_back({name + "[0] = 1", name, [=](AttentionData& x) { cu(x)[0] = 1; }});
    v.push_back({name + "[0] = -1", name, [=](AttentionData& x) { cu(x)[0] = -1; }});
    v.push_back({name + "[n] = total + 1", name,
                 [=](AttentionData& x) { cu(x)[static_cast<std::size_t>(n)] = total + 1; }});
    v.push_back({name + "[n] = total - 1", name,
                 [=](AttentionData& x) { cu(x)[static_cast<std::size_t>(n)] = total - 1; }});
    v.push_back({name + " one entry too many", name + ".size()",
                 [=](AttentionData& x) { cu(x).push_back(total); }});
    if (n >= 2) {
      const auto s = static_cast<std::size_t>(*rc::gen::inRange<i64>(1, n));
      // edge: sequence s−1 empty, or s empty (accepted; the slots' keys of
      // seqused_k clamped to the new slots); one past: a decrease either side
      const auto clamp_used = [](AttentionData& x) {
        for (std::size_t t = 0; t < x.used.size(); ++t)
          x.used[t] = std::min(x.used[t], x.cu_k[t + 1] - x.cu_k[t]);
      };
      v.push_back({name + "[s] = " + name + "[s-1]", "", [=](AttentionData& x) {
                     cu(x)[s] = cu(x)[s - 1];
                     clamp_used(x);
                   }});
      v.push_back({name + "[s] = " + name + "[s+1]", "", [=](AttentionData& x) {
                     cu(x)[s] = cu(x)[s + 1];
                     clamp_used(x);
                   }});
      v.push_back({name + "[s] = " + name + "[s-1] - 1", name,
                   [=](AttentionData& x) { cu(x)[s] = cu(x)[s - 1] - 1; }});
      v.push_back({name + "[s] = " + name + "[s+1] + 1", name,
                   [=](AttentionData& x) { cu(x)[s] = cu(x)[s + 1] + 1; }});
    }
  }
  const auto s = static_cast<std::size_t>(*rc::gen::inRange<i64>(0, n));
  const auto fill_used = [](AttentionData& x) {
    if (!x.used.empty()) return;
    for (std::size_t t = 0; t + 1 < x.cu_k.size(); ++t) x.used.push_back(x.cu_k[t + 1] - x.cu_k[t]);
  };
  const auto set_used = [=](i64 delta_from_slot, bool from_zero) {
    return [=](AttentionData& x) {
      fill_used(x);
      const i64 slot = x.cu_k[s + 1] - x.cu_k[s];
      x.used[s] = from_zero ? delta_from_slot : slot + delta_from_slot;
    };
  };
  v.push_back({"seqused_k[s] = its slot", "", set_used(0, false)});
  v.push_back({"seqused_k[s] = 0", "", set_used(0, true)});
  v.push_back({"seqused_k[s] = its slot + 1", "seqused_k", set_used(1, false)});
  v.push_back({"seqused_k[s] = -1", "seqused_k", set_used(-1, true)});
  v.push_back({"seqused_k one entry too many", "seqused_k.size()", [=](AttentionData& x) {
                 fill_used(x);
                 x.used.push_back(0);
               }});
}

/// The index-input edges of a paged case (SPEC §2.10, §8).
void paged_edges(const AttentionData& d, std::vector<Edge>& v) {
  const AttentionPlan& p = d.plan;
  const i64 W = p.max_blocks, NB = p.num_blocks, bs = p.block_size;
  const i64 b = *rc::gen::inRange<i64>(0, p.B);
  const auto valid_row = [=](AttentionData& x, i64 row) {  // every entry of the row a block
    for (i64 j = 0; j < W; ++j) {
      i64& e = x.table[static_cast<std::size_t>(row * W + j)];
      if (e < 0 || e >= NB) e = (row + j) % NB;
    }
  };
  const auto set_len = [=](i64 len, bool fix_row) {
    return [=](AttentionData& x) {
      if (fix_row) valid_row(x, b);
      x.lens[static_cast<std::size_t>(b)] = len;
    };
  };
  v.push_back({"cache_seqlens[b] = max_blocks*block_size", "", set_len(p.Sk, true)});
  v.push_back({"cache_seqlens[b] = 0", "", set_len(0, false)});
  v.push_back(
      {"cache_seqlens[b] = max_blocks*block_size + 1", "cache_seqlens", set_len(p.Sk + 1, true)});
  v.push_back({"cache_seqlens[b] = -1", "cache_seqlens", set_len(-1, false)});
  v.push_back({"cache_seqlens one entry too many", "cache_seqlens.size()",
               [](AttentionData& x) { x.lens.push_back(0); }});
  v.push_back({"block_table one entry too many", "block_table.size()",
               [](AttentionData& x) { x.table.push_back(0); }});
  const i64 len = d.lens[static_cast<std::size_t>(b)];
  const i64 used = (len + bs - 1) / bs;
  if (used > 0) {
    // an entry a length reads: its last one (the partial block) or any
    const i64 j = *rc::gen::element<i64>(used - 1, *rc::gen::inRange<i64>(0, used));
    const auto set = [=](i64 e) {
      return [=](AttentionData& x) { x.table[static_cast<std::size_t>(b * W + j)] = e; };
    };
    v.push_back({"a used block_table entry = num_blocks - 1", "", set(NB - 1)});
    v.push_back({"a used block_table entry = 0", "", set(0)});
    v.push_back({"a used block_table entry = num_blocks", "block_table", set(NB)});
    v.push_back({"a used block_table entry = -1", "block_table", set(-1)});
  }
  if (used < W) {  // an entry no length reads may hold anything
    const i64 j = *rc::gen::inRange<i64>(used, W);
    const i64 e = *rc::gen::element<i64>(-1, NB, NB + 1000);
    v.push_back({"an unused block_table entry out of range", "",
                 [=](AttentionData& x) { x.table[static_cast<std::size_t>(b * W + j)] = e; }});
  }
}

/// The edges of the value inputs' sizes (SPEC §8).
void view_edges(const AttentionData& d, std::vector<Edge>& v) {
  if (d.plan.sinks) {
    v.push_back(
        {"sinks one too many", "sinks.size()", [](AttentionData& x) { x.sinks.push_back(0.5f); }});
  } else {
    v.push_back({"sinks given to a plan without", "sinks.size()",
                 [](AttentionData& x) { x.sinks.assign(1, 0.5f); }});
  }
  if (d.plan.alibi != AlibiKind::none) {
    v.push_back({"alibi_slopes one too few", "alibi_slopes.size()",
                 [](AttentionData& x) { x.slopes.pop_back(); }});
  }
  const char* qkv[] = {"q.size()", "k.size()", "v.size()"};
  for (int t = 0; t < 3; ++t) v.push_back({"one element short", qkv[t], [](AttentionData&) {}, t});
  // key_origin (SPEC §12.1): any sequence's entry at 0 and 2^48 (int64 inputs), past them
  const i64 n = d.plan.sequences();
  const auto s = static_cast<std::size_t>(*rc::gen::inRange<i64>(0, n));
  const auto set_origin = [=](i64 value) {
    return [=](AttentionData& x) {
      x.origin.assign(static_cast<std::size_t>(n), 7);
      x.origin[s] = value;
      x.index64 = x.index64 || value > 1000;
    };
  };
  v.push_back({"key_origin[s] = 0", "", set_origin(0)});
  v.push_back({"key_origin[s] = 2^48", "", set_origin(kMaxKeyOrigin)});
  v.push_back({"key_origin[s] = 2^48 + 1", "key_origin", set_origin(kMaxKeyOrigin + 1)});
  v.push_back({"key_origin[s] = -1", "key_origin", set_origin(-1)});
  v.push_back({"key_origin one entry too many", "key_origin.size()",
               [=](AttentionData& x) { x.origin.assign(static_cast<std::size_t>(n) + 1, 0); }});
  if (d.plan.mask_size() > 0) {
    v.push_back(
        {"mask one too many", "mask.size()", [](AttentionData& x) { x.mask.push_back(1.0f); }});
  } else {
    v.push_back({"mask given to a plan without", "mask.size()",
                 [](AttentionData& x) { x.mask.assign(1, 1.0f); }});
  }
}

/// Every index and value input of an attention call at its edge (accepted:
/// the forward agrees with reference<double> on the same inputs and writes
/// every element, nothing past) and one past it (refused with an Error naming
/// the input, nothing written): block_table, cache_seqlens, cu_seqlens_q/k,
/// seqused_k, key_origin, sinks, alibi_slopes, the mask (SPEC §2.7–2.10, §8, §12.1).
void attention_index_edges(const Subject& s) {
  const bool paged = *rc::gen::arbitrary<bool>();
  AttentionGen g = AttentionGen{}.with_features();
  g = g.with(paged ? &AttentionGen::paged : &AttentionGen::varlen, Draw::always);
  if (*rc::gen::element(false, false, true))
    g = AttentionGen{}
            .with(&AttentionGen::sinks, Draw::sometimes)
            .with(&AttentionGen::alibi, Draw::sometimes);
  const AttentionCase c = gen_multi_head(g);
  AttentionData d = make_data(c);
  std::vector<Edge> edges;
  if (d.plan.varlen()) packed_edges(d, edges);
  if (d.plan.paged()) paged_edges(d, edges);
  view_edges(d, edges);
  const Edge& e = edges[*rc::gen::inRange<std::size_t>(0, edges.size())];
  RC_TAG(e.error.empty() ? "accepted" : "refused");
  e.apply(d);
  const SpecCall call(d, c.params);
  Guarded out(call.a.o.extent());
  AttentionInputs<float> in = call.in();
  if (e.short_view >= 0) {
    std::span<const float>* views[] = {&in.q, &in.k, &in.v};
    *views[e.short_view] = views[e.short_view]->first(views[e.short_view]->size() - 1);
  }
  std::string thrown = "(nothing)";
  try {
    s.backend.attention_forward(d.plan, in, out.view());
    thrown.clear();
  } catch (const Error& err) {
    thrown = err.parameter();
  }
  if (!e.error.empty()) {
    if (thrown != e.error) {
      RC_FAIL(e.what + " (" + d.plan.describe() + "): threw " +
              (thrown.empty() ? "nothing" : "an Error about " + thrown) + ", not one about " +
              e.error);
    }
    if (!out.untouched()) RC_FAIL(e.what + ": out written before the Error");
    TANDEM_REQUIRE_EMPTY(out.guard_damage());
    return;
  }
  if (!thrown.empty()) RC_FAIL(e.what + " (" + d.plan.describe() + ") refused: " + thrown);
  std::string m = out.guard_damage();
  if (m.empty()) m = out.unwritten();
  if (!m.empty()) RC_FAIL(e.what + ": " + m);
  const auto got = spec_gather(call.a.o, cs(out.values()));
  TANDEM_REQUIRE_EMPTY(
      attention_close(e.what, got, reference_forward(d), scales(d).out, scales(d)));
}

/// One edge of make()'s parameters: the params at it, and the Error's parameter (empty: accepted).
struct ParamEdge {
  std::string what, error;
  AttentionParams p;
};

/// The bounds of AttentionPlan::make (SPEC §8) at their edges on a valid case.
std::vector<ParamEdge> attention_param_edges(const AttentionParams& p) {
  std::vector<ParamEdge> v;
  const auto add = [&](const std::string& what, const std::string& error,
                       const std::function<void(AttentionParams&)>& f) {
    ParamEdge e{what, error, p};
    f(e.p);
    v.push_back(std::move(e));
  };
  const i64 Hkv = p.Hkv == 0 ? p.H : p.Hkv, Dv = p.Dv == 0 ? p.D : p.Dv;
  const bool paged = p.num_blocks > 0;
  if (p.layout == Layout::bshd) {
    add("q_row_stride = H*D", "", [&](AttentionParams& x) { x.q_row_stride = p.H * p.D; });
    add("k_row_stride = Hkv*D", "", [&](AttentionParams& x) { x.k_row_stride = Hkv * p.D; });
    add("v_row_stride = Hkv*Dv", "", [&](AttentionParams& x) { x.v_row_stride = Hkv * Dv; });
    add("q_row_stride = H*D + 1", "", [&](AttentionParams& x) { x.q_row_stride = p.H * p.D + 1; });
    if (p.H * p.D > 1)
      add("q_row_stride = H*D - 1", "q_row_stride",
          [&](AttentionParams& x) { x.q_row_stride = p.H * p.D - 1; });
    if (Hkv * p.D > 1)
      add("k_row_stride = Hkv*D - 1", "k_row_stride",
          [&](AttentionParams& x) { x.k_row_stride = Hkv * p.D - 1; });
    if (Hkv * Dv > 1)
      add("v_row_stride = Hkv*Dv - 1", "v_row_stride",
          [&](AttentionParams& x) { x.v_row_stride = Hkv * Dv - 1; });
  } else {
    add("bhsd q_row_stride = H*D", "", [&](AttentionParams& x) { x.q_row_stride = p.H * p.D; });
    add("bhsd v_row_stride = Hkv*Dv + 1", "v_row_stride",
        [&](AttentionParams& x) { x.v_row_stride = Hkv * Dv + 1; });
  }
  if (p.mask == MaskKind::sliding_window) {
    add("window = 0", "", [](AttentionParams& x) { x.window = 0; });
    add("window = -1", "window", [](AttentionParams& x) { x.window = -1; });
  } else {
    add("window = 1 without sliding_window", "window", [](AttentionParams& x) { x.window = 1; });
  }
  if (p.mask == MaskKind::bias) {
    add("bias_batch = B + 1", "bias_batch", [&](AttentionParams& x) { x.bias_batch = p.B + 1; });
    add("bias_heads = H + 1", "bias_heads", [&](AttentionParams& x) { x.bias_heads = p.H + 1; });
  }
  if (p.H > 1) add("Hkv = H + 1", "Hkv", [&](AttentionParams& x) { x.Hkv = p.H + 1; });
  add("softcap = 0", "", [](AttentionParams& x) { x.softcap = 0.0; });
  add("softcap = -1e-9", "softcap", [](AttentionParams& x) { x.softcap = -1e-9; });
  if (paged) {
    const i64 cap = p.max_blocks * p.block_size;
    add("Sk = max_blocks*block_size", "", [&](AttentionParams& x) { x.Sk = cap; });
    add("Sk = max_blocks*block_size + 1", "Sk", [&](AttentionParams& x) { x.Sk = cap + 1; });
    add("layout bhsd with a paged cache", "layout",
        [](AttentionParams& x) { x.layout = Layout::bhsd; });
  } else if (p.num_seqs > 0) {
    add("B = 2 with packed sequences", "B", [](AttentionParams& x) { x.B = 2; });
    add("the other layout with packed sequences (both are a batch of 1)", "",
        [](AttentionParams& x) {
          x.layout = x.layout == Layout::bshd ? Layout::bhsd : Layout::bshd;
          x.q_row_stride = x.k_row_stride = x.v_row_stride = 0;
        });
  } else {
    add("Sk = 0", "Sk", [](AttentionParams& x) { x.Sk = 0; });
  }
  add("Sq = 0", "Sq", [](AttentionParams& x) { x.Sq = 0; });
  add("B = 0", "B", [](AttentionParams& x) { x.B = 0; });
  add("H = 0", "H", [](AttentionParams& x) { x.H = 0; });
  add("D = 0", "D", [](AttentionParams& x) { x.D = 0; });
  add("Dv = -1", "Dv", [](AttentionParams& x) { x.Dv = -1; });
  add("scale = 0", "scale", [](AttentionParams& x) { x.scale = 0.0; });
  if (p.num_seqs > 0 || paged) {
    add("mask key_padding with packed sequences or a paged cache", "mask",
        [](AttentionParams& x) { x.mask = MaskKind::key_padding; });
  }
  if (p.num_seqs > 0) {
    add("num_blocks with packed sequences", "num_blocks",
        [](AttentionParams& x) { x.num_blocks = x.block_size = x.max_blocks = 1; });
  }
  if (paged) add("block_size = 0", "block_size", [](AttentionParams& x) { x.block_size = 0; });
  if (!paged && p.num_seqs == 0 && p.mask != MaskKind::bias) {
    add("B*Sq past 64 bits", "q", [](AttentionParams& x) { x.B = x.Sq = std::int64_t{1} << 40; });
  }
  return v;
}

/// make()'s bounds at their edges: the edge value gives a plan whose forward
/// (on memory placed by SPEC's formulas) is the canonical result; one past it
/// is refused with an Error naming the parameter (SPEC §8).
void attention_param_bounds(const Subject& s) {
  const AttentionCase c = gen_multi_head(AttentionGen{}.with_features());
  const std::vector<ParamEdge> edges = attention_param_edges(c.params);
  const ParamEdge& e = edges[*rc::gen::inRange<std::size_t>(0, edges.size())];
  RC_TAG(e.error.empty() ? "accepted" : "refused");
  std::optional<AttentionPlan> plan;
  std::string thrown;
  try {
    plan = AttentionPlan::make(e.p);
  } catch (const Error& err) {
    thrown = err.parameter();
  }
  if (!e.error.empty()) {
    if (thrown != e.error) {
      RC_FAIL(e.what + ": " +
              (plan ? "accepted as " + plan->describe() : "an Error about " + thrown) +
              ", not an Error about " + e.error);
    }
    return;
  }
  if (!plan) RC_FAIL(e.what + " refused: " + thrown);
  TANDEM_REQUIRE_EMPTY(plan_follows(*plan, e.p));
  AttentionCase ce = c;
  ce.params = e.p;
  TANDEM_REQUIRE_EMPTY(forward_follows_spec(s.backend, make_data(ce), e.p, *plan));
}

// --------------------------------------------------------------------- rope

/// SPEC §4's address of a RoPE source (src) or output of params `p`:
/// token rows `[B, S, W]` for bshd and thd (B = 1), `[B, H, S, D]` for bhsd.
SpecAddress rope_address(const RopeParams& p, bool source) {
  const i64 H = p.width / p.head_dim;
  if (p.layout == RopeLayout::bhsd) return heads_first_of(p.batch, p.seq, H, p.head_dim);
  return rows_of(p.batch, p.seq, H, p.head_dim, source ? p.src_row_stride : 0);
}

/// The backend's RoPE forward (or backward) of `d` under `plan`, on memory
/// placed by SPEC §4's formulas for `p`, against reference<double> of the
/// same logical data in the canonical layout (bshd, contiguous rows).
std::string rope_follows_spec(const Backend& be, const RopeData& d, const RopeParams& p,
                              const RopePlan& plan, bool backward) {
  const SpecAddress src = rope_address(p, true), dst = rope_address(p, false);
  const std::vector<float>& x = backward ? d.dy : d.x;
  const auto mem = spec_place(src, cs(x));
  Guarded out(dst.extent());
  (backward ? be.rope_backward : be.rope_forward)(plan, cs(mem), d.tables(), out.view());
  std::string m = out.guard_damage();
  if (m.empty()) m = out.unwritten();
  if (!m.empty()) return plan.describe() + " out: " + m;
  RopeParams cp = p;
  cp.layout = RopeLayout::bshd;
  cp.src_row_stride = 0;
  const RopePlan canon = RopePlan::make(cp);
  return rope_close(plan.describe() + " out placed by SPEC §4", spec_gather(dst, cs(out.values())),
                    reference_rope<double, double>(canon, cs(x), d.tables(), backward),
                    max_abs(to_double(x)));
}

/// Empty when a RoPE plan's source and output strides follow SPEC §4 for `p`.
std::string rope_plan_follows(const RopePlan& plan, const RopeParams& p) {
  std::string m = strides_follow("x", plan.src, rope_address(p, true));
  if (m.empty()) m = strides_follow("out", plan.out, rope_address(p, false));
  return m.empty() ? m : plan.describe() + ": " + m;
}

/// RoPE of every layout (bshd with padded rows, bhsd, thd) with H > 1 heads
/// addresses source and output as SPEC §4's formulas say, and its forward
/// and backward on memory placed by them (junk in the gaps) give the
/// canonical layout's result; axial RoPE's rows likewise (SPEC §5).
void rope_addressing(const Subject& s) {
  RopeCase c = *gen_rope();
  RopeParams& p = c.params;
  if (p.width == p.head_dim) {  // H > 1
    p.width *= 2;
    if (p.src_row_stride != 0) p.src_row_stride += p.head_dim;
  }
  RC_TAG(to_string(p.layout));
  const RopeData d = make_data(c);
  TANDEM_REQUIRE_EMPTY(rope_plan_follows(d.plan, p));
  TANDEM_REQUIRE_EMPTY(rope_follows_spec(s.backend, d, p, d.plan, *rc::gen::arbitrary<bool>()));
  // axial RoPE: rows (B'·S rows of W, src_row_stride apart)
  const AxialCase ac = *gen_axial();
  const AxialData ad = make_data(ac);
  const AxialRopePlan& ap = ad.plan;
  const SpecAddress rows =
      rows_of(ac.params.batch, ac.params.seq, 1, ac.params.width, ac.params.src_row_stride);
  if (ap.src_extent() != rows.extent() ||
      ap.out_size() != ac.params.batch * ac.params.seq * ac.params.width) {
    RC_FAIL(ap.describe() + ": source extent " + std::to_string(ap.src_extent()) +
            ", SPEC §5 gives " + std::to_string(rows.extent()));
  }
  const auto mem = spec_place(rows, cs(ad.x));
  Guarded out(ap.out_size());
  s.backend.axial_rope_forward(ap, cs(mem), out.view());
  TANDEM_REQUIRE_EMPTY(out.guard_damage());
  AxialRopeParams cp = ac.params;
  cp.src_row_stride = 0;
  TANDEM_REQUIRE_EMPTY(
      rope_close("axial out placed by SPEC §5", out.values(),
                 reference_axial<double, double>(AxialRopePlan::make(cp), cs(ad.x), false),
                 max_abs(to_double(ad.x))));
}

/// Rank-4 x with num_heads and no layout: dim 1 = H is bhsd, dim 2 = H is
/// bshd, both or neither is refused with an Error about `layout`; without
/// num_heads and layout it is refused too (SPEC §4). The plan so made computes
/// the canonical result on memory placed by that layout.
void rope_rank4_layout(const Subject& s) {
  const Rank4 r = *rc::gen::element(Rank4::bshd, Rank4::bhsd, Rank4::both, Rank4::neither);
  const bool no_heads = *rc::gen::element(false, false, false, true);
  RopeParams e;
  e.batch = *rc::gen::inRange<i64>(1, 4);
  const i64 H = *rc::gen::inRange<i64>(1, 4);
  e.head_dim = 2 * *rc::gen::inRange<i64>(1, 5);
  e.width = H * e.head_dim;
  i64 d1 = 0, d2 = 0;
  switch (r) {
    case Rank4::bshd:
      d1 = other_than(H), d2 = H;
      break;
    case Rank4::bhsd:
      d1 = H, d2 = other_than(H);
      break;
    case Rank4::both:
      d1 = d2 = H;
      break;
    case Rank4::neither:
      d1 = other_than(H), d2 = other_than(H);
      break;
  }
  e.layout = r == Rank4::bhsd ? RopeLayout::bhsd : RopeLayout::bshd;
  e.seq = e.layout == RopeLayout::bhsd ? d2 : d1;
  e.table_rows = std::max(d1, d2) + *rc::gen::inRange<i64>(0, 3);
  if (e.batch > 1 && e.table_rows == e.batch * e.seq) ++e.table_rows;  // position rows, not token
  e.table_stride = e.head_dim / 2;
  const Shape x{e.batch, d1, d2, e.head_dim}, table{e.table_rows, e.table_stride};
  RopeAttrs a;
  if (!no_heads) a.num_heads = H;
  RC_TAG(rank4_name(r), no_heads ? "no num_heads" : "num_heads");
  const bool refused = no_heads || r == Rank4::both || r == Rank4::neither;
  std::optional<RopePlan> plan;
  std::string thrown;
  try {
    plan = RopePlan::from_shapes(x, table, table, a);
  } catch (const Error& err) {
    thrown = err.parameter();
  }
  if (refused) {
    if (thrown != "layout") {
      RC_FAIL("x.shape = " + tandem::to_string(x) +
              (no_heads ? "" : " with num_heads = " + std::to_string(H)) + " and no layout: " +
              (plan ? "accepted as " + plan->describe() : "an Error about " + thrown) +
              ", not an Error about layout");
    }
    return;
  }
  if (!plan) RC_FAIL("x.shape = " + tandem::to_string(x) + " refused (" + thrown + ")");
  const RopePlan want = RopePlan::make(e);
  if (plan->describe() != want.describe()) {
    RC_FAIL("x.shape = " + tandem::to_string(x) + " gave " + plan->describe() + ", SPEC §4 says " +
            want.describe());
  }
  TANDEM_REQUIRE_EMPTY(rope_plan_follows(*plan, e));
  RopeCase c;
  c.params = e;
  c.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
  TANDEM_REQUIRE_EMPTY(rope_follows_spec(s.backend, make_data(c), e, *plan, false));
}

/// One edge of a RoPE call: params and (position ids, views) changes, and the
/// Error's parameter (empty: accepted).
struct RopeEdge {
  std::string what, error;
  RopeParams p;
  std::function<void(RopeData&)> data = [](RopeData&) {};
  i64 src_short = 0, out_extra = 0;  ///< source view shortened, output view lengthened by
};

std::vector<RopeEdge> rope_edges(const RopeParams& p) {
  std::vector<RopeEdge> v;
  const auto add = [&](const std::string& what, const std::string& error,
                       const std::function<void(RopeParams&)>& f) -> RopeEdge& {
    RopeEdge e{what, error, p};
    f(e.p);
    v.push_back(std::move(e));
    return v.back();
  };
  const auto none = [](RopeParams&) {};
  const i64 n_rot = p.n_rot.value_or(p.head_dim), S = p.seq, B = p.batch;
  // n_rot: the largest even value <= head_dim, and the next even one
  add("n_rot = 2*(head_dim/2)", "", [](RopeParams& x) {
    x.n_rot = x.head_dim / 2 * 2;
    x.table_stride = std::max(x.table_stride, x.head_dim / 2);
  });
  add("n_rot = 2*(head_dim/2) + 2", "n_rot", [](RopeParams& x) {
    x.n_rot = x.head_dim / 2 * 2 + 2;
    x.table_stride = x.head_dim / 2 + 1;
  });
  add("n_rot odd", "n_rot", [](RopeParams& x) { x.n_rot = 1; });
  add("table_stride = n_rot/2", "", [&](RopeParams& x) { x.table_stride = n_rot / 2; });
  if (n_rot >= 4)  // (table_stride 0 means n_rot/2)
    add("table_stride = n_rot/2 - 1", "table_stride",
        [&](RopeParams& x) { x.table_stride = n_rot / 2 - 1; });
  if (p.layout == RopeLayout::bhsd) {
    add("bhsd src_row_stride = width", "src_row_stride",
        [](RopeParams& x) { x.src_row_stride = x.width; });
  } else {
    add("src_row_stride = width", "", [](RopeParams& x) { x.src_row_stride = x.width; });
    if (p.width > 1)
      add("src_row_stride = width - 1", "src_row_stride",
          [](RopeParams& x) { x.src_row_stride = x.width - 1; });
  }
  if (p.layout == RopeLayout::thd)
    add("thd with batch 2", "batch", [](RopeParams& x) { x.batch = 2; });
  switch (p.rows) {
    case TableRows::position:
      add("table_rows = seq (position rows)", "", [&](RopeParams& x) { x.table_rows = S; });
      add("table_rows = seq - 1 (position rows)", "table_rows",
          [&](RopeParams& x) { x.table_rows = S - 1; });
      break;
    case TableRows::token:
      add("table_rows = batch*seq + 1 (token rows)", "table_rows",
          [&](RopeParams& x) { x.table_rows = B * S + 1; });
      if (B * S > 1)
        add("table_rows = batch*seq - 1 (token rows)", "table_rows",
            [&](RopeParams& x) { x.table_rows = B * S - 1; });
      break;
    case TableRows::position_ids: {
      const i64 at = *rc::gen::inRange<i64>(0, B * S);
      const auto pos = [at](i64 value, bool from_r) {
        return [=](RopeData& d) {
          auto ids = d.positions.values;
          ids[static_cast<std::size_t>(at)] = from_r ? d.plan.R + value : value;
          d.positions = PositionIds::of(std::move(ids), d.positions.int32);
        };
      };
      add("a position id = max_position - 1", "", none).data = pos(-1, true);
      add("a position id = 0", "", none).data = pos(0, false);
      add("a position id = max_position", "positions", none).data = pos(0, true);
      add("a position id = -1", "positions", none).data = pos(-1, false);
      add("one position id too many", "positions.size()", none).data = [](RopeData& d) {
        auto ids = d.positions.values;
        ids.push_back(0);
        d.positions = PositionIds::of(std::move(ids), d.positions.int32);
      };
      add("table_rows = 0 (position ids)", "table_rows", [](RopeParams& x) { x.table_rows = 0; });
      break;
    }
  }
  if (p.rows != TableRows::position_ids) {
    add("position ids for other rows", "positions.size()", none).data = [](RopeData& d) {
      d.positions = PositionIds::of({0}, false);
    };
  }
  add("cos one entry too many", "cos.size()", none).data = [](RopeData& d) {
    d.cos.push_back(0.5f);
  };
  add("sin one entry too few", "sin.size()", none).data = [](RopeData& d) {
    if (d.sin.empty())
      d.sin.push_back(0.5f);
    else
      d.sin.pop_back();
  };
  add("source one element short", "x.size()", none).src_short = 1;
  add("out one element long", "out.size()", none).out_extra = 1;
  return v;
}

/// Every bound of a RoPE call (SPEC §4, §8) at its edge: n_rot, table_stride,
/// src_row_stride, table_rows of each row kind, each position id, the views'
/// sizes. The edge value is accepted and agrees with reference<double>; one
/// past it is refused with an Error naming the parameter before anything is
/// written.
void rope_bounds(const Subject& s) {
  const RopeCase c = *gen_rope();
  const std::vector<RopeEdge> edges = rope_edges(c.params);
  const RopeEdge& e = edges[*rc::gen::inRange<std::size_t>(0, edges.size())];
  RC_TAG(e.error.empty() ? "accepted" : "refused");
  std::optional<RopePlan> plan;
  std::string thrown;
  try {
    plan = RopePlan::make(e.p);
  } catch (const Error& err) {
    thrown = err.parameter();
  }
  if (!plan) {
    if (thrown != e.error)
      RC_FAIL(e.what + ": make() refused with an Error about " + thrown + ", not " +
              (e.error.empty() ? "accepted" : e.error));
    return;
  }
  RopeCase ce = c;
  ce.params = e.p;
  RopeData d = make_data(ce);
  e.data(d);
  const auto mem = rope_source(*plan, d.x);
  const std::span<const float> src(mem.data(), mem.size() - static_cast<std::size_t>(e.src_short));
  Guarded out(plan->out_size() + e.out_extra);
  thrown = "(nothing)";
  try {
    s.backend.rope_forward(*plan, src, d.tables(), out.view());
    thrown.clear();
  } catch (const Error& err) {
    thrown = err.parameter();
  }
  if (!e.error.empty()) {
    if (thrown != e.error) {
      RC_FAIL(e.what + " (" + plan->describe() +
              "): " + (thrown.empty() ? "accepted" : "an Error about " + thrown) +
              ", not an Error about " + e.error);
    }
    if (!out.untouched()) RC_FAIL(e.what + ": out written before the Error");
    TANDEM_REQUIRE_EMPTY(out.guard_damage());
    return;
  }
  if (!thrown.empty()) RC_FAIL(e.what + " (" + plan->describe() + ") refused: " + thrown);
  TANDEM_REQUIRE_EMPTY(out.guard_damage());
  TANDEM_REQUIRE_EMPTY(out.unwritten());
  const auto got =
      gather<float>(plan->out, plan->B, plan->S, plan->heads(), plan->D, cs(out.values()));
  TANDEM_REQUIRE_EMPTY(rope_close(e.what, got,
                                  reference_rope<double, double>(*plan, cs(d.x), d.tables(), false),
                                  max_abs(to_double(d.x))));
}

}  // namespace

void register_plan_properties(std::vector<Property>& v) {
  v.push_back(
      {"attention_plan_addressing_follows_spec", "layout", 150, attention_addressing, true});
  v.push_back({"attention_rank4_layout_by_num_heads", "layout", 150, attention_rank4_layout});
  v.push_back(
      {"attention_index_inputs_at_their_bounds", "memory", 200, attention_index_edges, true});
  v.push_back(
      {"attention_plan_params_at_their_bounds", "memory", 150, attention_param_bounds, true});
  const std::size_t first = v.size();
  v.push_back({"rope_plan_addressing_follows_spec", "layout", 150, rope_addressing});
  v.push_back({"rope_rank4_layout_by_num_heads", "layout", 150, rope_rank4_layout});
  v.push_back({"rope_inputs_at_their_bounds", "memory", 200, rope_bounds});
  for (std::size_t i = first; i < v.size(); ++i) v[i].calls_attention = false;
}

}  // namespace tandem::props
