// SPDX-License-Identifier: Apache-2.0
/// @file lowp.hpp
/// @brief What the low-precision properties (SPEC §10) compare against:
///        the data of a case as stored in T, the calls of a backend's
///        Kernels<T>, and the oracles computed in double from the stored
///        values — SPEC §10.2's rounded forward with its ambiguous keys, the
///        naive computation in T, and SPEC §10.4's quantized cache.
///
/// Every oracle reads the stored values exactly (each bf16, f16 and e4m3
/// value is a float) and computes in double; `RN_T` is T's constructor.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cases.hpp"
#include "checks.hpp"

namespace tandem::props {

/// The spacing of T's values at |x| (the subnormal spacing below T's normal
/// range; T = float too).
template <class T>
double ulp(double x);

/// RN_T(x) as a double.
template <class T>
double rn(double x) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<double>(static_cast<float>(x));
  } else {
    return static_cast<double>(T(x));
  }
}

/// d with q, k, v, dout and the sinks rounded to T (SPEC §10.1: one call
/// has one storage type), held as the floats they are exactly; the mask and
/// the slopes stay float32.
template <class T>
AttentionData stored_as(const AttentionData& d);

/// The float32 bound on the relative error of each weight e_ij = 2^(x_ij − μ_i)
/// a float32 kernel computes: the rtol of the f32 attention tolerance,
/// 64ε(1 + L) (checks.hpp; the score's rounding grows with |x| ≤ L, exp2 adds a few ε).
double weight_rel_delta(const AttentionScales& sc);

/// SPEC §10.5's forward oracle for one call at T: `unrounded` = o* (logical
/// [B,Sq,H,Dv], before the final RN_T), `flip` = Σ_{j ∈ A_i} ulp_T(w_ij)·|v_j| / l_i over
/// the keys whose weight lies within rel_delta of a rounding boundary of T
/// (plus, below T's normal range, one subnormal step per weight: SPEC §10.2's note),
/// and lse* `[B,H,Sq]`. `q`, `k`, `v` are logical tensors in double (k and v
/// dequantized for a quantized plan), the rest of the call comes from d.
struct RoundedForward {
  std::vector<double> unrounded, flip, lse;
};
template <class T>
RoundedForward rounded_forward(const AttentionData& d, const Rounding& r, std::span<const double> q,
                               std::span<const double> k, std::span<const double> v,
                               double rel_delta);

struct Codes;  // below

/// The reference's own bound of the same call (reference/rounding_bound.hpp:
/// attention_forward_rounding, or attention_forward_quantized_rounding with
/// `codes`), as logical unrounded and flip; lse is left empty.
template <class T>
RoundedForward reference_rounding(const AttentionData& d, double rel_delta,
                                  const Codes* codes = nullptr);

/// SPEC §10.2's backward oracle (the one-call backward): the
/// gradients g* before their final RN_T (logical, shapes of q, k, v) with the
/// weights RN_T(p_ij) (dv) and RN_T(dx_ij) (dq, dk) of the profile, and for
/// each element the extra tolerance `tol` a float32 kernel may add to
/// ulp_T(g*)/2 + ε: where the inputs of a rounded weight are uncertain by
/// float32 arithmetic — p_ij from the float32 lse (relative rel_delta),
/// δ_i = <dO_i, O_i> from O_i stored in T (O_i within the forward's bound of o*),
/// dp_ij in float32 — the weight may round either way (its two candidates'
/// difference), and for the exact profile the uncertainty itself. dsinks
/// `[H]` (plans with sinks): −Σ_i p_sink,i·δ_i with δ_i from O_i = RN_T(o*_i),
/// its tol the effect of the O_i that may round the other way (an element
/// within its forward slack of a rounding boundary) and of float32's p_sink,i
/// and δ_i (SPEC §10.5).
struct RoundedBackward {
  std::vector<double> dq, dk, dv, tol_dq, tol_dk, tol_dv;
  std::vector<double> dsinks, tol_dsinks;
  /// dbias `[Bb,Hb,Sq,Sk]` (bias plans): Σ p_ij·(dp_ij − δ_i) over the (b, h) it
  /// sums, δ_i and its tol as for dsinks, plus float32's p_ij and dp_ij (SPEC §10.5).
  std::vector<double> dbias, tol_dbias;
};
template <class T>
RoundedBackward rounded_backward(const AttentionData& d, const AttentionScales& sc);

/// Each of got's gradients within ulp_T(g*)/2 + ε + tol of the oracle (ε the
/// float32 attention tolerance with the gradient's natural scale).
template <class T>
std::string rounded_grads_close(const Grads& got, const RoundedBackward& o,
                                const AttentionScales& sc);

/// The one-call backward (dq, dk, dv; dsinks for a plan with sinks, dbias for
/// a bias plan) of kernels<T> on d's data (stored in T).
template <class T>
Grads run_backward_t(const Kernels<T>& kt, const AttentionData& d);

/// The naive computation in T (logical out): the scores, the softmax and
/// P·V rounded to T after every operation, as a kernel written in T would:
/// `s = RN_T(s)`, `e = RN_T(exp(s − m))`, `l ← RN_T(l + e)`, `p = RN_T(e / l)`,
/// `o ← RN_T(o + RN_T(p·v))`.
template <class T>
std::vector<double> naive_forward(const AttentionData& d);

/// |o − o*| ≤ ulp_T(o*)/2 + ε_i + flip_i everywhere, ε_i the float32 attention
/// tolerance (checks.hpp) of o*; NaN only against NaN. Empty when it holds.
template <class T>
std::string rounded_close(const std::string& what, std::span<const double> got,
                          const RoundedForward& o, const AttentionScales& sc);

/// The logical out (and lse `[B,H,Sq]` when asked) of kernels<T>'s
/// attention_forward (attention_forward_lse with lse) on d's data, which must
/// be stored in T already; the outputs' guards must be intact.
template <class T>
std::vector<double> run_forward_t(const Kernels<T>& kt, const AttentionData& d,
                                  std::vector<double>* lse = nullptr);

/// A quantized cache (SPEC §10.4): codes through plan.k, plan.v (bytes) and scales.
struct Codes {
  std::vector<std::uint8_t> k, v;
  std::vector<float> k_scale, v_scale;
  [[nodiscard]] QuantizedKv view() const { return {k, v, k_scale, v_scale}; }
};
/// SPEC §10.4's quantize_kv of d's k and v (stored in T) for d.plan's kv_cache;
/// the gaps between rows hold 0.
Codes quantize_oracle(const AttentionData& d);
/// What kernels<T>'s quantize_kv writes (gaps filled with 0xA5 before the call).
template <class T>
Codes run_quantize_t(const Kernels<T>& kt, const AttentionData& d);
/// Logical k and v dequantized from codes: σ·c, exactly in double.
std::pair<std::vector<double>, std::vector<double>> dequantize(const AttentionPlan& p,
                                                               const Codes& c);
/// The logical out of kernels<T>'s attention_forward_quantized on d's q and codes c.
template <class T>
std::vector<double> run_quantized_t(const Kernels<T>& kt, const AttentionData& d, const Codes& c);

/// d with x, w_qkv and b_qkv moved to the grid of SPEC §10.5 ("The attention
/// block against its own parts"): x to multiples of 2^−3 in [−2, 2], w_qkv of
/// 2^−6 in [−1/2, 1/2], b_qkv of 2^−9 in [−1/2, 1/2], so that every float32
/// partial sum of the qkv projection is exact (E ≤ 24); then every input but
/// the keep mask stored in T (RN_T, held as the floats they are exactly).
template <class T>
BlockData block_on_qkv_grid(BlockData d);

/// SPEC §10.5's oracle of the block at T against kernels<T>'s own parts, on d
/// from block_on_qkv_grid: qkv = RN_T of the exact projection, q and k from
/// kt.rope_forward, a from kt.attention_forward (called as the block calls
/// them), then `y*` = the exact out projection of that a and `tol` =
/// γ_{E+1}(|b_out| + Σ_e |a_e||w_out|), float32 summation's bound. `y` `[B,S,E]`.
struct BlockOracle {
  std::vector<double> y, tol;
};
template <class T>
BlockOracle block_from_parts(const Kernels<T>& kt, const BlockData& d);

/// The out `[B,S,E]` of kernels<T>'s attention_block on d (d's values stored in T).
template <class T>
std::vector<double> run_block_t(const Kernels<T>& kt, const BlockData& d);

/// Whether the output memory of a call at T is untouched: every element's bits as set.
template <class T>
struct GuardedT {
  std::vector<T> mem;
  explicit GuardedT(std::int64_t n);
  [[nodiscard]] std::span<T> view() { return std::span<T>(mem); }
  [[nodiscard]] bool untouched() const;
};

}  // namespace tandem::props
