// SPDX-License-Identifier: Apache-2.0
// FlexAttention calls that are native attention calls (flex_native.hpp,
// SPEC §13.5): the band analysis of a mask_mod, the block mask's check
// against it, and the softcap form of a score_mod.

#include "flex_native.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "entry_points.hpp"
#include "tandem/optimized/convert.hpp"
#include "tandem/storage.hpp"

namespace tandem::optimized::flex {
namespace {

constexpr std::int64_t kMinus = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kPlus = std::numeric_limits<std::int64_t>::max();

/// An integer node as a·q_idx + b·kv_idx + c, or not affine.
struct Affine {
  bool ok = false;
  std::int64_t a = 0, b = 0, c = 0;
};

/// The keys lo <= kv_idx − q_idx <= hi, clamped to the call's range of
/// d = kv_idx − q_idx; lo > hi: none; not ok: not a band.
struct Band {
  bool ok = false;
  std::int64_t lo = 0, hi = 0;
};

/// x·y + z with overflow reported as not affine.
bool mul_add(std::int64_t x, std::int64_t y, std::int64_t z, std::int64_t& out) {
  std::int64_t p = 0;
  return !__builtin_mul_overflow(x, y, &p) && !__builtin_add_overflow(p, z, &out);
}

/// The affine form of x + s·y (s = ±1).
Affine combine(const Affine& x, const Affine& y, std::int64_t s) {
  Affine r{true};
  if (!x.ok || !y.ok || !mul_add(s, y.a, x.a, r.a) || !mul_add(s, y.b, x.b, r.b) ||
      !mul_add(s, y.c, x.c, r.c)) {
    return {};
  }
  return r;
}

/// The affine form of k·x for a constant k.
Affine scaled(const Affine& x, std::int64_t k) {
  Affine r{true};
  if (!x.ok || !mul_add(k, x.a, 0, r.a) || !mul_add(k, x.b, 0, r.b) || !mul_add(k, x.c, 0, r.c)) {
    return {};
  }
  return r;
}

/// Reads a mask_mod as bands of d = kv_idx − q_idx over the call's ranges.
class BandReader {
 public:
  BandReader(const ModProgram& p, std::int64_t Sq, std::int64_t Sk)
      : p_(p), Sq_(Sq), Sk_(Sk), dmin_(-(Sq - 1)), dmax_(Sk - 1) {
    affine_.resize(p.nodes().size());
    band_.resize(p.nodes().size());
    for (std::size_t i = 0; i < p.nodes().size(); ++i) visit(static_cast<std::int32_t>(i));
  }

  /// The band of node `id` (a boolean node).
  [[nodiscard]] Band band(std::int32_t id) const { return band_[static_cast<std::size_t>(id)]; }
  /// The affine form of node `id` (an integer node).
  [[nodiscard]] Affine affine_of(std::int32_t id) const {
    return affine_[static_cast<std::size_t>(id)];
  }
  /// Every key of the call.
  [[nodiscard]] Band all() const { return {true, dmin_, dmax_}; }

 private:
  [[nodiscard]] Band none() const { return {true, 1, 0}; }
  [[nodiscard]] Band clamp(std::int64_t lo, std::int64_t hi) const {
    lo = std::max(lo, dmin_), hi = std::min(hi, dmax_);
    return lo > hi ? none() : Band{true, lo, hi};
  }
  Affine& affine(std::int32_t id) { return affine_[static_cast<std::size_t>(id)]; }
  Band& band_of(std::int32_t id) { return band_[static_cast<std::size_t>(id)]; }

  void visit(std::int32_t id) {
    const ModNode& n = p_.node(id);
    if (n.type == ModType::integer) {
      affine(id) = integer(n);
    } else if (n.type == ModType::boolean) {
      band_of(id) = boolean(n);
    }
  }

  Affine integer(const ModNode& n) {
    const auto arg = [&](int i) { return affine(n.arg[static_cast<std::size_t>(i)]); };
    switch (n.op) {
      case ModOp::q_idx:
        return {true, 1, 0, 0};
      case ModOp::kv_idx:
        return {true, 0, 1, 0};
      case ModOp::constant:
        return {true, 0, 0, n.ivalue};
      case ModOp::add:
        return combine(arg(0), arg(1), 1);
      case ModOp::sub:
        return combine(arg(0), arg(1), -1);
      case ModOp::neg:
        return scaled(arg(0), -1);
      case ModOp::mul: {
        const Affine x = arg(0), y = arg(1);
        if (x.ok && x.a == 0 && x.b == 0) return scaled(y, x.c);
        if (y.ok && y.a == 0 && y.b == 0) return scaled(x, y.c);
        return {};
      }
      default:
        return {};  // b, h, loads, division, min/max, where: not affine
    }
  }

  Band boolean(const ModNode& n) {
    const auto arg = [&](int i) { return band_of(n.arg[static_cast<std::size_t>(i)]); };
    switch (n.op) {
      case ModOp::constant:
        return n.ivalue != 0 ? all() : none();
      case ModOp::lt:
      case ModOp::le:
      case ModOp::gt:
      case ModOp::ge:
      case ModOp::eq:
        if (p_.node(n.arg[0]).type != ModType::integer) return {};
        return compare(n.op, combine(affine(n.arg[0]), affine(n.arg[1]), -1));
      case ModOp::logical_and: {
        const Band x = arg(0), y = arg(1);
        if (!x.ok || !y.ok) return {};
        return clamp(std::max(x.lo, y.lo), std::min(x.hi, y.hi));
      }
      case ModOp::logical_or: {
        const Band x = arg(0), y = arg(1);
        if (!x.ok || !y.ok) return {};
        if (x.lo > x.hi) return y;
        if (y.lo > y.hi) return x;
        // one band only where they overlap or touch
        if (std::max(x.lo, y.lo) > std::min(x.hi, y.hi) + 1) return {};
        return clamp(std::min(x.lo, y.lo), std::max(x.hi, y.hi));
      }
      case ModOp::logical_not: {
        const Band x = arg(0);
        if (!x.ok) return {};
        if (x.lo > x.hi) return all();
        if (x.lo == dmin_) return x.hi == dmax_ ? none() : clamp(x.hi + 1, dmax_);
        if (x.hi == dmax_) return clamp(dmin_, x.lo - 1);
        return {};
      }
      default:
        return {};  // ne, where, a boolean tensor's load: not a band
    }
  }

  /// The band of z REL 0 for z = a·q + b·kv + c.
  Band compare(ModOp rel, const Affine& z) {
    if (!z.ok) return {};
    if (z.a == 0 && z.b == 0) return holds(rel, z.c) ? all() : none();
    if (z.a == 0 || z.b == 0) return one_index(rel, z);
    if (z.a != -z.b || (z.b != 1 && z.b != -1)) return {};
    // z = s·d + c with s = ±1: s·d + c REL 0, so d REL' −s·c (REL flipped for s = −1)
    const std::int64_t s = z.b;
    std::int64_t t = 0;
    if (__builtin_mul_overflow(-s, z.c, &t)) return {};
    const ModOp r = s == 1 ? rel : flipped(rel);
    switch (r) {
      case ModOp::lt:
        return t == kMinus ? none() : clamp(kMinus, t - 1);
      case ModOp::le:
        return clamp(kMinus, t);
      case ModOp::gt:
        return t == kPlus ? none() : clamp(t + 1, kPlus);
      case ModOp::ge:
        return clamp(t, kPlus);
      default:
        return clamp(t, t);  // eq
    }
  }

  /// z REL 0 for z reading one index only: a band when it holds for every
  /// value of that index over the call or for none.
  Band one_index(ModOp rel, const Affine& z) const {
    const std::int64_t k = z.a != 0 ? z.a : z.b, top = z.a != 0 ? Sq_ - 1 : Sk_ - 1;
    std::int64_t z0 = 0, z1 = 0;  // z at index 0 and at the last index
    if (!mul_add(k, 0, z.c, z0) || !mul_add(k, top, z.c, z1)) return {};
    const bool at0 = holds(rel, z0), at1 = holds(rel, z1);
    // z is monotone in the index, so lt, le, gt, ge hold everywhere when they
    // hold at both ends; eq holds nowhere when z never crosses 0
    if (rel == ModOp::eq) {
      if (top == 0) return at0 ? all() : none();
      return (z0 > 0 && z1 > 0) || (z0 < 0 && z1 < 0) ? none() : Band{};
    }
    if (at0 && at1) return all();
    if (!at0 && !at1) return none();
    return {};
  }

  static bool holds(ModOp rel, std::int64_t z) {
    switch (rel) {
      case ModOp::lt:
        return z < 0;
      case ModOp::le:
        return z <= 0;
      case ModOp::gt:
        return z > 0;
      case ModOp::ge:
        return z >= 0;
      default:
        return z == 0;
    }
  }
  static ModOp flipped(ModOp rel) {
    switch (rel) {
      case ModOp::lt:
        return ModOp::gt;
      case ModOp::le:
        return ModOp::ge;
      case ModOp::gt:
        return ModOp::lt;
      case ModOp::ge:
        return ModOp::le;
      default:
        return rel;
    }
  }

  const ModProgram& p_;
  std::int64_t Sq_, Sk_, dmin_, dmax_;
  std::vector<Affine> affine_;
  std::vector<Band> band_;
};

/// The softcap c of score_mod `f` (0: f is absent or the score itself), or
/// nothing when f is neither c · tanh(score / c) nor the score.
std::optional<double> softcap_of(const ModProgram& f) {
  if (f.empty() || f.node(f.result()).op == ModOp::score) return 0.0;
  const ModNode& r = f.node(f.result());
  if (r.op != ModOp::mul) return std::nullopt;
  const auto constant = [&](std::int32_t id) {
    const ModNode& n = f.node(id);
    return n.op == ModOp::constant && n.type == ModType::real && n.value > 0 &&
           n.value < std::numeric_limits<double>::infinity();
  };
  for (int side = 0; side < 2; ++side) {
    const std::int32_t c = r.arg[static_cast<std::size_t>(side)];
    const ModNode& t = f.node(r.arg[static_cast<std::size_t>(1 - side)]);
    if (!constant(c) || t.op != ModOp::tanh) continue;
    const ModNode& q = f.node(t.arg[0]);
    if (q.op == ModOp::div && f.node(q.arg[0]).op == ModOp::score && constant(q.arg[1]) &&
        f.node(q.arg[1]).value == f.node(c).value) {
      return f.node(c).value;
    }
  }
  return std::nullopt;
}

/// The ALiBi form of score_mod `f` on band `band`: the tensor holding the
/// slopes `[H]` when f is score − slopes[h]·abs(±(q_idx − kv_idx + shift))
/// or score + slopes[h]·(kv_idx − q_idx − shift) on a band with hi <= shift
/// (where kv_idx − q_idx − shift = −abs(q_idx + shift − kv_idx)), shift =
/// Sk − Sq (SPEC §2.8); −1 otherwise.
std::int32_t alibi_of(const ModProgram& f, const Band& band, std::int64_t Sq, std::int64_t Sk,
                      std::int64_t H) {
  if (f.empty() || f.tensors().size() != 1) return -1;
  const ModNode& r = f.node(f.result());
  std::int64_t sign = 0;  // the term's sign: score + sign·Y
  std::int32_t y = -1;
  if ((r.op == ModOp::add || r.op == ModOp::sub) && f.node(r.arg[0]).op == ModOp::score) {
    sign = r.op == ModOp::add ? 1 : -1, y = r.arg[1];
  } else if (r.op == ModOp::add && f.node(r.arg[1]).op == ModOp::score) {
    sign = 1, y = r.arg[0];
  }
  if (y < 0 || f.node(y).op != ModOp::mul) return -1;
  const ModNode& m = f.node(y);
  const auto slopes = [&](std::int32_t id) {
    const ModNode& n = f.node(id);
    return n.op == ModOp::load &&
           f.tensors()[static_cast<std::size_t>(n.tensor)].type == ModType::real &&
           f.tensors()[static_cast<std::size_t>(n.tensor)].shape == std::vector<std::int64_t>{H} &&
           f.node(n.index[0]).op == ModOp::head;
  };
  const std::int32_t load = slopes(m.arg[0]) ? m.arg[0] : slopes(m.arg[1]) ? m.arg[1] : -1;
  if (load < 0) return -1;
  const ModNode& dist = f.node(load == m.arg[0] ? m.arg[1] : m.arg[0]);
  if (dist.op != ModOp::to_real) return -1;
  const BandReader reader(f, Sq, Sk);
  const std::int64_t shift = Sk - Sq;
  const ModNode& g = f.node(dist.arg[0]);
  bool ok = false;
  if (g.op == ModOp::abs) {  // −abs(κ(q − kv) + c) with κc = shift
    const Affine a = reader.affine_of(g.arg[0]);
    ok = sign == -1 && a.ok && (a.a == 1 || a.a == -1) && a.b == -a.a && a.a * a.c == shift;
  } else {  // sign·(α(kv − q) + c) = kv − q − shift where kv − q <= shift
    const Affine a = reader.affine_of(dist.arg[0]);
    ok = a.ok && a.b == sign && a.a == -sign && sign * a.c == -shift && band.hi <= shift;
  }
  return ok ? f.node(load).tensor : -1;
}

/// True when block mask `blocks` of `plan` says nothing band `band` (and,
/// with `doc`, the documents: key j visible from query i only where doc[i]
/// = doc[j], doc non-decreasing) does not: each block it marks full is
/// inside the band and one document, each it hides sees nothing (outside
/// the band, or its rows' documents and its keys' apart).
bool blocks_agree(const FlexPlan& plan, const FlexBlockMaskData& blocks, const Band& band,
                  const Indices* doc) {
  const FlexBlockMaskShape& m = *plan.params().block_mask;
  const std::int64_t Sq = plan.params().Sq, Sk = plan.params().Sk;
  const std::int64_t nQ = plan.q_blocks(), nK = plan.kv_blocks();
  enum class Kind : std::uint8_t { hidden, partial, full };
  std::vector<Kind> kind(static_cast<std::size_t>(nK));
  for (std::int64_t row = 0; row < m.B * m.H * nQ; ++row) {
    std::fill(kind.begin(), kind.end(), Kind::hidden);
    const auto mark = [&](const Indices& num, const Indices& idx, std::int64_t width, Kind k) {
      const std::int64_t n = num[static_cast<std::size_t>(row)];
      for (std::int64_t c = 0; c < n; ++c) {
        kind[static_cast<std::size_t>(idx[static_cast<std::size_t>(row * width + c)])] = k;
      }
    };
    mark(blocks.kv_num_blocks, blocks.kv_indices, m.width, Kind::partial);
    if (m.has_full)
      mark(blocks.full_kv_num_blocks, blocks.full_kv_indices, m.full_width, Kind::full);
    const std::int64_t qb = row % nQ, i0 = qb * m.q_block, i1 = std::min(i0 + m.q_block, Sq) - 1;
    for (std::int64_t kb = 0; kb < nK; ++kb) {
      const std::int64_t j0 = kb * m.kv_block, j1 = std::min(j0 + m.kv_block, Sk) - 1;
      // the block holds every d in [j0 − i1, j1 − i0]
      const std::int64_t lo = j0 - i1, hi = j1 - i0;
      const Kind k = kind[static_cast<std::size_t>(kb)];
      const auto at = [doc](std::int64_t x) { return (*doc)[static_cast<std::size_t>(x)]; };
      const bool one_doc =
          doc == nullptr || (at(i0) == at(i1) && at(j0) == at(j1) && at(i0) == at(j0));
      const bool docs_meet = doc == nullptr || (at(j0) <= at(i1) && at(i0) <= at(j1));
      if (k == Kind::full && (lo < band.lo || hi > band.hi || !one_doc)) return false;
      if (k == Kind::hidden && hi >= band.lo && lo <= band.hi && docs_meet) return false;
    }
  }
  return true;
}

}  // namespace

namespace {

/// The conjuncts of boolean node `id` of `p`: its tree of logical_and, flattened.
void conjuncts(const ModProgram& p, std::int32_t id, std::vector<std::int32_t>& out) {
  const ModNode& n = p.node(id);
  if (n.op != ModOp::logical_and) {
    out.push_back(id);
    return;
  }
  conjuncts(p, n.arg[0], out);
  conjuncts(p, n.arg[1], out);
}

/// The integer tensor T `[Sk]` of conjunct `id` when it is T[q_idx] ==
/// T[kv_idx] (either side first), or −1.
std::int32_t documents_of(const ModProgram& p, std::int32_t id, std::int64_t Sk) {
  const ModNode& n = p.node(id);
  if (n.op != ModOp::eq) return -1;
  const ModNode &x = p.node(n.arg[0]), &y = p.node(n.arg[1]);
  if (x.op != ModOp::load || y.op != ModOp::load || x.tensor != y.tensor) return -1;
  const ModTensor& t = p.tensors()[static_cast<std::size_t>(x.tensor)];
  if (t.type != ModType::integer || t.shape != std::vector<std::int64_t>{Sk}) return -1;
  const ModOp a = p.node(x.index[0]).op, b = p.node(y.index[0]).op;
  const bool sides =
      (a == ModOp::q_idx && b == ModOp::kv_idx) || (a == ModOp::kv_idx && b == ModOp::q_idx);
  return sides ? x.tensor : -1;
}

/// True when doc (Sk values) never decreases: each document one run of keys.
bool runs(const Indices& doc) {
  for (std::size_t j = 1; j < doc.size(); ++j) {
    if (doc[j] < doc[j - 1]) return false;
  }
  return true;
}

}  // namespace

std::optional<NativeForm> native_form(const FlexPlan& plan, const FlexBlockMaskData& blocks,
                                      const std::vector<Indices>& mask_integers) {
  const FlexParams& f = plan.params();
  const BandReader reader(f.mask_mod, f.Sq, f.Sk);
  Band band = reader.all();
  std::int32_t documents = -1;
  if (!f.mask_mod.empty()) {
    std::vector<std::int32_t> parts;
    conjuncts(f.mask_mod, f.mask_mod.result(), parts);
    for (const std::int32_t id : parts) {
      const Band b = reader.band(id);
      if (b.ok) {
        band = {true, std::max(band.lo, b.lo), std::min(band.hi, b.hi)};
        continue;
      }
      const std::int32_t t = documents_of(f.mask_mod, id, f.Sk);
      if (t < 0 || documents >= 0 || f.Sq != f.Sk) return std::nullopt;
      documents = t;
    }
  }
  if (band.lo > band.hi) return std::nullopt;
  const Indices* doc = nullptr;
  if (documents >= 0) {
    doc = &mask_integers[static_cast<std::size_t>(documents)];
    if (!runs(*doc)) return std::nullopt;
  }
  NativeForm n;
  AttentionParams& a = n.params;
  if (const std::optional<double> softcap = softcap_of(f.score_mod)) {
    if (!f.score_mod.tensors().empty()) return std::nullopt;  // their gradients are outputs
    a.softcap = *softcap;
  } else {
    n.slopes = alibi_of(f.score_mod, band, f.Sq, f.Sk, f.H);
    if (n.slopes < 0) return std::nullopt;
    a.alibi = AlibiKind::per_head;
  }
  if (f.block_mask && !blocks_agree(plan, blocks, band, doc)) return std::nullopt;
  n.documents = documents;
  a.B = f.B, a.Sq = f.Sq, a.Sk = f.Sk, a.H = f.H, a.Hkv = f.Hkv, a.D = f.D, a.Dv = f.Dv;
  a.layout = Layout::bhsd;
  a.scale = plan.scale();
  a.rounding = kRoundingExact;
  const std::int64_t o = std::max<std::int64_t>(f.Sk - f.Sq, 0);
  const Band whole = reader.all();
  if (band.lo == whole.lo && band.hi == whole.hi) {
    a.mask = MaskKind::none;
  } else if (band.hi == o && band.lo == whole.lo) {
    a.mask = MaskKind::causal;
  } else if (band.hi == o) {
    a.mask = MaskKind::sliding_window;
    a.window = o - band.lo;
  } else {
    return std::nullopt;
  }
  return n;
}

namespace {

/// The `n` elements of batch entry b of x (`[B, …]`), or x when it is empty
/// (an output the call does not ask for).
template <class T>
std::span<T> entry(std::span<T> x, std::int64_t b, std::int64_t n) {
  return x.empty() ? x : x.subspan(static_cast<std::size_t>(b * n), static_cast<std::size_t>(n));
}

/// The native call of a flex call: its plan and inputs, the ALiBi slopes in
/// float (no plan when they are not all finite: the program path takes
/// them) and, for a document mask, the documents as the packed sequences
/// (SPEC §2.9) of a bhsd batch of 1: one such call per batch entry, each
/// reading its entry of q, k, v in place (the documents are the same in
/// every entry: doc is indexed by position alone).
template <class T>
struct NativeCall {
  std::optional<AttentionPlan> plan;
  AttentionInputs<T> in;
  std::vector<float> slopes;
  std::int64_t entries = 1;  ///< the calls: B for packed documents, else 1
  std::vector<std::int64_t> cu;

  NativeCall(const FlexPlan& p, const FlexInputs<T>& x) {
    std::optional<NativeForm> n = native_form(p, x.block_mask, x.mask_tensors.integer);
    if (!n) return;
    in = {x.q, x.k, x.v};
    if (n->slopes >= 0) {
      for (const T m : x.score_tensors.real[static_cast<std::size_t>(n->slopes)]) {
        slopes.push_back(static_cast<float>(m));
        if (!std::isfinite(slopes.back())) return;
      }
      in.alibi_slopes = slopes;
    }
    if (n->documents >= 0) pack(n->params, x.mask_tensors.integer[std::size_t(n->documents)]);
    plan = AttentionPlan::make(n->params);
  }

  /// Makes `a` the packed call of one batch entry's documents `doc`.
  void pack(AttentionParams& a, const Indices& doc) {
    entries = a.B;
    for (std::int64_t j = 0; j < a.Sq; ++j) {
      if (j == 0 || doc[std::size_t(j)] != doc[std::size_t(j - 1)]) cu.push_back(j);
    }
    cu.push_back(a.Sq);
    in.cu_seqlens_q = in.cu_seqlens_k = Indices{cu};
    a.num_seqs = static_cast<std::int64_t>(cu.size()) - 1;
    a.B = 1;
  }
  /// The inputs of batch entry b's call.
  [[nodiscard]] AttentionInputs<T> inputs(std::int64_t b) const {
    if (entries == 1) return in;
    AttentionInputs<T> e = in;
    e.q = entry(in.q, b, plan->q.extent);
    e.k = entry(in.k, b, plan->k.extent);
    e.v = entry(in.v, b, plan->v.extent);
    return e;
  }
};

/// The native forward of `c`, its inputs `in`, into out and lse (empty: not written).
template <class T>
void forward(const NativeCall<T>& c, const AttentionInputs<T>& in, std::span<T> out,
             std::span<float> lse, const Options& options) {
  const AttentionPlan& p = *c.plan;
  if constexpr (std::is_same_v<T, float>) {
    if (lse.empty()) {
      detail::attention_forward(p, in, out, options);
    } else {
      detail::attention_forward_lse(p, in, out, lse, options);
    }
  } else if (lse.empty()) {
    detail::attention_forward_stored(p, in, out, options);
  } else {
    detail::attention_forward_lse_stored(p, in, out, lse, options);
  }
}

}  // namespace

template <class T>
bool native_forward(const FlexPlan& plan, const FlexInputs<T>& in, std::span<T> out,
                    std::span<float> lse, const Options& options) {
  const NativeCall<T> c(plan, in);
  if (!c.plan) return false;
  const AttentionPlan& p = *c.plan;
  for (std::int64_t b = 0; b < c.entries; ++b) {
    forward(c, c.inputs(b), entry(out, b, p.o.extent), entry(lse, b, p.lse_size()), options);
  }
  return true;
}

namespace {

/// x widened to float (exact; convert.hpp's vector loads).
template <class T>
std::vector<float> widened(std::span<const T> x) {
  std::vector<float> y(x.size());
  convert_widen<T>(x, y);
  return y;
}

/// The backward of a bf16 or f16 call as the flex contract rounds it (SPEC
/// §13.5: dq, dk and dv rounded to T once, from float): the float native
/// backward on the inputs widened, its results narrowed. (The native
/// kernels' own bf16 backward reads the output rounded to T, a rounding
/// point flex does not have.)
template <class T>
bool native_backward_widened(const FlexPlan& plan, const FlexInputs<T>& in, std::span<const T> dout,
                             const FlexGrads<T>& grads, const Options& options) {
  if (!native_form(plan, in.block_mask, in.mask_tensors.integer)) return false;
  const std::vector<float> q = widened(in.q), k = widened(in.k), v = widened(in.v),
                           dO = widened(dout);
  std::vector<std::vector<float>> real;
  for (const auto& t : in.score_tensors.real) real.push_back(widened(t));
  ModCaptures<float> score{{}, in.score_tensors.integer};
  for (const auto& t : real) score.real.emplace_back(t);
  const ModCaptures<float> mask{std::vector<std::span<const float>>(in.mask_tensors.real.size()),
                                in.mask_tensors.integer};
  std::vector<float> dq(grads.dq.size()), dk(grads.dk.size()), dv(grads.dv.size());
  if (!native_backward<float>(plan, {q, k, v, score, mask, in.block_mask}, dO, {dq, dk, dv, {}},
                              options)) {
    return false;
  }
  // RN_T of each float gradient, once (convert.hpp's rounding stores)
  convert_round<T>(dq, grads.dq), convert_round<T>(dk, grads.dk), convert_round<T>(dv, grads.dv);
  return true;
}

}  // namespace

template <class T>
bool native_backward(const FlexPlan& plan, const FlexInputs<T>& in, std::span<const T> dout,
                     const FlexGrads<T>& grads, const Options& options) {
  for (const auto& dT : grads.d_score_tensors) {
    if (!dT.empty()) return false;  // the native kernels give no slope gradient
  }
  if constexpr (!std::is_same_v<T, float>) {
    return native_backward_widened(plan, in, dout, grads, options);
  }
  const NativeCall<T> c(plan, in);
  if (!c.plan) return false;
  const AttentionPlan& p = *c.plan;
  const AttentionSaved<T>* none = nullptr;  // the forward rerun
  for (std::int64_t b = 0; b < c.entries; ++b) {
    const AttentionGrads<T> g{entry(grads.dq, b, p.dq.extent), entry(grads.dk, b, p.dk.extent),
                              entry(grads.dv, b, p.dv.extent)};
    detail::attention_backward(p, c.inputs(b), entry(dout, b, p.o.extent), g, none, options);
  }
  return true;
}

#define TANDEM_FLEX_NATIVE(T)                                                              \
  template bool native_forward(const FlexPlan&, const FlexInputs<T>&, std::span<T>,        \
                               std::span<float>, const Options&);                          \
  template bool native_backward(const FlexPlan&, const FlexInputs<T>&, std::span<const T>, \
                                const FlexGrads<T>&, const Options&);
TANDEM_FLEX_NATIVE(float)
TANDEM_FLEX_NATIVE(bfloat16)
TANDEM_FLEX_NATIVE(float16)
#undef TANDEM_FLEX_NATIVE

}  // namespace tandem::optimized::flex
