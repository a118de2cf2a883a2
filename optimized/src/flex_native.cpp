// SPDX-License-Identifier: Apache-2.0
// FlexAttention calls that are native attention calls (flex_native.hpp,
// SPEC §13.5): the band analysis of a mask_mod, the block mask's check
// against it, and the softcap form of a score_mod.

#include "flex_native.hpp"

#include "entry_points.hpp"
#include "tandem/storage.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

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

/// True when block mask `blocks` of `plan` says nothing band `band` does
/// not: each block it marks full lies inside the band, each it hides
/// outside.
bool blocks_agree(const FlexPlan& plan, const FlexBlockMaskData& blocks, const Band& band) {
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
    if (m.has_full) mark(blocks.full_kv_num_blocks, blocks.full_kv_indices, m.full_width, Kind::full);
    const std::int64_t qb = row % nQ, i0 = qb * m.q_block, i1 = std::min(i0 + m.q_block, Sq) - 1;
    for (std::int64_t kb = 0; kb < nK; ++kb) {
      const std::int64_t j0 = kb * m.kv_block, j1 = std::min(j0 + m.kv_block, Sk) - 1;
      // the block holds every d in [j0 − i1, j1 − i0]
      const std::int64_t lo = j0 - i1, hi = j1 - i0;
      const Kind k = kind[static_cast<std::size_t>(kb)];
      if (k == Kind::full && (lo < band.lo || hi > band.hi)) return false;
      if (k == Kind::hidden && band.lo <= band.hi && hi >= band.lo && lo <= band.hi) return false;
    }
  }
  return true;
}

}  // namespace

std::optional<AttentionParams> native_form(const FlexPlan& plan, const FlexBlockMaskData& blocks) {
  const FlexParams& f = plan.params();
  if (!f.score_mod.tensors().empty()) return std::nullopt;  // its gradients are outputs
  const std::optional<double> softcap = softcap_of(f.score_mod);
  if (!softcap) return std::nullopt;
  const BandReader reader(f.mask_mod, f.Sq, f.Sk);
  const Band band = f.mask_mod.empty() ? reader.all() : reader.band(f.mask_mod.result());
  if (!band.ok || band.lo > band.hi) return std::nullopt;
  if (f.block_mask && !blocks_agree(plan, blocks, band)) return std::nullopt;
  AttentionParams a;
  a.B = f.B, a.Sq = f.Sq, a.Sk = f.Sk, a.H = f.H, a.Hkv = f.Hkv, a.D = f.D, a.Dv = f.Dv;
  a.layout = Layout::bhsd;
  a.scale = plan.scale();
  a.softcap = *softcap;
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
  return a;
}

template <class T>
bool native_forward(const FlexPlan& plan, const FlexInputs<T>& in, std::span<T> out,
                    std::span<float> lse, const Options& options) {
  const std::optional<AttentionParams> a = native_form(plan, in.block_mask);
  if (!a) return false;
  const AttentionPlan native = AttentionPlan::make(*a);
  const AttentionInputs<T> x{in.q, in.k, in.v};
  if constexpr (std::is_same_v<T, float>) {
    if (lse.empty()) {
      detail::attention_forward(native, x, out, options);
    } else {
      detail::attention_forward_lse(native, x, out, lse, options);
    }
  } else if (lse.empty()) {
    detail::attention_forward_stored(native, x, out, options);
  } else {
    detail::attention_forward_lse_stored(native, x, out, lse, options);
  }
  return true;
}

template <class T>
bool native_backward(const FlexPlan& plan, const FlexInputs<T>& in, std::span<const T> dout,
                     const FlexGrads<T>& grads, const Options& options) {
  const std::optional<AttentionParams> a = native_form(plan, in.block_mask);
  if (!a) return false;
  const AttentionInputs<T> x{in.q, in.k, in.v};
  const AttentionGrads<T> g{grads.dq, grads.dk, grads.dv};
  const AttentionSaved<T>* none = nullptr;  // the forward rerun
  detail::attention_backward(AttentionPlan::make(*a), x, dout, g, none, options);
  return true;
}

#define TANDEM_FLEX_NATIVE(T)                                                                   \
  template bool native_forward(const FlexPlan&, const FlexInputs<T>&, std::span<T>,            \
                               std::span<float>, const Options&);                              \
  template bool native_backward(const FlexPlan&, const FlexInputs<T>&, std::span<const T>,     \
                                const FlexGrads<T>&, const Options&);
TANDEM_FLEX_NATIVE(float)
TANDEM_FLEX_NATIVE(bfloat16)
TANDEM_FLEX_NATIVE(float16)
#undef TANDEM_FLEX_NATIVE

}  // namespace tandem::optimized::flex
