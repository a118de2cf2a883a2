// SPDX-License-Identifier: Apache-2.0
/// @file attention_views.hpp
/// @brief The views of an attention call (inputs, gradients, saved state)
///        and the checks that they fit a plan (SPEC §8).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "tandem/attention_plan.hpp"
#include "tandem/error.hpp"
#include "tandem/indices.hpp"
#include "tandem/shape.hpp"
#include "tandem/storage.hpp"

namespace tandem {

/// Read-only views of the inputs of an attention call, in any scalar type
/// (float for the backends; double and complex for the reference in tests).
/// `mask` and `alibi_slopes` are always float; sinks have the scalar type so
/// that a complex-step derivative reaches them. A feature's views are empty
/// when the plan does not take it (check_inputs says which are required).
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
  /// sinks `[H]`, finite: the logit of query head h's sink (SPEC §2.7)
  std::span<const T> sinks = {};
  /// ALiBi slopes `[H]` or `[n, H]`, finite (SPEC §2.8)
  std::span<const float> alibi_slopes = {};
  ///@{
  /// `[n+1]` each, non-decreasing from 0 to total_q (total_k): sequence n owns query rows
  /// [cu_seqlens_q[n], cu_seqlens_q[n+1]) and the key slot [cu_seqlens_k[n], cu_seqlens_k[n+1])
  /// (SPEC §2.9).
  Indices cu_seqlens_q = {}, cu_seqlens_k = {};
  ///@}
  /// `[n]` or empty: sequence n reads only the first seqused_k[n] keys of its slot (SPEC §2.9)
  Indices seqused_k = {};
  /// `[B, max_blocks]`: key j of batch entry b is slot j % block_size of block
  /// block_table[b, j / block_size] (SPEC §2.10)
  Indices block_table = {};
  /// `[B]`, 0 <= cache_seqlens[b] <= max_blocks·block_size: the keys of batch entry b (SPEC §2.10)
  Indices cache_seqlens = {};
  /// `[n]` (one per sequence: batch entry or packed sequence) or empty (all 0), 0 <=
  /// key_origin[n] <= kMaxKeyOrigin: the position of sequence n's key 0 in the whole
  /// sequence, as in a cache that has dropped its oldest keys. It changes no value: the
  /// invariant order counts its blocks and chunks from it (SPEC §12.2).
  Indices key_origin = {};
};

/// The largest key_origin (2^48): origin + keys stays far inside int64.
inline constexpr std::int64_t kMaxKeyOrigin = std::int64_t{1} << 48;

/// `in` with the element views q, k, v and sinks of another type U (a
/// backend that widens bfloat16 or float16 inputs to float): the mask, the
/// ALiBi slopes and every index input carried over as they are.
template <class U, class T>
AttentionInputs<U> retyped(const AttentionInputs<T>& in, std::span<const U> q, std::span<const U> k,
                           std::span<const U> v, std::span<const U> sinks) {
  AttentionInputs<U> out{q, k, v, in.mask};
  out.sinks = sinks;
  out.alibi_slopes = in.alibi_slopes;
  out.cu_seqlens_q = in.cu_seqlens_q;
  out.cu_seqlens_k = in.cu_seqlens_k;
  out.seqused_k = in.seqused_k;
  out.block_table = in.block_table;
  out.cache_seqlens = in.cache_seqlens;
  out.key_origin = in.key_origin;
  return out;
}

/// Writable views of the gradients; an empty view is not computed.
template <class T>
struct AttentionGrads {
  ///@{
  /// dq `[B,Sq,H,D]`, dk `[B,Sk,Hkv,D]`, dv `[B,Sk,Hkv,Dv]`, contiguous in the plan's layout; an
  /// empty view is not computed.
  std::span<T> dq, dk, dv;
  ///@}
  /// dsinks `[H]` (plans with sinks only): `dsink_h = −Σ_{b,i} p_sink,i · <dO_i, O_i>`
  /// (SPEC §2.7); empty: not computed.
  std::span<T> dsinks = {};
  /// dbias `[Bb, Hb, Sq, Sk]`, contiguous (plans with mask kind bias only): the bias's own
  /// shape, `dbias_{b,h,i,j} = Σ ds_ij = Σ p_ij (<dO_i, v_j> − <dO_i, O_i>)` summed over the
  /// batch entries when Bb = 1 and over the heads when Hb = 1, 0 for a hidden key (SPEC §3);
  /// empty: not computed.
  std::span<T> dbias = {};
};

/// What a training step's forward keeps for its backward (FlashAttention's
/// saved state), so that the backward need not run the forward again:
/// out `[B,Sq,H,Dv]` (contiguous, plan.o) and the log-sum-exp lse `[B,H,Sq]`
/// (contiguous, plan.lse_at), `lse_i = m_i + log Σ_j exp(s_ij − m_i)` over the
/// keys visible to query i (−inf for a query that sees none), so that
/// `p_ij = exp(s_ij − lse_i)`. With sinks the sink joins the sum:
/// `lse_i = log(exp(sink_h) + Σ_j exp(s_ij))`, sink_h for a query that sees no key.
template <class T>
struct AttentionSaved {
  std::span<const T> out;          ///< the forward's output `[B,Sq,H,Dv]`
  std::span<const stat_t<T>> lse;  ///< the forward's log-sum-exp `[B,H,Sq]` (float32 for bf16, f16)
};

/// A K/V cache stored as 8-bit codes with float32 scales (SPEC §10.4), read by
/// attention_forward_quantized for plans with kv_cache int8 or e4m3:
/// `k_{b,s,g,d} = k_scale[plan.kv_scale_at(b, s, g)] · code(k[plan.k.at(b, s, g) + d])`, and
/// v alike. Codes are int8 (two's complement) or float8 e4m3fn bytes, addressed through plan.k
/// and plan.v (row strides and paged blocks as for plain k and v); scales `[kv_scale_size()]`,
/// finite and >= 0: one per (key row, kv head) for int8, one per kv head for e4m3.
struct QuantizedKv {
  ///@{
  /// codes of k `[B,Sk,Hkv,D]` and v `[B,Sk,Hkv,Dv]` (or the paged cache's blocks)
  std::span<const std::uint8_t> k, v;
  ///@}
  ///@{
  /// scales `[kv_scale_size()]`
  std::span<const float> k_scale, v_scale;
  ///@}
};

/// Where quantize_kv writes a cache: the codes at the addresses of plan.k and
/// plan.v (the element addresses of the k and v it quantizes), the scales
/// `[kv_scale_size()]` each.
struct QuantizedKvOut {
  ///@{
  /// codes of k and v, plan.k.extent and plan.v.extent bytes
  std::span<std::uint8_t> k, v;
  ///@}
  ///@{
  /// scales `[kv_scale_size()]`
  std::span<float> k_scale, v_scale;
  ///@}
};

namespace detail {

/// True when x (real, bf16, f16, or both parts of a complex) is finite.
template <class T>
bool finite_value(const T& x) {
  if constexpr (std::is_arithmetic_v<T>) {
    return std::isfinite(x);
  } else if constexpr (is_low_precision_v<T>) {
    return std::isfinite(static_cast<double>(x));
  } else {
    return std::isfinite(x.real()) && std::isfinite(x.imag());
  }
}

/// x as text for messages (the real part of a complex).
template <class T>
std::string value_text(const T& x) {
  if constexpr (std::is_arithmetic_v<T>) {
    return std::to_string(x);
  } else if constexpr (is_low_precision_v<T>) {
    return std::to_string(static_cast<double>(x));
  } else {
    return std::to_string(x.real());
  }
}

/// Throws Error naming `name` unless the view has `size` finite values.
template <class T>
void check_finite_values(std::span<const T> x, std::int64_t size, const std::string& name) {
  require_size(x.size(), size, name);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (finite_value(x[i])) continue;  // the value's text only for the message
    require_entry(false, name, static_cast<std::int64_t>(i), value_text(x[i]), "must be finite");
  }
}

/// Throws Error naming `name` unless offsets `[n+1]` start at 0, never
/// decrease and end at `total`.
inline void check_offsets(const Indices& cu, std::int64_t n, std::int64_t total,
                          const std::string& name) {
  require_size(cu.size(), n == 0 ? 0 : n + 1, name);
  if (n == 0) return;
  require_entry(cu[0] == 0, name, 0, std::to_string(cu[0]),
                "must be 0 (the first sequence starts at row 0)");
  for (std::int64_t s = 0; s < n; ++s) {
    const std::int64_t a = cu[static_cast<std::size_t>(s)], b = cu[static_cast<std::size_t>(s + 1)];
    require_entry(b >= a, name, s + 1, std::to_string(b),
                  "must be >= " + name + "[" + std::to_string(s) + "] = " + std::to_string(a) +
                      " (offsets never decrease)");
  }
  const std::int64_t last = cu[static_cast<std::size_t>(n)];
  require_entry(last == total, name, n, std::to_string(last),
                "must be the total number of rows, " + std::to_string(total));
}

}  // namespace detail

namespace detail {
template <class T>
void check_features(const AttentionPlan& plan, const AttentionInputs<T>& in);
}  // namespace detail

/// Throws Error unless the views fit the plan (SPEC §8): strided inputs hold
/// q.extent…, the mask has mask_size() elements (none when the kind takes
/// none); sinks `[H]` and ALiBi slopes `[slopes_size()]` are finite (empty
/// when not taken); packed sequences' cu_seqlens start at 0, never decrease
/// and end at the row count, 0 <= seqused_k[n] <= its slot; a paged cache's
/// lengths lie in [0, max_blocks·block_size] and every block-table entry a
/// length uses lies in [0, num_blocks) (the others are never read and may
/// hold anything). Every feature input the plan does not take must be empty.
template <class T>
void check_inputs(const AttentionPlan& plan, const AttentionInputs<T>& in) {
  require(plan.kv_cache == KvCache::plain, "kv_cache", std::string(to_string(plan.kv_cache)),
          "takes codes and scales: call attention_forward_quantized (SPEC §10.4)");
  require_extent(in.q.size(), plan.q.extent, "q");
  require_extent(in.k.size(), plan.k.extent, "k");
  require_extent(in.v.size(), plan.v.extent, "v");
  detail::check_features(plan, in);
}

namespace detail {

/// check_inputs less q, k and v: the mask and every feature input.
template <class T>
void check_features(const AttentionPlan& plan, const AttentionInputs<T>& in) {
  require_size(in.mask.size(), plan.mask_size(), "mask");
  detail::check_finite_values(in.sinks, plan.sinks ? plan.H : 0, "sinks");
  detail::check_finite_values(in.alibi_slopes, plan.slopes_size(), "alibi_slopes");
  // packed sequences
  const std::int64_t n = plan.num_seqs;
  detail::check_offsets(in.cu_seqlens_q, n, plan.Sq, "cu_seqlens_q");
  detail::check_offsets(in.cu_seqlens_k, n, plan.Sk, "cu_seqlens_k");
  if (!in.seqused_k.empty() || n == 0) require_size(in.seqused_k.size(), n, "seqused_k");
  for (std::size_t s = 0; s < in.seqused_k.size(); ++s) {
    const std::int64_t slot = in.cu_seqlens_k[s + 1] - in.cu_seqlens_k[s];
    require_entry(in.seqused_k[s] >= 0 && in.seqused_k[s] <= slot, "seqused_k",
                  static_cast<std::int64_t>(s), std::to_string(in.seqused_k[s]),
                  "must lie in [0, " + std::to_string(slot) + "] (the keys of sequence " +
                      std::to_string(s) + "'s slot in cu_seqlens_k)");
  }
  // where each sequence's key 0 sits (SPEC §12.1)
  if (!in.key_origin.empty()) require_size(in.key_origin.size(), plan.sequences(), "key_origin");
  for (std::size_t s = 0; s < in.key_origin.size(); ++s) {
    require_entry(in.key_origin[s] >= 0 && in.key_origin[s] <= kMaxKeyOrigin, "key_origin",
                  static_cast<std::int64_t>(s), std::to_string(in.key_origin[s]),
                  "must lie in [0, 2^48]");
  }
  // paged cache
  const std::int64_t B = plan.paged() ? plan.B : 0, W = plan.max_blocks;
  require_size(in.block_table.size(), B * W, "block_table");
  require_size(in.cache_seqlens.size(), B, "cache_seqlens");
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = in.cache_seqlens[static_cast<std::size_t>(b)];
    require_entry(len >= 0 && len <= plan.Sk, "cache_seqlens", b, std::to_string(len),
                  "must lie in [0, " + std::to_string(plan.Sk) + "] (max_blocks·block_size = " +
                      std::to_string(W) + "·" + std::to_string(plan.block_size) + ")");
    const std::int64_t used = (len + plan.block_size - 1) / plan.block_size;
    for (std::int64_t j = 0; j < used; ++j) {
      const std::int64_t e = in.block_table[static_cast<std::size_t>(b * W + j)];
      require_entry(e >= 0 && e < plan.num_blocks, "block_table", b * W + j, std::to_string(e),
                    "must lie in [0, num_blocks = " + std::to_string(plan.num_blocks) +
                        ") (entry [" + std::to_string(b) + ", " + std::to_string(j) +
                        "] holds keys of cache_seqlens[" + std::to_string(b) +
                        "] = " + std::to_string(len) + ")");
    }
  }
}

}  // namespace detail

/// Throws Error unless the gradient views fit the plan: every non-empty one
/// has its full size (dsinks `[H]` only for plans with sinks, dbias
/// mask_size() only for a bias mask) and at least one is asked for. A paged
/// plan has no backward (SPEC §2.10).
template <class T>
void check_grads(const AttentionPlan& plan, const AttentionGrads<T>& g) {
  require(!plan.paged(), "block_table", std::string("(a paged cache)"),
          "has no backward: attention backward takes contiguous or packed k and v");
  if (!g.dq.empty()) require_size(g.dq.size(), plan.dq.extent, "dq");
  if (!g.dk.empty()) require_size(g.dk.size(), plan.dk.extent, "dk");
  if (!g.dv.empty()) require_size(g.dv.size(), plan.dv.extent, "dv");
  if (!g.dsinks.empty()) require_size(g.dsinks.size(), plan.sinks ? plan.H : 0, "dsinks");
  if (!g.dbias.empty()) {
    require(plan.mask == MaskKind::bias, "dbias", std::to_string(g.dbias.size()) + " elements",
            std::string("must be empty: only a bias mask has a gradient (mask is ") +
                to_string(plan.mask) + ")");
    require_size(g.dbias.size(), plan.mask_size(), "dbias");
  }
  require(!g.dq.empty() || !g.dk.empty() || !g.dv.empty() || !g.dsinks.empty() || !g.dbias.empty(),
          "grads", std::string("(all empty)"),
          "must ask for at least one of dq, dk, dv, dsinks, dbias");
}

/// Throws Error unless a quantized cache fits the plan: kv_cache is int8 or
/// e4m3, the plain k and v of `in` are empty, the codes hold plan.k.extent
/// and plan.v.extent bytes, the scales have kv_scale_size() finite values
/// >= 0; and everything else of `in` as check_inputs (SPEC §10.4, §8).
template <class T>
void check_inputs(const AttentionPlan& plan, const AttentionInputs<T>& in, const QuantizedKv& kv) {
  require(plan.kv_cache != KvCache::plain, "kv_cache", std::string("plain"),
          "must be int8 or e4m3 for a quantized cache (plain k and v go to attention_forward)");
  require_extent(in.q.size(), plan.q.extent, "q");
  require_size(in.k.size(), 0, "k");
  require_size(in.v.size(), 0, "v");
  require_extent(kv.k.size(), plan.k.extent, "k_codes");
  require_extent(kv.v.size(), plan.v.extent, "v_codes");
  const auto check_scales = [&](std::span<const float> s, const std::string& name) {
    require_size(s.size(), plan.kv_scale_size(), name);
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (std::isfinite(s[i]) && s[i] >= 0.0f) continue;  // the value's text only for the message
      require_entry(false, name, static_cast<std::int64_t>(i), std::to_string(s[i]),
                    "must be finite and >= 0");
    }
  };
  check_scales(kv.k_scale, "k_scale");
  check_scales(kv.v_scale, "v_scale");
  AttentionInputs<T> rest = in;  // the features, checked as for plain k and v
  rest.k = {};
  rest.v = {};
  detail::check_features(plan, rest);
}

namespace detail {
/// Throws Error naming `name` unless every value of x `[B',S',Hkv,width]`
/// (through `view`) is finite: a scale of inf or NaN has no codes.
template <class T>
void require_quantizable(const AttentionPlan& plan, const Strides& view, std::int64_t width,
                         std::span<const T> x, const char* name) {
  for (std::int64_t b = 0; b < plan.kv_batch(); ++b) {
    for (std::int64_t s = 0; s < plan.kv_seq(); ++s) {
      for (std::int64_t g = 0; g < plan.Hkv; ++g) {
        for (std::int64_t d = 0; d < width; ++d) {
          const std::int64_t at = view.at(b, s, g) + d;
          require_entry(std::isfinite(static_cast<double>(x[at])), name, at,
                        std::to_string(static_cast<double>(x[at])),
                        "must be finite to be quantized (SPEC §10.4)");
        }
      }
    }
  }
}
}  // namespace detail

/// Throws Error unless quantize_kv's views fit the plan: k and v hold
/// plan.k.extent and plan.v.extent elements, every value of them finite,
/// and the output codes and scales their full sizes (SPEC §10.4).
template <class T>
void check_quantize(const AttentionPlan& plan, std::span<const T> k, std::span<const T> v,
                    const QuantizedKvOut& out) {
  require(plan.kv_cache != KvCache::plain, "kv_cache", std::string("plain"),
          "must be int8 or e4m3 to quantize a cache");
  require_extent(k.size(), plan.k.extent, "k");
  require_extent(v.size(), plan.v.extent, "v");
  require_size(out.k.size(), plan.k.extent, "k_codes");
  require_size(out.v.size(), plan.v.extent, "v_codes");
  require_size(out.k_scale.size(), plan.kv_scale_size(), "k_scale");
  require_size(out.v_scale.size(), plan.kv_scale_size(), "v_scale");
  detail::require_quantizable(plan, plan.k, plan.D, k, "k");
  detail::require_quantizable(plan, plan.v, plan.Dv, v, "v");
}

/// Throws Error unless the saved out and lse have their full sizes.
template <class T>
void check_saved(const AttentionPlan& plan, const AttentionSaved<T>& saved) {
  require_size(saved.out.size(), plan.o.extent, "out");
  require_size(saved.lse.size(), plan.lse_size(), "lse");
}

template <class T>
AttentionSeq AttentionPlan::sequence(const AttentionInputs<T>& in, std::int64_t n) const {
  AttentionSeq seq;
  seq.n = n;
  seq.Sq = Sq;
  seq.Sk = Sk;
  if (varlen()) {
    const auto s = static_cast<std::size_t>(n);
    seq.b = 0;
    seq.q_start = in.cu_seqlens_q[s];
    seq.Sq = in.cu_seqlens_q[s + 1] - seq.q_start;
    seq.k_start = in.cu_seqlens_k[s];
    seq.Sk = in.seqused_k.empty() ? in.cu_seqlens_k[s + 1] - seq.k_start : in.seqused_k[s];
  } else if (paged()) {
    seq.b = n;
    seq.Sk = in.cache_seqlens[static_cast<std::size_t>(n)];
    seq.block_size = block_size;
    seq.blocks = in.block_table.subview(static_cast<std::size_t>(n * max_blocks),
                                        static_cast<std::size_t>(max_blocks));
  } else {
    seq.b = n;
  }
  if (!in.key_origin.empty()) seq.key_origin = in.key_origin[static_cast<std::size_t>(n)];
  return seq;
}

}  // namespace tandem
