// SPDX-License-Identifier: Apache-2.0
/// @file attention.hpp
/// @brief The attention plan: shapes, layout, mask, scale and softcap of one
///        scaled dot-product attention call, validated once (SPEC §1–3, §8).
///
/// For each batch b, query head h (kv head g = h / (H/Hkv)), query i, key j:
/// @f[ s_{ij} = \mathrm{scale}\,\langle q_i, k_j\rangle,\quad
///     s_{ij} \leftarrow c\tanh(s_{ij}/c)\ (c>0),\quad
///     s_{ij} \leftarrow s_{ij} + \mathrm{bias}_{ij}, @f]
/// @f[ p_{ij} = \frac{e^{s_{ij}}}{\sum_{\text{visible } j'} e^{s_{ij'}}},\qquad
///     o_i = \sum_{\text{visible } j} p_{ij} v_j . @f]
/// q `[B,Sq,H,D]`, k `[B,Sk,Hkv,D]`, v `[B,Sk,Hkv,Dv]`, out `[B,Sq,H,Dv]`
/// (shown in `bshd`; `bhsd` swaps the S and H axes).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "tandem/error.hpp"
#include "tandem/shape.hpp"

namespace tandem {

/// Which keys a query sees (SPEC §2). With `a = q_offset + i`,
/// `q_offset = max(Sk − Sq, 0)` (bottom-right alignment):
enum class MaskKind {
  none,            ///< every key
  causal,          ///< j <= a
  sliding_window,  ///< a − w <= j <= a  (at most w + 1 keys)
  key_padding,     ///< keep[b, j] != 0, keep `[B, Sk]`
  bias,            ///< additive bias `[Bb, Hb, Sq, Sk]`; −inf hides the key
};

/// "none", "causal", "sliding_window", "key_padding" or "bias".
inline const char* to_string(MaskKind kind) {
  switch (kind) {
    case MaskKind::none:
      return "none";
    case MaskKind::causal:
      return "causal";
    case MaskKind::sliding_window:
      return "sliding_window";
    case MaskKind::key_padding:
      return "key_padding";
    case MaskKind::bias:
      return "bias";
  }
  return "?";
}

/// Explicit parameters of an attention call; AttentionPlan::make validates
/// them. Zero means "the default" where noted.
struct AttentionParams {
  std::int64_t batch = 1;          ///< B
  std::int64_t seq_q = 0;          ///< Sq
  std::int64_t seq_k = 0;          ///< Sk
  std::int64_t heads = 0;          ///< H, query heads
  std::int64_t kv_heads = 0;       ///< Hkv, divides H; 0 means H
  std::int64_t head_dim = 0;       ///< D, width of q and k heads
  std::int64_t v_head_dim = 0;     ///< Dv, width of v and out heads; 0 means D
  Layout layout = Layout::bshd;    ///< memory layout of q, k, v, out and the gradients (SPEC §1)
  MaskKind mask = MaskKind::none;  ///< which keys each query sees (SPEC §2)
  std::int64_t window = 0;         ///< w of sliding_window
  std::optional<double> scale;     ///< defaults to 1/sqrt(D)
  double softcap = 0.0;            ///< c; 0 disables the cap
  std::int64_t q_row_stride = 0;   ///< bshd row stride of q; 0 = H*D
  std::int64_t k_row_stride = 0;   ///< bshd row stride of k; 0 = Hkv*D
  std::int64_t v_row_stride = 0;   ///< bshd row stride of v; 0 = Hkv*Dv
  std::int64_t bias_batch = 1;     ///< Bb ∈ {1, B} of a bias mask
  std::int64_t bias_heads = 1;     ///< Hb ∈ {1, H} of a bias mask
};

/// Attributes that shapes do not carry, for AttentionPlan::from_shapes
/// (the `attrs` of a case file, SPEC §9).
struct AttentionAttrs {
  std::int64_t num_heads = 0;      ///< H (required)
  std::optional<Layout> layout;    ///< from shapes when absent (SPEC §1)
  MaskKind mask = MaskKind::none;  ///< which keys each query sees (SPEC §2)
  std::int64_t window = 0;         ///< w of sliding_window: keys a−w..a are visible
  std::optional<double> scale;     ///< multiplies <q_i, k_j>; defaults to 1/sqrt(D)
  double softcap = 0.0;            ///< c of s ← c·tanh(s/c); 0 disables the cap
};

/// One attention call, validated. Kernels read sizes and the strides of
/// every tensor from here and nowhere else.
struct AttentionPlan {
  ///@{
  /// Sizes in SPEC's symbols: B batch, Sq query length, Sk key length, H query heads, Hkv kv heads
  /// (divides H), D q/k head width, Dv v/out head width.
  std::int64_t B = 0, Sq = 0, Sk = 0, H = 0, Hkv = 0, D = 0, Dv = 0;
  ///@}
  Layout layout = Layout::bshd;    ///< layout of every tensor of the call (SPEC §1)
  MaskKind mask = MaskKind::none;  ///< which keys each query sees (SPEC §2)
  std::int64_t window = 0;         ///< w of sliding_window (0 for the other mask kinds)
  double scale = 0.0;              ///< resolved: never absent
  double softcap = 0.0;            ///< 0 = no cap
  ///@{
  /// Bb ∈ {1, B} and Hb ∈ {1, H}: the broadcast shape `[Bb, Hb, Sq, Sk]` of a bias mask (1 and 1
  /// otherwise).
  std::int64_t bias_batch = 1, bias_heads = 1;
  ///@}

  ///@{
  Strides q, k, v;  ///< inputs, possibly with row strides (bshd)
  ///@}
  Strides o;  ///< out and dout: contiguous, layout of q
  ///@{
  Strides dq, dk, dv;  ///< gradients: contiguous, shapes of q, k, v
  ///@}

  /// H / Hkv: query heads per kv head.
  [[nodiscard]] std::int64_t group() const { return H / Hkv; }
  /// The kv head that query head h reads: h / (H/Hkv) (contiguous groups).
  [[nodiscard]] std::int64_t kv_head(std::int64_t h) const { return h / group(); }
  /// max(Sk − Sq, 0): query i sits at key position q_offset + i.
  [[nodiscard]] std::int64_t q_offset() const { return Sk > Sq ? Sk - Sq : 0; }
  /// Number of mask elements the call takes: B·Sk, Bb·Hb·Sq·Sk, or 0.
  [[nodiscard]] std::int64_t mask_size() const;
  /// Offset of mask element (b, h, i, 0): the keep row of b, or the bias row.
  [[nodiscard]] std::int64_t mask_row(std::int64_t b, std::int64_t h, std::int64_t i) const;
  /// Number of log-sum-exp values a forward saves: B·H·Sq, one per query row
  /// (no overflow: make() checked the larger B·Sq·H·D).
  [[nodiscard]] std::int64_t lse_size() const { return B * H * Sq; }
  /// Offset of lse(b, h, i) in the contiguous `[B, H, Sq]` log-sum-exp.
  [[nodiscard]] std::int64_t lse_at(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return (b * H + h) * Sq + i;
  }

  /// Validates `p` by SPEC §8 — the only place that does — and derives strides.
  static AttentionPlan make(const AttentionParams& p);

  /// Applies the shape rules of SPEC §1 to q, k, v (and the mask, when the
  /// mask kind takes one), then make(). An ambiguous rank-4 layout is an error.
  static AttentionPlan from_shapes(const Shape& q, const Shape& k, const Shape& v,
                                   const std::optional<Shape>& mask, const AttentionAttrs& a);

  /// "B=1 Sq=4 Sk=6 H=4 Hkv=2 D=8 Dv=8 bshd causal scale=0.3536 ..." for
  /// messages and counterexamples.
  [[nodiscard]] std::string describe() const;
};

/// Read-only views of the inputs of an attention call, in any scalar type
/// (float for the backends; double and complex for the reference in tests).
/// `mask` is the keep mask or the additive bias; it is always float.
template <class T>
struct AttentionInputs {
  ///@{
  /// q `[B,Sq,H,D]`, k `[B,Sk,Hkv,D]`, v `[B,Sk,Hkv,Dv]` in the plan's layout, read through the
  /// plan's strides (at least q.extent, k.extent, v.extent elements).
  std::span<const T> q, k, v;
  ///@}
  /// keep `[B, Sk]` (key_padding; nonzero = attend) or additive bias `[Bb, Hb, Sq, Sk]` (bias);
  /// empty otherwise
  std::span<const float> mask = {};
};

/// Writable views of the gradients; an empty view is not computed.
template <class T>
struct AttentionGrads {
  ///@{
  /// dq `[B,Sq,H,D]`, dk `[B,Sk,Hkv,D]`, dv `[B,Sk,Hkv,Dv]`, contiguous in the plan's layout; an
  /// empty view is not computed.
  std::span<T> dq, dk, dv;
  ///@}
};

/// What a training step's forward keeps for its backward (FlashAttention's
/// saved state), so that the backward need not run the forward again:
/// out `[B,Sq,H,Dv]` (contiguous, plan.o) and the log-sum-exp lse `[B,H,Sq]`
/// (contiguous, plan.lse_at), `lse_i = m_i + log Σ_j exp(s_ij − m_i)` over the
/// keys visible to query i (−inf for a query that sees none), so that
/// `p_ij = exp(s_ij − lse_i)`.
template <class T>
struct AttentionSaved {
  std::span<const T> out;  ///< the forward's output `[B,Sq,H,Dv]`
  std::span<const T> lse;  ///< the forward's log-sum-exp `[B,H,Sq]`
};

/// Throws Error unless the views fit the plan: strided inputs hold q.extent…,
/// the mask has mask_size() elements (none when the kind takes none).
template <class T>
void check_inputs(const AttentionPlan& plan, const AttentionInputs<T>& in) {
  require_extent(in.q.size(), plan.q.extent, "q");
  require_extent(in.k.size(), plan.k.extent, "k");
  require_extent(in.v.size(), plan.v.extent, "v");
  require_size(in.mask.size(), plan.mask_size(), "mask");
}

/// Throws Error unless at least one gradient is asked for (a non-empty view)
/// and every non-empty view has its full size.
template <class T>
void check_grads(const AttentionPlan& plan, const AttentionGrads<T>& g) {
  require(!(g.dq.empty() && g.dk.empty() && g.dv.empty()), "grads",
          std::string("(dq, dk and dv all empty)"), "must ask for at least one gradient");
  if (!g.dq.empty()) require_size(g.dq.size(), plan.dq.extent, "dq");
  if (!g.dk.empty()) require_size(g.dk.size(), plan.dk.extent, "dk");
  if (!g.dv.empty()) require_size(g.dv.size(), plan.dv.extent, "dv");
}

/// Throws Error unless the saved out and lse have their full sizes.
template <class T>
void check_saved(const AttentionPlan& plan, const AttentionSaved<T>& saved) {
  require_size(saved.out.size(), plan.o.extent, "out");
  require_size(saved.lse.size(), plan.lse_size(), "lse");
}

// ---------------------------------------------------------------------------
// Implementation

inline std::int64_t AttentionPlan::mask_size() const {
  switch (mask) {
    case MaskKind::key_padding:
      return B * Sk;
    case MaskKind::bias:
      return bias_batch * bias_heads * Sq * Sk;
    default:
      return 0;
  }
}

inline std::int64_t AttentionPlan::mask_row(std::int64_t b, std::int64_t h, std::int64_t i) const {
  if (mask == MaskKind::key_padding) return b * Sk;
  const std::int64_t bb = bias_batch == 1 ? 0 : b;
  const std::int64_t hb = bias_heads == 1 ? 0 : h;
  return ((bb * bias_heads + hb) * Sq + i) * Sk;
}

inline AttentionPlan AttentionPlan::make(const AttentionParams& p) {
  require(p.batch >= 1, "batch", p.batch, "must be >= 1");
  require(p.seq_q >= 1, "seq_q", p.seq_q, "must be >= 1");
  require(p.seq_k >= 1, "seq_k", p.seq_k, "must be >= 1");
  require(p.heads >= 1, "num_heads", p.heads, "must be >= 1");
  const std::int64_t Hkv = p.kv_heads == 0 ? p.heads : p.kv_heads;
  require(Hkv >= 1 && p.heads % Hkv == 0, "kv_heads", Hkv,
          "must divide num_heads = " + std::to_string(p.heads));
  require(p.head_dim >= 1, "head_dim", p.head_dim, "must be >= 1");
  const std::int64_t Dv = p.v_head_dim == 0 ? p.head_dim : p.v_head_dim;
  require(Dv >= 1, "v_head_dim", Dv, "must be >= 1");
  if (p.mask == MaskKind::sliding_window) {
    require(p.window >= 0, "window", p.window, "must be >= 0");
  } else {
    require(p.window == 0, "window", p.window,
            std::string("must be 0 (only mask sliding_window takes a window; mask is ") +
                to_string(p.mask) + ")");
  }
  const double scale = p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  require(std::isfinite(scale) && scale != 0.0, "scale", std::to_string(scale),
          "must be finite and non-zero");
  require(std::isfinite(p.softcap) && p.softcap >= 0.0, "softcap", std::to_string(p.softcap),
          "must be finite and >= 0 (0 disables it)");
  if (p.mask == MaskKind::bias) {
    require(p.bias_batch == 1 || p.bias_batch == p.batch, "bias_batch", p.bias_batch,
            "must be 1 or batch = " + std::to_string(p.batch));
    require(p.bias_heads == 1 || p.bias_heads == p.heads, "bias_heads", p.bias_heads,
            "must be 1 or num_heads = " + std::to_string(p.heads));
  }
  const auto check_stride = [&](std::int64_t stride, std::int64_t heads, std::int64_t width,
                                const char* name) {
    if (stride == 0) return;
    const std::int64_t row = checked_mul(heads, width, name);
    if (p.layout == Layout::bhsd) {
      require(stride == row, name, stride,
              "must be 0 or " + std::to_string(row) + " (bhsd is always contiguous)");
    } else {
      require(stride >= row, name, stride, "must be >= heads*width = " + std::to_string(row));
    }
  };
  check_stride(p.q_row_stride, p.heads, p.head_dim, "q_row_stride");
  check_stride(p.k_row_stride, Hkv, p.head_dim, "k_row_stride");
  check_stride(p.v_row_stride, Hkv, Dv, "v_row_stride");

  AttentionPlan plan;
  plan.B = p.batch;
  plan.Sq = p.seq_q;
  plan.Sk = p.seq_k;
  plan.H = p.heads;
  plan.Hkv = Hkv;
  plan.D = p.head_dim;
  plan.Dv = Dv;
  plan.layout = p.layout;
  plan.mask = p.mask;
  plan.window = p.window;
  plan.scale = scale;
  plan.softcap = p.softcap;
  plan.bias_batch = p.mask == MaskKind::bias ? p.bias_batch : 1;
  plan.bias_heads = p.mask == MaskKind::bias ? p.bias_heads : 1;
  const Layout L = p.layout;
  plan.q = Strides::of(L, plan.B, plan.Sq, plan.H, plan.D, p.q_row_stride, "q");
  plan.k = Strides::of(L, plan.B, plan.Sk, Hkv, plan.D, p.k_row_stride, "k");
  plan.v = Strides::of(L, plan.B, plan.Sk, Hkv, Dv, p.v_row_stride, "v");
  plan.o = Strides::of(L, plan.B, plan.Sq, plan.H, Dv, 0, "out");
  plan.dq = Strides::of(L, plan.B, plan.Sq, plan.H, plan.D, 0, "dq");
  plan.dk = Strides::of(L, plan.B, plan.Sk, Hkv, plan.D, 0, "dk");
  plan.dv = Strides::of(L, plan.B, plan.Sk, Hkv, Dv, 0, "dv");
  // Mask sizes must fit in 64 bits too (only the mask the kind takes: a call
  // without a bias never forms Sq·Sk).
  if (plan.mask == MaskKind::bias) {
    checked_mul(checked_mul(checked_mul(plan.bias_batch, plan.bias_heads, "mask"), plan.Sq, "mask"),
                plan.Sk, "mask");
  }
  checked_mul(plan.B, plan.Sk, "mask");
  return plan;
}

inline AttentionPlan AttentionPlan::from_shapes(const Shape& q, const Shape& k, const Shape& v,
                                                const std::optional<Shape>& mask,
                                                const AttentionAttrs& a) {
  require(a.num_heads >= 1, "num_heads", a.num_heads, "must be >= 1");
  const std::int64_t H = a.num_heads;
  const std::size_t rank = q.size();
  require(rank >= 2 && rank <= 4, "q.shape", to_string(q), "must have rank 2, 3 or 4");
  require(k.size() == rank, "k.shape", to_string(k),
          "must have the rank of q.shape = " + to_string(q));
  require(v.size() == rank, "v.shape", to_string(v),
          "must have the rank of q.shape = " + to_string(q));
  element_count(q, "q.shape");
  element_count(k, "k.shape");
  element_count(v, "v.shape");

  AttentionParams p;
  p.heads = H;
  p.mask = a.mask;
  p.window = a.window;
  p.scale = a.scale;
  p.softcap = a.softcap;
  if (rank == 4) {
    Layout L;
    if (a.layout) {
      L = *a.layout;
    } else {
      const bool dim1 = q[1] == H, dim2 = q[2] == H;
      require(dim1 != dim2, "layout", std::string("(absent)"),
              "is ambiguous for q.shape = " + to_string(q) +
                  " and num_heads = " + std::to_string(H) + "; give layout bshd or bhsd");
      L = dim1 ? Layout::bhsd : Layout::bshd;
    }
    const int s_ax = L == Layout::bshd ? 1 : 2, h_ax = L == Layout::bshd ? 2 : 1;
    require(q[h_ax] == H, "q.shape", to_string(q),
            std::string("must have num_heads = ") + std::to_string(H) + " on its head axis (" +
                to_string(L) + ")");
    p.layout = L;
    p.batch = q[0];
    p.seq_q = q[s_ax];
    p.head_dim = q[3];
    p.seq_k = k[s_ax];
    p.kv_heads = k[h_ax];
    p.v_head_dim = v[3];
    require(k[0] == p.batch, "k.shape", to_string(k),
            "must have batch = " + std::to_string(p.batch));
    require(k[3] == p.head_dim, "k.shape", to_string(k),
            "must have head_dim = " + std::to_string(p.head_dim) + " (q's last dim)");
    require(v[0] == p.batch && v[s_ax] == p.seq_k && v[h_ax] == p.kv_heads, "v.shape", to_string(v),
            "must match k.shape = " + to_string(k) + " except the last dim");
  } else {
    require(!a.layout || *a.layout == Layout::bshd, "layout",
            std::string(a.layout ? to_string(*a.layout) : ""),
            "must be bshd for rank-" + std::to_string(rank) + " tensors");
    p.layout = Layout::bshd;
    const std::size_t o = rank == 3 ? 1 : 0;
    p.batch = rank == 3 ? q[0] : 1;
    p.seq_q = q[o];
    require(q[o + 1] % H == 0, "q.shape", to_string(q),
            "must have a last dim divisible by num_heads = " + std::to_string(H));
    p.head_dim = q[o + 1] / H;
    require(p.head_dim >= 1, "q.shape", to_string(q), "must have a non-empty last dim");
    require(rank == 2 || k[0] == p.batch, "k.shape", to_string(k),
            "must have batch = " + std::to_string(p.batch));
    p.seq_k = k[o];
    require(k[o + 1] % p.head_dim == 0, "k.shape", to_string(k),
            "must have a last dim divisible by head_dim = " + std::to_string(p.head_dim));
    p.kv_heads = k[o + 1] / p.head_dim;
    require(p.kv_heads >= 1, "k.shape", to_string(k), "must have a non-empty last dim");
    require((rank == 2 || v[0] == p.batch) && v[o] == p.seq_k, "v.shape", to_string(v),
            "must match k.shape = " + to_string(k) + " except the last dim");
    require(v[o + 1] % p.kv_heads == 0, "v.shape", to_string(v),
            "must have a last dim divisible by kv_heads = " + std::to_string(p.kv_heads));
    p.v_head_dim = v[o + 1] / p.kv_heads;
  }
  // make() reads v_head_dim = 0 as "Dv = D": an empty v head must fail here.
  require(p.v_head_dim >= 1, "v.shape", to_string(v), "must have a non-empty last dim");
  require(p.kv_heads >= 1 && H % p.kv_heads == 0, "kv_heads", p.kv_heads,
          "(from k.shape = " + to_string(k) + ") must divide num_heads = " + std::to_string(H));

  const bool takes_mask = a.mask == MaskKind::key_padding || a.mask == MaskKind::bias;
  if (!takes_mask) {
    require(!mask, "mask", mask ? to_string(*mask) : "",
            std::string("must be absent for mask ") + to_string(a.mask));
  } else {
    require(mask.has_value(), "mask", std::string("(absent)"),
            std::string("is required for mask ") + to_string(a.mask));
    const Shape& m = *mask;
    if (a.mask == MaskKind::key_padding) {
      require(m.size() == 2 && m[0] == p.batch && m[1] == p.seq_k, "mask.shape", to_string(m),
              "must be [B, Sk] = " + to_string({p.batch, p.seq_k}) + " for key_padding");
    } else {
      require(m.size() == 4 && (m[0] == 1 || m[0] == p.batch) && (m[1] == 1 || m[1] == H) &&
                  m[2] == p.seq_q && m[3] == p.seq_k,
              "mask.shape", to_string(m),
              "must be [Bb, Hb, Sq, Sk] with Bb in {1, " + std::to_string(p.batch) +
                  "}, Hb in {1, " + std::to_string(H) + "}, Sq = " + std::to_string(p.seq_q) +
                  ", Sk = " + std::to_string(p.seq_k) + " for bias");
      p.bias_batch = m[0];
      p.bias_heads = m[1];
    }
  }
  return make(p);
}

inline std::string AttentionPlan::describe() const {
  std::string s = "B=" + std::to_string(B) + " Sq=" + std::to_string(Sq) +
                  " Sk=" + std::to_string(Sk) + " H=" + std::to_string(H) +
                  " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
                  " Dv=" + std::to_string(Dv) + " " + to_string(layout) + " " + to_string(mask);
  if (mask == MaskKind::sliding_window) s += "(w=" + std::to_string(window) + ")";
  if (mask == MaskKind::bias) {
    s += "[" + std::to_string(bias_batch) + "," + std::to_string(bias_heads) + ",Sq,Sk]";
  }
  s += " scale=" + std::to_string(scale);
  if (softcap > 0) s += " softcap=" + std::to_string(softcap);
  if (layout == Layout::bshd) {
    s += " row_strides=" + std::to_string(q.seq) + "/" + std::to_string(k.seq) + "/" +
         std::to_string(v.seq);
  }
  return s;
}

}  // namespace tandem
