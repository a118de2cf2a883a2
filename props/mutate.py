#!/usr/bin/env python3
"""Testing the tests: plants one bug at a time in the optimized kernels and
checks that the property suite alone rejects each one.

Every mutation is a file of optimized/src (or, for the plan layer's checks
and addressing, of include/tandem), one or more (exact fragment,
replacement) edits and what the bug means. The script copies the checkout
once into WORK/src (WORK defaults to build-mutate/), configures one Release
build of it in WORK/build, and for each mutation applies its edits to the
copy, rebuilds props_suite alone, runs the optimized subjects' properties
(fixed seed, no shrinking; every property, or up to the first failure with
--fail-fast), then restores the file. A fragment found other than exactly once stops the script: the list
cannot rot silently when the kernels change.

By default the copy compiles the kernels for the one Highway target AVX2
(HWY_COMPILE_ONLY_STATIC, -march=haswell -maes: Highway's AVX2 baseline also
asks for AES, which GCC's haswell leaves out) instead of every target, a
quarter of the compile time; the suite runs the same properties at every target, so
a bug killed here is killed by `ctest -L props` too. The mutations of
include/tandem (the plan layer) change what every backend checks and
addresses; --reference-only rebuilds the copy without the optimized backend,
at -O0, and runs the reference and broken_none subjects, which share them. --all-targets builds
as shipped. The mutations marked avx3 (the bf16 forward's AVX512-BF16
products, which only AVX3 kernels take) are skipped in that build: --avx3
compiles the one target AVX3 (-march=skylake-avx512) instead, for a CPU with
AVX512-BF16.

  props/mutate.py                       # every mutation; a Markdown table at the end
  props/mutate.py --only gqa_mod,tail   # some of them
  props/mutate.py --list                # names and descriptions
  props/mutate.py --reference-only --work build-mutate-ref --only block_table_one_past
                                        # a plan-layer mutation (include/tandem)
Exit status 1 when a mutation survives, 2 when the list does not apply.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Mutation:
    name: str
    file: str  # relative to root
    edits: list  # [(fragment, replacement)], each fragment exactly once in the file
    description: str
    avx3: bool = False  # reached only by the AVX3 kernels (the default build compiles AVX2)
    root: str = "optimized/src"  # the folder of file: include/tandem for the plan layer


MUTATIONS = [
    Mutation("rescale_output_dropped", "attention_forward_tile-inl.h",
             [("const VF a = hn::LoadU(d, softmax.alpha() + r0);",
               "const VF a = hn::Set(d, 1.0f);")],
             "wide tile: the running output is not rescaled by 2^(m_old - m_new) when m moves"),
    Mutation("decode_rescale_dropped", "attention_forward_tile-inl.h",
             [("if (softmax_.alpha()[r] == 1.0f) continue;", "continue;")],
             "decode tile: the running output is never rescaled"),
    Mutation("row_sum_not_rescaled", "attention_softmax-inl.h",
             [("hn::StoreU(hn::MulAdd(hn::LoadU(d, l_ + r0), a, sum), d, l_ + r0);",
               "hn::StoreU(hn::Add(hn::LoadU(d, l_ + r0), sum), d, l_ + r0);")],
             "online softmax: l <- l + rowsum(P), without the factor 2^(m_old - m_new)"),
    Mutation("rescale_threshold_too_high", "attention_softmax-inl.h",
             [("static constexpr float kRescaleAbove = 8.0f;",
               "static constexpr float kRescaleAbove = 160.0f;")],
             "the running max moves only past 2^160: 2^(x - m) overflows float for large scores"),
    Mutation("careful_pv_never", "attention_forward_tile-inl.h",
             [("  if (!score.hides_per_row()) return false;\n  bool finite = true;",
               "  return false;\n  bool finite = true;")],
             "forward: never the careful P.V, so 0 * (NaN in v of a hidden key) reaches out"),
    Mutation("causal_last_key_skipped", "attention_call-inl.h",
             [("if (c.banded()) j_end = std::min(Sk, a_last + 1);",
               "if (c.banded()) j_end = std::min(Sk, a_last);")],
             "causal/window: a tile's key range ends one key early (its last row loses its diagonal key)"),
    Mutation("causal_band_one_past", "attention_score-inl.h",
             [("hi = std::clamp<std::int64_t>(a - j0, -1, nk);",
               "hi = std::clamp<std::int64_t>(a - j0 + 1, -1, nk);")],
             "causal offset off by one: row i also sees key q_offset + i + 1 within a block"),
    Mutation("causal_active_rows_late", "attention_call-inl.h",
             [("qi_lo = std::clamp<std::int64_t>(j0 - q_offset - i0, 0, nq);",
               "qi_lo = std::clamp<std::int64_t>(j0 - q_offset - i0 + 1, 0, nq);")],
             "causal: the row whose diagonal key starts a block is left out of the block's columns"),
    Mutation("window_first_key_skipped", "attention_call-inl.h",
             [("j_begin = std::max<std::int64_t>(0, a_first - c.window);",
               "j_begin = std::max<std::int64_t>(0, a_first - c.window + 1);")],
             "sliding window: the tile's key range starts one key late"),
    Mutation("window_lower_bound", "attention_score-inl.h",
             [("lo = std::clamp<std::int64_t>(a - c_.window - j0, -1, nk);",
               "lo = std::clamp<std::int64_t>(a - c_.window - j0 + 1, -1, nk);")],
             "sliding window lower bound off by one: row sees w keys back, not w + 1"),
    Mutation("window_active_rows_short", "attention_call-inl.h",
             [("qi_hi = std::clamp<std::int64_t>(j0 + nk - 1 + c.window - q_offset - i0 + 1, 0, nq);",
               "qi_hi = std::clamp<std::int64_t>(j0 + nk - 1 + c.window - q_offset - i0, 0, nq);")],
             "sliding window: the last row that still sees a block is left out of its columns"),
    Mutation("gqa_head_mod", "attention_call-inl.h",
             [("std::int64_t n = 0, b = 0, g = 0, G = 1, i0 = 0,",
               "std::int64_t n = 0, b = 0, g = 0, G = 1, Hkv = 1, i0 = 0,"),
              (": n(n_), b(c.seqs[n_].b), g(g_), G(c.G) {",
               ": n(n_), b(c.seqs[n_].b), g(g_), G(c.G), Hkv(c.plan->Hkv) {"),
              ("std::int64_t head(std::int64_t r) const { return g * G + r % G; }",
               "std::int64_t head(std::int64_t r) const { return g + r % G * Hkv; }")],
             "GQA: kv head g serves query heads h with h % Hkv = g instead of h / G = g"),
    Mutation("packed_rows_head_ignored", "attention_packed_rows-inl.h",
             [("if (head != head_ || j0 < lo_ || j0 > hi_) {", "if (j0 < lo_ || j0 > hi_) {")],
             "packed K/V kept across tiles: a tile of another (batch, kv head) reuses the rows packed for the last one"),
    Mutation("split_chunk_end", "attention_split_keys-inl.h",
             [("std::min(c.seqs[n].Sk, (ch + 1) * chunk - shift)",
               "std::min(c.seqs[n].Sk, (ch + 1) * chunk - shift - 1)")],
             "split-key decode: each chunk ends one key early"),
    Mutation("origin_blocks_ignored", "attention_call-inl.h",
             [("return std::min(c.key_block - (key_origin + j0) % c.key_block, j_end - j0);",
               "return std::min(c.key_block - j0 % c.key_block, j_end - j0);")],
             "invariant order: key blocks counted from the call's key 0, not from key_origin"),
    Mutation("origin_tile_chunks_ignored", "attention_forward_tile-inl.h",
             [("merge_.Enter(t_.key_origin + kb.j0, [&] {\n        softmax_.Restart();",
               "merge_.Enter(kb.j0, [&] {\n        softmax_.Restart();")],
             "invariant decode tile: its 1024-key chunks counted from the call's key 0"),
    Mutation("origin_split_chunks_ignored", "attention_split_keys-inl.h",
             [("return c.invariant ? c.seqs[n].key_origin % chunk : 0;", "return 0;")],
             "invariant split-key decode: its chunks counted from the call's key 0"),
    Mutation("origin_split_steps_unaligned", "attention_split_keys-inl.h",
             [("j + step - (c.invariant ? (origin + j) % c.key_block : 0)", "j + step")],
             "invariant split-key decode: steps that cut a key block of the sequence in two"),
    Mutation("split_merge_unscaled", "attention_split_keys-inl.h",
             [("l += lc * hn::GetLane(w);", "l += lc;")],
             "split-key merge: the chunks' sums l_c added without 2^(m_c - m)"),
    Mutation("split_acc_not_cleared", "attention_split_keys-inl.h",
             [("std::fill(acc, acc + Dvp, 0.0f);", "")],
             "split-key merge: the accumulator of a row keeps the previous row's output"),
    Mutation("backward_dk_not_cleared", "attention_backward.cpp",
             [("if (bw.want_dk) std::fill(dK, dK + Sk * s.Dp, 0.0f);", "")],
             "backward: a thread's dK sum is not cleared between (batch, kv head) tasks"),
    Mutation("backward_dv_not_cleared", "attention_backward.cpp",
             [("if (bw.want_dv) std::fill(dV, dV + Sk * s.Dvp, 0.0f);", "")],
             "backward: a thread's dV sum is not cleared between (batch, kv head) tasks"),
    Mutation("backward_last_part_dropped", "attention_backward.cpp",
             [("for (std::int64_t k = 1; k < parts_; ++k) sum +=", "for (std::int64_t k = 1; k + 1 < parts_; ++k) sum +=")],
             "backward query parts: the last part's dK/dV partial is not added"),
    Mutation("backward_last_qblock_of_part", "attention_backward.cpp",
             [("for (std::int64_t qb = part; qb < c.qblocks(n); qb += parts) {",
               "for (std::int64_t qb = part; qb + parts < c.qblocks(n); qb += parts) {")],
             "backward query parts: the last query block of each part is left out"),
    Mutation("softcap_derivative", "attention_backward.cpp",
             [("ds = hn::Mul(ds, hn::NegMulAdd(th, th, hn::Set(d, 1.0f)));",
               "ds = hn::Mul(ds, hn::Sub(hn::Set(d, 1.0f), th));")],
             "softcap backward: 1 - tanh instead of 1 - tanh^2"),
    Mutation("backward_careful_padding", "attention_backward.cpp",
             [("if (!score_.hides_per_row() && !score_.any_hidden()) return false;",
               "if (!score_.hides_per_row()) return false;")],
             "backward: blocks with a padding key never take the careful path"),
    Mutation("sink_output_not_rescaled", "attention_softmax-inl.h",
             [("a = lane::IfThenElse(real, a_new, a);", "a = lane::IfThenElse(real, a, a);")],
             "sinks: merging the sink moves m but the running output is not rescaled by 2^(m_old - m)"),
    Mutation("split_merge_sink_dropped", "attention_split_keys-inl.h",
             [("if (c.sinks != nullptr) MergeSink(", "if (c.sinks == nullptr) MergeSink(")],
             "split-key merge: the sink's share of the row sum is left out"),
    Mutation("dsink_sign", "attention_backward.cpp",
             [("dsink[r % t_.G] -= std::exp(sink - lse)", "dsink[r % t_.G] += std::exp(sink - lse)")],
             "dsinks: +p_sink * rowsum(dO o O) instead of minus"),
    Mutation("dbias_broadcast_one_head", "attention_backward.cpp",
             [("nh = Hb == 1 ? plan.H : 1;", "nh = 1;")],
             "dbias of a bias broadcast over heads: only head 0's dS rows are summed"),
    Mutation("dbias_rows_shared_heads", "attention_backward.cpp",
             [("return plan.bias_batch == plan.B && plan.bias_heads == plan.H;",
               "return plan.bias_batch == plan.B;")],
             "dbias of a bias broadcast over heads written in place: each head overwrites the row"),
    Mutation("dbias_block_offset_dropped", "attention_backward.cpp",
             [("attn::StoreColumn(dBt + r, R, kb.nk, BiasRow(bw_.dbias_rows, r) + kb.j0);",
               "attn::StoreColumn(dBt + r, R, kb.nk, BiasRow(bw_.dbias_rows, r));"),
              ("attn::StoreColumn(dBt + r, R, kb.nk, BiasRow(bw_.ds_scratch, r) + kb.j0);",
               "attn::StoreColumn(dBt + r, R, kb.nk, BiasRow(bw_.ds_scratch, r));")],
             "dbias: every key block's dS lands in the first columns of the row"),
    Mutation("alibi_distance_signed", "attention_score-inl.h",
             [("const VF distance = hn::Abs(hn::Sub(hn::LoadU(d, position_ + r0), j));",
               "const VF distance = hn::Sub(hn::LoadU(d, position_ + r0), j);")],
             "ALiBi: the penalty m*(i + Sk - Sq - j) without the absolute value"),
    Mutation("paged_run_past_block", "attention_call-inl.h",
             [(": seq->block_size - j % seq->block_size;", ": seq->block_size - j % seq->block_size + 1;")],
             "paged cache: a block of keys is read in place one row past the end of its cache block"),
    Mutation("gemm_narrow_strip", "gemm-inl.h",
             [("const auto nr = static_cast<std::size_t>(std::min<std::int64_t>(kNR, (NC - c0) / N));",
               "const auto nr = static_cast<std::size_t>((NC - c0) / N >= static_cast<std::int64_t>(kNR)"
               " ? kNR : (NC - c0) / N - 1);")],
             "Gemm's last strip of columns, when narrower than the register tile, loses its last vector"),
    Mutation("finite_check_tail", "gemm-inl.h",
             [("for (; x < width; ++x) finite = finite && std::isfinite(row[x]);", "")],
             "RowsFinite ignores the last partial vector of a row (the careful path's test)"),
    Mutation("rope_tail_pairs", "rotate_pairs-inl.h",
             [("x1 = full ? LoadWide(d, x + m + i) : LoadWideN(d, x + m + i, n);",
               "x1 = full ? LoadWide(d, x + m + i) : LoadWideN(d, x + m + i, n - 1);")],
             "RoPE (NeoX): the last partial vector loses its last pair's second element"),
    # bf16/f16 storage (SPEC §10.2): each is a no-op at float, so only the
    # low-precision properties (props_lowp.cpp) can reject it
    Mutation("swiglu_silu_rounded", "swiglu.cpp",
             [("const V y = hn::Mul(silu, u);              // y = silu·u",
               "const V y = hn::Mul(RoundAs<T>(d, silu), u);")],
             "SwiGLU forward in bf16/f16: silu(g) rounded to T before the product (two roundings)"),
    Mutation("rope_product_rounded", "rotate_pairs-inl.h",
             [("const VF y0 = hn::MulSub(x0, cv, hn::Mul(x1, sv));  // x0·c − x1·s",
               "const VF y0 = hn::MulSub(x0, cv, RoundAs<T>(d, hn::Mul(x1, sv)));")],
             "RoPE and axial RoPE in bf16/f16: x1·s rounded to T before the difference"),
    Mutation("lowp_weights_unrounded", "attention_softmax-inl.h",
             [("hn::StoreU(RoundAs<T>(d, pr), d, St + jj * R_ + r0);",
               "hn::StoreU(pr, d, St + jj * R_ + r0);")],
             "bf16/f16 forward tiles (pytorch profile): the weights reach P·V unrounded"),
    Mutation("lowp_max_not_whole", "attention_softmax-inl.h",
             [("hn::IfThenElse(grow, whole ? hn::Ceil(mx) : mx, m_old);",
               "hn::IfThenElse(grow, mx, m_old);")],
             "bf16/f16 forward tiles: the running max is not a whole number, so the weights are "
             "rounded at another scale than SPEC §10.2's"),
    Mutation("decode_stored_v_scale_dropped", "attention_decode_stored.cpp",
             [("a_.v_scale != nullptr ? a_.v_scale[p_.kv_scale_at(at.batch, at.seq, t.g)] : 1.0f;",
               "1.0f;")],
             "quantized decode: the v codes are summed without their scales"),
    Mutation("decode_stored_weights_unrounded", "attention_decode_stored.cpp",
             [("hn::Store(round_ ? RoundAs<Q>(d, e) : e, d, S + x);", "hn::Store(e, d, S + x);")],
             "stored-K/V decode (pytorch profile): the weights reach P·V unrounded"),
    Mutation("decode_stored_max_not_whole", "attention_decode_stored.cpp",
             [("const float m_new = std::max(m, std::ceil(block_max));",
               "const float m_new = std::max(m, block_max);")],
             "stored-K/V decode: the running max is not a whole number"),
    Mutation("decode_stored_fold_swapped", "attention_decode_stored.cpp",
             [("((v[I] = hn::Add(hn::ConcatEven(d, v[2 * I + 1], v[2 * I]),",
               "((v[I] = hn::Add(hn::ConcatEven(d, v[2 * I], v[2 * I + 1]),")],
             "stored-K/V decode: the transposed reduction of the dot products sums half of "
             "one (key, row) pair's lanes into its neighbour's"),
    Mutation("decode_stored_causal_block_whole", "attention_decode_stored.cpp",
             [("        return j_last <= a_first;\n", "        return j0 <= a_last;\n")],
             "stored-K/V decode: a key block crossing the causal diagonal of some query is "
             "taken as seen by every row"),
    Mutation("decode_stored_window_block_whole", "attention_decode_stored.cpp",
             [("return j_last <= a_first && a_last - p_.window <= j0;",
               "return j_last <= a_first && a_first - p_.window <= j0;")],
             "stored-K/V decode: a key block leaving the sliding window of the last query is "
             "taken as seen by every row"),
    Mutation("decode_stored_whole_weights_unscaled", "attention_decode_stored.cpp",
             [("hn::Store(hn::Mul(hn::Load(d, y + x), hn::Load(d, sv + x)), d, w + x);",
               "hn::Store(hn::Load(d, y + x), d, w + x);")],
             "quantized decode: a fully visible key block's weights miss the v scales"),
    Mutation("decode_stored_value_weight_of_first_key", "attention_decode_stored.cpp",
             [("acc[r][c] = hn::MulAdd(hn::Set(d, w[r * kDecodeKeyBlock + a]), vv, acc[r][c]);",
               "acc[r][c] = hn::MulAdd(hn::Set(d, w[r * kDecodeKeyBlock]), vv, acc[r][c]);")],
             "stored-K/V decode: every value row of a block takes the first key's weight"),
    Mutation("decode_stored_e4m3_max_is_nan", "attention_decode_stored-inl.h",
             [("hn::Eq(hn::Abs(value), hn::Set(d, 480.0f));",
               "hn::Ge(hn::Abs(value), hn::Set(d, 448.0f));")],
             "e4m3 K/V: the largest finite code (448) read as NaN"),
    Mutation("decode_stored_e4m3_sign_dropped", "attention_decode_stored-inl.h",
             [("hn::Set(du, 0x87F00000u)", "hn::Set(du, 0x07F00000u)")],
             "e4m3 K/V: negative codes read as their magnitude"),
    Mutation("quantize_int8_truncates", "quantize_kv.cpp",
             [("hn::Min(hn::Max(hn::Round(hn::Div(x, sigma)),",
               "hn::Min(hn::Max(hn::Trunc(hn::Div(x, sigma)),")],
             "quantize_kv int8: x/σ truncated instead of rounded half to even"),
    Mutation("quantize_e4m3_ties_up", "quantize_kv.cpp",
             [("hn::ShiftRight<20>(hn::Add(rebias, hn::Add(hn::Set(du, 0x7FFFFu), odd)));",
               "hn::ShiftRight<20>(hn::Add(rebias, hn::Set(du, 0x80000u)));")],
             "quantize_kv e4m3: ties rounded away from zero instead of to even"),
    Mutation("lowp_backward_dx_unrounded", "attention_backward.cpp",
             [("hn::StoreU(round ? RoundAs<T>(d, ds) : hn::Mul(ds, scale), d, dSt + at);",
               "hn::StoreU(round ? ds : hn::Mul(ds, scale), d, dSt + at);")],
             "bf16/f16 backward (pytorch profile): dX reaches dQ and dK unrounded"),
    Mutation("lowp_backward_p_unrounded", "attention_backward.cpp",
             [("hn::StoreU(RoundAs<T>(d, hn::LoadU(d, at)), d, at);",
               "hn::StoreU(hn::LoadU(d, at), d, at);")],
             "bf16/f16 backward (pytorch profile): P reaches dV unrounded"),
    # the AVX512-BF16 products of the bf16 forward's wide tiles (Bf16Tile):
    # compiled for AVX3 alone and taken on a CPU with AVX512-BF16 (--avx3)
    Mutation("bf16_key_pair_swapped", "attention_forward_bf16_tile-inl.h",
             [("Kb[jj * d_pairs_ + p] = PairWord(even, odd);",
               "Kb[jj * d_pairs_ + p] = PairWord(odd, even);")],
             "bf16 tile: a key pair's halves swapped (q[2p]·k[2p+1] + q[2p+1]·k[2p])",
             avx3=True),
    Mutation("bf16_scores_unscaled", "attention_forward_bf16_tile-inl.h",
             [("b_.Qb.data(), R, lo, hi, c_.q_scale, St, R);",
               "b_.Qb.data(), R, lo, hi, 1.0f, St, R);")],
             "bf16 tile: the raw dot products reach the softmax without scale·log2 e", avx3=True),
    Mutation("bf16_pv_under_exact", "attention_forward_bf16_tile-inl.h",
             [("c_.weights == WeightRounding::bf16 && !careful", "!careful")],
             "bf16 tile: P·V by bf16 pairs under the exact profile too (P truncated to bf16)",
             avx3=True),
    Mutation("bf16_values_chain_restarts", "bf16_dot.cpp",
             [("acc[j][v] = _mm512_loadu_ps(Ot + (dv + j) * R + r0 + v * kLanes);",
               "acc[j][v] = _mm512_setzero_ps();")],
             "bf16 P·V kernel: each key block overwrites the running output, not adds to it",
             avx3=True),
    Mutation("block_sum_rounded_before_bias", "attention_block.cpp",
             [("VF v = hn::LoadU(d, tile + j);", "VF v = RoundAs<T>(d, hn::LoadU(d, tile + j));")],
             "bf16/f16 attention block: each projection's sum rounded to T before its bias is "
             "added (two roundings)"),
    # the plan layer (include/tandem): every backend takes these checks and
    # strides, so only properties that hold the plan to SPEC's own formulas
    # and bounds (props_plan.cpp) can reject them
    Mutation("block_table_one_past", "attention_views.hpp",
             [("e >= 0 && e < plan.num_blocks", "e >= 0 && e <= plan.num_blocks")],
             "paged cache: a block-table entry equal to num_blocks passes the check (a call "
             "reads one block past the cache)", root="include/tandem"),
    Mutation("rope_thd_bhsd_strides", "rope.hpp",
             [("const Layout L = p.layout == RopeLayout::bhsd ? Layout::bhsd : Layout::bshd;",
               "const Layout L = p.layout == RopeLayout::bshd ? Layout::bshd : Layout::bhsd;")],
             "RoPE plan: a thd source and output addressed with bhsd strides", root="include/tandem"),
    Mutation("rank4_layout_ambiguous_accepted", "attention_shapes.hpp",
             [("require(dim1 != dim2, \"layout\"", "require(dim1 || dim2, \"layout\"")],
             "attention shapes: a rank-4 q whose dims 1 and 2 both equal num_heads is taken as "
             "bhsd instead of refused as ambiguous", root="include/tandem"),
    Mutation("block_table_partial_block_unchecked", "attention_views.hpp",
             [("const std::int64_t used = (len + plan.block_size - 1) / plan.block_size;",
               "const std::int64_t used = len / plan.block_size;")],
             "paged cache: the block-table entry of a cache's last, partial block is not checked",
             root="include/tandem"),
    Mutation("rows_extent_whole_last_row", "shape.hpp",
             [("st.extent = rows == 0 ? 0 : checked_add(checked_mul(rows - 1, rs, what), row, what);",
               "st.extent = checked_mul(rows, rs, what);")],
             "strides: a bshd tensor with padded rows must hold its last row's padding too",
             root="include/tandem"),
    # Geometry::invariant (SPEC §12): reached by the *_invariant subjects alone
    Mutation("invariant_decode_scores_dotrows", "attention_forward_tile-inl.h",
             [("    if (c_.invariant) {\n      ScoresInOrder(kb);", "    if (false) {\n      ScoresInOrder(kb);")],
             "invariant decode tile: scores summed in the DotRows order, not the wide tile's d-ordered chains"),
    Mutation("invariant_chunk_merge_skipped", "attention_chunk_merge-inl.h",
             [("    if (!active_) return;\n    const std::int64_t chunk = a / kInvariantChunk;",
               "    return;\n    const std::int64_t chunk = a / kInvariantChunk;")],
             "invariant tile: one online softmax across the 1024-key chunks (no restart and merge; "
             "the split-key merge still merges them)"),
    Mutation("invariant_blocks_from_tile_start", "attention_call-inl.h",
             [("return std::min(c.key_block - (key_origin + j0) % c.key_block, j_end - j0);",
               "return std::min(c.key_block, j_end - j0);")],
             "invariant call: 64-key blocks counted from the tile's first key, not from key 0"),
    Mutation("invariant_split_chunk_from_geometry", "attention_split_keys-inl.h",
             [("std::int64_t chunk = c.invariant ? kInvariantChunk : geo.split_keys_chunk;",
               "std::int64_t chunk = geo.split_keys_chunk;")],
             "invariant split-key decode: chunks of split_keys_chunk keys, not kInvariantChunk"),
    Mutation("flex_partial_as_full", "flex_call.hpp",
             [("add(blocks.kv_num_blocks, blocks.kv_indices, bm->width, false);",
               "add(blocks.kv_num_blocks, blocks.kv_indices, bm->width, true);")],
             "flex block mask: a partial kv block is taken as full (its mask_mod is not evaluated)"),
    Mutation("flex_chunk_last_key_dropped", "flex_scores-inl.h",
             [("const std::int64_t cols = std::min(kChunkKeys, last - j0);",
               "const std::int64_t cols = std::min(kChunkKeys, last - j0) - 1;")],
             "flex: each chunk of a kv block ends one key early"),
    Mutation("flex_rescale_dropped", "flex_softmax-inl.h",
             [("for (std::int64_t e = 0; e < c.Dv; ++e) o[e] *= alpha;", "")],
             "flex online softmax: the running output is not rescaled by e^(m_old - m_new) when m moves"),
    Mutation("flex_lse_without_max", "flex_softmax-inl.h",
             [("l = m + std::log(l);", "l = std::log(l);")],
             "flex forward: lse = log l without the running max m"),
    Mutation("flex_gqa_v_head", "flex_softmax-inl.h",
             [("const float* v = c.v + (b * c.Hkv + h / c.G) * c.Sk * c.Dv;",
               "const float* v = c.v + (b * c.Hkv + h % c.Hkv) * c.Sk * c.Dv;")],
             "flex GQA: query head h reads the values of kv head h % Hkv instead of h / G"),
    Mutation("flex_d_score_dropped", "flex_backward.cpp",
             [("dt * dsc[e]", "dt")],
             "flex backward: ds = dt, the score_mod's derivative dt/ds dropped"),
    Mutation("flex_tensor_grad_index_off", "flex_backward.cpp",
             [("dst[off[e]] += s.dp[e] * dl[e];",
               "dst[off[e] > 0 ? off[e] - 1 : 0] += s.dp[e] * dl[e];")],
             "flex backward: a captured tensor's gradient lands one element early"),
    Mutation("flex_full_blocks_dropped", "flex_call.hpp",
             [("if (bm->has_full) add(", "if (false) add(")],
             "flex block mask: the full kv blocks are never visited (their keys hidden)"),
    Mutation("flex_tile_crosses_query_block", "flex_call.hpp",
             [("std::min({first + kTileRows, (qb + 1) * q_block, Sq})",
               "std::min({first + kTileRows, Sq})")],
             "flex: a query tile runs past its query block, its last rows under the block's kv blocks"),
    Mutation("flex_backward_gqa_kv_head", "flex_backward.cpp",
             [("const std::int64_t kv = b * c.Hkv + h / c.G;",
               "const std::int64_t kv = b * c.Hkv + h % c.Hkv;")],
             "flex backward GQA: dq, dk and dv of query head h use kv head h % Hkv instead of h / G"),
    Mutation("flex_native_blocks_trusted", "flex_native.cpp",
             [("if (f.block_mask && !blocks_agree(plan, blocks, band, doc)) return std::nullopt;", "")],
             "flex native form: a block mask that disagrees with the band is not looked at"),
    Mutation("flex_native_window_wide", "flex_native.cpp",
             [("a.window = o - band.lo;", "a.window = o - band.lo + 1;")],
             "flex native form: a band's sliding window one key wider"),
    Mutation("flex_native_softcap_constants", "flex_native.cpp",
             [("f.node(q.arg[1]).value == f.node(c).value", "true")],
             "flex native form: c1 * tanh(score / c2) taken as a softcap c1 whatever c2"),
    Mutation("flex_native_sign_unflipped", "flex_native.cpp",
             [("const ModOp r = s == 1 ? rel : flipped(rel);", "const ModOp r = rel;")],
             "flex native form: a comparison on q_idx - kv_idx read as one on kv_idx - q_idx"),
    Mutation("flex_native_alibi_any_offset", "flex_native.cpp",
             [("a.b == -a.a && a.a * a.c == shift;", "a.b == -a.a;")],
             "flex native form: score - m[h]*abs(q_idx - kv_idx + c) taken as ALiBi whatever c"),
    Mutation("flex_native_alibi_band_unchecked", "flex_native.cpp",
             [("sign * a.c == -shift && band.hi <= shift;", "sign * a.c == -shift;")],
             "flex native form: torch's ALiBi taken as ALiBi where keys after the query are visible"),
    Mutation("flex_native_documents_not_runs", "flex_native.cpp",
             [("if (!runs(*doc)) return std::nullopt;", "")],
             "flex native form: a document tensor that is not in runs packed as if it were"),
    Mutation("flex_native_full_block_across_documents", "flex_native.cpp",
             [("hi > band.hi || !one_doc)", "hi > band.hi)")],
             "flex native form: a block marked full across two documents trusted"),
    Mutation("flex_native_stored_backward_rounds_out", "flex_native.cpp",
             [("return native_backward_widened(plan, in, dout, grads, options);", "(void)0;")],
             "flex native form at bf16/f16: the native stored-type backward (its output rounded to T)"),
    Mutation("flex_nonfinite_row_not_poisoned", "flex_softmax-inl.h",
             [("poisoned |= std::isnan(t[j]) || t[j] == -kNegInf;", "poisoned |= false;")],
             "flex forward: a NaN or +inf t left to the running max and Exp, not made the row's NaN"),
    Mutation("flex_log_unguarded", "flex_mod_tile-inl.h",
             [("RealUnary(id, a, [](DF d, VF x) { return LogOf(d, x); });",
               "RealUnary(id, a, [](DF d, VF x) { return hn::Log(d, x); });")],
             "flex mods: log by Highway's Log alone (not NaN below 0, not -inf at 0)"),
    Mutation("flex_exp_unguarded", "flex_mod_tile-inl.h",
             [("RealUnary(id, a, [](DF d, VF x) { return ExpOf(d, x); });",
               "RealUnary(id, a, [](DF d, VF x) { return hn::Exp(d, x); });")],
             "flex mods: exp by Highway's Exp alone (0 at NaN)"),
    Mutation("flex_native_documents_entry_zero", "flex_native.cpp",
             [("forward(c, c.inputs(b), entry(out, b, p.o.extent)",
               "forward(c, c.inputs(0), entry(out, b, p.o.extent)")],
             "flex document form: every batch entry's packed call reads entry 0's q, k, v"),
    Mutation("flex_native_documents_grads_entry_zero", "flex_native.cpp",
             [("entry(grads.dk, b, p.dk.extent)", "entry(grads.dk, 0, p.dk.extent)")],
             "flex document form backward: every batch entry's dk lands in entry 0's"),
]


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def sync_copy(src_root: Path, dst_root: Path):
    """Copies the checkout's files (tracked and untracked, not ignored) into
    dst_root, writing only those that differ so the build stays incremental."""
    files = subprocess.run(["git", "-C", str(src_root), "ls-files", "-co", "--exclude-standard", "-z"],
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src, dst = src_root / rel, dst_root / rel
        if not src.is_file():
            continue
        data = src.read_bytes()
        if dst.is_file() and dst.read_bytes() == data:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
        shutil.copymode(src, dst)


def apply(m: Mutation, text: str) -> str:
    for fragment, replacement in m.edits:
        count = text.count(fragment)
        if count != 1:
            print(f"mutate.py: {m.name}: the fragment {fragment!r} occurs {count} times in "
                  f"{m.root}/{m.file} (must be exactly once): update the mutation list",
                  file=sys.stderr)
            sys.exit(2)
        text = text.replace(fragment, replacement)
    return text


def build(build_dir: Path, jobs: int):
    return subprocess.run(["cmake", "--build", str(build_dir), "--target", "props_suite", f"-j{jobs}"],
                          capture_output=True, text=True)


def run_props(build_dir: Path, args):
    env = dict(os.environ, OMP_WAIT_POLICY="passive", RC_PARAMS="noshrink=1",
               TANDEM_PROPS_SCALE=str(args.scale))
    cmd = [str(build_dir / "props" / "props_suite"), f"--gtest_filter={args.filter}", "--gtest_brief=1"]
    if args.fail_fast:
        cmd.append("--gtest_fail_fast")
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        out, code = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, code = (e.stdout or b"").decode(errors="replace"), None
    return out, code, time.monotonic() - t0


def verdict(out: str, code):
    """(status, the failed tests <subject>.<property> in order, or why)."""
    if code is None:
        return "killed", ["timeout"]
    if code == 0:
        return "survived", []
    failed = []
    for test in re.findall(r"\[  FAILED  \] (\S+)", out):
        test = test.rstrip(",")
        if "." in test and test not in failed:
            failed.append(test)
    return "killed", failed or [f"crash (exit {code})"]


def properties_of(failed):
    """The properties among the failed tests, in order, and the subjects' geometries."""
    props, geos = [], []
    for test in failed:
        subject, _, prop = test.partition(".")
        if prop and prop not in props:
            props.append(prop)
        base = subject.removesuffix("_invariant")
        geo = "small_decode" if base.endswith("_small_decode") else \
            "small" if base.endswith("_small") else "default"
        if base != subject:
            geo += " invariant"
        if prop and geo not in geos:
            geos.append(geo)
    return props or failed, geos


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=str(ROOT / "build-mutate"), help="copy and build dir (default build-mutate)")
    ap.add_argument("--only", default="", help="comma-separated mutation names")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--all-targets", action="store_true", help="compile every Highway target, as shipped")
    ap.add_argument("--avx3", action="store_true",
                    help="compile the one target AVX3 (-march=skylake-avx512): the mutations "
                         "marked avx3, on a CPU with AVX512-BF16")
    ap.add_argument("--filter", default=None,
                    help="gtest filter of the props run (default optimized_*; with "
                         "--reference-only reference.*:broken_none.*)")
    ap.add_argument("--reference-only", action="store_true",
                    help="build without the optimized backend, at -O0, and run the reference "
                         "and broken_none subjects: a plan-layer mutation of include/tandem "
                         "reaches every backend and rebuilds every file that includes it, "
                         "so compile time is what counts")
    ap.add_argument("--scale", type=float, default=1.0, help="TANDEM_PROPS_SCALE of the props run")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per props run")
    ap.add_argument("--fail-fast", action="store_true", help="stop each props run at its first failure")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    if args.filter is None:
        args.filter = "reference.*:broken_none.*" if args.reference_only else "optimized_*"

    names = [m.name for m in MUTATIONS]
    assert len(set(names)) == len(names), "mutation names must be unique"
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:32} {m.file:30} {m.description}")
        return 0
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - set(names)
    if unknown:
        sys.exit(f"mutate.py: no mutation named {', '.join(sorted(unknown))}")

    # Every edit applies to the checkout as it is, before anything is built.
    for m in MUTATIONS:
        apply(m, (ROOT / m.root / m.file).read_text())

    work = Path(args.work).resolve()
    src, bld = work / "src", work / "build"
    sync_copy(ROOT, src)
    static = "-UHWY_COMPILE_ALL_ATTAINABLE -DHWY_COMPILE_ONLY_STATIC"
    flags = "" if args.all_targets else f"{static} -march=skylake-avx512" if args.avx3 else \
        f"{static} -march=haswell -maes"
    if not (args.all_targets or args.avx3):
        skipped = [m.name for m in chosen if m.avx3]
        if skipped:
            print(f"skipped (AVX3 kernels, run with --avx3): {', '.join(skipped)}", flush=True)
        chosen = [m for m in chosen if not m.avx3]
    run(["cmake", "-S", str(src), "-B", str(bld), "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_CXX_FLAGS={flags}",
         "-DTANDEM_BUILD_BENCH=OFF", "-DTANDEM_BUILD_TOOLS=OFF", "-DTANDEM_BUILD_DOCS=OFF",
         "-DTANDEM_PYTHON_VENV=", f"-DTANDEM_WITH_OPTIMIZED={'OFF' if args.reference_only else 'ON'}",
         f"-DCMAKE_CXX_FLAGS_RELEASE={'-O0' if args.reference_only else '-O3'} -DNDEBUG"],
        stdout=subprocess.DEVNULL)
    b = build(bld, args.jobs)
    if b.returncode != 0:
        sys.exit("mutate.py: the unmutated copy does not build:\n" + b.stdout[-4000:] + b.stderr[-4000:])
    out, code, secs = run_props(bld, args)
    if code != 0:
        sys.exit(f"mutate.py: the unmutated suite fails ({verdict(out, code)[1]}):\n{out[-4000:]}")
    print(f"baseline: the properties of {args.filter} pass ({secs:.0f} s)", flush=True)

    rows, survivors = [], []
    for m in chosen:
        path = src / m.root / m.file
        original = path.read_text()
        path.write_text(apply(m, original))
        t0 = time.monotonic()
        try:
            b = build(bld, args.jobs)
            build_s = time.monotonic() - t0
            if b.returncode != 0:
                sys.exit(f"mutate.py: {m.name} does not compile:\n{b.stdout[-3000:]}{b.stderr[-3000:]}")
            out, code, secs = run_props(bld, args)
        finally:
            path.write_text(original)
        status, failed = verdict(out, code)
        if status == "survived":
            survivors.append(m.name)
        props, geos = properties_of(failed)
        rows.append((m, status, failed, props, geos, secs))
        print(f"{m.name}: {status}, {len(failed)} tests failed, first {failed[:1]} "
              f"(build {build_s:.0f} s, props {secs:.0f} s)", flush=True)

    print("\n| mutation | file | planted bug | failed tests | properties that fail (in run order) | geometries | props time |")
    print("|---|---|---|---|---|---|---|")
    for m, status, failed, props, geos, secs in rows:
        count = "survived" if status == "survived" else str(len(failed))
        print(f"| `{m.name}` | {m.file} | {m.description} | {count} | "
              f"{', '.join(f'`{p}`' for p in props)} | {', '.join(geos)} | {secs:.0f} s |")
    if survivors:
        print(f"\nsurvived: {', '.join(survivors)}")
        return 1
    print(f"\nall {len(rows)} mutations killed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
