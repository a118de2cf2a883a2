// SPDX-License-Identifier: Apache-2.0
// The reference attention block: projections as plain loops in double, then
// the reference RoPE and attention at T = double, then the output projection.
#include "tandem/reference/attention_block.hpp"

#include <cstdint>
#include <vector>

#include "tandem/reference/attention.hpp"
#include "tandem/reference/rope.hpp"

namespace tandem::reference {

void attention_block(const AttentionBlockPlan& plan, const AttentionBlockInputs& in,
                     std::span<float> out) {
  check_views(plan, in, out.size());
  const std::int64_t B = plan.B, S = plan.S, E = plan.E;

  // qkv[b,s,o] = b_qkv[o] + Σ_e x[b,s,e]·w_qkv[o,e]   for o < 3E (rows q, k, v of w_qkv)
  std::vector<double> qkv(static_cast<std::size_t>(B * S * 3 * E));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t s = 0; s < S; ++s) {
      for (std::int64_t o = 0; o < 3 * E; ++o) {
        double acc = plan.qkv_bias ? static_cast<double>(in.b_qkv[o]) : 0.0;
        for (std::int64_t e = 0; e < E; ++e) {
          acc += static_cast<double>(in.x[(b * S + s) * E + e]) *
                 static_cast<double>(in.w_qkv[o * E + e]);
        }
        qkv[(b * S + s) * 3 * E + o] = acc;
      }
    }
  }
  const std::span<const double> qkv_view(qkv);
  // q, k and v start at columns 0, E and 2E of each qkv row (row stride 3E).
  std::span<const double> q = qkv_view.subspan(0);
  std::span<const double> k = qkv_view.subspan(static_cast<std::size_t>(E));
  const std::span<const double> v = qkv_view.subspan(static_cast<std::size_t>(2 * E));

  // q ← rope(q), k ← rope(k): NeoX, n_rot = D, position rows; outputs
  // contiguous [B, S, E] (the attention plan reads them with row stride E).
  std::vector<double> q_rot, k_rot;
  if (plan.has_rope) {
    const std::vector<double> cos(in.cos.begin(), in.cos.end());
    const std::vector<double> sin(in.sin.begin(), in.sin.end());
    const RopeTables<double> tables{cos, sin};
    q_rot.resize(static_cast<std::size_t>(plan.rope.out_size()));
    k_rot.resize(static_cast<std::size_t>(plan.rope.out_size()));
    rope_forward<double>(plan.rope, q, tables, std::span<double>(q_rot));
    rope_forward<double>(plan.rope, k, tables, std::span<double>(k_rot));
    q = q_rot;
    k = k_rot;
  }

  // a = attention(q, k, v, keep), a [B, S, H, D] = [B, S, E]
  std::vector<double> a(static_cast<std::size_t>(B * S * E));
  const AttentionInputs<double> att_in{q, k, v, in.keep};
  attention_forward<double>(plan.attention, att_in, std::span<double>(a));

  // out[b,s,o] = b_out[o] + Σ_e a[b,s,e]·w_out[o,e]   for o < E
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t s = 0; s < S; ++s) {
      for (std::int64_t o = 0; o < E; ++o) {
        double acc = plan.out_bias ? static_cast<double>(in.b_out[o]) : 0.0;
        for (std::int64_t e = 0; e < E; ++e) {
          acc += a[(b * S + s) * E + e] * static_cast<double>(in.w_out[o * E + e]);
        }
        out[(b * S + s) * E + o] = static_cast<float>(acc);
      }
    }
  }
}

}  // namespace tandem::reference
