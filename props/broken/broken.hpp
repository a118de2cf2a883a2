// SPDX-License-Identifier: Apache-2.0
/// @file broken.hpp
/// @brief Deliberately broken backends: the fixtures that prove every
///        property of the suite can fail.
///
/// Each fixture is a small, self-contained scalar implementation of every
/// entry point of tandem::Backend (sums in double) that is correct except
/// for one planted bug, selected by Bug. `Bug::none` is a correct third
/// implementation and must pass the whole suite.
#pragma once

#include <string>
#include <vector>

#include "tandem/backend.hpp"

namespace tandem::props::broken {

/// The planted bug of a broken backend.
enum class Bug {
  none,                          ///< correct: passes every property
  rope_table_stride_half_nrot,   ///< RoPE reads table row r at r·(n_rot/2) instead of r·T
  rope_rank4_as_bshd,            ///< RoPE position rows taken as (b'·S + s) / B' (seq read as H)
  attn_batch_offset_units,       ///< K/V batch offset advanced by b·batch/sizeof(float)
  rope_backward_other_row,       ///< RoPE backward reads row s even for token rows
  gqa_mod,                       ///< query head h reads kv head h mod Hkv
  causal_offset_dropped,         ///< causal mask aligned top-left (offset 0)
  window_off_by_one,             ///< sliding window sees w keys, not w + 1
  softcap_missing_backward,      ///< one-call backward omits 1 − tanh²(x/c)
  masked_row_nan,                ///< a fully masked row divides 0 by 0
  scale_ignored_backward,        ///< dq and dk not multiplied by scale
  write_past_output,             ///< attention forward writes one element past out
  rope_src_stride_ignored,       ///< RoPE reads source rows W apart, not src_row_stride
  token_rows_transposed,         ///< token table row taken as s·B' + b' instead of b'·S + s
  rope_sin_sign,                 ///< NeoX forward: y[i+m] = x[i+m]c − x[i]s (not a rotation)
  gptj_angle_negated,            ///< GPT-J forward rotates by −angle
  axial_backward_same_angle,     ///< axial backward rotates by +angle (not the transpose)
  axial_repeat_ignored,          ///< axial position taken from s, not s mod (end_x·end_y)
  keep_row_batch0,               ///< key padding reads batch 0's keep row for every batch
  softcap_tanh_unscaled,         ///< forward cap c·tanh(s) instead of c·tanh(s/c)
  key_tail_dropped,              ///< keys past the last full block of 8 are skipped (Sk > 8)
  masked_times_value,            ///< hidden keys enter o as 0·v (junk v gives NaN)
  swiglu_backward_short,         ///< SwiGLU dg misses the (1 + g(1 − σ(g))) factor
  block_out_bias_dropped,        ///< attention block ignores b_out
  thread_dependent_sum,          ///< o sums keys in `threads` float partial sums
  coarse_exp,                    ///< exp rounded to 12 mantissa bits
  v_row_stride_ignored,          ///< V rows read Hkv·Dv apart, not v_row_stride (bshd)
  saved_lse_without_log,         ///< saved log-sum-exp is m, the row maximum, without + log l
  rope_positions_per_batch_row,  ///< position id of token (b, s) read at b·S, not b·S + s
  rope_bhsd_as_bshd,             ///< a bhsd source and output addressed as bshd rows
  rope_qk_k_rows_by_q_heads,     ///< k's (token, head) pairs mapped to tokens with q's head count
  rope_positions_checked_late,   ///< a position id's range checked while writing, not before
  sink_value_first_key,          ///< the sink's share p_sink carries the value of key 0
  dsink_sign_flipped,            ///< dsink_h = +Σ p_sink·<dO, O> (sign flipped)
  sink_sum_thread_dependent,     ///< dsink_h summed in `threads` float partial sums
  alibi_without_abs,             ///< ALiBi penalty m·(i + Sk − Sq − j), no absolute value
  alibi_shift_flipped,           ///< ALiBi distance |i + Sq − Sk − j| (shift sign flipped)
  varlen_global_alignment,       ///< causal/window aligned over the packed totals, not per sequence
  varlen_reads_across_boundary,  ///< a sequence also sees the first key after its own
  varlen_ignores_seqused,        ///< seqused_k ignored: the padding keys of a slot are read
  paged_table_ignored,    ///< key j of batch b read from block (b·max_blocks + j/bs) % num_blocks
  paged_slot_off_by_one,  ///< key j read from slot (j + 1) % block_size of its block
  features_write_before_check,  ///< a feature call writes its first output, then validates
  dsinks_one_past,              ///< backward writes one element past dsinks
  dbias_broadcast_unsummed,     ///< dbias of a broadcast bias keeps the last (b, h)'s dS, unsummed
  dbias_is_p,                   ///< dbias takes P instead of dS = P·(dP − delta)
  dbias_capped,                ///< dbias takes dS·(1 − tanh²(x/c)), the gradient before the cap
  dbias_sum_thread_dependent,  ///< dbias summed in float at more than one "thread", else double
  decode_dot_reversed,  ///< q·k in float, from d = D − 1 down in decode-shaped calls (Sq·G <= 4)
  key_chunks_by_sequences,   ///< o and dq summed in float over as many key chunks as sequences
  blocks_ignore_key_origin,  ///< o summed in float over 64-key blocks from the call's key 0
  // low precision (SPEC §10; broken_lowp.cpp)
  weights_rounded_twice,       ///< bf16/f16: P = RN_T(RN_T(e_ij) / l_i) before P·V (two roundings)
  output_accumulated_in_t,     ///< bf16/f16: Σ_j w_ij v_j rounded to T after every key
  weights_non_integer_max,     ///< bf16/f16: w_ij = RN_T(2^(x_ij − m_i)), m_i not a whole number
  weights_three_bits,          ///< weights kept to 3 fraction bits (an e4m3's precision)
  store_truncates,             ///< bf16/f16 outputs truncated towards zero, not RN_T
  quantize_truncates,          ///< quantize_kv truncates k/σ instead of rounding to nearest even
  decode_drops_v_scale,        ///< quantized attention: the weights never take v's scale
  quantized_plan_unchecked,    ///< bf16/f16 attention_forward writes out for a quantized plan
  dv_weights_unrounded,        ///< bf16/f16 backward (pytorch): dV from p_ij, not RN_T(p_ij)
  sink_weight_rounded,         ///< bf16/f16 (pytorch): the sink's share of l_i rounded to T
  exact_rounds_masked_rows,    ///< bf16/f16 (exact): a row that hides a key rounds its weights
  paged_blocks_reversed_bf16,  ///< bf16: a sequence's block-table row read back to front
  dsinks_accumulated_in_t,     ///< bf16/f16: dsinks rounded to T after every row, not once
  dbias_accumulated_in_t,      ///< bf16/f16: a broadcast dbias rounded to T after every term
  block_qkv_unrounded,         ///< bf16/f16 block: the float32 block, only its output rounded to T
  flex_score_unscaled,         ///< flex: s_ij = <q_i, k_j> without the scale
  flex_thread_dependent,       ///< flex: out's first element one ulp up at more than one thread
  flex_block_mask_ignored,     ///< flex: mask_mod alone decides, the block mask dropped
  flex_nonfinite_rows_zeroed,  ///< flex: a NaN or +inf t's row given o = 0, lse = −inf
};

/// The bug's name, e.g. "gqa_mod".
const char* to_string(Bug bug);

/// Every bug but none.
std::vector<Bug> all_bugs();

/// A backend named "broken:<bug>" with `bug` planted. `threads` only matters
/// for Bug::thread_dependent_sum, Bug::sink_sum_thread_dependent and
/// Bug::flex_thread_dependent (it stands for the OpenMP thread count). The
/// flex entry points are the float reference's, with the flex bugs planted.
Backend backend(Bug bug, int threads = 1);

/// Sets be's bf16 and f16 kernels (attention forward, the quantized cache,
/// RoPE, axial RoPE, SwiGLU, the attention block) and its float quantized entry points, with the
/// low-precision bugs of `bug` planted (broken_lowp.cpp).
void attach_low_precision(Backend& be, Bug bug);

}  // namespace tandem::props::broken
