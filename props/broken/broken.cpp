// SPDX-License-Identifier: Apache-2.0
// The broken fixtures: one small scalar kernel per op, correct except for the
// planted Bug (a switch at the one line each bug lives on). Sums run in
// double, so Bug::none is as accurate as the reference.
#include "broken/broken.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/reference/kernels.hpp"

namespace tandem::props::broken {
namespace {

using i64 = std::int64_t;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double exp_of(double x, Bug bug) {
  const double e = std::exp(x);
  if (bug != Bug::coarse_exp) return e;
  // keep 12 of float's 23 mantissa bits
  float f = static_cast<float>(e);
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits &= ~((1u << 11) - 1u);
  std::memcpy(&f, &bits, sizeof bits);
  return f;
}

// ---------------------------------------------------------------- attention

struct Attention {
  const AttentionPlan& p;
  const AttentionInputs<float>& in;
  Bug bug;
  int threads;

  i64 kv_head(i64 h) const { return bug == Bug::gqa_mod ? h % p.Hkv : p.kv_head(h); }

  /// Sequence n (AttentionPlan::sequence), with the varlen bugs planted.
  AttentionSeq seq(i64 n) const {
    AttentionSeq s = p.sequence(in, n);
    if (p.varlen() && bug == Bug::varlen_ignores_seqused) {
      s.Sk = in.cu_seqlens_k[n + 1] - in.cu_seqlens_k[n];
    }
    if (p.varlen() && bug == Bug::varlen_reads_across_boundary && s.k_start + s.Sk < p.Sk) {
      ++s.Sk;  // one key of the next slot
    }
    return s;
  }
  /// Where key j of s lives, with the paged bugs planted.
  KeyRow key_row(const AttentionSeq& s, i64 j) const {
    if (p.paged() && bug == Bug::paged_table_ignored) {
      return {(s.b * p.max_blocks + j / p.block_size) % p.num_blocks, j % p.block_size};
    }
    KeyRow r = s.key_row(j);
    if (p.paged() && bug == Bug::paged_slot_off_by_one) r.seq = (r.seq + 1) % p.block_size;
    return r;
  }
  i64 k_at(const KeyRow& r, i64 g) const {
    const i64 base = bug == Bug::attn_batch_offset_units
                         ? r.batch * p.k.batch / static_cast<i64>(sizeof(float))
                         : r.batch * p.k.batch;
    return base + r.seq * p.k.seq + g * p.k.head;
  }
  i64 v_at(const KeyRow& r, i64 g) const {
    const i64 base = bug == Bug::attn_batch_offset_units
                         ? r.batch * p.v.batch / static_cast<i64>(sizeof(float))
                         : r.batch * p.v.batch;
    const i64 seq =
        bug == Bug::v_row_stride_ignored && p.layout == Layout::bshd ? p.Hkv * p.Dv : p.v.seq;
    return base + r.seq * seq + g * p.v.head;
  }

  bool visible(const AttentionSeq& s, i64 h, i64 i, i64 j) const {
    if (bug == Bug::key_tail_dropped && s.Sk > 8 && j >= (s.Sk / 8) * 8) return false;
    i64 a = (bug == Bug::causal_offset_dropped ? 0 : s.q_offset()) + i;
    if (p.varlen() && bug == Bug::varlen_global_alignment) {
      // one alignment over the packed totals, in packed coordinates
      a = p.q_offset() + s.q_row(i) - s.k_start;
    }
    switch (p.mask) {
      case MaskKind::none:
        return true;
      case MaskKind::causal:
        return j <= a;
      case MaskKind::sliding_window:
        return (bug == Bug::window_off_by_one ? a - p.window < j : a - p.window <= j) && j <= a;
      case MaskKind::key_padding:
        return in.mask[(bug == Bug::keep_row_batch0 ? 0 : s.b * p.Sk) + j] != 0.0f;
      case MaskKind::bias:
        return in.mask[p.mask_row(s.b, h, i) + j] != -std::numeric_limits<float>::infinity();
    }
    return false;
  }

  /// ALiBi's penalty m·|i + Sk − Sq − j|, with the ALiBi bugs planted.
  double alibi(const AttentionSeq& s, i64 h, i64 i, i64 j) const {
    const double m = in.alibi_slopes[p.slope_at(s.n, h)];
    const i64 shift = bug == Bug::alibi_shift_flipped ? -s.alibi_shift() : s.alibi_shift();
    const i64 dist = i + shift - j;
    return m * double(bug == Bug::alibi_without_abs ? dist : std::abs(dist));
  }

  /// <q_i, k_j> of query i of sq (head h) and key row kr (kv head g): in
  /// double, or with Bug::decode_dot_reversed in float along d, backwards
  /// in a decode-shaped call (Sq·G <= 4 in the sequence), forwards otherwise.
  double dot_qk(const AttentionSeq& sq, i64 h, i64 i, const KeyRow& kr, i64 g) const {
    const float* q = &in.q[p.q.at(sq.b, sq.q_row(i), h)];
    const float* k = &in.k[k_at(kr, g)];
    if (bug == Bug::decode_dot_reversed) {
      const bool decode = sq.Sq * p.group() <= 4;
      float acc = 0.0f;
      for (i64 e = 0; e < p.D; ++e) {
        const i64 d = decode ? p.D - 1 - e : e;
        acc += q[d] * k[d];
      }
      return acc;
    }
    double dot = 0.0;
    for (i64 d = 0; d < p.D; ++d) dot += double(q[d]) * k[d];
    return dot;
  }

  /// Keys per chunk of a row's float sums under Bug::key_chunks_by_sequences:
  /// Sk split into as many chunks as the call has sequences.
  i64 sequence_chunk(i64 Sk) const {
    return std::max<i64>(1, (Sk + p.sequences() - 1) / p.sequences());
  }

  struct Row {
    std::vector<char> vis;
    std::vector<KeyRow> key;
    std::vector<double> x, s, p;  // raw score scale·<q,k>, final score, probability
    double p_sink = 0.0;
    double lse = -std::numeric_limits<double>::infinity();  // m + log l
    i64 n = 0;
  };

  Row row(const AttentionSeq& sq, i64 h, i64 i) const {
    Row r;
    const i64 Sk = sq.Sk;
    r.vis.assign(Sk, 0);
    r.key.resize(Sk);
    r.x.assign(Sk, 0.0);
    r.p.assign(Sk, 0.0);
    std::vector<double> s(Sk, 0.0);
    const i64 g = kv_head(h);
    double m = p.sinks ? double(in.sinks[h]) : -std::numeric_limits<double>::infinity();
    for (i64 j = 0; j < Sk; ++j) {
      if (!visible(sq, h, i, j)) continue;
      r.vis[j] = 1;
      r.key[j] = key_row(sq, j);
      ++r.n;
      r.x[j] = p.scale * dot_qk(sq, h, i, r.key[j], g);
      double sj = r.x[j];
      if (p.softcap > 0) {
        sj = bug == Bug::softcap_tanh_unscaled ? p.softcap * std::tanh(sj)
                                               : p.softcap * std::tanh(sj / p.softcap);
      }
      if (p.alibi != AlibiKind::none) sj -= alibi(sq, h, i, j);
      if (p.mask == MaskKind::bias) sj += in.mask[p.mask_row(sq.b, h, i) + j];
      s[j] = sj;
      m = std::max(m, sj);
    }
    if (r.n == 0 && !p.sinks) {
      r.s = std::move(s);
      return r;
    }
    double l = p.sinks ? exp_of(in.sinks[h] - m, bug) : 0.0;
    for (i64 j = 0; j < Sk; ++j) {
      if (r.vis[j]) l += exp_of(s[j] - m, bug);
    }
    for (i64 j = 0; j < Sk; ++j) {
      if (r.vis[j]) r.p[j] = exp_of(s[j] - m, bug) / l;
    }
    if (p.sinks) r.p_sink = exp_of(in.sinks[h] - m, bug) / l;
    r.lse = bug == Bug::saved_lse_without_log ? m : m + std::log(l);
    r.s = std::move(s);
    return r;
  }

  /// The row rebuilt from a saved lse: p_j = exp(s_j − lse), p_sink = exp(sink − lse).
  Row saved_row(const AttentionSaved<float>& saved, const AttentionSeq& sq, i64 h, i64 i) const {
    Row r = row(sq, h, i);
    const double lse = saved.lse[p.lse_at(sq.b, h, sq.q_row(i))];
    for (i64 j = 0; j < sq.Sk; ++j) {
      if (r.vis[j]) r.p[j] = exp_of(r.s[j] - lse, bug);
    }
    if (p.sinks) r.p_sink = exp_of(in.sinks[h] - lse, bug);
    return r;
  }

  void forward(std::span<float> out, std::span<float> lse = {}) const {
    for (i64 n = 0; n < p.sequences(); ++n) {
      const AttentionSeq sq = seq(n);
      for (i64 h = 0; h < p.H; ++h) {
        const i64 g = kv_head(h);
        for (i64 i = 0; i < sq.Sq; ++i) {
          const Row r = row(sq, h, i);
          if (!lse.empty()) lse[p.lse_at(sq.b, h, sq.q_row(i))] = static_cast<float>(r.lse);
          for (i64 d = 0; d < p.Dv; ++d) {
            // Σ_j p_j v_jd as float partial sums over consecutive chunks of keys
            const auto chunked_sum = [&](i64 chunk) {
              float sum = 0.0f;
              for (i64 j0 = 0; j0 < sq.Sk; j0 += chunk) {
                float part = 0.0f;
                for (i64 j = j0; j < std::min(sq.Sk, j0 + chunk); ++j) {
                  if (r.vis[j]) part += float(r.p[j]) * in.v[v_at(r.key[j], g) + d];
                }
                sum += part;
              }
              return sum;
            };
            float y;
            if (r.n == 0) {
              y = bug == Bug::masked_row_nan ? float(kNaN) : 0.0f;
            } else if (bug == Bug::key_chunks_by_sequences) {
              // float partial sums over chunks of keys, as many as the call's sequences
              y = chunked_sum(sequence_chunk(sq.Sk));
            } else if (bug == Bug::blocks_ignore_key_origin) {
              // float partial sums over 64-key blocks counted from the call's key 0, not
              // from the sequence's position key_origin (SPEC §12.2)
              y = chunked_sum(64);
            } else if (bug == Bug::thread_dependent_sum) {
              // `threads` partial sums in float, one per contiguous chunk of keys
              y = chunked_sum((sq.Sk + threads - 1) / threads);
            } else {
              double acc = 0.0;
              for (i64 j = 0; j < sq.Sk; ++j) {
                if (r.vis[j]) {
                  acc += r.p[j] * in.v[v_at(r.key[j], g) + d];
                } else if (bug == Bug::masked_times_value) {
                  acc += r.p[j] * in.v[v_at(key_row(sq, j), g) + d];
                }
              }
              if (bug == Bug::sink_value_first_key && sq.Sk > 0) {
                acc += r.p_sink * in.v[v_at(key_row(sq, 0), g) + d];
              }
              y = float(acc);
            }
            out[p.o.at(sq.b, sq.q_row(i), h) + d] = y;
          }
        }
      }
    }
    if (bug == Bug::write_past_output) out.data()[out.size()] = 0.0f;
  }

  // dq, dk, dv (indexed by plan.dq / dk / dv), dsinks [H] and dbias
  // [Bb, Hb, Sq, Sk], in double. With `saved`, p from the saved lse and delta
  // from the saved out.
  struct Grads {
    std::vector<double> dq, dk, dv, dsinks, dbias;
  };
  Grads backward(std::span<const float> dout, bool fused,
                 const AttentionSaved<float>* saved = nullptr) const {
    Grads gr;
    gr.dq.assign(p.dq.extent, 0.0);
    gr.dk.assign(p.dk.extent, 0.0);
    gr.dv.assign(p.dv.extent, 0.0);
    gr.dsinks.assign(p.sinks ? p.H : 0, 0.0);
    gr.dbias.assign(p.mask == MaskKind::bias ? p.mask_size() : 0, 0.0);
    // dsink terms per head in row order, summed at the end
    std::vector<std::vector<double>> sink_terms(gr.dsinks.size());
    const double sc = bug == Bug::scale_ignored_backward ? 1.0 : p.scale;
    for (i64 n = 0; n < p.sequences(); ++n) {
      const AttentionSeq sq = seq(n);
      for (i64 h = 0; h < p.H; ++h) {
        const i64 g = kv_head(h);
        for (i64 i = 0; i < sq.Sq; ++i) {
          const Row r = saved != nullptr ? saved_row(*saved, sq, h, i) : row(sq, h, i);
          const i64 qi = sq.q_row(i);
          if (r.n == 0) {
            if (bug == Bug::masked_row_nan) {
              for (i64 d = 0; d < p.D; ++d) gr.dq[p.dq.at(sq.b, qi, h) + d] = kNaN;
            }
            continue;
          }
          const i64 oo = p.o.at(sq.b, qi, h);
          double delta = 0.0;
          for (i64 d = 0; d < p.Dv; ++d) {
            double o = 0.0;
            for (i64 j = 0; saved == nullptr && j < sq.Sk; ++j) {
              if (r.vis[j]) o += r.p[j] * in.v[v_at(r.key[j], g) + d];
            }
            if (saved != nullptr) o = saved->out[oo + d];
            delta += double(dout[oo + d]) * o;
          }
          if (p.sinks) {
            sink_terms[h].push_back((bug == Bug::dsink_sign_flipped ? 1.0 : -1.0) * r.p_sink *
                                    delta);
          }
          // Bug::key_chunks_by_sequences: dq in float, one partial sum per key chunk
          std::vector<float> dq_part(bug == Bug::key_chunks_by_sequences ? p.D : 0, 0.0f);
          std::vector<float> dq_total(dq_part);
          const i64 dq_chunk = sequence_chunk(sq.Sk);
          for (i64 j = 0; j < sq.Sk; ++j) {
            if (!dq_part.empty() && j > 0 && j % dq_chunk == 0) {
              for (i64 d = 0; d < p.D; ++d) dq_total[d] += std::exchange(dq_part[d], 0.0f);
            }
            if (!r.vis[j]) continue;
            double dp = 0.0;
            for (i64 d = 0; d < p.Dv; ++d) dp += double(dout[oo + d]) * in.v[v_at(r.key[j], g) + d];
            double ds = r.p[j] * (dp - delta);
            const double ds_bias = bug == Bug::dbias_is_p ? r.p[j] : ds;  // d/dbias_ij
            if (p.softcap > 0 && !(fused && bug == Bug::softcap_missing_backward)) {
              const double t = std::tanh(r.x[j] / p.softcap);
              ds *= 1.0 - t * t;
            }
            if (!gr.dbias.empty()) {
              double& db = gr.dbias[p.mask_row(sq.b, h, i) + j];
              const double term = bug == Bug::dbias_capped ? ds : ds_bias;
              db = bug == Bug::dbias_broadcast_unsummed ? term : db + term;
              if (bug == Bug::dbias_sum_thread_dependent && threads > 1) db = float(db);
            }
            const KeyRow& kr = r.key[j];
            for (i64 d = 0; d < p.D; ++d) {
              if (!dq_part.empty()) dq_part[d] += float(sc * ds * in.k[k_at(kr, g) + d]);
              if (dq_part.empty())
                gr.dq[p.dq.at(sq.b, qi, h) + d] += sc * ds * in.k[k_at(kr, g) + d];
              gr.dk[p.dk.at(kr.batch, kr.seq, g) + d] += sc * ds * in.q[p.q.at(sq.b, qi, h) + d];
            }
            for (i64 d = 0; d < p.Dv; ++d) {
              gr.dv[p.dv.at(kr.batch, kr.seq, g) + d] += r.p[j] * dout[oo + d];
            }
          }
          for (std::size_t d = 0; d < dq_part.size(); ++d) {
            gr.dq[p.dq.at(sq.b, qi, h) + static_cast<i64>(d)] = dq_total[d] + dq_part[d];
          }
        }
      }
    }
    for (std::size_t h = 0; h < sink_terms.size(); ++h) {
      if (bug == Bug::sink_sum_thread_dependent) {
        // `threads` partial sums in float, one per contiguous chunk of rows
        const std::size_t rows = sink_terms[h].size();
        const std::size_t chunk = (rows + threads - 1) / static_cast<std::size_t>(threads);
        float total = 0.0f;
        for (std::size_t r0 = 0; r0 < rows; r0 += std::max<std::size_t>(chunk, 1)) {
          float part = 0.0f;
          for (std::size_t r = r0; r < std::min(rows, r0 + chunk); ++r) {
            part += static_cast<float>(sink_terms[h][r]);
          }
          total += part;
        }
        gr.dsinks[h] = total;
      } else {
        for (double t : sink_terms[h]) gr.dsinks[h] += t;
      }
    }
    return gr;
  }
};

void copy_out(const std::vector<double>& src, std::span<float> dst) {
  if (dst.empty()) return;  // not asked for
  for (std::size_t e = 0; e < src.size(); ++e) dst[e] = static_cast<float>(src[e]);
}

// --------------------------------------------------------------------- rope

/// The table row token (b, s) reads, with the row bugs planted.
i64 rope_row(const RopePlan& p, const Indices& positions, i64 b, i64 s, bool backward, Bug bug) {
  switch (p.rows) {
    case TableRows::token:
      if (backward && bug == Bug::rope_backward_other_row) return s;
      return bug == Bug::token_rows_transposed ? s * p.B + b : b * p.S + s;
    case TableRows::position_ids: {
      const i64 t = bug == Bug::rope_positions_per_batch_row ? b * p.S : b * p.S + s;
      const i64 pos = positions[static_cast<std::size_t>(t)];
      if (bug == Bug::rope_positions_checked_late) {
        require_entry(
            pos >= 0 && pos < p.R, "positions", t, std::to_string(pos),
            "must be in [0, max_position = " + std::to_string(p.R) + ") (the rows of cos and sin)");
      }
      return pos;
    }
    case TableRows::position:
      return bug == Bug::rope_rank4_as_bshd ? (b * p.S + s) / p.B : s;
  }
  return s;
}

/// Every view of a RoPE call fits its plan (positions only by size with
/// Bug::rope_positions_checked_late, which checks their values while writing).
void check_rope(const RopePlan& p, std::span<const float> src, const RopeTables<float>& t,
                std::size_t dst, bool backward, Bug bug) {
  const char* src_name = backward ? "dy" : "x";
  const char* dst_name = backward ? "dx" : "out";
  if (bug != Bug::rope_positions_checked_late) {
    check_views(p, src, t, dst, src_name, dst_name);
    return;
  }
  require_extent(src.size(), p.src_extent(), src_name);
  require_size(t.cos.size(), p.R * p.T, "cos");
  require_size(t.sin.size(), p.R * p.T, "sin");
  require_size(t.positions.size(), p.rows == TableRows::position_ids ? p.B * p.S : 0, "positions");
  require_size(dst, p.out_size(), dst_name);
}

/// RoPE of one tensor. `q_heads` > 0: this is k of a q-and-k call whose q has q_heads heads.
void rope(const RopePlan& p, std::span<const float> src, const RopeTables<float>& t,
          std::span<float> dst, bool backward, Bug bug, i64 q_heads = 0) {
  const i64 m = p.n_rot / 2, H = p.W / p.D;
  const i64 T = bug == Bug::rope_table_stride_half_nrot ? m : p.T;
  // Where head h of token (b, s) is in the source and the output.
  const auto at = [&](const Strides& st, i64 row_stride, i64 b, i64 s, i64 h) {
    if (bug == Bug::rope_bhsd_as_bshd && p.layout == RopeLayout::bhsd) {
      return (b * p.S + s) * p.W + h * p.D;
    }
    if (bug == Bug::rope_src_stride_ignored && p.layout != RopeLayout::bhsd) {
      return (b * p.S + s) * row_stride + h * p.D;
    }
    return st.at(b, s, h);
  };
  for (i64 b = 0; b < p.B; ++b) {
    for (i64 s = 0; s < p.S; ++s) {
      for (i64 hd = 0; hd < H; ++hd) {
        i64 row = rope_row(p, t.positions, b, s, backward, bug);
        if (bug == Bug::rope_qk_k_rows_by_q_heads && q_heads > 0) {
          // k's (token, head) pairs counted off with q's head count (within the tokens)
          const i64 tk = std::min(((b * p.S + s) * H + hd) / q_heads, p.B * p.S - 1);
          row = rope_row(p, t.positions, tk / p.S, tk % p.S, backward, bug);
        }
        const i64 so = at(p.src, p.W, b, s, hd), dofs = at(p.out, p.W, b, s, hd);
        for (i64 d = 0; d < p.D; ++d) dst[dofs + d] = src[so + d];
        for (i64 i = 0; i < m; ++i) {
          const double c = t.cos[row * T + i];
          double sn = t.sin[row * T + i];
          if (backward) sn = -sn;
          if (p.style == RopeStyle::gptj && bug == Bug::gptj_angle_negated) sn = -sn;
          const i64 i0 = p.style == RopeStyle::neox ? i : 2 * i;
          const i64 i1 = p.style == RopeStyle::neox ? i + m : 2 * i + 1;
          const double x0 = src[so + i0], x1 = src[so + i1];
          double y1 = x1 * c + x0 * sn;
          if (p.style == RopeStyle::neox && bug == Bug::rope_sin_sign && !backward) {
            y1 = x1 * c - x0 * sn;
          }
          dst[dofs + i0] = static_cast<float>(x0 * c - x1 * sn);
          dst[dofs + i1] = static_cast<float>(y1);
        }
      }
    }
  }
}

/// RoPE of q and k with the same tables: both checked, then q, then k.
void rope_qk(const RopeQkPlan& p, std::span<const float> q, std::span<const float> k,
             const RopeTables<float>& t, std::span<float> q_dst, std::span<float> k_dst,
             bool backward, Bug bug) {
  const RopeQkNames& names = backward ? kRopeQkBackward : kRopeQkForward;
  check_rope(p.q, q, t, q_dst.size(), backward, bug);
  require_extent(k.size(), p.k.src_extent(), names.k);
  require_size(k_dst.size(), p.k.out_size(), names.k_out);
  rope(p.q, q, t, q_dst, backward, bug);
  rope(p.k, k, t, k_dst, backward, bug, p.q.W / p.q.D);
}

void axial(const AxialRopePlan& p, std::span<const float> src, std::span<float> dst, bool backward,
           Bug bug) {
  check_views(p, src, dst.size(), backward ? "dy" : "x", backward ? "dx" : "out");
  const i64 D = p.D, q = D / 4;
  std::vector<double> f(q);
  for (i64 k = 0; k < q; ++k) f[k] = std::pow(p.theta, -4.0 * double(k) / double(D));
  for (i64 b = 0; b < p.B; ++b) {
    for (i64 s = 0; s < p.S; ++s) {
      const i64 pos = bug == Bug::axial_repeat_ignored ? s : s % (p.end_x * p.end_y);
      const i64 px = pos % p.end_x, py = pos / p.end_x;
      const i64 so = (b * p.S + s) * p.src_row_stride, dofs = (b * p.S + s) * p.W;
      for (i64 hd = 0; hd < p.num_heads; ++hd) {
        for (i64 j = 0; j < D / 2; ++j) {
          const double ang = j < q ? double(px) * f[j] : double(py) * f[j - q];
          const double c = std::cos(ang);
          double sn = std::sin(ang);
          if (backward && bug != Bug::axial_backward_same_angle) sn = -sn;
          const i64 i0 = so + hd * D + 2 * j;
          const double x0 = src[i0], x1 = src[i0 + 1];
          dst[dofs + hd * D + 2 * j] = static_cast<float>(x0 * c - x1 * sn);
          dst[dofs + hd * D + 2 * j + 1] = static_cast<float>(x1 * c + x0 * sn);
        }
      }
    }
  }
}

// ------------------------------------------------------------------- swiglu

void swiglu(const SwigluPlan& p, std::span<const float> x, std::span<const float> dy,
            std::span<float> out, bool backward, Bug bug) {
  require_size(x.size(), p.in_size(), "x");
  if (backward) {
    require_size(dy.size(), p.out_size(), "dy");
    require_size(out.size(), p.in_size(), "dx");
  } else {
    require_size(out.size(), p.out_size(), "out");
  }
  for (i64 r = 0; r < p.rows; ++r) {
    for (i64 j = 0; j < p.n; ++j) {
      const i64 gi = r * 2 * p.n + p.gate_offset() + j, ui = r * 2 * p.n + p.up_offset() + j;
      const double g = x[gi], u = x[ui];
      const double sig = 1.0 / (1.0 + std::exp(-g));
      if (!backward) {
        out[r * p.n + j] = static_cast<float>(g * sig * u);
      } else {
        const double d = dy[r * p.n + j];
        const double dsilu =
            bug == Bug::swiglu_backward_short ? sig : sig * (1.0 + g * (1.0 - sig));
        out[gi] = static_cast<float>(d * u * dsilu);
        out[ui] = static_cast<float>(d * g * sig);
      }
    }
  }
}

// ---------------------------------------------------------- attention block

void block(const AttentionBlockPlan& p, const AttentionBlockInputs<float>& in, std::span<float> out,
           Bug bug) {
  check_views(p, in, out.size());
  const i64 E = p.E, rows = p.B * p.S;
  std::vector<float> qkv(rows * 3 * E);
  for (i64 r = 0; r < rows; ++r) {
    for (i64 o = 0; o < 3 * E; ++o) {
      double acc = p.qkv_bias ? double(in.b_qkv[o]) : 0.0;
      for (i64 e = 0; e < E; ++e) acc += double(in.x[r * E + e]) * in.w_qkv[o * E + e];
      qkv[r * 3 * E + o] = static_cast<float>(acc);
    }
  }
  std::vector<float> qr(p.rotated_size()), kr(p.rotated_size());
  const RopeTables<float> t{in.cos, in.sin};
  const AttentionInputs<float> ai = block_attention_inputs<float>(
      p, std::span<const float>(qkv), in.keep, std::span<float>(qr), std::span<float>(kr),
      [&](const RopePlan& rp, std::span<const float> src, std::span<float> dst) {
        rope(rp, src, t, dst, false, Bug::none);
      });
  std::vector<float> att(p.attention.o.extent);
  Attention{p.attention, ai, Bug::none, 1}.forward(att);
  for (i64 r = 0; r < rows; ++r) {
    for (i64 o = 0; o < E; ++o) {
      double acc = (p.out_bias && bug != Bug::block_out_bias_dropped) ? double(in.b_out[o]) : 0.0;
      for (i64 e = 0; e < E; ++e) acc += double(att[r * E + e]) * in.w_out[o * E + e];
      out[r * E + o] = static_cast<float>(acc);
    }
  }
}

}  // namespace

const char* to_string(Bug bug) {
  switch (bug) {
    case Bug::none:
      return "none";
    case Bug::flex_score_unscaled:
      return "flex_score_unscaled";
    case Bug::flex_thread_dependent:
      return "flex_thread_dependent";
    case Bug::flex_block_mask_ignored:
      return "flex_block_mask_ignored";
    case Bug::flex_nonfinite_rows_zeroed:
      return "flex_nonfinite_rows_zeroed";
    case Bug::rope_table_stride_half_nrot:
      return "rope_table_stride_half_nrot";
    case Bug::rope_rank4_as_bshd:
      return "rope_rank4_as_bshd";
    case Bug::attn_batch_offset_units:
      return "attn_batch_offset_units";
    case Bug::rope_backward_other_row:
      return "rope_backward_other_row";
    case Bug::gqa_mod:
      return "gqa_mod";
    case Bug::causal_offset_dropped:
      return "causal_offset_dropped";
    case Bug::window_off_by_one:
      return "window_off_by_one";
    case Bug::softcap_missing_backward:
      return "softcap_missing_backward";
    case Bug::masked_row_nan:
      return "masked_row_nan";
    case Bug::scale_ignored_backward:
      return "scale_ignored_backward";
    case Bug::write_past_output:
      return "write_past_output";
    case Bug::rope_src_stride_ignored:
      return "rope_src_stride_ignored";
    case Bug::token_rows_transposed:
      return "token_rows_transposed";
    case Bug::rope_sin_sign:
      return "rope_sin_sign";
    case Bug::gptj_angle_negated:
      return "gptj_angle_negated";
    case Bug::axial_backward_same_angle:
      return "axial_backward_same_angle";
    case Bug::axial_repeat_ignored:
      return "axial_repeat_ignored";
    case Bug::keep_row_batch0:
      return "keep_row_batch0";
    case Bug::softcap_tanh_unscaled:
      return "softcap_tanh_unscaled";
    case Bug::key_tail_dropped:
      return "key_tail_dropped";
    case Bug::masked_times_value:
      return "masked_times_value";
    case Bug::swiglu_backward_short:
      return "swiglu_backward_short";
    case Bug::block_out_bias_dropped:
      return "block_out_bias_dropped";
    case Bug::thread_dependent_sum:
      return "thread_dependent_sum";
    case Bug::coarse_exp:
      return "coarse_exp";
    case Bug::v_row_stride_ignored:
      return "v_row_stride_ignored";
    case Bug::saved_lse_without_log:
      return "saved_lse_without_log";
    case Bug::rope_positions_per_batch_row:
      return "rope_positions_per_batch_row";
    case Bug::rope_bhsd_as_bshd:
      return "rope_bhsd_as_bshd";
    case Bug::rope_qk_k_rows_by_q_heads:
      return "rope_qk_k_rows_by_q_heads";
    case Bug::rope_positions_checked_late:
      return "rope_positions_checked_late";
    case Bug::sink_value_first_key:
      return "sink_value_first_key";
    case Bug::dsink_sign_flipped:
      return "dsink_sign_flipped";
    case Bug::sink_sum_thread_dependent:
      return "sink_sum_thread_dependent";
    case Bug::alibi_without_abs:
      return "alibi_without_abs";
    case Bug::alibi_shift_flipped:
      return "alibi_shift_flipped";
    case Bug::varlen_global_alignment:
      return "varlen_global_alignment";
    case Bug::varlen_reads_across_boundary:
      return "varlen_reads_across_boundary";
    case Bug::varlen_ignores_seqused:
      return "varlen_ignores_seqused";
    case Bug::paged_table_ignored:
      return "paged_table_ignored";
    case Bug::paged_slot_off_by_one:
      return "paged_slot_off_by_one";
    case Bug::features_write_before_check:
      return "features_write_before_check";
    case Bug::dbias_broadcast_unsummed:
      return "dbias_broadcast_unsummed";
    case Bug::dbias_is_p:
      return "dbias_is_p";
    case Bug::dbias_capped:
      return "dbias_capped";
    case Bug::dbias_sum_thread_dependent:
      return "dbias_sum_thread_dependent";
    case Bug::decode_dot_reversed:
      return "decode_dot_reversed";
    case Bug::key_chunks_by_sequences:
      return "key_chunks_by_sequences";
    case Bug::blocks_ignore_key_origin:
      return "blocks_ignore_key_origin";
    case Bug::weights_rounded_twice:
      return "weights_rounded_twice";
    case Bug::output_accumulated_in_t:
      return "output_accumulated_in_t";
    case Bug::weights_non_integer_max:
      return "weights_non_integer_max";
    case Bug::weights_three_bits:
      return "weights_three_bits";
    case Bug::store_truncates:
      return "store_truncates";
    case Bug::quantize_truncates:
      return "quantize_truncates";
    case Bug::decode_drops_v_scale:
      return "decode_drops_v_scale";
    case Bug::quantized_plan_unchecked:
      return "quantized_plan_unchecked";
    case Bug::dv_weights_unrounded:
      return "dv_weights_unrounded";
    case Bug::sink_weight_rounded:
      return "sink_weight_rounded";
    case Bug::exact_rounds_masked_rows:
      return "exact_rounds_masked_rows";
    case Bug::paged_blocks_reversed_bf16:
      return "paged_blocks_reversed_bf16";
    case Bug::dsinks_accumulated_in_t:
      return "dsinks_accumulated_in_t";
    case Bug::dbias_accumulated_in_t:
      return "dbias_accumulated_in_t";
    case Bug::block_qkv_unrounded:
      return "block_qkv_unrounded";
    case Bug::dsinks_one_past:
      return "dsinks_one_past";
  }
  return "?";
}

std::vector<Bug> all_bugs() {
  std::vector<Bug> v;
  for (int b = static_cast<int>(Bug::rope_table_stride_half_nrot);
       b <= static_cast<int>(Bug::flex_nonfinite_rows_zeroed); ++b) {
    v.push_back(static_cast<Bug>(b));
  }
  return v;
}

namespace {

/// The reference's flex entry points at T with the flex bugs planted:
/// flex_score_unscaled calls it at scale 1, flex_thread_dependent moves
/// out's first element one ulp up when `threads` > 1 (float only: the
/// determinism property runs at float), flex_block_mask_ignored calls it
/// without the block mask (mask_mod alone decides: what a kernel that
/// trusts mask_mod over a block mask that contradicts it computes), and
/// flex_nonfinite_rows_zeroed gives a row that SPEC §13.4 makes NaN o = 0
/// and lse = −inf (a kernel whose max and exp drop a NaN or +inf).
template <class T>
void attach_flex(Kernels<T>& be, Bug bug, int threads) {
  const Kernels<T> ref = reference::kernels<T>();
  const auto planned = [bug](const FlexPlan& plan) {
    if (bug != Bug::flex_score_unscaled && bug != Bug::flex_block_mask_ignored) return plan;
    FlexParams p = plan.params();
    if (bug == Bug::flex_score_unscaled) p.scale = 1.0;
    if (bug == Bug::flex_block_mask_ignored) p.block_mask.reset();
    return FlexPlan::make(p);
  };
  const auto inputs = [bug](FlexInputs<T> in) {
    if (bug == Bug::flex_block_mask_ignored) in.block_mask = {};
    return in;
  };
  be.flex_forward = [ref, planned, inputs, bug, threads](const FlexPlan& plan,
                                                         const FlexInputs<T>& in, std::span<T> out,
                                                         std::span<float> lse) {
    ref.flex_forward(planned(plan), inputs(in), out, lse);
    if (bug == Bug::flex_nonfinite_rows_zeroed) {
      for (T& o : out) {
        if (std::isnan(static_cast<double>(o))) o = T(0.0);
      }
      for (float& l : lse) {
        if (std::isnan(l)) l = -std::numeric_limits<float>::infinity();
      }
    }
    if constexpr (std::is_same_v<T, float>) {
      if (bug == Bug::flex_thread_dependent && threads > 1 && !out.empty()) {
        out[0] = std::nextafter(out[0], std::numeric_limits<float>::infinity());
      }
    }
  };
  be.flex_backward = [ref, planned, inputs](const FlexPlan& plan, const FlexInputs<T>& in,
                                            std::span<const T> dout, const FlexGrads<T>& g) {
    ref.flex_backward(planned(plan), inputs(in), dout, g);
  };
}

}  // namespace

Backend backend(Bug bug, int threads) {
  Backend be;
  be.name = std::string("broken:") + to_string(bug);
  // Bug::features_write_before_check: a call with a feature input writes its
  // first output before it validates anything.
  const auto early_write = [bug](const AttentionPlan& p, std::span<float> first) {
    const bool features = p.sinks || p.alibi != AlibiKind::none || p.varlen() || p.paged();
    if (bug == Bug::features_write_before_check && features && !first.empty()) first[0] = 0.0f;
  };
  be.attention_forward = [bug, threads, early_write](const AttentionPlan& p,
                                                     const AttentionInputs<float>& in,
                                                     std::span<float> out) {
    early_write(p, out);
    check_inputs(p, in);
    require_size(out.size(), p.o.extent, "out");
    Attention{p, in, bug, threads}.forward(out);
  };
  be.attention_forward_lse = [bug, threads, early_write](
                                 const AttentionPlan& p, const AttentionInputs<float>& in,
                                 std::span<float> out, std::span<float> lse) {
    early_write(p, out);
    check_inputs(p, in);
    require_size(out.size(), p.o.extent, "out");
    require_size(lse.size(), p.lse_size(), "lse");
    Attention{p, in, bug, threads}.forward(out, lse);
  };
  const auto backward = [bug, threads, early_write](
                            const AttentionPlan& p, const AttentionInputs<float>& in,
                            const AttentionSaved<float>* saved, std::span<const float> dout,
                            const AttentionGrads<float>& g) {
    early_write(p, !g.dq.empty() ? g.dq : !g.dk.empty() ? g.dk : !g.dv.empty() ? g.dv : g.dsinks);
    check_inputs(p, in);
    if (saved != nullptr) check_saved(p, *saved);
    require_size(dout.size(), p.o.extent, "dout");
    check_grads(p, g);
    const Attention::Grads r = Attention{p, in, bug, threads}.backward(dout, true, saved);
    copy_out(r.dq, g.dq);
    copy_out(r.dk, g.dk);
    copy_out(r.dv, g.dv);
    copy_out(r.dsinks, g.dsinks);
    copy_out(r.dbias, g.dbias);
    if (bug == Bug::dsinks_one_past && !g.dsinks.empty()) g.dsinks.data()[g.dsinks.size()] = 0.0f;
  };
  be.attention_backward = [backward](const AttentionPlan& p, const AttentionInputs<float>& in,
                                     std::span<const float> dout, const AttentionGrads<float>& g) {
    backward(p, in, nullptr, dout, g);
  };
  be.attention_backward_saved =
      [backward](const AttentionPlan& p, const AttentionInputs<float>& in,
                 const AttentionSaved<float>& saved, std::span<const float> dout,
                 const AttentionGrads<float>& g) { backward(p, in, &saved, dout, g); };
  const auto one = [bug, early_write](int which) {
    return [bug, which, early_write](const AttentionPlan& p, const AttentionInputs<float>& in,
                                     std::span<const float> dout, std::span<float> grad) {
      early_write(p, grad);
      check_inputs(p, in);
      require_size(dout.size(), p.o.extent, "dout");
      const i64 extent = which == 0 ? p.dq.extent : which == 1 ? p.dk.extent : p.dv.extent;
      require_size(grad.size(), extent, which == 0 ? "dq" : which == 1 ? "dk" : "dv");
      AttentionGrads<float> g;
      (which == 0 ? g.dq : which == 1 ? g.dk : g.dv) = grad;
      check_grads(p, g);
      const Attention::Grads r = Attention{p, in, bug, 1}.backward(dout, false);
      copy_out(which == 0 ? r.dq : which == 1 ? r.dk : r.dv, grad);
    };
  };
  be.attention_backward_dq = one(0);
  be.attention_backward_dk = one(1);
  be.attention_backward_dv = one(2);
  be.rope_forward = [bug](const RopePlan& p, std::span<const float> x, const RopeTables<float>& t,
                          std::span<float> out) {
    check_rope(p, x, t, out.size(), false, bug);
    rope(p, x, t, out, false, bug);
  };
  be.rope_backward = [bug](const RopePlan& p, std::span<const float> dy, const RopeTables<float>& t,
                           std::span<float> dx) {
    check_rope(p, dy, t, dx.size(), true, bug);
    rope(p, dy, t, dx, true, bug);
  };
  be.rope_forward_qk = [bug](const RopeQkPlan& p, std::span<const float> q,
                             std::span<const float> k, const RopeTables<float>& t,
                             std::span<float> q_out, std::span<float> k_out) {
    rope_qk(p, q, k, t, q_out, k_out, false, bug);
  };
  be.rope_backward_qk = [bug](const RopeQkPlan& p, std::span<const float> dq_out,
                              std::span<const float> dk_out, const RopeTables<float>& t,
                              std::span<float> dq, std::span<float> dk) {
    rope_qk(p, dq_out, dk_out, t, dq, dk, true, bug);
  };
  be.axial_rope_forward = [bug](const AxialRopePlan& p, std::span<const float> x,
                                std::span<float> out) { axial(p, x, out, false, bug); };
  be.axial_rope_backward = [bug](const AxialRopePlan& p, std::span<const float> dy,
                                 std::span<float> dx) { axial(p, dy, dx, true, bug); };
  be.swiglu_forward = [bug](const SwigluPlan& p, std::span<const float> x, std::span<float> out) {
    swiglu(p, x, {}, out, false, bug);
  };
  be.swiglu_backward = [bug](const SwigluPlan& p, std::span<const float> x,
                             std::span<const float> dy,
                             std::span<float> dx) { swiglu(p, x, dy, dx, true, bug); };
  be.attention_block = [bug](const AttentionBlockPlan& p, const AttentionBlockInputs<float>& in,
                             std::span<float> out) { block(p, in, out, bug); };
  attach_low_precision(be, bug);  // sets be.bf16 and be.f16: the flex entry points after it
  attach_flex(be.kernels<float>(), bug, threads);
  attach_flex(be.kernels<bfloat16>(), bug, threads);
  attach_flex(be.kernels<float16>(), bug, threads);
  return be;
}

}  // namespace tandem::props::broken
