// SPDX-License-Identifier: Apache-2.0
// The AVX512-BF16 dot products of the bf16 forward (SPEC §10.2, §10.5):
// raw intrinsics in their own translation unit (bf16_dot.cpp, compiled with
// the instruction's target attributes), since Highway 1.0.3 has none, and
// whether this CPU may run them. Called only from the AVX3 copies of the
// tiles (attention_forward_bf16_tile-inl.h), and only when Enabled().
//
// Operands are bf16 bit patterns in "pair-interleaved" layouts: one 32-bit
// word holds two bf16 values that vdpbf16ps multiplies and adds into one
// float lane, the lower half first in memory.
#pragma once

#include <cstdint>

namespace tandem::optimized::bf16dot {

/// Whether this CPU has AVX512-BF16 (with AVX512 F/BW/VL) and the path is not
/// switched off (tandem::optimized::enable_bf16_dot).
bool Enabled();
/// Whether this CPU has AVX512-BF16 (with AVX512 F/BW/VL).
bool Supported();
/// Switches the path on (the default where Supported()) or off.
void SetEnabled(bool on);

/// Float lanes of one vdpbf16ps (one 512-bit vector of rows).
inline constexpr std::int64_t kLanes = 16;

/// St[jj·R + r] = factor·Σ_p ⟨Qb[p][r], Kb[jj][p]⟩ for keys jj < nk and the
/// rows r in [lo, hi) (whole vectors of kLanes), where a pair p covers
/// d = 2p, 2p + 1 and each is one word:
///   Kb[jj·pairs + p]  the pair (k_jj[2p], k_jj[2p+1]);
///   Qb[p·qs + r]      the pair (q_r[2p], q_r[2p+1]) (qs rows per line).
/// The sum over p runs in order, each pair added by one vdpbf16ps (SPEC
/// §10.5: products exact, sums rounded to float, denormals flushed).
void Scores(const std::uint32_t* Kb, std::int64_t nk, std::int64_t pairs, const std::uint32_t* Qb,
            std::int64_t qs, std::int64_t lo, std::int64_t hi, float factor, float* St,
            std::int64_t R);

/// Ot[dv·R + r] += Σ_q ⟨Pb[q][r], Vb[q][dv]⟩ for dv < Dv and the rows r in
/// [0, width) (whole vectors), where a pair q covers keys 2q, 2q + 1 and
/// each is one word:
///   Pb[q·ps + r]   the pair (p_r of key 2q, p_r of key 2q + 1) (ps rows per line);
///   Vb[q·Dv + dv]  the pair (v_2q[dv], v_2q+1[dv]).
/// Each output's sum continues from Ot in key-pair order.
void Values(const std::uint32_t* Pb, std::int64_t ps, std::int64_t pairs, const std::uint32_t* Vb,
            std::int64_t Dv, std::int64_t width, float* Ot, std::int64_t R);

}  // namespace tandem::optimized::bf16dot
