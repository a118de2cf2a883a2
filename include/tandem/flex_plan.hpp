// SPDX-License-Identifier: Apache-2.0
/// @file flex_plan.hpp
/// @brief The plan of one FlexAttention call (SPEC §13.4): sizes, scale, the
///        score_mod and mask_mod programs of flex_mod.hpp and the shape of
///        the block mask, validated once by FlexPlan::make(); the call's
///        views (q, k, v, the captured tensors, the block mask's indices)
///        validated by FlexPlan::check_inputs() before anything is written.
///
/// For batch entry b, query head h (kv head g = h / (H/Hkv)), query i and
/// key j, all in `bhsd` as torch's flex_attention takes them:
/// @f[ s_{ij} = \mathrm{scale}\,\langle q_i, k_j\rangle,\qquad
///     t_{ij} = \mathrm{score\_mod}(s_{ij}, b, h, i, j), @f]
/// @f[ p_{ij} = \frac{e^{t_{ij}}}{\sum_{\text{visible } j'} e^{t_{ij'}}},\qquad
///     o_i = \sum_{\text{visible } j} p_{ij}\, v_j,\qquad
///     \mathrm{lse}_i = \log \sum_{\text{visible } j} e^{t_{ij}} , @f]
/// where key j is visible to query i when its block (i / q_block,
/// j / kv_block) is a full block of the block mask, or a partial block and
/// mask_mod(b, h, i, j) holds (without a block mask: when mask_mod holds).
/// q `[B,H,Sq,D]`, k `[B,Hkv,Sk,D]`, v `[B,Hkv,Sk,Dv]`, out `[B,H,Sq,Dv]`,
/// lse `[B,H,Sq]`, contiguous. A row with no visible key has o = 0 and
/// lse = −inf.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tandem/error.hpp"
#include "tandem/flex_mod.hpp"
#include "tandem/indices.hpp"
#include "tandem/shape.hpp"

namespace tandem {

/// The shape of a block mask (torch's BlockMask, SPEC §13.4). Its indices
/// arrive with each call (FlexBlockMaskData).
struct FlexBlockMaskShape {
  std::int64_t q_block = 128;   ///< query rows per block (BLOCK_SIZE[0])
  std::int64_t kv_block = 128;  ///< keys per block (BLOCK_SIZE[1])
  std::int64_t B = 1;           ///< batch extent: B of the call, or 1 (broadcast)
  std::int64_t H = 1;           ///< head extent: H of the call, or 1 (broadcast)
  std::int64_t width = 0;       ///< last extent of kv_indices (0: the call's kv block count)
  std::int64_t full_width = 0;  ///< last extent of full_kv_indices (0: the same as width)
  bool has_full = false;        ///< full_kv_num_blocks and full_kv_indices are given
};

/// Explicit parameters of a FlexAttention call; FlexPlan::make validates
/// them. Zero means "the default" where noted.
struct FlexParams {
  std::int64_t B = 1;           ///< batch
  std::int64_t H = 0;           ///< query heads
  std::int64_t Hkv = 0;         ///< kv heads (divides H; 0 means H: enable_gqa when smaller)
  std::int64_t Sq = 0;          ///< query rows
  std::int64_t Sk = 0;          ///< keys
  std::int64_t D = 0;           ///< q/k head width
  std::int64_t Dv = 0;          ///< v/out head width (0 means D)
  std::optional<double> scale;  ///< defaults to 1/sqrt(D)
  ModProgram score_mod;         ///< empty: t = s
  ModProgram mask_mod;          ///< empty: every key of a kept block is visible
  /// The block mask's shape; absent: no block mask (mask_mod alone decides).
  std::optional<FlexBlockMaskShape> block_mask;
};

/// The indices of a block mask, torch's BlockMask fields (int32 or int64):
/// for mask entry (b', h') = (b mod B, h mod H) of the shape and query block
/// m, the kv blocks `kv_indices[b', h', m, 0 : kv_num_blocks[b', h', m]]`
/// are partial (mask_mod decides) and
/// `full_kv_indices[b', h', m, 0 : full_kv_num_blocks[b', h', m]]` are
/// full (every key visible, mask_mod not evaluated); every other block is
/// hidden.
struct FlexBlockMaskData {
  Indices kv_num_blocks;       ///< `[B', H', nQ]`
  Indices kv_indices;          ///< `[B', H', nQ, width]`
  Indices full_kv_num_blocks;  ///< `[B', H', nQ]` (has_full only)
  Indices full_kv_indices;     ///< `[B', H', nQ, full_width]` (has_full only)
};

/// A block mask held in vectors (what create_block_mask returns): its
/// shape and int32 indices, viewed by data() for a call.
struct FlexBlockMask {
  FlexBlockMaskShape shape;                      ///< block sizes, B', H', widths
  std::vector<std::int32_t> kv_num_blocks;       ///< `[B', H', nQ]`
  std::vector<std::int32_t> kv_indices;          ///< `[B', H', nQ, width]`
  std::vector<std::int32_t> full_kv_num_blocks;  ///< `[B', H', nQ]`
  std::vector<std::int32_t> full_kv_indices;     ///< `[B', H', nQ, full_width]`

  /// Views of the indices for FlexInputs::block_mask.
  [[nodiscard]] FlexBlockMaskData data() const {
    return {kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices};
  }
};

/// The views of one call, elements of type T (float; double or complex in
/// the reference): q, k, v contiguous `bhsd`, and the tensors each mod
/// captured, in capture order (ModCaptures).
template <class T>
struct FlexInputs {
  std::span<const T> q;          ///< `[B,H,Sq,D]`
  std::span<const T> k;          ///< `[B,Hkv,Sk,D]`
  std::span<const T> v;          ///< `[B,Hkv,Sk,Dv]`
  ModCaptures<T> score_tensors;  ///< the score_mod's captured tensors
  ModCaptures<T> mask_tensors;   ///< the mask_mod's captured tensors
  FlexBlockMaskData block_mask;  ///< with a block mask in the plan
};

/// Writable gradient views; an empty view is not computed.
template <class T>
struct FlexGrads {
  std::span<T> dq;  ///< `[B,H,Sq,D]`
  std::span<T> dk;  ///< `[B,Hkv,Sk,D]`
  std::span<T> dv;  ///< `[B,Hkv,Sk,Dv]`
  /// One per score_mod tensor (empty for an integer one, or not wanted):
  /// dT[e] = Σ over visible (b, h, i, j) and each load of element e of
  /// dt_ij · ∂score_mod/∂T[e], in T's shape (SPEC §13.4).
  std::vector<std::span<T>> d_score_tensors;
};

/// The sizes of a FlexAttention call from the shapes of q `[B,H,Sq,D]`, k
/// `[B,Hkv,Sk,D]` and v `[B,Hkv,Sk,Dv]` (torch's flex_attention, SPEC §13.4),
/// the inputs called `names` in errors: each of rank 4, k and v agreeing with
/// q on B, k with q on D, and v with k on Hkv and Sk. Throws Error naming
/// "<name>.shape" before FlexPlan::make checks the rest.
inline FlexParams flex_params_from_shapes(const Shape& q, const Shape& k, const Shape& v,
                                          const std::array<const char*, 3>& names = {"q", "k",
                                                                                     "v"}) {
  const char* axes[] = {"[B, H, Sq, D]", "[B, Hkv, Sk, D]", "[B, Hkv, Sk, Dv]"};
  const Shape* x[] = {&q, &k, &v};
  for (int t = 0; t < 3; ++t) {
    require(x[t]->size() == 4, std::string(names[t]) + ".shape", to_string(*x[t]),
            std::string("must be ") + axes[t]);
  }
  const auto same = [&](int t, std::size_t axis, int of, const char* what) {
    require((*x[t])[axis] == (*x[of])[axis], std::string(names[t]) + ".shape", to_string(*x[t]),
            std::string("must have ") + what + " = " + std::to_string((*x[of])[axis]) + " (" +
                names[of] + "'s)");
  };
  same(1, 0, 0, "B");
  same(1, 3, 0, "D");
  same(2, 0, 1, "B");
  same(2, 1, 1, "Hkv");
  same(2, 2, 1, "Sk");
  FlexParams p;
  p.B = q[0];
  p.H = q[1];
  p.Sq = q[2];
  p.D = q[3];
  p.Hkv = k[1];
  p.Sk = k[2];
  p.Dv = v[3];
  return p;
}

/// A validated FlexAttention call shape (SPEC §13.4).
class FlexPlan {
 public:
  /// Validates `p`: sizes >= 1, Hkv divides H, a finite positive scale,
  /// each mod by check_mod over (B, H, Sq, Sk), the block mask's block
  /// sizes >= 1 and its B, H each 1 or the call's, its widths within the
  /// kv block count. Derives the score_mod's gradient once. Throws Error.
  static FlexPlan make(FlexParams p);

  [[nodiscard]] const FlexParams& params() const { return p_; }       ///< the parameters
  [[nodiscard]] double scale() const { return scale_; }               ///< the scale used
  [[nodiscard]] std::int64_t group() const { return p_.H / p_.Hkv; }  ///< H / Hkv
  /// Query blocks nQ = ceil(Sq / q_block) and kv blocks nK = ceil(Sk / kv_block).
  [[nodiscard]] std::int64_t q_blocks() const { return q_blocks_; }
  [[nodiscard]] std::int64_t kv_blocks() const { return kv_blocks_; }  ///< nK
  /// ∂score_mod (differentiate()), empty when there is no score_mod.
  [[nodiscard]] const ModGradient& score_grad() const { return grad_; }

  ///@{
  /// Element counts of q, k, v, out and lse.
  [[nodiscard]] std::int64_t q_size() const { return q_size_; }
  [[nodiscard]] std::int64_t k_size() const { return k_size_; }
  [[nodiscard]] std::int64_t v_size() const { return v_size_; }
  [[nodiscard]] std::int64_t out_size() const { return out_size_; }
  [[nodiscard]] std::int64_t lse_size() const { return lse_size_; }
  ///@}

  /// Checks a call's views before anything is written: the sizes of q, k,
  /// v, out and lse (`lse` may be empty), each captured tensor's size and
  /// each integer tensor's values within its declared [lo, hi], and the
  /// block mask's indices (counts within 0…width, indices within 0…nK−1,
  /// no kv block listed twice for one query block, partial or full).
  template <class T>
  void check_inputs(const FlexInputs<T>& in, std::size_t out, std::size_t lse) const;
  /// As check_inputs, and the gradient views: each empty or of its tensor's size.
  template <class T>
  void check_grads(const FlexInputs<T>& in, std::size_t dout, const FlexGrads<T>& g) const;

 private:
  void check_block_mask(const FlexBlockMaskData& m) const;
  template <class T>
  void check_captures(const ModProgram& p, const ModCaptures<T>& c, const std::string& what) const;

  FlexParams p_;
  double scale_ = 1.0;
  std::int64_t q_blocks_ = 1, kv_blocks_ = 1;
  std::int64_t q_size_ = 0, k_size_ = 0, v_size_ = 0, out_size_ = 0, lse_size_ = 0;
  ModGradient grad_;
};

// ---------------------------------------------------------------------------

inline FlexPlan FlexPlan::make(FlexParams p) {
  require(p.B >= 1, "B", p.B, "must be >= 1");
  require(p.H >= 1, "H", p.H, "must be >= 1");
  if (p.Hkv == 0) p.Hkv = p.H;
  require(p.Hkv >= 1 && p.H % p.Hkv == 0, "Hkv", p.Hkv, "must divide H = " + std::to_string(p.H));
  require(p.Sq >= 1, "Sq", p.Sq, "must be >= 1");
  require(p.Sk >= 1, "Sk", p.Sk, "must be >= 1");
  require(p.D >= 1, "D", p.D, "must be >= 1");
  if (p.Dv == 0) p.Dv = p.D;
  require(p.Dv >= 1, "Dv", p.Dv, "must be >= 1");
  FlexPlan plan;
  plan.scale_ = p.scale.value_or(1.0 / std::sqrt(static_cast<double>(p.D)));
  require(std::isfinite(plan.scale_) && plan.scale_ > 0, "scale", std::to_string(plan.scale_),
          "must be finite and > 0");
  const ModDomain domain{p.B, p.H, p.Sq, p.Sk};
  if (!p.score_mod.empty()) {
    check_mod(p.score_mod, ModRole::score_mod, domain, "score_mod");
    plan.grad_ = differentiate(p.score_mod);
  }
  if (!p.mask_mod.empty()) check_mod(p.mask_mod, ModRole::mask_mod, domain, "mask_mod");
  const auto blocks = [](std::int64_t n, std::int64_t b) { return n / b + (n % b != 0); };
  if (p.block_mask) {
    auto& m = *p.block_mask;
    require(m.q_block >= 1, "block_mask.q_block", m.q_block, "must be >= 1");
    require(m.kv_block >= 1, "block_mask.kv_block", m.kv_block, "must be >= 1");
    require(m.B == 1 || m.B == p.B, "block_mask.B", m.B, "must be 1 or B = " + std::to_string(p.B));
    require(m.H == 1 || m.H == p.H, "block_mask.H", m.H, "must be 1 or H = " + std::to_string(p.H));
    plan.q_blocks_ = blocks(p.Sq, m.q_block);
    plan.kv_blocks_ = blocks(p.Sk, m.kv_block);
    if (m.width == 0) m.width = plan.kv_blocks_;
    if (m.full_width == 0) m.full_width = m.width;
    require(m.width >= 1 && m.width <= plan.kv_blocks_, "block_mask.width", m.width,
            "must be in 1…" + std::to_string(plan.kv_blocks_) + " (the kv blocks of Sk)");
    require(m.full_width >= 1 && m.full_width <= plan.kv_blocks_, "block_mask.full_width",
            m.full_width,
            "must be in 1…" + std::to_string(plan.kv_blocks_) + " (the kv blocks of Sk)");
  }
  const auto size = [](std::initializer_list<std::int64_t> e, const char* what) {
    std::int64_t n = 1;
    for (const auto x : e) n = checked_mul(n, x, what);
    return n;
  };
  plan.q_size_ = size({p.B, p.H, p.Sq, p.D}, "q");
  plan.k_size_ = size({p.B, p.Hkv, p.Sk, p.D}, "k");
  plan.v_size_ = size({p.B, p.Hkv, p.Sk, p.Dv}, "v");
  plan.out_size_ = size({p.B, p.H, p.Sq, p.Dv}, "out");
  plan.lse_size_ = size({p.B, p.H, p.Sq}, "lse");
  plan.p_ = std::move(p);
  return plan;
}

inline void FlexPlan::check_block_mask(const FlexBlockMaskData& d) const {
  const auto& m = *p_.block_mask;
  const std::int64_t rows = m.B * m.H * q_blocks_;
  const auto one = [&](const Indices& num, const Indices& idx, std::int64_t width,
                       const std::string& name, std::vector<std::int8_t>& seen, bool full) {
    require(static_cast<std::int64_t>(num.size()) == rows, name + "kv_num_blocks",
            static_cast<std::int64_t>(num.size()),
            "elements given: wants B'·H'·nQ = " + std::to_string(rows));
    require(static_cast<std::int64_t>(idx.size()) == rows * width, name + "kv_indices",
            static_cast<std::int64_t>(idx.size()),
            "elements given: wants B'·H'·nQ·width = " + std::to_string(rows * width));
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t n = num[static_cast<std::size_t>(r)];
      require_entry(n >= 0 && n <= width, name + "kv_num_blocks", r, std::to_string(n),
                    "must be in 0…" + std::to_string(width));
      for (std::int64_t c = 0; c < n; ++c) {
        const std::int64_t at = r * width + c;
        const std::int64_t kb = idx[static_cast<std::size_t>(at)];
        require_entry(kb >= 0 && kb < kv_blocks_, name + "kv_indices", at, std::to_string(kb),
                      "must be in 0…" + std::to_string(kv_blocks_ - 1));
        auto& s = seen[static_cast<std::size_t>(r * kv_blocks_ + kb)];
        require_entry(s == 0, name + "kv_indices", at, std::to_string(kb),
                      s == 1 && full ? "is also a partial block of its query block"
                                     : "is listed twice for its query block");
        s = full ? 2 : 1;
      }
    }
  };
  std::vector<std::int8_t> seen(static_cast<std::size_t>(rows * kv_blocks_), 0);
  one(d.kv_num_blocks, d.kv_indices, m.width, "block_mask.", seen, false);
  if (m.has_full) {
    one(d.full_kv_num_blocks, d.full_kv_indices, m.full_width, "block_mask.full_", seen, true);
  } else {
    require(d.full_kv_num_blocks.empty() && d.full_kv_indices.empty(),
            "block_mask.full_kv_num_blocks", static_cast<std::int64_t>(d.full_kv_num_blocks.size()),
            "elements given, but the plan's block mask has no full blocks");
  }
}

template <class T>
void FlexPlan::check_captures(const ModProgram& p, const ModCaptures<T>& c,
                              const std::string& what) const {
  const auto n = p.tensors().size();
  require(c.real.size() == n && c.integer.size() == n, what + " tensors",
          static_cast<std::int64_t>(std::max(c.real.size(), c.integer.size())),
          "given: the " + what + " captured " + std::to_string(n));
  for (std::size_t t = 0; t < n; ++t) {
    const ModTensor& m = p.tensors()[t];
    const std::string name = what + " tensor " + m.name;
    if (m.type == ModType::real) {
      require(static_cast<std::int64_t>(c.real[t].size()) == m.size(), name,
              static_cast<std::int64_t>(c.real[t].size()),
              "elements given: wants " + std::to_string(m.size()));
      continue;
    }
    const Indices& x = c.integer[t];
    require(static_cast<std::int64_t>(x.size()) == m.size(), name,
            static_cast<std::int64_t>(x.size()),
            "elements given: wants " + std::to_string(m.size()));
    for (std::size_t e = 0; e < x.size(); ++e) {
      require_entry(x[e] >= m.lo && x[e] <= m.hi, name, static_cast<std::int64_t>(e),
                    std::to_string(x[e]),
                    "is outside its declared range [" + std::to_string(m.lo) + ", " +
                        std::to_string(m.hi) + "]");
    }
  }
}

template <class T>
void FlexPlan::check_inputs(const FlexInputs<T>& in, std::size_t out, std::size_t lse) const {
  const auto need = [](std::size_t got, std::int64_t want, const char* name) {
    require(static_cast<std::int64_t>(got) == want, name, static_cast<std::int64_t>(got),
            "elements given: wants " + std::to_string(want));
  };
  need(in.q.size(), q_size_, "q");
  need(in.k.size(), k_size_, "k");
  need(in.v.size(), v_size_, "v");
  need(out, out_size_, "out");
  if (lse != 0) need(lse, lse_size_, "lse");
  check_captures(p_.score_mod, in.score_tensors, "score_mod");
  check_captures(p_.mask_mod, in.mask_tensors, "mask_mod");
  if (p_.block_mask) check_block_mask(in.block_mask);
}

template <class T>
void FlexPlan::check_grads(const FlexInputs<T>& in, std::size_t dout, const FlexGrads<T>& g) const {
  check_inputs(in, dout, 0);
  const auto grad = [](std::size_t got, std::int64_t want, const std::string& name) {
    require(got == 0 || static_cast<std::int64_t>(got) == want, name,
            static_cast<std::int64_t>(got),
            "elements given: wants 0 (not computed) or " + std::to_string(want));
  };
  grad(g.dq.size(), q_size_, "dq");
  grad(g.dk.size(), k_size_, "dk");
  grad(g.dv.size(), v_size_, "dv");
  const auto& ts = p_.score_mod.tensors();
  require(g.d_score_tensors.empty() || g.d_score_tensors.size() == ts.size(), "d_score_tensors",
          static_cast<std::int64_t>(g.d_score_tensors.size()),
          "given: wants 0 or one per score_mod tensor (" + std::to_string(ts.size()) + ")");
  for (std::size_t t = 0; t < g.d_score_tensors.size(); ++t) {
    const auto n = g.d_score_tensors[t].size();
    require(n == 0 || ts[t].type == ModType::real, "d_score_tensors", static_cast<std::int64_t>(t),
            "names an integer tensor (" + ts[t].name + "), which has no gradient");
    grad(n, ts[t].size(), "d_score_tensors[" + std::to_string(t) + "] (" + ts[t].name + ")");
  }
}

}  // namespace tandem
