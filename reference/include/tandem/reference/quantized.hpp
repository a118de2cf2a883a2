// SPDX-License-Identifier: Apache-2.0
/// @file reference/quantized.hpp
/// @brief Reference quantized KV caches (SPEC §10.4): quantize_kv, which
///        defines the codes and scales bit for bit, and the attention forward
///        that reads them with the scales factored out of the products.
///
/// A cache of kind int8 keeps one float32 scale per (key row, kv head) of
/// k `[B',S',Hkv,D]` (B', S' = B, Sk, or num_blocks, block_size of a paged
/// cache), `[B',S',Hkv]`; a cache of kind e4m3 one per kv head, `[Hkv]`, over
/// every row of the head. v has its own scales of the same shape. For a row
/// (or head) x with m = max |x_d| (exact: every stored value is a float32):
///
///     int8:  σ = m ⊘ 127               c_d = clamp(round_even(x_d ⊘ σ), −127, 127)
///     e4m3:  σ = m ⊘ 448               c_d = RN_e4m3(x_d ⊘ σ)   (saturating at ±448)
///
/// ⊘ is the float32 division (IEEE, correctly rounded: RN_f32 of the exact
/// quotient), round_even rounds a float32 to the nearest integer, ties to
/// even, and RN_e4m3 rounds a float32 to the nearest e4m3 value, ties to
/// even. When σ = 0 (an all-zero row or head, or m/127 below the smallest
/// float32) every code is 0. These are the bits the optimized backend must
/// reproduce exactly.
///
/// The forward (SPEC §10.4) takes q and writes out in the storage type T:
///
///     x_ij = scale · σ^k_j · <q_i, c^k_j>          then softcap, ALiBi, bias as SPEC §2
///     o_i  = RN_T( Σ_j (w_ij · σ^v_j) · c^v_j / l_i )
///
/// with e_ij, l_i, w_ij as SPEC §10.2 (the rounding of plan.rounding; for
/// float storage nothing is rounded in between). No dequantized value is
/// formed: in double, `(w_ij · σ^v_j) · c^v_jd` is exact (at most 11 + 24 + 8
/// significant bits), so the order of the factors does not matter. ggml's
/// `q_as_k` (q rounded to K's type) is not modelled for a quantized cache: q
/// is read as stored (SPEC §10.4).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "tandem/attention.hpp"
#include "tandem/error.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/scalar.hpp"
#include "tandem/storage.hpp"

namespace tandem::reference {

/// The value of one code byte of a cache of kind `kind`: the int8 two's
/// complement integer, or the e4m3fn value (exact in double).
inline double code_value(KvCache kind, std::uint8_t code) {
  if (kind == KvCache::int8) return static_cast<double>(static_cast<std::int8_t>(code));
  return static_cast<double>(float8_e4m3::from_bits(code));
}

/// The scale σ = m ⊘ bound in float32, m = max |x| of what it scales (exact).
inline float quantize_scale(float m, float bound) {
  return m / bound;
}

/// The code of x at scale σ (SPEC §10.4): int8 `clamp(round_even(x ⊘ σ), −127, 127)`,
/// e4m3 `RN_e4m3(x ⊘ σ)`; 0 when σ = 0.
inline std::uint8_t quantize_code(KvCache kind, float x, float sigma) {
  if (sigma == 0.0f) return 0;
  const float r = x / sigma;  // RN_f32(x / σ)
  if (kind == KvCache::int8) {
    const float c = std::clamp(std::nearbyint(r), -127.0f, 127.0f);  // ties to even
    return static_cast<std::uint8_t>(static_cast<std::int8_t>(c));
  }
  return float8_e4m3(static_cast<double>(r)).bits;
}

namespace detail {

/// Quantizes one tensor x `[B',S',Hkv,width]` (through `view`) into `codes`
/// (the same addresses) and `scales` `[kv_scale_size()]` (SPEC §10.4).
template <class T>
void quantize_tensor(const AttentionPlan& plan, const Strides& view, std::int64_t width,
                     std::span<const T> x, std::span<std::uint8_t> codes, std::span<float> scales) {
  const bool int8 = plan.kv_cache == KvCache::int8;
  const float bound = int8 ? 127.0f : 448.0f;
  const std::int64_t rows = plan.kv_batch(), slots = plan.kv_seq();
  // m = max |x_d| over the row (int8) or over every row of the head (e4m3); σ = m ⊘ bound
  std::vector<float> m(scales.size(), 0.0f);
  for (std::int64_t b = 0; b < rows; ++b) {
    for (std::int64_t s = 0; s < slots; ++s) {
      for (std::int64_t g = 0; g < plan.Hkv; ++g) {
        float& m_bsg = m[plan.kv_scale_at(b, s, g)];
        for (std::int64_t d = 0; d < width; ++d) {
          m_bsg = std::max(m_bsg, std::fabs(static_cast<float>(x[view.at(b, s, g) + d])));
        }
      }
    }
  }
  for (std::size_t e = 0; e < scales.size(); ++e) scales[e] = quantize_scale(m[e], bound);
  // c_d = code(x_d ⊘ σ)
  for (std::int64_t b = 0; b < rows; ++b) {
    for (std::int64_t s = 0; s < slots; ++s) {
      for (std::int64_t g = 0; g < plan.Hkv; ++g) {
        const float sigma = scales[plan.kv_scale_at(b, s, g)];
        for (std::int64_t d = 0; d < width; ++d) {
          const std::int64_t at = view.at(b, s, g) + d;
          codes[at] = quantize_code(plan.kv_cache, static_cast<float>(x[at]), sigma);
        }
      }
    }
  }
}

}  // namespace detail

/// Fills a quantized cache from k `[B',S',Hkv,D]` and v `[B',S',Hkv,Dv]` of
/// storage type T (float, bfloat16, float16), read through plan.k and plan.v
/// (a paged plan's whole cache, every block): codes at the same addresses in
/// out.k, out.v, scales `[kv_scale_size()]` in out.k_scale, out.v_scale, as
/// the file comment says (SPEC §10.4). Bytes of out.k, out.v at no element's
/// address are not written. Throws tandem::Error before writing anything when
/// the views do not fit (check_quantize) or a value of k or v is not finite.
template <class T, class Acc = accumulator_t<T>>
void quantize_kv(const AttentionPlan& plan, std::span<const T> k, std::span<const T> v,
                 const QuantizedKvOut& out) {
  check_quantize(plan, k, v, out);
  detail::quantize_tensor<T>(plan, plan.k, plan.D, k, out.k, out.k_scale);
  detail::quantize_tensor<T>(plan, plan.v, plan.Dv, v, out.v, out.v_scale);
}

/// Forward passes 1–4 for query i of sequence `seq`, head h, from a quantized
/// cache: `<q_i, k_j> = σ^k_j · <q_i, c^k_j>` (attention_row_from). Inputs
/// must be checked.
template <class T, class Acc = accumulator_t<T>>
AttentionRow<Acc> attention_row_quantized(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                          const QuantizedKv& kv, const AttentionSeq& seq,
                                          std::int64_t h, std::int64_t i) {
  const std::int64_t g = plan.kv_head(h);
  const std::int64_t q_at = plan.q.at(seq.b, seq.q_row(i), h);
  // σ^k_j · <q_i, c^k_j> = σ^k_j · sum_d q_id · c^k_jd
  const auto dot = [&](const KeyRow& key) {
    Acc dot_ij = Acc(0);
    for (std::int64_t d = 0; d < plan.D; ++d) {
      dot_ij +=
          static_cast<Acc>(in.q[q_at + d]) *
          static_cast<Acc>(code_value(plan.kv_cache, kv.k[plan.k.at(key.batch, key.seq, g) + d]));
    }
    return static_cast<Acc>(kv.k_scale[plan.kv_scale_at(key.batch, key.seq, g)]) * dot_ij;
  };
  return attention_row_from<T, Acc>(plan, in, seq, h, i, dot);
}

/// Forward pass 5 from a quantized cache, before the final rounding:
/// `o_i = Σ_j (w_ij · σ^v_j) · c^v_j / l_i` (attention_output_row_from with
/// v_jd = σ^v_j · c^v_jd, exact in Acc = double). Returns o_i `[Dv]`.
template <class T, class Acc = accumulator_t<T>>
std::vector<Acc> attention_output_row_quantized(const AttentionPlan& plan, const QuantizedKv& kv,
                                                const AttentionSeq& seq,
                                                const AttentionRow<Acc>& row, std::int64_t h) {
  const std::int64_t g = plan.kv_head(h);
  const auto v_jd = [&](const KeyRow& key, std::int64_t d) {
    return static_cast<Acc>(kv.v_scale[plan.kv_scale_at(key.batch, key.seq, g)]) *
           static_cast<Acc>(code_value(plan.kv_cache, kv.v[plan.v.at(key.batch, key.seq, g) + d]));
  };
  return attention_output_row_from<T, Acc>(plan, seq, row, v_jd);
}

/// Attention forward from a quantized cache (SPEC §10.4): out `[B,Sq,H,Dv]`
/// (plan.o) = attention_forward of q with k_jd = σ^k_j·c^k_jd and
/// v_jd = σ^v_j·c^v_jd, the scales taken out of the products (file comment),
/// every feature of attention_forward (masks, softcap, ALiBi, sinks, packed
/// and paged caches), rounded as plan.rounding says for bf16 and f16.
/// in.k and in.v are empty; kv holds the codes and scales. Throws
/// tandem::Error before writing anything (check_inputs(plan, in, kv)).
template <class T, class Acc = accumulator_t<T>>
void attention_forward_quantized(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                 const QuantizedKv& kv, std::span<T> out) {
  check_inputs(plan, in, kv);
  require_size(out.size(), plan.o.extent, "out");
  for (std::int64_t n = 0; n < plan.sequences(); ++n) {
    const AttentionSeq seq = plan.sequence(in, n);
    for (std::int64_t h = 0; h < plan.H; ++h) {
      for (std::int64_t i = 0; i < seq.Sq; ++i) {
        // passes 1–4 over the scaled codes of k
        const AttentionRow<Acc> row = attention_row_quantized<T, Acc>(plan, in, kv, seq, h, i);
        // pass 5 over the scaled codes of v, rounded once to T
        const std::vector<Acc> o_i = attention_output_row_quantized<T, Acc>(plan, kv, seq, row, h);
        for (std::int64_t d = 0; d < plan.Dv; ++d) {
          out[plan.o.at(seq.b, seq.q_row(i), h) + d] = static_cast<T>(o_i[d]);
        }
      }
    }
  }
}

}  // namespace tandem::reference
